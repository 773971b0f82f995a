// Decode attention for one query token, with RoPE and the KV-cache write fused in.
//
// Input: the fused qkv projection's row [(H + 2 KVH) D], not yet rotated, and the
// position p = pos[0] read from device memory (a graph replays with no host input).
// The kernel rotates q and k (rotate-half; each product and the sum rounded to the
// activation dtype, exactly as kernels/rope_cache.py), writes rotated k and raw v into
// the cache at p, and attends query head h (KV head h / G) over [0, p] with an fp32
// softmax (scale 1/sqrt(D)); output [H, D] in the activation dtype.
//
// Grid (splits, KVH), fixed at capture time. Every block reads p and works out which
// positions it owns: chunk = ceil(L / splits) rounded up to 16, L = p + 1, so short and
// long contexts both spread over the blocks (no block is launched to exit, except where
// L < 16 splits). A block serves all G query heads of its KV head (GQA reads K/V once).
//
// Inside a block each warp takes 16-position tiles in turn (warp w: tiles w, w + NW, ...)
// and streams them through its own STAGES shared-memory slots with cp.async (16 KB per
// warp in flight, no block barrier in the loop). Per tile, on the tensor cores, with
// the G <= 8 query heads as the n8 side of every mma (no padding rows):
//   S^T [16 pos x 8 heads] = K Q^T       (A = K via ldmatrix, B = rotated Q; D/16 mma)
//   online softmax in fp32 on S^T's accumulators (exp2, scale folded in)
//   O^T [D x 8 heads] += V^T P^T         (A = V via ldmatrix.trans, B = P^T: S^T's C
//                                         fragments transposed by movmatrix; 2 D/16 mma)
// P goes in as two 16-bit halves, hi = round(P) and lo = round(P - hi): the product is
// exact to ~2^-17 of P, as good as fp32 P for the output; the products Q K^T are exact.
// The new key at p (owned by the last used block) is never read from the cache: the
// owner rotates k into shared memory and copies it (and v) into its tile's slot, while
// the cache write goes out beside it. K/V rows are XOR-swizzled in shared memory
// (16-byte chunk c of row r at c ^ (r & 7)) so the ldmatrix reads are conflict-free.
//
// The warps' partials merge in shared memory; split blocks then write fp32 partials
// (o, max, sum per head) and the last block of the KV head to arrive (an atomic counter
// it resets) merges them: one launch, graph-safe, the same pattern as w4a16.cu. One
// used block (L <= 16) writes the output directly. On sm_90, where a KV head's splits
// (at most 8) fit in a thread-block cluster, the `_cluster` kernels merge without global
// memory instead: every split block stores its partial into its slot of the first
// block's shared memory, arrives at the cluster barrier (release) and exits; the first
// block waits once and merges from its own shared memory. On the H200 that is 0.62 us
// for the merge against 1.60 for the first block reading the others' shared memory
// between two full barriers (bench/README.md, "Kernel experiments").
//
// Napkin math: bytes = 2 L KVH D 2 (K + V). Llama-2-7B at L = 640: 10.5 MB, 2.5 us at
// 4.28 TB/s; 4 splits x 32 KV heads = 128 blocks of 8 warps, each 160 positions (80 KB
// in flight per SM at once). Qwen2.5-1.5B at L = 640: 0.65 MB, latency-bound: 8 splits
// x 2 KV heads, every tile's loads issued up front, the merge reads 8 x 3 KB. Per
// 16-position tile and warp at D = 128: 24 mma, 16 ldmatrix, 16 cp.async, ~390 SASS
// instructions, against the ~500 cycles an SM's share of bandwidth takes for its 8 KB.
#include "common.cuh"

struct RopeAttnArgs {
  const u16* qkv;        // [(H + 2 KVH) D] this token's projection (activation dtype)
  const long long* pos;  // [1] the token's position (int64, device)
  const u16* cos;        // [S, D] RoPE tables (activation dtype)
  const u16* sin;
  u16* k_cache;          // [KVH, S, D]
  u16* v_cache;          // [KVH, S, D]
  u16* out;              // [H, D]
  float* o_part;         // [KVH, splits, G, D] split partials (unnormalised)
  float* ml_part;        // [KVH, splits, G, 2] their max (log2 units) and sum
  int* counters;         // [KVH] arrivals per KV head, zero between launches
  int heads;
  int kv_heads;
  int group;             // G = heads / kv_heads, 1..8
  int max_context;       // S
  float scale_log2;      // log2(e) / sqrt(D)
};

