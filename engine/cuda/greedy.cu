// The end of a greedy step in one launch: from the lm_head's logits to each row's
// argmax and its log-probability, written where the host reads them.
//
// The PyTorch sequence it replaces (a fp32 copy, argmax, two reductions for the
// logsumexp, gather, elementwise, copies) costs ~35-40 us inside the decode graph;
// the row is 64 KB (vocab 32000, bf16) to 300 KB (151936) and sits in L2, so one
// pass over it by a few dozen blocks should take a few microseconds, mostly latency.
//
// Grid: (blocks, rows). Block b of row r reads a contiguous slice of the row in
// 16-byte vectors (VPT vectors in flight per thread), keeping per thread
//   - the best chosen score c = row + bias (bias: fp32 [V] or none), its index and
//     the row's value there (the log-probability is of the unbiased row);
//   - a running max m of the row and s = sum exp(row - ref(m)), updated once per
//     vector (ref(m) = m, or 0 while m = -inf, so -inf entries add exact zeros).
// Ties go to the smallest index and a NaN beats every number (the first NaN
// wins), exactly as torch.argmax. The block reduces its threads, writes one
// partial (8 floats) to the workspace and takes a ticket from the row's counter;
// the block that draws the last ticket merges the row's partials, writes the
// token (int64) and log-probability (fp32), advances the decode position when
// given one (row 0's), and resets the counter for the next launch (graph-safe:
// nothing to clear between replays).
//
// Elements before the row's first 16-byte boundary and after its last whole
// vector (at most 2 x 7) are read one by one by block 0.
#include "pick.cuh"

struct GreedyArgs {
  const void* logits;      // [rows][row_stride], fp32 / fp16 / bf16 (the template's)
  const float* bias;       // [vocab] fp32 added before the argmax, or null
  float* ws;               // [rows][gridDim.x][8] partials
  int* counters;           // [rows], zero between launches
  long long* token;        // [rows] int64 or null: the next step's input, on the device
  long long* out_token;    // [rows] int64: mapped pinned host memory or a device buffer
  float* out_logprob;      // [rows] fp32: likewise
  long long* advance;      // [1] int64 or null: the decode position, + 1 once the token is out
  long long row_stride;    // elements between rows
  int vocab;
  int sys_fence;           // fence the stores at system scope before the kernel ends
};

constexpr int THREADS = 256;
constexpr int VPT = 2;  // 16-byte vectors per thread per trip (greedy.py's VECTORS_PER_THREAD)
constexpr int WARPS = THREADS / 32;
constexpr float LOG2E = PICK_LOG2E;

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2 };

template <int DT>
NIB_DEVICE float load_elem(const void* row, int i) {
  if constexpr (DT == DT_F32) return reinterpret_cast<const float*>(row)[i];
  else if constexpr (DT == DT_F16) return h2f(reinterpret_cast<const u16*>(row)[i]);
  else return bf2f(reinterpret_cast<const u16*>(row)[i]);
}

template <int DT>
NIB_DEVICE void unpack(const uint4& v, float (&x)[16 / (DT == DT_F32 ? 4 : 2)]) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if constexpr (DT == DT_F32) {
      x[e] = __uint_as_float(w[e]);
    } else if constexpr (DT == DT_F16) {
      x[2 * e] = lo_h2f(w[e]);
      x[2 * e + 1] = hi_h2f(w[e]);
    } else {
      x[2 * e] = __uint_as_float(w[e] << 16);
      x[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
    }
  }
}

template <int DT, bool BIAS>
NIB_DEVICE void greedy_body(const GreedyArgs& a) {
  constexpr int EPV = DT == DT_F32 ? 4 : 8;  // elements per 16-byte vector
  constexpr int ESIZE = 16 / EPV;
  __shared__ Best scratch[WARPS];
  const int row = blockIdx.y, tid = threadIdx.x;
  // Launched right behind the lm_head (programmatic dependent launch on sm_90): wait
  // for its logits before reading them.
  NIB_TRACE_BLOCK(NIB_KIND_GREEDY);
  pdl_launch_dependents();
  pdl_wait();
  NIB_TRACE_WAITED();
  const unsigned char* base =
      reinterpret_cast<const unsigned char*>(a.logits) + (size_t)row * a.row_stride * ESIZE;
  const int head = min(a.vocab, (int)(((16 - ((size_t)base & 15)) & 15) / ESIZE));
  const int nvec = (a.vocab - head) / EPV;
  const int tail = head + nvec * EPV;
  const uint4* vec = reinterpret_cast<const uint4*>(base + head * ESIZE);
  const int per = (nvec + gridDim.x - 1) / gridDim.x;
  const int v0 = blockIdx.x * per, v1 = min(nvec, v0 + per);

  Best b = empty_best();
  for (int v = v0 + tid; v < v1; v += THREADS * VPT) {
    uint4 raw[VPT];
    float bias[VPT][EPV];
#pragma unroll
    for (int j = 0; j < VPT; ++j) {  // every load of the trip first: they overlap
      const int vj = v + j * THREADS;
      raw[j] = vj < v1 ? ld_nc(vec + vj) : make_uint4(0, 0, 0, 0);
      if constexpr (BIAS) {
#pragma unroll
        for (int e = 0; e < EPV; ++e) bias[j][e] = vj < v1 ? a.bias[head + vj * EPV + e] : 0.f;
      }
    }
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int vj = v + j * THREADS;
      if (vj >= v1) break;
      float x[EPV];
      unpack<DT>(raw[j], x);
      const int i0 = head + vj * EPV;
      float vm = x[0];
#pragma unroll
      for (int e = 1; e < EPV; ++e) vm = fmaxf(vm, x[e]);
      const float m = fmaxf(b.m, vm);
      const float ref = ref_of(m);
      const float nref = -ref * LOG2E;
      float s = b.s * ex2((b.m - ref) * LOG2E);
#pragma unroll
      for (int e = 0; e < EPV; ++e) {
        s += ex2(fmaf(x[e], LOG2E, nref));
        take(b, BIAS ? x[e] + bias[j][e] : x[e], x[e], i0 + e);
      }
      b.m = m;
      b.s = s;
    }
  }
  if (blockIdx.x == 0) {  // the unaligned head and the tail: one element per thread
    const int i = tid < head ? tid : tail + tid - head;
    if (tid < head + (a.vocab - tail)) {
      const float x = load_elem<DT>(base, i);
      b = merge(b, best_of(BIAS ? x + a.bias[i] : x, x, i));
    }
  }

  b = block_merge(b, scratch);
  const PickOut out{a.token, a.out_token, a.out_logprob, a.advance, a.sys_fence};
  pick_across_blocks<PICK_ONE_LEVEL>(b, a.ws + (size_t)row * gridDim.x * PICK_PARTIAL_FLOATS, a.counters + row,
                     blockIdx.x, gridDim.x, out, row, [&] { return load_elem<DT>(base, 0); },
                     scratch);
}

#define GREEDY_KERNEL(NAME, DT, BIAS)                                              \
  extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME(const GreedyArgs a) { \
    greedy_body<DT, BIAS>(a);                                                      \
  }

GREEDY_KERNEL(greedy_f32, DT_F32, false)
GREEDY_KERNEL(greedy_f16, DT_F16, false)
GREEDY_KERNEL(greedy_bf16, DT_BF16, false)
GREEDY_KERNEL(greedy_f32_bias, DT_F32, true)
GREEDY_KERNEL(greedy_f16_bias, DT_F16, true)
GREEDY_KERNEL(greedy_bf16_bias, DT_BF16, true)
