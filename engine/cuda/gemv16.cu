// Batch-1 GEMV for 16-bit weights (bf16 or fp16) with the decoder's glue, on the CUDA cores.
//
// y = W x (+ b): W [rows][stride] row-major, x, b and y in W's dtype, fp32 sums. At one
// row the product is a pure stream of W: ~2 instructions per weight here (a shift or a
// mask to widen, one FMA), against the ~15 the issue rate allows at the copy bandwidth,
// so what sets the pace is how many bytes each SM keeps in flight (Little's law:
// 4.28 TB/s x ~1 us / 132 SMs = ~32 KB). Each lane keeps U 16-byte loads per weight row
// in registers, R (GLU: 2R) rows per warp.
//
// Layout of the work:
// - a row group is R output rows; a warp owns `per_warp` row groups (warp w of the grid:
//   groups w, w + warps_in_grid, ...) and streams them back to back: the loads of the
//   next group are in flight while it reduces the last, and the block stages the
//   activations once for all of them;
// - lanes stride K in 16-byte chunks (lane l reads chunk l, l + 32, ... of its K slice);
// - the block stages its K slice of x in shared memory as fp32, chunk c's inputs
//   0-3 at xs[c] and 4-7 at xs[half + c]: a warp's 16-byte reads are then consecutive
//   (no bank conflicts), and the slice is zero-padded to whole multiples of U warp
//   strides so that a masked (zero) weight never meets an unwritten activation;
// - split-K (blockIdx.y = split, few rows over a long K): each split's warp writes fp32
//   partials for its group, and the last of the group's splits to arrive (an atomic
//   counter per group, which it resets) sums them in split order and runs the epilogue.
//   One launch, graph-safe.
//
// Fusions, as kernels/gemv.py's Triton kernel computes them:
// - norm: x is the residual stream h and the input is rms_norm(h) * nw; the block stages
//   h * nw in fp32 (not rounded to 16 bits) and scales each sum by 1/rms at the end
//   (every block sums the squares of the whole row itself: a few KB, from L2);
// - epi 1 (residual): y[j] = round(y[j] + round(W x + b)) in place;
// - GLU (a template flag): W holds [gate; up] (2n rows), the warp owns gate rows j and
//   up rows n + j, y = round(round(silu(round(gate))) * round(up)).
#include "common.cuh"

struct G16Args {
  const u16* w;     // [rows][stride] weights (GLU: 2n rows, gate then up)
  const u16* x;     // [k] activations (norm: the residual stream h)
  const u16* nw;    // [k] RMSNorm weight (norm only)
  const u16* bias;  // [n] or null (never with GLU)
  u16* y;           // [n] output; epi 1: the residual stream, read and written
  float* ws;        // split-K partials: [splits][2][n] (plain/gate, up)
  int* counters;    // [groups] arrivals per row group, zero between launches
  int n;            // output rows
  int k;            // inputs (a multiple of 8)
  int stride;       // elements between rows of w (a multiple of 8)
  int groups;       // ceil(n / R)
  int per_warp;     // row groups per warp
  int splits;       // gridDim.y: blocks along K per row group
  int k_split;      // inputs per split (a multiple of 256 when splits > 1)
  int epi;          // 0 plain, 1 residual
  int norm;
  float eps;
};

enum { EPI_PLAIN = 0, EPI_RESIDUAL = 1 };

// A streamed weight load that reads nothing (and yields zeros) where `ok` is false:
// one predicated instruction, no branch around it.
NIB_DEVICE uint4 ld_stream_if(const uint4* p, bool ok) {
  uint4 v;
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @q ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n}"
      : "=&r"(v.x), "=&r"(v.y), "=&r"(v.z), "=&r"(v.w)
      : "l"(p), "r"((int)ok));
  return v;
}