NIB_DEVICE float neg_inf() { return __int_as_float(0xff800000); }

// Eight rotated elements (16 bytes) of one head: x, its partner chunk xp (dims d +- D/2),
// cos and sin at p. Rounding as kernels/rope_cache.py: round(round(x cos) + round(xr sin)).
template <bool BF16>
NIB_DEVICE uint4 rope_chunk(uint4 x, uint4 xp, uint4 c, uint4 s, bool first_half) {
  const float sign = first_half ? -1.f : 1.f;
  const u32 xs[4] = {x.x, x.y, x.z, x.w}, ps[4] = {xp.x, xp.y, xp.z, xp.w};
  const u32 cs[4] = {c.x, c.y, c.z, c.w}, ss[4] = {s.x, s.y, s.z, s.w};
  u32 o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int sh = 16 * h;
      const float xv = act2f((u16)(xs[i] >> sh), BF16);
      const float xr = act2f((u16)(ps[i] >> sh), BF16) * sign;
      const float a = round_act(xv * act2f((u16)(cs[i] >> sh), BF16), BF16);
      const float b = round_act(xr * act2f((u16)(ss[i] >> sh), BF16), BF16);
      r[h] = a + b;
    }
    o[i] = pack_act2<BF16>(r[0], r[1]);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// P (fp32, in [0, 1]) as hi + lo 16-bit pairs: hi = round(P), lo = round(P - hi).
template <bool BF16>
NIB_DEVICE void split_p(float p0, float p1, u32& hi, u32& lo) {
  hi = pack_act2<BF16>(p0, p1);
  lo = pack_act2<BF16>(p0 - lo_act2f<BF16>(hi), p1 - hi_act2f<BF16>(hi));
}

// Shared-memory address of 16-byte chunk c of row r in a swizzled [rows][D] tile.
template <int D>
NIB_DEVICE u32 swz(u32 base, int r, int c) {
  return base + r * (D * 2) + ((c ^ (r & 7)) << 4);
}

// Lane-constant ldmatrix offsets into a swizzled 16-row tile (lane i addresses row i % 8
// of matrix i / 8). K, for k-step k: matrices (pos 0-7, chunk 2k), (pos 8-15, 2k),
// (pos 0-7, 2k+1), (pos 8-15, 2k+1) = the A fragment of a 16-position x 16-dim step.
// V (.trans), for output dims 16j..16j+15: (pos 0-7, chunk 2j), (pos 0-7, 2j+1),
// (pos 8-15, 2j), (pos 8-15, 2j+1) = the A fragment of V^T (16 dims x 16 positions).
template <int D>
NIB_DEVICE void tile_offsets(int lane, u32 (&koff)[D / 16], u32 (&voff)[D / 16]) {
  const int mi = lane >> 3, r8 = lane & 7;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    koff[k] = swz<D>(0, r8 + 8 * (mi & 1), 2 * k + (mi >> 1));
    voff[k] = swz<D>(0, r8 + 8 * (mi >> 1), 2 * k + (mi & 1));
  }
}

