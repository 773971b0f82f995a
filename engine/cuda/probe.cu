// Probes of what a kernel boundary costs, for bench/micro_boundary.py (not used by the
// engine): a decode step is ~150 small dependent kernels, so the fixed cost of one
// launch inside a CUDA graph (with and without programmatic dependent launch) and the
// ramp of a kernel that streams a few MB set how close a kernel-per-op design can get
// to the floor.
//
// probe_stream: each block sums its `per_block` 16-byte vectors of `src` and writes one
// float, then adds the previous launch's value of its slot (the data dependency a layer
// has on the one before). Loads are issued before griddepcontrol.wait, as nib's GEMVs
// issue their weight loads; `per_block` 0 makes it a pure boundary: wait, read, write.
#include "common.cuh"

struct ProbeArgs {
  const uint4* src;  // [blocks][per_block] 16-byte vectors (may be null when per_block = 0)
  const float* prev;  // [blocks] the previous launch's outputs
  float* out;         // [blocks]
  int per_block;      // vectors per block
};

template <int U>
NIB_DEVICE void probe_body(const ProbeArgs& a) {
  pdl_launch_dependents();
  const uint4* p = a.src + (size_t)blockIdx.x * a.per_block;
  const int step = (int)blockDim.x;
  uint4 buf[U];
  auto fill = [&](int i) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      buf[u] = i + u * step < a.per_block ? ld_stream(p + i + u * step) : make_uint4(0, 0, 0, 0);
  };
  int i = threadIdx.x;
  fill(i);
  pdl_wait();
  float s = 0.f;
  for (;;) {
#pragma unroll
    for (int u = 0; u < U; ++u) s += (float)(buf[u].x & 1u) + (float)(buf[u].w & 1u);
    i += U * step;
    if (i >= a.per_block) break;
    fill(i);
  }
  extern __shared__ float scratch[];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) a.out[blockIdx.x] = s + ld_cg(a.prev + blockIdx.x);
}

extern "C" __global__ void __launch_bounds__(256) probe_stream(const ProbeArgs a) { probe_body<8>(a); }