// 16 bytes global -> shared without registers (sm_80+), and the wait for this thread's.
NIB_DEVICE void cp_async16(void* smem_dst, const void* src) {
  u32 dst;
  asm("{\n .reg .u64 a;\n cvta.to.shared.u64 a, %1;\n cvt.u32.u64 %0, a;\n}"
      : "=r"(dst) : "l"(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
NIB_DEVICE void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\n cp.async.wait_group 0;" ::: "memory");
}

// The two 16-bit values of a word as fp32: element 0 in the low half.
template <bool BF16>
NIB_DEVICE float lo16(u32 v) {
  if constexpr (BF16) return __uint_as_float(v << 16);
  else return h2f((u16)(v & 0xffffu));
}
template <bool BF16>
NIB_DEVICE float hi16(u32 v) {
  if constexpr (BF16) return __uint_as_float(v & 0xffff0000u);
  else return h2f((u16)(v >> 16));
}
template <bool BF16>
NIB_DEVICE void widen8(const uint4 v, float (&f)[8]) {
  f[0] = lo16<BF16>(v.x), f[1] = hi16<BF16>(v.x), f[2] = lo16<BF16>(v.y), f[3] = hi16<BF16>(v.y);
  f[4] = lo16<BF16>(v.z), f[5] = hi16<BF16>(v.z), f[6] = lo16<BF16>(v.w), f[7] = hi16<BF16>(v.w);
}

// Output row j's epilogue: v (and up, GLU) are the finished fp32 sums (1/rms applied).
template <bool BF16, bool GLU>
NIB_DEVICE void store_row(const G16Args& a, int j, float v, float up) {
  if constexpr (GLU) {
    const float g = round_act(v, BF16), u = round_act(up, BF16);
    a.y[j] = f2act(round_act(silu(g), BF16) * u, BF16);
  } else {
    if (a.bias) v += act2f(a.bias[j], BF16);
    if (a.epi == EPI_RESIDUAL) v = act2f(a.y[j], BF16) + round_act(v, BF16);
    a.y[j] = f2act(v, BF16);
  }
}

template <bool BF16, bool GLU, int R, int WARPS, int U>
NIB_DEVICE void gemv16_body(const G16Args& a) {
  NIB_TRACE_BLOCK(NIB_KIND_GEMV16);
  constexpr int ROWS = GLU ? 2 * R : R;  // weight rows per warp
  constexpr int THREADS = WARPS * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  float* scratch = reinterpret_cast<float*>(smem);      // 32 floats for block_sum
  float4* xs = reinterpret_cast<float4*>(smem + 128);  // the staged K slice
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = blockIdx.y;
  const int k0 = split * a.k_split;
  const int k1 = min(a.k, k0 + a.k_split);
  const int chunks = (k1 - k0) >> 3;  // 16-byte chunks of a weight row in this slice
  // Loads per weight row per lane and row group, whole multiples of U (the loop below
  // is unrolled U times; loads past the slice are predicated off and read zeros).
  const int n_it = ((chunks + 32 * U - 1) / (32 * U)) * U;
  const int half = n_it << 5;  // chunks per half of xs (zero-padded)
  const int gstride = gridDim.x * WARPS;
  const int wg = blockIdx.x * WARPS + warp;
  const int n_t = wg < a.groups ? min(a.per_warp, (a.groups - 1 - wg) / gstride + 1) : 0;
  const int total = n_t * n_it;  // this warp's loads per weight row, all groups

  // The load cursor: row group lt (of this warp), chunk stride li.
  const uint4* rowp[ROWS];
  auto set_rows = [&](int t) {
    const int j0 = (wg + t * gstride) * R;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      // Rows past n repeat the last one: loaded, never stored.
      const int j = min(j0 + (GLU ? r % R : r), a.n - 1);
      const int row = (GLU && r >= R) ? a.n + j : j;
      rowp[r] = reinterpret_cast<const uint4*>(a.w + (size_t)row * a.stride + k0) + lane;
    }
  };
  int lt = 0, li = 0;
  auto load = [&](uint4 (&b)[ROWS]) {
    const bool ok = (li << 5) + lane < chunks;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) b[r] = ld_stream_if(rowp[r] + (li << 5), ok);
    if (++li == n_it) {
      li = 0;
      if (++lt < n_t) set_rows(lt);
    }
  };

  // Weights first: they do not depend on the previous kernel, so with programmatic
  // dependent launch (sm_90) their trip to memory overlaps that kernel's tail and the
  // staging below; nothing the previous kernel writes is read before pdl_wait.
  pdl_launch_dependents();
  uint4 buf[U][ROWS];
  if (total > 0) set_rows(0);
#pragma unroll
  for (int p = 0; p < U; ++p)
    if (p < total) load(buf[p]);
  pdl_wait();
  NIB_TRACE_WAITED();

  // Stage the slice (norm: h * nw, and the squares of the row). The raw 16-bit chunks
  // land by cp.async in the very slots their fp32 values will take (x chunk j in
  // xs[half + j], nw chunk j in xs[j]), all in flight at once: one trip to L2 instead
  // of one per loop step, and no registers while the weight loads are outstanding.
  const int c0 = k0 >> 3;
  const uint4* x8 = reinterpret_cast<const uint4*>(a.x);
  const uint4* n8 = reinterpret_cast<const uint4*>(a.nw);
  for (int j = (int)threadIdx.x; j < half; j += THREADS) {
    if (j < chunks) {
      cp_async16(xs + half + j, x8 + c0 + j);
      if (a.norm) cp_async16(xs + j, n8 + c0 + j);
    } else {
      xs[j] = xs[half + j] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  cp_async_wait_all();
  float ss = 0.f;
  // Each thread converts the chunks it copied itself (its own slots: no barrier yet).
#pragma unroll 1
  for (int j = (int)threadIdx.x; j < chunks; j += THREADS) {
    const float4 raw = xs[half + j];
    float h[8];
    widen8<BF16>(make_uint4(__float_as_uint(raw.x), __float_as_uint(raw.y),
                            __float_as_uint(raw.z), __float_as_uint(raw.w)),
                 h);
    if (a.norm) {
      const float4 rn = xs[j];
      float g[8];
      widen8<BF16>(make_uint4(__float_as_uint(rn.x), __float_as_uint(rn.y),
                              __float_as_uint(rn.z), __float_as_uint(rn.w)),
                   g);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        ss = fmaf(h[e], h[e], ss);
        h[e] *= g[e];
      }
    }
    xs[j] = make_float4(h[0], h[1], h[2], h[3]);
    xs[half + j] = make_float4(h[4], h[5], h[6], h[7]);
  }
  if (a.norm && a.splits > 1) {
    // The squares of the inputs outside this slice (norm with split K: rare).
#pragma unroll 1
    for (int c = (int)threadIdx.x; c < (a.k >> 3); c += THREADS) {
      if (c >= c0 && c < c0 + chunks) continue;
      float h[8];
      widen8<BF16>(ld_nc(x8 + c), h);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = fmaf(h[e], h[e], ss);
    }
  }
  float inv = 1.f;
  if (a.norm) {
    ss = block_sum(ss, scratch);  // its barriers also publish xs
    inv = 1.f / sqrtf(ss / (float)a.k + a.eps);
  } else {
    __syncthreads();
  }

  // Two accumulators per row: inputs 0-3 and 4-7 of each chunk (shorter FMA chains).
  float acc[ROWS][2];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = 0.f;

  auto fma8 = [&](int ci, const uint4 (&b)[ROWS]) {
    const int c = (ci << 5) + lane;
    const float4 xa = xs[c], xb = xs[half + c];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float s0 = acc[r][0], s1 = acc[r][1];
      s0 = fmaf(lo16<BF16>(b[r].x), xa.x, s0);
      s0 = fmaf(hi16<BF16>(b[r].x), xa.y, s0);
      s0 = fmaf(lo16<BF16>(b[r].y), xa.z, s0);
      s0 = fmaf(hi16<BF16>(b[r].y), xa.w, s0);
      s1 = fmaf(lo16<BF16>(b[r].z), xb.x, s1);
      s1 = fmaf(hi16<BF16>(b[r].z), xb.y, s1);
      s1 = fmaf(lo16<BF16>(b[r].w), xb.z, s1);
      s1 = fmaf(hi16<BF16>(b[r].w), xb.w, s1);
      acc[r][0] = s0, acc[r][1] = s1;
    }
  };

  // Row group t of this warp is complete in acc: reduce, then epilogue or split partials.
  auto finish = [&](int t) {
    const int g = wg + t * gstride;
    const int j0 = g * R;
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) s[r] = warp_sum(acc[r][0] + acc[r][1]);
    if (a.splits == 1) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (lane == r && j0 + r < a.n)
          store_row<BF16, GLU>(a, j0 + r, s[r] * inv, GLU ? s[(R + r) % ROWS] * inv : 0.f);
      return;
    }
    if (lane != 0) return;
    // One thread writes, fences, arrives; the last arrival reads all partials (the
    // classic threadfence reduction, per row group).
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int j = j0 + r;
      if (j < a.n) {
        a.ws[(size_t)(2 * split) * a.n + j] = s[r];
        if (GLU) a.ws[(size_t)(2 * split + 1) * a.n + j] = s[(R + r) % ROWS];
      }
    }
    __threadfence();
    if (atomicAdd(a.counters + g, 1) != a.splits - 1) return;
    __threadfence();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int j = j0 + r;
      if (j < a.n) {
        float v = 0.f, u = 0.f;
        for (int sp = 0; sp < a.splits; ++sp) {
          v += ld_cg(a.ws + (size_t)(2 * sp) * a.n + j);
          if (GLU) u += ld_cg(a.ws + (size_t)(2 * sp + 1) * a.n + j);
        }
        store_row<BF16, GLU>(a, j, v * inv, u * inv);
      }
    }
    a.counters[g] = 0;
  };

  for (int t = 0; t < n_t; ++t) {
    for (int q0 = 0; q0 < n_it; q0 += U) {
#pragma unroll
      for (int p = 0; p < U; ++p) {
        fma8(q0 + p, buf[p]);
        if (t * n_it + q0 + p + U < total) load(buf[p]);
      }
    }
    finish(t);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = 0.f;
  }
}