// One 16-position tile on the tensor cores, everything transposed so that the G <= 8
// query heads are the n8 side of each mma (no padding rows):
//   S^T [16 pos x 8 heads] = K [16 x D] Q^T        (D/16 mma)
//   online softmax in fp32 on S^T's accumulators; P^T's fragments become the B operand
//   with movmatrix (its C layout is the transpose of the B layout)
//   O^T [D x 8 heads] += V^T [D x 16 pos] P^T      (2 D/16 mma: P as hi + lo halves)
// ks / vs: the tile's swizzled K and V rows; positions >= `valid` are masked. Lane
// (g = lane / 4, t = lane % 4) holds m, l for heads 2t, 2t + 1 (l: its positions' share)
// and acc[j] = O^T[dim 16j + g][heads 2t, 2t + 1], O^T[dim 16j + g + 8][heads 2t, 2t + 1].
template <int D, bool BF16>
NIB_DEVICE void attend_tile(u32 ks, u32 vs, int valid, const u32 (&qf)[D / 16][2],
                            const u32 (&koff)[D / 16], const u32 (&voff)[D / 16], float (&m)[2],
                            float (&l)[2], float (&acc)[D / 16][4], float scale_log2, int lane) {
  const int g = lane >> 2;
  // Two accumulator chains (even and odd k-steps) halve the dependent mma latency.
  float s[2][4];
#pragma unroll
  for (int ch = 0; ch < 2; ++ch)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[ch][e] = 0.f;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    u32 a[4];
    ldsm_x4(a, ks + koff[k]);
    mma16816_act<BF16>(s[k & 1], a, qf[k][0], qf[k][1]);
  }
  // sc[e]: position g (e < 2) or g + 8, head 2t + (e & 1).
  float sc[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >> 1);
    sc[e] = row < valid ? (s[0][e] + s[1][e]) * scale_log2 : neg_inf();
  }
  // Column (head) maxima over the tile's positions: the 8 lanes g of a column t.
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = fmaxf(sc[h], sc[2 + h]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float mn = fmaxf(m[h], mx);  // finite: position 0 of the tile is valid
    alpha[h] = ex2(m[h] - mn);         // 0 on the first tile (m = -inf)
    m[h] = mn;
  }
  float p[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) p[e] = ex2(sc[e] - m[e & 1]);
  l[0] = l[0] * alpha[0] + (p[0] + p[2]);
  l[1] = l[1] * alpha[1] + (p[1] + p[3]);
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    acc[j][0] *= alpha[0];
    acc[j][1] *= alpha[1];
    acc[j][2] *= alpha[0];
    acc[j][3] *= alpha[1];
  }
  // P^T [pos][head] fragments (positions g / g + 8, heads 2t, 2t + 1) -> B fragments
  // (positions 2t, 2t + 1 / 2t + 8, 2t + 9, head g).
  u32 hi0, lo0, hi1, lo1;
  split_p<BF16>(p[0], p[1], hi0, lo0);
  split_p<BF16>(p[2], p[3], hi1, lo1);
  hi0 = movmatrix_trans(hi0);
  hi1 = movmatrix_trans(hi1);
  lo0 = movmatrix_trans(lo0);
  lo1 = movmatrix_trans(lo1);
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    u32 a[4];
    ldsm_x4_trans(a, vs + voff[j]);
    mma16816_act<BF16>(acc[j], a, hi0, hi1);
    mma16816_act<BF16>(acc[j], a, lo0, lo1);
  }
}

// Eight partials (max, sum; output) from load(k, ml, op) for k < n; the rest weigh nothing.
template <class Load>
NIB_DEVICE void gather8(int n, float2 (&ml)[8], float4 (&op)[8], Load load) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    ml[k] = make_float2(neg_inf(), 0.f);
    op[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (k < n) load(k, ml[k], op[k]);
  }
}

// Fold eight partials (max in log2 units, sum; unnormalised output) into a running
// (mt, lt, o); partials with max -inf weigh nothing. Both split merges use it.
NIB_DEVICE void fold8(const float2 (&ml)[8], const float4 (&op)[8], float& mt, float& lt, float4& o) {
  float mn = mt;
#pragma unroll
  for (int k = 0; k < 8; ++k) mn = fmaxf(mn, ml[k].x);
  const float alpha = ex2(mt - mn);  // 0 while mt = -inf (nothing folded yet)
  lt *= alpha;
  o.x *= alpha, o.y *= alpha, o.z *= alpha, o.w *= alpha;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float e = ex2(ml[k].x - mn);
    lt += e * ml[k].y;
    o.x += e * op[k].x, o.y += e * op[k].y, o.z += e * op[k].z, o.w += e * op[k].w;
  }
  mt = mn;
}

