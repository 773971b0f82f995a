// The decode step's first kernel: row tokens[r] of the embedding table into the
// residual stream, for each of the step's rows.
//
// PyTorch's embedding kernel did this before, inside the decode graph. It is short
// (one row, 3-8 KB), but it neither starts early nor lets the next kernel do so:
// the first layer's q/k/v GEMV could only launch once it had ended, and that GEMV's
// first weight loads then sat on the step's critical path. This kernel lets the next
// one launch at once (programmatic dependent launch, sm_90), so the GEMV's blocks
// stream their weights while the row is copied; the GEMV waits for this kernel's
// end before it reads the row (its griddepcontrol.wait).
//
// Grid (blocks, rows): block b of row r copies 16-byte vectors b * THREADS + t, ...
// A token outside [0, vocab) (the engine never feeds one: prompts are checked
// against the vocabulary and sampled tokens are in it) reads nothing and gives a
// zero row, where PyTorch's kernel would stop the context with a device assert.
#include "common.cuh"

struct EmbedArgs {
  const long long* tokens;  // [rows] int64
  const uint4* table;       // [vocab][vecs] 16-byte vectors (fp16 / bf16 rows)
  uint4* out;               // [rows][vecs]
  long long vocab;
  int rows;
  int vecs;                 // 16-byte vectors per row
};

constexpr int THREADS = 256;

extern "C" __global__ void __launch_bounds__(THREADS) embed_rows(const EmbedArgs a) {
  NIB_TRACE_BLOCK(NIB_KIND_EMBED);
  pdl_launch_dependents();
  pdl_wait();  // the tokens may come from the kernel before (a copy, the greedy pick)
  NIB_TRACE_WAITED();
  const int r = blockIdx.y;
  if (r >= a.rows) return;
  const long long tok = a.tokens[r];
  const bool ok = tok >= 0 && tok < a.vocab;
  const uint4* src = a.table + (size_t)(ok ? tok : 0) * a.vecs;
  uint4* dst = a.out + (size_t)r * a.vecs;
  for (int v = blockIdx.x * THREADS + threadIdx.x; v < a.vecs; v += gridDim.x * THREADS)
    dst[v] = ok ? ld_nc(src + v) : make_uint4(0u, 0u, 0u, 0u);
}
