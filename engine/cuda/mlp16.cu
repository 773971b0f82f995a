// The feed-forward block of one decode token in one launch, 16-bit weights:
//   h += W_down · (silu(gate) * up),   [gate; up] = W_gate_up · rms_norm(h) * nw
// with the dependency between the two products tracked per chunk of the GLU output
// instead of per kernel.
//
// Why: as two kernels (gemv16.cu's norm+GLU, then its residual down projection) the
// down product cannot start before every gate/up row is done, and its split-K partials
// meet behind one more barrier. Inside a decode step that boundary costs the time it
// takes the last gate/up blocks to drain and the down kernel's blocks to ramp up, with
// the memory system half idle. Here every warp goes from its gate/up rows straight to
// its down rows: it issues their weight loads first (they depend on nothing), and only
// then waits for the slice of the GLU output those rows multiply, which earlier warps
// have usually finished by then.
//
// Layout of the work (static, no work queue: one atomic counter would serialise):
// - phase 1, gate/up: row group g (R GLU outputs: R gate rows and R up rows) belongs to
//   warp g mod W (W = warps in the grid), so the groups finish roughly in index order
//   and the GLU output fills from its start; each block stages rms_norm's input h * nw
//   as fp32 in shared memory once (as gemv16.cu) and scales each sum by 1 / rms;
// - phase 2, down with split K: the GLU output is cut into chunks of CHUNK = CL x 256
//   values; task u = s x groups_d + g is split s (chunk s) of down row group g (RD rows);
//   warp w takes the contiguous tasks [w T / W, (w + 1) T / W) (split-major: the early
//   chunks first). Each warp keeps the next task's weight loads in flight while it
//   waits for and multiplies the current one;
// - the warp that runs split S - 1 of a row group also sums the S partials, in split
//   order (the result does not depend on timing), and adds the residual in place.
//
// Synchronisation without fences in the streaming loops. A fence (membar) waits for
// every load the warp has in flight, which would drain the weight pipeline at each
// handover. Instead every value another warp reads carries a tag in the same
// single-copy-atomic word: a GLU output is a 32-bit word (tag << 16 | value), a down
// partial a 64-bit word (tag << 32 | fp32 bits). The tag is this launch's generation
// + 1 (the generation: a counter in `sync` that the last block to leave increments),
// so a word left over from the launch before never matches. A reader re-reads (from
// L2, past L1; relaxed loads, which are performed each time) until every word it needs carries the tag; a 32- or 64-bit store is
// seen whole or not at all. The last block to leave (an exit counter) also publishes
// the next generation; the next launch reads it after griddepcontrol.wait, when this
// launch has completed.
//
// Deadlock freedom. The grid is at most what fits on the GPU at once (mlp16.py sizes it
// by the occupancy API), so every warp runs. Phase 1 waits for nothing. A task waits
// only for phase-1 groups and, at split S - 1, for tasks of its row group with a smaller
// split, i.e. a smaller task index, which run earlier on the same warp or on a warp
// with a smaller index: by induction over the task index every wait ends. The residual
// stream h is read by phase 1's staging and written by the last split's epilogue, which
// runs only after every chunk is complete, so after every block with phase-1 work has
// staged h (a block without phase-1 work does not stage it).
//
// Rounding points as gemv16.cu's two kernels: act = round(round(silu(round(gate))) *
// round(up)); h = round(h + round(sum)), the sum in fp32.
#include "common.cuh"

// Down partials a finishing warp gathers: (S - 1) x RD <= 32 x MAX_PART_SLOTS (mlp16.py).
#define MAX_PART_SLOTS 4
// A wait that has re-read this many times gives up and flags sync[2] (a bug or a grid
// that is not all resident: never expected, but a kernel must not hang the GPU).
#define SPIN_LIMIT (1 << 20)