// Output dims 4 d4 .. 4 d4 + 3 of query head qh: o / l in the activation dtype.
template <bool BF16>
NIB_DEVICE void store_out4(u16* out, int qh, int d, int d4, float4 o, float l) {
  const float inv = 1.f / l;
  *reinterpret_cast<uint2*>(out + (size_t)qh * d + 4 * d4) =
      make_uint2(pack_act2<BF16>(o.x * inv, o.y * inv), pack_act2<BF16>(o.z * inv, o.w * inv));
}

// Dynamic shared memory, in order: NW warps x STAGES x (K tile, V tile); the rotated
// queries [8][D] (swizzled); the new k and v rows [2][D]; per-warp max and sum [2][NW][8];
// the last-block flag; (16-byte aligned) the cluster merge's slots, one a split (one in
// the global-merge kernels, unused). attention.py's shared_bytes() mirrors this.
template <int D, bool BF16, int NW, bool CLUSTER>
NIB_DEVICE void rope_attend_body(const RopeAttnArgs& a) {
  constexpr int TILE = 16;
  constexpr int HEADS = 8;    // query heads per KV head, at most (the mma's n8)
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  constexpr int ROW_BYTES = D * 2;
  constexpr int TILE_BYTES = TILE * ROW_BYTES;
  constexpr int STAGES = 256 / D;  // 16 KB of K and V per warp in flight
  constexpr int STAGE_BYTES = 2 * TILE_BYTES;
  constexpr int WARP_BYTES = STAGES * STAGE_BYTES;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* const q_smem = smem + NW * WARP_BYTES;
  unsigned char* const fresh = q_smem + HEADS * ROW_BYTES;
  float* const wm = reinterpret_cast<float*>(fresh + 2 * ROW_BYTES);
  float* const wl = wm + NW * HEADS;
  int* const flag = reinterpret_cast<int*>(wl + NW * HEADS);
  // CLUSTER: the first block's slots, one a split: its merged partial, o [8][D] then
  // (max, sum) [8][2], stored there by the split's block through distributed shared memory.
  constexpr int SLOT = HEADS * D + HEADS * 2;  // floats
  float* const cp_o = reinterpret_cast<float*>(smem + ((NW * WARP_BYTES + (HEADS + 2) * ROW_BYTES +
                                                       2 * NW * HEADS * 4 + 16 + 15) & ~15));

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y;
  const int S = a.max_context, G = a.group;
  // Programmatic dependent launch (sm_90): the next kernel may start now; this one runs
  // ahead of the q/k/v GEMV's end up to pdl_wait below. Before it, only what no kernel
  // of this step writes: the position (advanced after the step) and the cache rows
  // below it (written by earlier steps).
  NIB_TRACE_BLOCK(NIB_KIND_ATTENTION);
  pdl_launch_dependents();
  if constexpr (CLUSTER) cluster_arrive_relaxed();  // phase 1: this block is running
  const long long pos = *a.pos;
  if (pos < 0 || pos >= S) return;  // a bad position must not write outside the cache
  const int p = (int)pos, L = p + 1;
  const int chunk = ((L + splits - 1) / splits + TILE - 1) & ~(TILE - 1);
  const int used = (L + chunk - 1) / chunk;
  if (split >= used) return;  // a cluster's barrier does not wait for exited threads
  const int start = split * chunk;
  const int end = min(start + chunk, L);
  const int ntiles = (end - start + TILE - 1) / TILE;
  const int mine = warp < ntiles ? (ntiles - 1 - warp) / NW + 1 : 0;
  const size_t head_base = (size_t)kvh * S * D;
  const u16* const kc = a.k_cache + head_base;
  const u16* const vc = a.v_cache + head_base;

  // K/V first: their trip to memory overlaps the RoPE prologue. A 32-lane pass copies
  // RPJ rows; lane (r0 = lane / CPR, c0 = lane % CPR) always copies chunk c0 of rows
  // j RPJ + r0, so its swizzled offset is (c0 ^ r0 ^ (j RPJ & 7)) (disjoint bits).
  constexpr int RPJ = 32 / CPR;
  const int r0 = lane / CPR, c0 = lane % CPR;
  const u32 lane_dst = r0 * ROW_BYTES + ((c0 ^ r0) << 4);
  const u32 warp_smem = smem_addr(smem) + warp * WARP_BYTES;
  auto issue = [&](int i) {
    const int base = start + (warp + i * NW) * TILE;
    const u32 ks = warp_smem + (i % STAGES) * STAGE_BYTES;
    const int rel = base + r0;   // this lane's first row
    const int last = end - 1 - rel;  // rows past it that exist (the source of masked rows)
    const char* const k0 = reinterpret_cast<const char*>(kc + (ptrdiff_t)rel * D + c0 * 8);
    const char* const v0 = reinterpret_cast<const char*>(vc + (ptrdiff_t)rel * D + c0 * 8);
#pragma unroll
    for (int j = 0; j < TILE / RPJ; ++j) {
      const int row = rel + j * RPJ;
      const bool ok = row < end && row != p;  // row p is the new key: not in the cache yet
      const int off = min(j * RPJ, last) * ROW_BYTES;  // masked rows read nothing, from a valid row
      const u32 dst = ks + ((lane_dst + j * RPJ * ROW_BYTES) ^ (((j * RPJ) & 7) << 4));
      cp_async16(dst, k0 + off, ok);
      cp_async16(dst + TILE_BYTES, v0 + off, ok);
    }
  };
#pragma unroll
  for (int i = 0; i < STAGES; ++i) {
    if (i < mine) issue(i);
    cp_async_commit();
  }
  pdl_wait();  // the q/k/v projection is complete and visible from here on
  NIB_TRACE_WAITED();

  // RoPE: the G query heads into shared memory (rows G..7 zero); the owner of p also
  // rotates the new key and writes k and v to the cache and to shared memory.
  const bool owner = split == used - 1;
  const u16* const cos_row = a.cos + (size_t)p * D;
  const u16* const sin_row = a.sin + (size_t)p * D;
  const u32 q_base = smem_addr(q_smem);
  const u32 fresh_k = smem_addr(fresh), fresh_v = fresh_k + ROW_BYTES;
  for (int item = tid; item < (HEADS + 2) * CPR; item += NW * 32) {
    const int r = item / CPR, c = item % CPR;
    const int pc = (c + CPR / 2) % CPR;
    const bool first_half = c < CPR / 2;
    if (r < HEADS) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (r < G) {
        const u16* src = a.qkv + (size_t)(kvh * G + r) * D;
        v = rope_chunk<BF16>(ld_nc(reinterpret_cast<const uint4*>(src + c * 8)),
                             ld_nc(reinterpret_cast<const uint4*>(src + pc * 8)),
                             ld_nc(reinterpret_cast<const uint4*>(cos_row + c * 8)),
                             ld_nc(reinterpret_cast<const uint4*>(sin_row + c * 8)), first_half);
      }
      st_shared16(swz<D>(q_base, r, c), v);
    } else if (owner) {
      const size_t at = head_base + (size_t)p * D + c * 8;
      if (r == HEADS) {
        const u16* src = a.qkv + (size_t)(a.heads + kvh) * D;
        const uint4 k = rope_chunk<BF16>(
            ld_nc(reinterpret_cast<const uint4*>(src + c * 8)),
            ld_nc(reinterpret_cast<const uint4*>(src + pc * 8)),
            ld_nc(reinterpret_cast<const uint4*>(cos_row + c * 8)),
            ld_nc(reinterpret_cast<const uint4*>(sin_row + c * 8)), first_half);
        *reinterpret_cast<uint4*>(a.k_cache + at) = k;
        st_shared16(fresh_k + (c << 4), k);
      } else {
        const u16* src = a.qkv + (size_t)(a.heads + a.kv_heads + kvh) * D;
        const uint4 v = ld_nc(reinterpret_cast<const uint4*>(src + c * 8));
        *reinterpret_cast<uint4*>(a.v_cache + at) = v;
        st_shared16(fresh_v + (c << 4), v);
      }
    }
  }
  __syncthreads();
  NIB_TRACE_MARK(0);  // q rotated into shared memory (and the new k/v written)

  // Q^T's B fragments, once per warp: lane i addresses head i % 8 of chunk 4kk + i / 8,
  // so registers 0, 1 / 2, 3 are k-steps 2kk / 2kk + 1 (dims 2t.. and 2t + 8.. each).
  u32 koff[D / 16], voff[D / 16];
  tile_offsets<D>(lane, koff, voff);
  u32 qf[D / 16][2];
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) {
    u32 r[4];
    ldsm_x4(r, swz<D>(q_base, lane & 7, 4 * kk + (lane >> 3)));
    qf[2 * kk][0] = r[0], qf[2 * kk][1] = r[1];
    qf[2 * kk + 1][0] = r[2], qf[2 * kk + 1][1] = r[3];
  }

  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  float acc[D / 16][4];
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  for (int i = 0; i < mine; ++i) {
    cp_async_wait<STAGES - 1>();
    __syncwarp();  // every lane's copies of this tile have landed
    const int base = start + (warp + i * NW) * TILE;
    const u32 ks = warp_smem + (i % STAGES) * STAGE_BYTES;
    const int fr = p - base;
    if (fr < TILE) {  // the owner's last tile: the new key and value (zero-filled so far)
      if (lane < 2 * CPR) {
        const u32 half = lane < CPR ? 0 : 1;
        const int c = lane % CPR;
        st_shared16(swz<D>(ks + half * TILE_BYTES, fr, c),
                    ld_shared16(fresh_k + half * ROW_BYTES + (c << 4)));
      }
      __syncwarp();
    }
    attend_tile<D, BF16>(ks, ks + TILE_BYTES, end - base, qf, koff, voff, m, l, acc,
                         a.scale_log2, lane);
    __syncwarp();  // every lane is done reading the slot before it is refilled
    if (i + STAGES < mine) issue(i + STAGES);
    cp_async_commit();
  }
  cp_async_wait<0>();
  __syncwarp();
  NIB_TRACE_MARK(1);  // warp 0's tiles attended

  // This warp's partial into its own (now idle) slots: max, sum per head, o [G][D].
  // l: sum over the 8 lanes g that hold a head's positions.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 4);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 8);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 16);
  }
  if (g == 0) {
    wm[warp * HEADS + 2 * t] = m[0];
    wm[warp * HEADS + 2 * t + 1] = m[1];
    wl[warp * HEADS + 2 * t] = l[0];
    wl[warp * HEADS + 2 * t + 1] = l[1];
  }
  float* const wo = reinterpret_cast<float*>(smem + warp * WARP_BYTES);
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = 2 * t + (e & 1), d = 16 * j + g + 8 * (e >> 1);
      if (h < G) wo[h * D + d] = acc[j][e];
    }
  __syncthreads();

  // Merge the warps: thread per (head, 4 dims). Warps without tiles have m = -inf: weight 0.
  constexpr int D4 = D / 4;
  u32 slot = 0;  // CLUSTER: this block's slot in the first block's shared memory
  if constexpr (CLUSTER) {
    if (used > 1) {
      cluster_wait_acquire();  // phase 1: the first block is running, its slots exist
      slot = cluster_map(smem_addr(cp_o + split * SLOT), 0);
    }
  }
  for (int item = tid; item < G * D4; item += NW * 32) {
    const int h = item / D4, d4 = item % D4;
    float mb = neg_inf();
#pragma unroll
    for (int w = 0; w < NW; ++w) mb = fmaxf(mb, wm[w * HEADS + h]);
    float lb = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float e = ex2(wm[w * HEADS + h] - mb);
      const float4 v = *reinterpret_cast<const float4*>(
          reinterpret_cast<const float*>(smem + w * WARP_BYTES) + h * D + 4 * d4);
      lb += e * wl[w * HEADS + h];
      o.x += e * v.x, o.y += e * v.y, o.z += e * v.z, o.w += e * v.w;
    }
    if (used == 1) {
      store_out4<BF16>(a.out, kvh * G + h, D, d4, o, lb);
    } else if constexpr (CLUSTER) {
      st_cluster_f4(slot + (h * D + 4 * d4) * 4, o);
      if (d4 == 0) st_cluster_f2(slot + (HEADS * D + h * 2) * 4, make_float2(mb, lb));
    } else {
      const size_t row = ((size_t)kvh * splits + split) * G + h;
      *reinterpret_cast<float4*>(a.o_part + row * D + 4 * d4) = o;
      if (d4 == 0) *reinterpret_cast<float2*>(a.ml_part + row * 2) = make_float2(mb, lb);
    }
  }
  NIB_TRACE_MARK(2);  // the warps merged: the block's partial written
  if constexpr (CLUSTER) {
    // The cluster is this KV head's splits (block rank = split). Every used block has
    // stored its partial into its slot of the first block's shared memory; it arrives
    // (release) and leaves, and the first block alone waits, then merges its slots in
    // split order (the global path's order) from its own shared memory.
    if (used == 1) return;
    cluster_arrive_release();  // phase 2: this block's partial is in the first block's slot
    if (split != 0) return;
    cluster_wait_acquire();
    for (int item = tid; item < G * D4; item += NW * 32) {
      const int h = item / D4, d4 = item % D4;
      float2 ml[8];
      float4 op[8];
      gather8(used, ml, op, [&](int k, float2& m, float4& o) {
        const float* const sk = cp_o + k * SLOT;
        m = *reinterpret_cast<const float2*>(sk + HEADS * D + h * 2);
        o = *reinterpret_cast<const float4*>(sk + h * D + 4 * d4);
      });
      float mt = neg_inf(), lt = 0.f;
      float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
      fold8(ml, op, mt, lt, o);
      store_out4<BF16>(a.out, kvh * G + h, D, d4, o, lt);
    }
    return;
  }
  if (used == 1) return;

  // Split partials: the last block of this KV head to arrive merges them.
  fence_acq_rel_gpu();
  __syncthreads();
  if (tid == 0) *flag = atomicAdd(a.counters + kvh, 1) == used - 1;
  __syncthreads();
  if (!*flag) return;
  fence_acq_rel_gpu();
  for (int item = tid; item < G * D4; item += NW * 32) {
    const int h = item / D4, d4 = item % D4;
    float mt = neg_inf(), lt = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    // Eight splits per round trip, folded into the running max, sum and output.
    for (int s0 = 0; s0 < used; s0 += 8) {
      float2 ml[8];
      float4 op[8];
      gather8(used - s0, ml, op, [&](int k, float2& m, float4& o) {
        const size_t row = ((size_t)kvh * splits + s0 + k) * G + h;
        m = make_float2(ld_cg(a.ml_part + row * 2), ld_cg(a.ml_part + row * 2 + 1));
        o = ld_cg4(reinterpret_cast<const float4*>(a.o_part + row * D) + d4);
      });
      fold8(ml, op, mt, lt, o);
    }
    store_out4<BF16>(a.out, kvh * G + h, D, d4, o, lt);
  }
  if (tid == 0) a.counters[kvh] = 0;  // ready for the next launch (the next layer)
}

#define ROPE_ATTEND(D, DT, BF16, NW)                                                    \
  extern "C" __global__ void __launch_bounds__(NW * 32, 1)                              \
      rope_attend_d##D##_##DT##_w##NW(const RopeAttnArgs a) {                           \
    rope_attend_body<D, BF16, NW, false>(a);                                            \
  }                                                                                     \
  extern "C" __global__ void __launch_bounds__(NW * 32, 1)                              \
      rope_attend_d##D##_##DT##_w##NW##_cluster(const RopeAttnArgs a) {                 \
    rope_attend_body<D, BF16, NW, true>(a);                                             \
  }

ROPE_ATTEND(64, bf16, true, 4)
ROPE_ATTEND(64, bf16, true, 8)
ROPE_ATTEND(64, f16, false, 4)
ROPE_ATTEND(64, f16, false, 8)
ROPE_ATTEND(128, bf16, true, 4)
ROPE_ATTEND(128, bf16, true, 8)
ROPE_ATTEND(128, f16, false, 4)
ROPE_ATTEND(128, f16, false, 8)