// The shapes gemv16.py may launch: gemv16_<bf16|fp16>_r<R>w<WARPS>u<U>[_glu].
#define G16_KERNEL(DT, BF, GLU, TAG, R, WARPS, U)                                  \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                         \
      gemv16_##DT##_r##R##w##WARPS##u##U##TAG(const G16Args a) {                   \
    gemv16_body<BF, GLU, R, WARPS, U>(a);                                          \
  }
#define G16_PLAIN(R, WARPS, U)                  \
  G16_KERNEL(bf16, true, false, , R, WARPS, U)  \
  G16_KERNEL(fp16, false, false, , R, WARPS, U)
#define G16_GLU(R, WARPS, U)                        \
  G16_KERNEL(bf16, true, true, _glu, R, WARPS, U)   \
  G16_KERNEL(fp16, false, true, _glu, R, WARPS, U)

// Plain, norm and residual: R output rows of U loads in flight per lane. Every GLU
// shape is here too: a gate_up layer runs its GLU config for the plain product as well.
G16_PLAIN(1, 4, 4)
G16_PLAIN(1, 4, 8)
G16_PLAIN(2, 4, 4)
G16_PLAIN(2, 4, 8)
G16_PLAIN(4, 4, 4)
G16_PLAIN(1, 8, 8)
G16_PLAIN(2, 8, 4)
// SiLU(gate) * up: R gate rows and R up rows per warp.
G16_GLU(1, 4, 4)
G16_GLU(1, 4, 8)
G16_GLU(2, 4, 4)
G16_GLU(1, 8, 8)
G16_GLU(2, 8, 4)