struct MlpArgs {
  const u16* wgu;   // [2F][K]: gate rows, then up rows (row stride K)
  const u16* wd;    // [K][F] (row stride F)
  const u16* nw;    // [K] RMSNorm weight
  u16* h;           // [K] the residual stream: the norm's input, then += the product
  u32* act;         // [F] tagged GLU outputs
  u64* part;        // [S][K] tagged down partials
  u32* sync;        // [0] generation, [1] blocks left the launch, [2] waits given up
  int k;            // hidden size (a multiple of 8)
  int f;            // intermediate size (a multiple of 8)
  int groups_gu;    // ceil(f / R)
  int groups_d;     // ceil(k / RD)
  int splits;       // S = ceil(f / CHUNK)
  float eps;
};

// Relaxed (morally strong) accesses at GPU scope for the values warps hand each other:
// each 32- or 64-bit element is single-copy atomic, and a relaxed load in a loop is
// performed every time (a weak ld.global.cg may be hoisted out of a spin by ptxas).
NIB_DEVICE u32 ld_relaxed_u32(const u32* p) {
  u32 v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
NIB_DEVICE uint4 ld_relaxed_u32x4(const u32* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
NIB_DEVICE u64 ld_relaxed_u64(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
NIB_DEVICE void st_relaxed_u32(u32* p, u32 v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
NIB_DEVICE void st_relaxed_u64(u64* p, u64 v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// The residual stream, written by the previous kernel: from L2.
NIB_DEVICE uint4 ld_cg_u32x4(const u32* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// A streamed weight load that reads nothing (and yields zeros) where `ok` is false.
NIB_DEVICE uint4 ld_weights_if(const uint4* p, bool ok) {
  uint4 v;
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @q ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n}"
      : "=&r"(v.x), "=&r"(v.y), "=&r"(v.z), "=&r"(v.w)
      : "l"(p), "r"((int)ok));
  return v;
}

template <bool BF16>
NIB_DEVICE float lo_half(u32 v) {
  if constexpr (BF16) return __uint_as_float(v << 16);
  else return h2f((u16)(v & 0xffffu));
}
template <bool BF16>
NIB_DEVICE float hi_half(u32 v) {
  if constexpr (BF16) return __uint_as_float(v & 0xffff0000u);
  else return h2f((u16)(v >> 16));
}
// Sum of the 8 products of one 16-byte weight chunk with 8 fp32 inputs, into two chains.
template <bool BF16>
NIB_DEVICE void fma_chunk(const uint4 w, const float4 xa, const float4 xb, float& s0, float& s1) {
  s0 = fmaf(lo_half<BF16>(w.x), xa.x, s0);
  s0 = fmaf(hi_half<BF16>(w.x), xa.y, s0);
  s0 = fmaf(lo_half<BF16>(w.y), xa.z, s0);
  s0 = fmaf(hi_half<BF16>(w.y), xa.w, s0);
  s1 = fmaf(lo_half<BF16>(w.z), xb.x, s1);
  s1 = fmaf(hi_half<BF16>(w.z), xb.y, s1);
  s1 = fmaf(lo_half<BF16>(w.w), xb.z, s1);
  s1 = fmaf(hi_half<BF16>(w.w), xb.w, s1);
}

// R: GLU outputs per phase-1 group; U: 16-byte loads per weight row in flight per lane;
// RD: down rows per task; CL: 16-byte chunks per lane per down row (CHUNK = CL x 256).
template <bool BF16, int R, int WARPS, int U, int RD, int CL>
NIB_DEVICE void mlp16_body(const MlpArgs& a) {
  constexpr int ROWS = 2 * R;
  constexpr int THREADS = WARPS * 32;
  constexpr int CHUNK = CL * 256;
  extern __shared__ __align__(16) unsigned char smem[];
  float* scratch = reinterpret_cast<float*>(smem);     // block_sum
  float4* xs = reinterpret_cast<float4*>(smem + 128);  // h * nw, fp32 (gemv16.cu's layout)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int W = gridDim.x * WARPS;
  const int wg = blockIdx.x * WARPS + warp;
  const int K = a.k, F = a.f;
  const int chunks = K >> 3;  // 16-byte chunks of a gate/up row
  const int n_it = ((chunks + 32 * U - 1) / (32 * U)) * U;
  const int half = n_it << 5;
  const int n_t = wg < a.groups_gu ? (a.groups_gu - 1 - wg) / W + 1 : 0;  // my phase-1 groups
  const int total = n_t * n_it;

  // ---- phase 1 load cursor (gemv16.cu's): group lt of this warp, chunk stride li ----
  const uint4* rowp[ROWS];
  auto set_rows = [&](int t) {
    const int j0 = (wg + t * W) * R;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int j = min(j0 + r % R, F - 1);  // rows past F repeat the last: never stored
      const int row = r >= R ? F + j : j;
      rowp[r] = reinterpret_cast<const uint4*>(a.wgu + (size_t)row * K) + lane;
    }
  };
  int lt = 0, li = 0;
  auto load = [&](uint4 (&b)[ROWS]) {
    const bool ok = (li << 5) + lane < chunks;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) b[r] = ld_weights_if(rowp[r] + (li << 5), ok);
    if (++li == n_it) {
      li = 0;
      if (++lt < n_t) set_rows(lt);
    }
  };

  // Weights before the wait: they do not depend on the previous kernel (PDL, sm_90).
  pdl_launch_dependents();
  uint4 buf[U][ROWS];
  if (total > 0) set_rows(0);
#pragma unroll
  for (int p = 0; p < U; ++p)
    if (p < total) load(buf[p]);
  pdl_wait();
  const u32 gen = ld_relaxed_u32(a.sync) + 1u;  // this launch's tag
  const u32 tag16 = (gen & 0xffffu) << 16;

  // ---- staging: h * nw into shared memory, the sum of squares (blocks with work) ----
  const bool block_works = blockIdx.x * WARPS < a.groups_gu;
  float inv = 1.f;
  if (block_works) {
    const uint4* x8 = reinterpret_cast<const uint4*>(a.h);
    const uint4* n8 = reinterpret_cast<const uint4*>(a.nw);
    float ss = 0.f;
    for (int j = (int)threadIdx.x; j < half; j += THREADS) {
      float4 lo = make_float4(0.f, 0.f, 0.f, 0.f), hi = lo;
      if (j < chunks) {
        float hv[8], gv[8];
        const uint4 raw = ld_cg_u32x4(reinterpret_cast<const u32*>(x8 + j));
        const uint4 nr = ld_nc(n8 + j);
        const u32 rs[4] = {raw.x, raw.y, raw.z, raw.w}, ns[4] = {nr.x, nr.y, nr.z, nr.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          hv[2 * e] = lo_half<BF16>(rs[e]), hv[2 * e + 1] = hi_half<BF16>(rs[e]);
          gv[2 * e] = lo_half<BF16>(ns[e]), gv[2 * e + 1] = hi_half<BF16>(ns[e]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          ss = fmaf(hv[e], hv[e], ss);
          hv[e] *= gv[e];
        }
        lo = make_float4(hv[0], hv[1], hv[2], hv[3]);
        hi = make_float4(hv[4], hv[5], hv[6], hv[7]);
      }
      xs[j] = lo;
      xs[half + j] = hi;
    }
    ss = block_sum(ss, scratch);  // its barriers also publish xs
    inv = 1.f / sqrtf(ss / (float)K + a.eps);
  }

  // ---- phase 1: gate/up rows, the GLU outputs tagged ----
  float acc[ROWS][2];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = 0.f;
  for (int t = 0; t < n_t; ++t) {
    for (int q0 = 0; q0 < n_it; q0 += U) {
#pragma unroll
      for (int p = 0; p < U; ++p) {
        const int c = ((q0 + p) << 5) + lane;
        const float4 xa = xs[c], xb = xs[half + c];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) fma_chunk<BF16>(buf[p][r], xa, xb, acc[r][0], acc[r][1]);
        if (t * n_it + q0 + p + U < total) load(buf[p]);
      }
    }
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      s[r] = warp_sum(acc[r][0] + acc[r][1]) * inv;
      acc[r][0] = acc[r][1] = 0.f;
    }
    const int j0 = (wg + t * W) * R;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (lane == r && j0 + r < F) {
        const float g = round_act(s[r], BF16), u = round_act(s[R + r], BF16);
        const u16 v = f2act(round_act(silu(g), BF16) * u, BF16);
        st_relaxed_u32(a.act + j0 + r, tag16 | v);
      }
    }
  }

  // ---- phase 2: down projection, split K by chunks of the GLU output ----
  const int T = a.splits * a.groups_d;
  const int u0 = (int)(((long long)wg * T) / W), u1 = (int)(((long long)(wg + 1) * T) / W);
  auto load_task = [&](int u, uint4 (&b)[RD][CL]) {
    const int s = u / a.groups_d, g = u - s * a.groups_d;
#pragma unroll
    for (int r = 0; r < RD; ++r) {
      const int j = min(g * RD + r, K - 1);
      const uint4* row = reinterpret_cast<const uint4*>(a.wd + (size_t)j * F + (size_t)s * CHUNK);
#pragma unroll
      for (int i = 0; i < CL; ++i) {
        const int e = s * CHUNK + ((i << 5) + lane) * 8;  // first GLU index of the chunk
        b[r][i] = ld_weights_if(row + (i << 5) + lane, e < F);
      }
    }
  };
  u32 xv[CL][4];  // this lane's GLU inputs of the current split, two 16-bit values a word
  int cur_split = -1;
  // One task: wait for its chunk (when it is not the previous task's), multiply, and
  // either store the tagged partial or (last split) gather the others and finish.
  auto run_task = [&](int u, const uint4 (&w)[RD][CL]) {
    const int s = u / a.groups_d, g = u - s * a.groups_d;
    if (s != cur_split) {
      // The chunk's GLU outputs: re-read from L2 until each carries this launch's tag.
      cur_split = s;
      const u32* src = a.act + (size_t)s * CHUNK;
      bool ready;
      int tries = 0;
      do {
        if (++tries > SPIN_LIMIT) {
          if (lane == 0) atomicOr(a.sync + 2, 1u);
          break;
        }
        ready = true;
#pragma unroll
        for (int i = 0; i < CL; ++i) {
          const int off = ((i << 5) + lane) * 8;
          uint4 w0 = make_uint4(tag16, tag16, tag16, tag16), w1 = w0;  // past F: weight zero
          if (s * CHUNK + off < F) {
            w0 = ld_relaxed_u32x4(src + off);
            w1 = ld_relaxed_u32x4(src + off + 4);
          }
          const u32 q[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            ready &= ((q[2 * e] & 0xffff0000u) == tag16) & ((q[2 * e + 1] & 0xffff0000u) == tag16);
            xv[i][e] = (q[2 * e] & 0xffffu) | (q[2 * e + 1] << 16);
          }
        }
      } while (!__all_sync(0xffffffffu, ready));
    }
    float sum[RD];
#pragma unroll
    for (int r = 0; r < RD; ++r) {
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int i = 0; i < CL; ++i)
        fma_chunk<BF16>(w[r][i],
                        make_float4(lo_half<BF16>(xv[i][0]), hi_half<BF16>(xv[i][0]),
                                    lo_half<BF16>(xv[i][1]), hi_half<BF16>(xv[i][1])),
                        make_float4(lo_half<BF16>(xv[i][2]), hi_half<BF16>(xv[i][2]),
                                    lo_half<BF16>(xv[i][3]), hi_half<BF16>(xv[i][3])),
                        s0, s1);
      sum[r] = warp_sum(s0 + s1);
    }
    const int j0 = g * RD;
    if (s < a.splits - 1) {
#pragma unroll
      for (int r = 0; r < RD; ++r)
        if (lane == r && j0 + r < K)
          st_relaxed_u64(a.part + (size_t)s * K + j0 + r,
                    ((u64)gen << 32) | (u64)__float_as_uint(sum[r]));
      return;
    }
    // The last split: the other splits' partials of these rows, all loads in flight at
    // once (word i = split i / RD, row i % RD, held by lane i % 32 in slot i / 32) ...
    const int n_words = (a.splits - 1) * RD;
    float got[MAX_PART_SLOTS];
    bool ok;
    int tries = 0;
    do {
      if (++tries > SPIN_LIMIT) {
        if (lane == 0) atomicOr(a.sync + 2, 2u);
        break;
      }
      ok = true;
#pragma unroll
      for (int q = 0; q < MAX_PART_SLOTS; ++q) {
        const int i = q * 32 + lane;
        got[q] = 0.f;
        if (i < n_words && j0 + i % RD < K) {
          const u64 v = ld_relaxed_u64(a.part + (size_t)(i / RD) * K + j0 + i % RD);
          ok &= (u32)(v >> 32) == gen;
          got[q] = __uint_as_float((u32)v);
        }
      }
    } while (!__all_sync(0xffffffffu, ok));
    // ... summed in split order (timing never changes the result), then the residual.
#pragma unroll
    for (int r = 0; r < RD; ++r) {
      float v = 0.f;
      for (int sp = 0; sp < a.splits - 1; ++sp) {
        const int i = sp * RD + r;
        float x = 0.f;
#pragma unroll
        for (int q = 0; q < MAX_PART_SLOTS; ++q) {
          const float y = __shfl_sync(0xffffffffu, got[q], i & 31);
          if (q == (i >> 5)) x = y;
        }
        v += x;
      }
      v += sum[r];
      if (lane == 0 && j0 + r < K) {
        const int j = j0 + r;
        a.h[j] = f2act(act2f(a.h[j], BF16) + round_act(v, BF16), BF16);
      }
    }
  };
  uint4 wa[RD][CL], wb[RD][CL];
  if (u0 < u1) load_task(u0, wa);
  for (int u = u0; u < u1; u += 2) {
    if (u + 1 < u1) load_task(u + 1, wb);
    run_task(u, wa);
    if (u + 1 >= u1) break;
    if (u + 2 < u1) load_task(u + 2, wa);
    run_task(u + 1, wb);
  }

  // ---- leave: the last block publishes the next generation ----
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.sync + 1, 1u) == gridDim.x - 1) {
      a.sync[1] = 0u;
      a.sync[0] = gen;
      __threadfence();
    }
  }
}

