// Shared device helpers for nib's CUDA kernels. No CUDA headers: everything the
// kernels need is a builtin or a line of PTX, so a file compiles the same with
// nvcc and with NVRTC, and the PTX in the disassembly is the PTX written here.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define NIB_DEVICE __device__ __forceinline__

// ---- loads -------------------------------------------------------------------
// Weights stream through once: read-only path, no L1 allocation.
NIB_DEVICE uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Small read-only operands (activations, scales, norm weights): cached.
NIB_DEVICE uint4 ld_nc(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
NIB_DEVICE u32 ld_nc_u32(const u32* p) {
  u32 v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
// Data other blocks of this launch wrote (split-K partials): from L2, past L1.
NIB_DEVICE float ld_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
NIB_DEVICE float4 ld_cg4(const float4* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// ---- 16-bit floats -------------------------------------------------------------
NIB_DEVICE float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
NIB_DEVICE u16 f2h(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
NIB_DEVICE float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
NIB_DEVICE u16 f2bf(float f) {
  u16 b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}
// A value of the activation dtype (bf16 when is_bf16, else fp16) <-> fp32.
NIB_DEVICE float act2f(u16 v, bool is_bf16) { return is_bf16 ? bf2f(v) : h2f(v); }
NIB_DEVICE u16 f2act(float f, bool is_bf16) { return is_bf16 ? f2bf(f) : f2h(f); }
// Round f to the activation dtype and back (the reference's rounding points).
NIB_DEVICE float round_act(float f, bool is_bf16) { return act2f(f2act(f, is_bf16), is_bf16); }
NIB_DEVICE u32 pack_h2(float lo, float hi) {
  u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
NIB_DEVICE float lo_h2f(u32 v) { return h2f((u16)(v & 0xffff)); }
NIB_DEVICE float hi_h2f(u32 v) { return h2f((u16)(v >> 16)); }

// ---- bit tricks ----------------------------------------------------------------
template <int LUT>
NIB_DEVICE u32 lop3(u32 a, u32 b, u32 c) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
  return d;
}
NIB_DEVICE u32 hsub2(u32 a, u32 b) {
  u32 d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
NIB_DEVICE u32 hfma2(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// ---- tensor cores --------------------------------------------------------------
// D = A B + C, m16n8k16, fp16 inputs, fp32 accumulators (PTX ISA fragment layouts:
// a lane (g = lane / 4, t = lane % 4) holds A rows g and g + 8, B column g, C rows
// g and g + 8 at columns 2t and 2t + 1).
NIB_DEVICE void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- reductions ----------------------------------------------------------------
NIB_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
NIB_DEVICE float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block; `scratch` holds at least 32 floats. Every thread gets the sum.
NIB_DEVICE float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = lane < warps ? scratch[lane] : 0.f;
  return warp_sum(s);
}

NIB_DEVICE float silu(float g) { return g / (1.f + __expf(-g)); }

// ---- programmatic dependent launch (sm_90) ---------------------------------------
// launch_dependents: the next kernel on the stream may start once every block of this
// one has called it (or exited). wait: block until the previous kernel has finished
// and its writes are visible; nothing the previous kernel writes (or reads) may be
// touched before it. Both are no-ops when the kernel was not launched with PDL.
NIB_DEVICE void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
NIB_DEVICE void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---- the step timeline (NIB_TRACE builds only) ------------------------------------
// bench/step_timeline.py builds the kernels with -DNIB_TRACE (NIB_CUDA_TRACE=1): each
// block's thread 0 then records when the block started, when its pdl_wait returned and
// when it left (%globaltimer, ns, one clock for every SM), its SM and its launch's
// grid, into this module's nib_trace buffer (the host reads it by name). A kernel may
// also mark up to NIB_TRACE_MARKS points of its own between the wait and the end
// (NIB_TRACE_MARK(i): when thread 0 got there; 0 where never reached), so the time after
// the wait splits into phases (e.g. activations staged, weights consumed). Without
// NIB_TRACE the macros are empty and the kernels compile exactly as before.
#define NIB_TRACE_MARKS 3
#ifdef NIB_TRACE
struct NibTraceRecord {
  u64 start, waited, end;
  u64 marks[NIB_TRACE_MARKS];
  u32 smid, kind, grid, threads;
};
static_assert(sizeof(NibTraceRecord) == 64, "bench/step_timeline.py's RECORD");
#define NIB_TRACE_CAPACITY (1u << 16)
__device__ NibTraceRecord nib_trace[NIB_TRACE_CAPACITY];
__device__ u32 nib_trace_count;
NIB_DEVICE u64 nib_globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
struct NibTraceScope {
  u64 start, waited;
  u32 marks[NIB_TRACE_MARKS];  // ns after start (32-bit: one register each)
  u32 kind;
  __device__ explicit NibTraceScope(u32 k) : start(nib_globaltimer()), waited(0), kind(k) {
#pragma unroll
    for (int i = 0; i < NIB_TRACE_MARKS; ++i) marks[i] = 0;
  }
  __device__ void wait_done() { waited = nib_globaltimer(); }
  __device__ void mark(int i) { marks[i] = (u32)(nib_globaltimer() - start); }
  __device__ ~NibTraceScope() {  // every return path of the block's thread 0
    if (threadIdx.x != 0) return;
    const u64 end = nib_globaltimer();
    u32 sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const u32 i = atomicAdd(&nib_trace_count, 1u);
    u64 at[NIB_TRACE_MARKS];
#pragma unroll
    for (int m = 0; m < NIB_TRACE_MARKS; ++m) at[m] = marks[m] ? start + marks[m] : 0;
    if (i < NIB_TRACE_CAPACITY)
      nib_trace[i] = {start, waited, end, {at[0], at[1], at[2]}, sm, kind,
                      gridDim.x * gridDim.y * gridDim.z, blockDim.x};
  }
};
#define NIB_TRACE_BLOCK(kind) NibTraceScope nib_trace_scope_(kind)
#define NIB_TRACE_WAITED() nib_trace_scope_.wait_done()
#define NIB_TRACE_MARK(i) nib_trace_scope_.mark(i)
#else
#define NIB_TRACE_BLOCK(kind) ((void)0)
#define NIB_TRACE_WAITED() ((void)0)
#define NIB_TRACE_MARK(i) ((void)0)
#endif
// The kinds the records carry (bench/step_timeline.py names them).
enum { NIB_KIND_W4A16 = 1, NIB_KIND_W4A16_BULK = 2, NIB_KIND_GEMV16 = 3, NIB_KIND_ATTENTION = 4,
       NIB_KIND_GREEDY = 5, NIB_KIND_EMBED = 6 };

// ---- bulk copies and mbarriers (sm_90) -------------------------------------------
NIB_DEVICE u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
#if __CUDA_ARCH__ >= 900
NIB_DEVICE void mbar_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Make the barriers' initialisation visible to the copy engine before any copy uses them.
NIB_DEVICE void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// One arrival that also announces `bytes` of copies completing on this barrier's phase.
NIB_DEVICE void mbar_expect_tx(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
NIB_DEVICE bool mbar_try_wait(u64* bar, u32 parity) {
  u32 ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}
NIB_DEVICE void mbar_wait(u64* bar, u32 parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// global -> shared, `bytes` (a multiple of 16, both addresses 16-byte aligned), completing
// on `bar` (the shared::cluster address of this block's own shared memory).
NIB_DEVICE void bulk_g2s(void* dst, const void* src, u32 bytes, u64* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
#endif

// ---- shared memory, async copies, ldmatrix (sm_80+) ------------------------------
// A generic pointer into shared memory as the 32-bit shared-window address PTX wants.
NIB_DEVICE u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
NIB_DEVICE void st_shared16(u32 addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};"
               :: "r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
NIB_DEVICE uint4 ld_shared16(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
// 16 bytes global -> shared without a register round trip, cached in L2 only; with
// `ok` false nothing is read and the destination is zero-filled.
NIB_DEVICE void cp_async16(u32 dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
NIB_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
NIB_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
// Four 8x8 b16 matrices; lane i gives the row address of matrix i / 8, row i % 8, and
// receives in register j the elements (row lane/4, columns 2(lane%4), +1) of matrix j
// (.trans: rows 2(lane%4), +1 of column lane/4).
NIB_DEVICE void ldsm_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
NIB_DEVICE void ldsm_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// The transpose of an 8x8 b16 matrix held as a fragment (lane: row lane/4, columns
// 2(lane%4), +1): each lane gets the same positions of the transposed matrix.
NIB_DEVICE u32 movmatrix_trans(u32 a) {
  u32 d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}

// ---- more conversions, tensor cores, math, ordering -----------------------------
NIB_DEVICE u32 pack_bf2(float lo, float hi) {
  u32 d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
// Two fp32 values as a 16-bit pair of the activation dtype (lo in the low half).
template <bool BF16>
NIB_DEVICE u32 pack_act2(float lo, float hi) {
  return BF16 ? pack_bf2(lo, hi) : pack_h2(lo, hi);
}
template <bool BF16>
NIB_DEVICE float lo_act2f(u32 v) {
  return BF16 ? bf2f((u16)(v & 0xffff)) : h2f((u16)(v & 0xffff));
}
template <bool BF16>
NIB_DEVICE float hi_act2f(u32 v) {
  return BF16 ? bf2f((u16)(v >> 16)) : h2f((u16)(v >> 16));
}
// mma16816 (fp16, above) with bf16 inputs.
NIB_DEVICE void mma16816_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <bool BF16>
NIB_DEVICE void mma16816_act(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  if constexpr (BF16) {
    mma16816_bf16(d, a, b0, b1);
  } else {
    mma16816(d, a, b0, b1);
  }
}
// 2^x (ex2.approx: ~2 ulp; 2^-inf = +0; results below 2^-126 flush to 0, which a
// softmax weight next to its maximum's 1 never misses).
NIB_DEVICE float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// This thread's earlier writes are visible GPU-wide before its later ones (split-K
// partials before the counter that announces them; the counter before reading them).
NIB_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// ---- thread-block clusters (sm_90) -----------------------------------------------
// All threads of every block of the cluster: arrive (release), then wait (acquire).
NIB_DEVICE void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();
#endif
}
// A cluster barrier's halves (sm_90), for merges that push: a block arrives (relaxed)
// when it starts, waits for that phase before its first store into another block's
// shared memory, and arrives with release semantics once its partial is there; a cluster
// barrier waits only for threads that have not exited, so blocks that are done leave.
NIB_DEVICE void cluster_arrive_relaxed() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
  __trap();
#endif
}
NIB_DEVICE void cluster_arrive_release() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
  __trap();
#endif
}
NIB_DEVICE void cluster_wait_acquire() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();
#endif
}
NIB_DEVICE void st_cluster_f4(u32 addr, float4 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1,%2,%3,%4};"
               :: "r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
#else
  __trap();
#endif
}
NIB_DEVICE void st_cluster_f2(u32 addr, float2 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1,%2};" :: "r"(addr), "f"(v.x), "f"(v.y) : "memory");
#else
  __trap();
#endif
}
// The shared::cluster address of `addr` (this block's shared window) in block `rank`.
NIB_DEVICE u32 cluster_map(u32 addr, int rank) {
  u32 r = 0;
#if __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
#else
  __trap();
#endif
  return r;
}
NIB_DEVICE float ld_cluster_f32(u32 addr) {
  float v = 0.f;
#if __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
#endif
  return v;
}