// The shapes mlp16.py may launch: mlp16_<bf16|fp16>_r<R>w<WARPS>u<U>d<RD>c<CL>b<B>, B the
// blocks per SM the register budget is capped for (__launch_bounds__).
#define MLP_KERNEL(DT, BF, R, WARPS, U, RD, CL, B)                                    \
  extern "C" __global__ void __launch_bounds__(WARPS * 32, B)                         \
      mlp16_##DT##_r##R##w##WARPS##u##U##d##RD##c##CL##b##B(const MlpArgs a) {        \
    mlp16_body<BF, R, WARPS, U, RD, CL>(a);                                           \
  }
#define MLP_BOTH(R, WARPS, U, RD, CL, B)              \
  MLP_KERNEL(bf16, true, R, WARPS, U, RD, CL, B)      \
  MLP_KERNEL(fp16, false, R, WARPS, U, RD, CL, B)

MLP_BOTH(2, 8, 4, 4, 2, 2)
MLP_BOTH(1, 8, 4, 4, 2, 2)
MLP_BOTH(1, 4, 4, 4, 2, 4)
MLP_BOTH(2, 4, 4, 4, 2, 4)
MLP_BOTH(2, 8, 4, 2, 4, 1)
MLP_BOTH(1, 8, 8, 2, 4, 1)
