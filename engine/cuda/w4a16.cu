// INT4 weights x 16-bit activations on the tensor cores, for 1 to 16 rows.
//
// The weight is W [N, K]: symmetric 4-bit codes q (W = s * (q - 8)), one fp16 scale s
// per output and group of 128 inputs. w4a16.py packs it once after loading into the
// order this kernel reads ("mma16"):
//
//   qw  uint4 [N/16 tiles][K/64 chunks][32 lanes]: lane (g = lane/4, t = lane%4) of a
//       16-row tile gets, for one chunk of 64 inputs, exactly its m16n8k16 A fragments
//       of four k-steps: word j holds rows g and g+8 at inputs c*64 + 16t + 4j + {0..3},
//       nibbles at bits {0,16,8,24} (row g) and {4,20,12,28} (row g+8), so that
//       lop3 with 0x000f000f / 0x00f000f0 and 0x64006400 gives the four fp16x2
//       registers (the 1024.0-mantissa trick) without any shuffle.
//   sc  u32 [tiles][K/128 groups][8]: fp16x2 (scale of row g, scale of row g+8).
//
// Inside a chunk the 64 inputs are permuted (k-slot s of k-step j means input
// 16t + 4j + ...), which the dot product does not see as long as the activations
// use the same permutation: a lane's B fragments for a chunk are then its 16
// contiguous activations, two 16-byte loads.
//
// Per 16-byte weight load a lane runs 4 x (4 lop3 + 4 fp16x2 ops + 1 mma) for 32
// weights: ~1.3 instructions per weight, against ~3.9 that the issue rate allows at
// the H200's copy bandwidth; the previous Triton kernel needed ~3.
//
// A block owns R tiles and a slice of K (one split); its warps take the slice's
// groups in turn (warp w: groups w, w + WARPS, ...), keep PF groups of loads in
// flight in registers, and accumulate each group in fp32 before applying its scale
// (scale x sum of 128 products: no fp16 rounding of dequantised weights). Warps are
// reduced through shared memory; split blocks write fp32 partials and the last one
// to arrive (an atomic counter it resets) finishes. One launch, graph-safe. The "c"
// kernels (sm_90) launch a split's blocks as one thread-block cluster instead: each
// leaves its partials in its own shared memory, and after a cluster barrier the first
// block sums them through distributed shared memory (no fence, atomic or L2 trip).
//
// Rows: M = 1 stages the activation slice in shared memory as fp16, after the
// optional RMSNorm (the block sums the squares of the whole row first); M = 2..16
// reads fp16 activations from global memory (MT = 2 n8 tiles above 8 rows).
// Epilogues: plain (+bias), residual add in place, SiLU(gate) * up (the "glu"
// packing puts gate channels 8i..8i+7 on tile rows 0-7 and up channels on 8-15),
// and plain output of a glu-packed weight in [gate | up] order.
#include "pick.cuh"

struct W4Args {
  const uint4* qw;
  const u32* sc;
  const void* x;      // M = 1: [K] fp16/bf16 (the residual stream when norm); else fp16 [m][x_stride]
  const void* nw;     // [K] RMSNorm weight, x's dtype (norm only)
  const void* bias;   // [n_out] output dtype, or null
  void* y;            // [m][y_stride] output dtype
  const void* res;    // residual input for epi 1 (usually y itself)
  float* ws;          // split-K partials
  int* counters;      // one per tile group, zero between launches
  int tiles;          // N / 16
  int k;
  int m;
  int x_stride;
  int y_stride;
  int inter;          // glu: intermediate size I (N = 2I)
  int splits;
  int groups_per_split;
  int epi;            // 0 plain, 1 residual, 2 silu(gate)*up, 3 plain from a glu packing
  int norm;
  int x_bf16;
  int y_bf16;
  float eps;
};

// The greedy pick fused into a one-row plain epilogue (the decode step's lm_head): the
// `_pick` kernels take W4PickArgs. Each finishing block merges its logits' argmax and
// logsumexp into ws and the last writes the token (pick.cuh). Kept out of W4Args: a
// larger parameter struct changes the code ptxas makes for every other launch.
struct PickPtrs {
  float* ws;              // [gridDim.x + groups][8] partials (groups: of PICK_GROUP blocks)
  int* counter;           // [1 + groups], zero between launches
  long long* token;       // int64 or null: the next step's input, on the device
  long long* out_token;   // int64: mapped pinned host memory or a device buffer
  float* out_logprob;
  long long* advance;     // int64 or null: the decode position
  int sys_fence;
  int parts;              // partials ws holds (w4a16.py checks the launch against it)
};

struct W4PickArgs {
  W4Args w;
  PickPtrs p;
};

enum { EPI_PLAIN = 0, EPI_RESIDUAL = 1, EPI_GLU = 2, EPI_GLU_PLAIN = 3 };
// The fused pick's first-level groups (pick.cuh): blocks of tiles merged per group
// before the groups are (greedy.py's FusedPick sizes its workspace and counters by it).
constexpr int PICK_GROUP = 64;

NIB_DEVICE void dequant8(u32 q, u32 (&a)[4]) {
  const u32 LO = 0x000f000fu, HI = 0x00f000f0u, EX = 0x64006400u;
  const u32 SUB = 0x64086408u;  // 1032 = 1024 + 8 (the zero point)
  const u32 MUL = 0x2c002c00u;  // 1/16
  const u32 ADD = 0xd480d480u;  // -72 = -(1024 / 16 + 8)
  const u32 lo0 = lop3<0xEA>(q, LO, EX);
  const u32 hi0 = lop3<0xEA>(q, HI, EX);
  q >>= 8;
  const u32 lo1 = lop3<0xEA>(q, LO, EX);
  const u32 hi1 = lop3<0xEA>(q, HI, EX);
  a[0] = hsub2(lo0, SUB);
  a[1] = hfma2(hi0, MUL, ADD);
  a[2] = hsub2(lo1, SUB);
  a[3] = hfma2(hi1, MUL, ADD);
}

// Logical output row of tile row rr (0..15) of tile t, for packings 0 (natural) and glu.
NIB_DEVICE int out_row(int t, int rr, bool glu, int inter) {
  if (!glu) return t * 16 + rr;
  return rr < 8 ? t * 8 + rr : inter + t * 8 + rr - 8;
}

NIB_DEVICE void store_act(void* y, size_t i, float v, bool bf16) {
  reinterpret_cast<u16*>(y)[i] = f2act(v, bf16);
}
NIB_DEVICE float load_act(const void* p, size_t i, bool bf16) {
  return act2f(reinterpret_cast<const u16*>(p)[i], bf16);
}

// The epilogue operands of one lane's pair (rows g and g + 8 of a tile, one batch row),
// read before they are needed: the bias before pdl_wait (no kernel of the step writes
// it), the residual right after it, beside the activations' staging. Read at the end,
// each was one more trip to memory on the kernel's critical path. Held in registers
// through the main loop, so only where a lane finishes few pairs (R x MT <= 2: the
// shapes of the residual and bias layers); larger tiles still read them at the end.
struct PairOperands {
  float bias0, bias1, res0, res1;
};

// Tile, batch row and output rows of pair `pair` of a lane (g, t4): fragment pairs
// (e, e + 2) of (r, mt) are rows g and g + 8 of tile r, batch row 2 t4 + (e & 1) + 8 mt.
template <int MT>
NIB_DEVICE void pair_place(const W4Args& a, int tile0, int g, int t4, int pair, int& t, int& b,
                           int& r0, int& r1) {
  const int r = pair / (MT * 2), mt = (pair >> 1) % MT, e = pair & 1;
  t = tile0 + r;
  b = 2 * t4 + e + 8 * mt;
  const bool glu = a.epi == EPI_GLU_PLAIN;
  r0 = out_row(t, g, glu, a.inter);
  r1 = out_row(t, g + 8, glu, a.inter);
}

// This lane's pairs (pair = warp + q * WARPS, as reduce_and_finish finishes them).
template <int MT, int R, int WARPS>
struct LanePairs {
  static constexpr int PAIRS = R * MT * 2;
  static constexpr int MINE = (PAIRS + WARPS - 1) / WARPS;
  static constexpr bool EARLY = R * MT <= 2;
  PairOperands op[EARLY ? MINE : 1];

  NIB_DEVICE void load_bias(const W4Args& a, int tile0, int warp, int g, int t4) {
    if constexpr (!EARLY) return;
    const bool ybf = a.y_bf16 != 0;
#pragma unroll
    for (int q = 0; q < MINE; ++q) {
      op[q].bias0 = op[q].bias1 = 0.f;
      const int pair = warp + q * WARPS;
      if (pair >= PAIRS || !a.bias || a.epi == EPI_GLU) continue;
      int t, b, r0, r1;
      pair_place<MT>(a, tile0, g, t4, pair, t, b, r0, r1);
      if (b >= a.m) continue;
      op[q].bias0 = load_act(a.bias, r0, ybf);
      op[q].bias1 = load_act(a.bias, r1, ybf);
    }
  }
  NIB_DEVICE void load_residual(const W4Args& a, int tile0, int warp, int g, int t4) {
    if constexpr (!EARLY) return;
    const bool ybf = a.y_bf16 != 0;
#pragma unroll
    for (int q = 0; q < MINE; ++q) {
      op[q].res0 = op[q].res1 = 0.f;
      const int pair = warp + q * WARPS;
      if (pair >= PAIRS || a.epi != EPI_RESIDUAL) continue;
      int t, b, r0, r1;
      pair_place<MT>(a, tile0, g, t4, pair, t, b, r0, r1);
      if (b >= a.m) continue;
      const size_t yrow = (size_t)b * a.y_stride;
      op[q].res0 = load_act(a.res, yrow + r0, ybf);
      op[q].res1 = load_act(a.res, yrow + r1, ybf);
    }
  }
};

// The epilogue for one lane's pair of values: rows rr0 = g and g + 8 of tile t, for
// batch row b. v0/v1 are the finished fp32 sums; `op` the pair's bias and residual when
// `early` (read ahead), else they are read here.
// KEEP (the fused pick): the two values as stored, into *out0 / *out1.
template <bool KEEP = false>
NIB_DEVICE void finish_pair(const W4Args& a, int t, int g, int b, float v0, float v1,
                            const PairOperands& op, bool early, float* out0 = nullptr,
                            float* out1 = nullptr) {
  if (b >= a.m) return;
  const bool ybf = a.y_bf16 != 0;
  const size_t yrow = (size_t)b * a.y_stride;
  if (a.epi == EPI_GLU) {
    const float gate = round_act(v0, ybf), up = round_act(v1, ybf);
    const float act = round_act(silu(gate), ybf);
    store_act(a.y, yrow + t * 8 + g, act * up, ybf);
    return;
  }
  const bool glu = a.epi == EPI_GLU_PLAIN;
  const int r0 = out_row(t, g, glu, a.inter), r1 = out_row(t, g + 8, glu, a.inter);
  if (a.bias) {
    v0 += early ? op.bias0 : load_act(a.bias, r0, ybf);
    v1 += early ? op.bias1 : load_act(a.bias, r1, ybf);
  }
  if (a.epi == EPI_RESIDUAL) {
    v0 = (early ? op.res0 : load_act(a.res, yrow + r0, ybf)) + round_act(v0, ybf);
    v1 = (early ? op.res1 : load_act(a.res, yrow + r1, ybf)) + round_act(v1, ybf);
  }
  store_act(a.y, yrow + r0, v0, ybf);
  store_act(a.y, yrow + r1, v1, ybf);
  if constexpr (KEEP) {
    *out0 = round_act(v0, ybf);  // as stored: what a pick over y would read
    *out1 = round_act(v1, ybf);
  }
}

// What every block of a launch agrees on: its tiles, its K slice, its lane's place.
struct Block {
  int lane, warp, g, t4, tile0, split, n_groups, chunks, gb0, gb1;
};

NIB_DEVICE Block block_of(const W4Args& a, int r_tiles) {
  Block b;
  b.lane = threadIdx.x & 31;
  b.warp = threadIdx.x >> 5;
  b.g = b.lane >> 2;
  b.t4 = b.lane & 3;
  b.tile0 = blockIdx.x * r_tiles;
  b.split = blockIdx.y;
  b.n_groups = a.k >> 7;
  b.chunks = a.k >> 6;
  b.gb0 = b.split * a.groups_per_split;
  b.gb1 = min(b.n_groups, b.gb0 + a.groups_per_split);
  return b;
}

// Eight activations (one 16-byte vector) -> fp16x2 words, after the RMSNorm when norm:
// the unfused path's rounding (normalise, round, times the weight, round).
NIB_DEVICE uint4 to_fp16(uint4 v, uint4 nv, bool norm, float inv, bool xbf) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
  const u32 n[4] = {nv.x, nv.y, nv.z, nv.w};
  u32 o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float lo = act2f((u16)(w[e] & 0xffff), xbf), hi = act2f((u16)(w[e] >> 16), xbf);
    if (norm) {
      lo = round_act(round_act(lo * inv, xbf) * act2f((u16)(n[e] & 0xffff), xbf), xbf);
      hi = round_act(round_act(hi * inv, xbf) * act2f((u16)(n[e] >> 16), xbf), xbf);
    }
    o[e] = pack_h2(lo, hi);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

NIB_DEVICE float sum_squares(uint4 v, bool xbf) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float lo = act2f((u16)(w[e] & 0xffff), xbf), hi = act2f((u16)(w[e] >> 16), xbf);
    ss += lo * lo + hi * hi;
  }
  return ss;
}

// One row of activations -> fp16 in shared memory (this block's K slice), after the
// optional RMSNorm over the whole row. A row of up to THREADS * HELD vectors is read
// once, into registers (one trip to L2 before the barrier); longer rows twice. Ends
// with a barrier.
template <int THREADS>
NIB_DEVICE void stage_x(const W4Args& a, const Block& b, u16* xs, float* scratch) {
  constexpr int HELD = 4;
  const bool xbf = a.x_bf16 != 0;
  const uint4* x8 = reinterpret_cast<const uint4*>(a.x);
  const uint4* n8 = reinterpret_cast<const uint4*>(a.nw);
  const int s0 = b.gb0 * 16, s1 = b.gb1 * 16;  // this slice's vectors
  const int nvec = a.k >> 3;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  if (!a.norm) {
    for (int i = s0 + threadIdx.x; i < s1; i += THREADS)
      reinterpret_cast<uint4*>(xs)[i - s0] = to_fp16(ld_nc(x8 + i), zero, false, 1.f, xbf);
    __syncthreads();
    return;
  }
  float ss = 0.f;
  if (nvec <= THREADS * HELD) {
    uint4 v[HELD], nv[HELD];
#pragma unroll
    for (int j = 0; j < HELD; ++j) {
      const int i = threadIdx.x + j * THREADS;
      v[j] = i < nvec ? ld_nc(x8 + i) : zero;
      nv[j] = i >= s0 && i < s1 ? ld_nc(n8 + i) : zero;
    }
#pragma unroll
    for (int j = 0; j < HELD; ++j) ss += sum_squares(v[j], xbf);
    ss = block_sum(ss, scratch);
    const float inv = 1.f / sqrtf(ss / (float)a.k + a.eps);
#pragma unroll
    for (int j = 0; j < HELD; ++j) {
      const int i = threadIdx.x + j * THREADS;
      if (i >= s0 && i < s1)
        reinterpret_cast<uint4*>(xs)[i - s0] = to_fp16(v[j], nv[j], true, inv, xbf);
    }
  } else {
    for (int i = threadIdx.x; i < nvec; i += THREADS) ss += sum_squares(ld_nc(x8 + i), xbf);
    ss = block_sum(ss, scratch);
    const float inv = 1.f / sqrtf(ss / (float)a.k + a.eps);
    for (int i = s0 + threadIdx.x; i < s1; i += THREADS)
      reinterpret_cast<uint4*>(xs)[i - s0] = to_fp16(ld_nc(x8 + i), ld_nc(n8 + i), true, inv, xbf);
  }
  __syncthreads();
}

// The B fragments of chunk `ch` (absolute) for n8 tile mt: 8 fp16x2 words.
template <bool SMEM_X>
NIB_DEVICE void load_b(const W4Args& a, const Block& b, const u16* xs, int ch, int mt, u32 (&v)[8]) {
  uint4 v0, v1;
  if constexpr (SMEM_X) {
    const uint4* p = reinterpret_cast<const uint4*>(xs + (ch - 2 * b.gb0) * 64 + 16 * b.t4);
    v0 = p[0], v1 = p[1];
  } else {
    const int row = min(b.g + 8 * mt, a.m - 1);  // rows past m repeat the last: unused columns
    const uint4* p = reinterpret_cast<const uint4*>(reinterpret_cast<const u16*>(a.x) +
                                                    (size_t)row * a.x_stride + ch * 64 + 16 * b.t4);
    v0 = ld_nc(p), v1 = ld_nc(p + 1);
  }
  v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w;
  v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
}

template <int R, int MT>
NIB_DEVICE void zero(float (&a)[R][MT][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) a[r][mt][e] = 0.f;
}

// part += W x over half h of a group of R tiles (w: the lane's two chunks per tile, bx:
// that half's B fragments per n8 tile).
template <int MT, int R>
NIB_DEVICE void mma_half(const u32 (&bx)[MT][8], const uint4 (&w)[R][2], int h,
                         float (&part)[R][MT][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const u32 words[4] = {w[r][h].x, w[r][h].y, w[r][h].z, w[r][h].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      u32 frag[4];
      dequant8(words[j], frag);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) mma16816(part[r][mt], frag, bx[mt][2 * j], bx[mt][2 * j + 1]);
    }
  }
}

// acc += scale x part (rows g and g + 8 of each tile: the scale word's halves).
template <int MT, int R>
NIB_DEVICE void add_scaled(const float (&part)[R][MT][4], const u32 (&s)[R], float (&acc)[R][MT][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s0 = lo_h2f(s[r]), s1 = hi_h2f(s[r]);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      acc[r][mt][0] += part[r][mt][0] * s0;
      acc[r][mt][1] += part[r][mt][1] * s0;
      acc[r][mt][2] += part[r][mt][2] * s1;
      acc[r][mt][3] += part[r][mt][3] * s1;
    }
  }
}

// acc += scale x (W x) over group `grp` of R tiles: w holds the lane's two chunks per tile.
template <int MT, int R, bool SMEM_X>
NIB_DEVICE void mma_group(const W4Args& a, const Block& b, const u16* xs, int grp,
                          const uint4 (&w)[R][2], const u32 (&s)[R], float (&acc)[R][MT][4]) {
  float part[R][MT][4];
  zero(part);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    u32 bx[MT][8];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_b<SMEM_X>(a, b, xs, 2 * grp + h, mt, bx[mt]);
    mma_half<MT, R>(bx, w, h, part);
  }
  add_scaled<MT, R>(part, s, acc);
}

// Activation fragments one group ahead (the `x` twins of the `g` kernels, W4Config.xpf):
// each warp loads the fragments of its next group from global memory before the products
// of this one, instead of just before their own products, so that their trip to L1/L2
// overlaps a group's dequantisation and mma. Under ncu (H100, 2026-12-06) waits on those
// loads were ~42% of the stalls of the 7B gate_up at M = 16 (bulk r4w4n2: 121 registers,
// 15% occupancy); the twins hold 2 x MT x 8 more registers, which some shapes pay for in
// occupancy, so the tuner picks per layer.

// The B fragments of group `grp` (both chunks, every n8 tile) from global memory.
template <int MT>
NIB_DEVICE void load_group_b(const W4Args& a, const Block& b, int grp, u32 (&bx)[2][MT][8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_b<false>(a, b, nullptr, 2 * grp + h, mt, bx[h][mt]);
}

// mma_group on fragments loaded beforehand (load_group_b).
template <int MT, int R>
NIB_DEVICE void mma_group_b(const u32 (&bx)[2][MT][8], const uint4 (&w)[R][2], const u32 (&s)[R],
                            float (&acc)[R][MT][4]) {
  float part[R][MT][4];
  zero(part);
#pragma unroll
  for (int h = 0; h < 2; ++h) mma_half<MT, R>(bx[h], w, h, part);
  add_scaled<MT, R>(part, s, acc);
}

template <int MT>
NIB_DEVICE void copy_b(const u32 (&from)[2][MT][8], u32 (&to)[2][MT][8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 8; ++e) to[h][mt][e] = from[h][mt][e];
}

// Sum the warps' accumulators (shared memory), then split-K (partials + the last block
// of a tile group finishes) and the epilogue.
template <int MT, int R, int WARPS, bool CL, bool PICK>
NIB_DEVICE void reduce_and_finish(const W4Args& a, const Block& b, const float (&acc)[R][MT][4],
                                  float* red, float* scratch, const LanePairs<MT, R, WARPS>& ops,
                                  const PickPtrs* pk = nullptr) {
  constexpr int FRAG = R * MT * 4;
  const int lane = b.lane;
  const int warp = WARPS > 1 ? b.warp : 0;
  float v[FRAG];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) v[(r * MT + mt) * 4 + e] = acc[r][mt][e];
  if constexpr (WARPS > 1) {
    // Lane-major so that a warp's stores hit 32 banks.
#pragma unroll
    for (int f = 0; f < FRAG; ++f) red[(warp * FRAG + f) * 32 + lane] = v[f];
    __syncthreads();
  }
  // Pairs (e, e + 2) of fragment (r, mt): rows g and g + 8 of tile r, batch row
  // 2 t4 + (e & 1) + 8 mt. Warp w finishes pairs w, w + WARPS, ...
  constexpr int PAIRS = R * MT * 2;
  constexpr int MINE = (PAIRS + WARPS - 1) / WARPS;
  float fin[MINE][2];
#pragma unroll
  for (int q = 0; q < MINE; ++q) {
    const int pair = warp + q * WARPS;
    fin[q][0] = fin[q][1] = 0.f;
    if (pair < PAIRS) {
      const int f0 = (pair >> 1) * 4 + (pair & 1);
      if constexpr (WARPS > 1) {
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
          fin[q][0] += red[(w * FRAG + f0) * 32 + lane];
          fin[q][1] += red[(w * FRAG + f0 + 2) * 32 + lane];
        }
      } else {
#pragma unroll
        for (int f = 0; f < FRAG; ++f) {  // compile-time indices only
          if (f == f0) fin[q][0] = v[f];
          if (f == f0 + 2) fin[q][1] = v[f];
        }
      }
    }
  }
  if (CL && a.splits > 1) {
    // The cluster is this tile group's splits (rank = split): partials stay in each
    // block's shared memory, [pair][2][32] after the scratch words, and block 0 sums
    // them in split order (the global path's order) between two cluster barriers.
    float* part = scratch + 64;
#pragma unroll
    for (int q = 0; q < MINE; ++q) {
      const int pair = warp + q * WARPS;
      if (pair < PAIRS) {
        part[pair * 64 + lane] = fin[q][0];
        part[pair * 64 + 32 + lane] = fin[q][1];
      }
    }
    cluster_sync();
    if (b.split == 0) {
      const u32 base = smem_u32(part);
      for (int s = 1; s < a.splits; ++s) {
#pragma unroll
        for (int q = 0; q < MINE; ++q) {
          const int pair = warp + q * WARPS;
          if (pair < PAIRS) {
            fin[q][0] += ld_cluster_f32(cluster_map(base + (pair * 64 + lane) * 4, s));
            fin[q][1] += ld_cluster_f32(cluster_map(base + (pair * 64 + 32 + lane) * 4, s));
          }
        }
      }
    }
    cluster_sync();  // the other blocks' shared memory lives until block 0 has read it
    if (b.split != 0) return;
  } else if (a.splits > 1) {
    // Partials of this split: [tile group][split][pair][2][32].
    float* mine = a.ws + ((size_t)blockIdx.x * a.splits + b.split) * PAIRS * 64;
#pragma unroll
    for (int q = 0; q < MINE; ++q) {
      const int pair = warp + q * WARPS;
      if (pair < PAIRS) {
        mine[pair * 64 + lane] = fin[q][0];
        mine[pair * 64 + 32 + lane] = fin[q][1];
      }
    }
    __threadfence();
    __syncthreads();
    int* flag = reinterpret_cast<int*>(scratch + 32);
    if (threadIdx.x == 0) *flag = atomicAdd(a.counters + blockIdx.x, 1);
    __syncthreads();
    if (*flag != a.splits - 1) return;
    __threadfence();
    const float* all = a.ws + (size_t)blockIdx.x * a.splits * PAIRS * 64;
#pragma unroll
    for (int q = 0; q < MINE; ++q) {
      const int pair = warp + q * WARPS;
      fin[q][0] = fin[q][1] = 0.f;
      if (pair < PAIRS) {
        for (int s = 0; s < a.splits; ++s) {
          fin[q][0] += ld_cg(all + (s * PAIRS + pair) * 64 + lane);
          fin[q][1] += ld_cg(all + (s * PAIRS + pair) * 64 + 32 + lane);
        }
      }
    }
    if (threadIdx.x == 0) a.counters[blockIdx.x] = 0;
  }
  if constexpr (!PICK) {
#pragma unroll
    for (int q = 0; q < MINE; ++q) {
      const int pair = warp + q * WARPS;
      if (pair < PAIRS) {
        const int r = pair / (MT * 2), mt = (pair >> 1) % MT, e = pair & 1;
        using Ops = LanePairs<MT, R, WARPS>;
        finish_pair(a, b.tile0 + r, b.g, 2 * b.t4 + e + 8 * mt, fin[q][0], fin[q][1],
                    ops.op[Ops::EARLY ? q : 0], Ops::EARLY);
      }
    }
  } else {
    Best pick = empty_best();
#pragma unroll
    for (int q = 0; q < MINE; ++q) {
      const int pair = warp + q * WARPS;
      if (pair < PAIRS) {
        const int r = pair / (MT * 2), mt = (pair >> 1) % MT, e = pair & 1;
        const int row = 2 * b.t4 + e + 8 * mt;
        using Ops = LanePairs<MT, R, WARPS>;
        float y0 = 0.f, y1 = 0.f;
        finish_pair<true>(a, b.tile0 + r, b.g, row, fin[q][0], fin[q][1],
                          ops.op[Ops::EARLY ? q : 0], Ops::EARLY, &y0, &y1);
        if (row == 0) {  // one row, plain epilogue (w4a16.py checks)
          const int o0 = (b.tile0 + r) * 16 + b.g;
          pick = merge(pick, merge(best_of(y0, y0, o0), best_of(y1, y1, o0 + 8)));
        }
      }
    }
    // The warps' accumulators in `red` were all read before the split-K merge or, with
    // one split, before this barrier: it holds the block's merge now.
    __syncthreads();
    Best* picks = reinterpret_cast<Best*>(red);
    pick = block_merge(pick, picks);
    const PickOut out{pk->token, pk->out_token, pk->out_logprob, pk->advance, pk->sys_fence};
    const bool ybf = a.y_bf16 != 0;
    pick_across_blocks<PICK_GROUP>(pick, pk->ws, pk->counter, blockIdx.x, gridDim.x, out, 0,
                       [&] { return act2f(*reinterpret_cast<volatile const u16*>(a.y), ybf); },
                       picks);
  }
}

// Register pipeline: each warp keeps PF groups of its loads in flight in registers.
extern __shared__ __align__(128) unsigned char smem[];

template <int MT, int R, int WARPS, int PF, bool SMEM_X, bool CL = false, bool PICK = false,
          bool XPF = false>
NIB_DEVICE void w4a16_body(const W4Args& a, const PickPtrs* pk = nullptr) {
  static_assert(!(XPF && SMEM_X), "XPF loads activations from global memory");
  NIB_TRACE_BLOCK(NIB_KIND_W4A16);
  constexpr int FRAG = R * MT * 4;
  const Block b = block_of(a, R);
  // This warp's groups: gb0 + warp + i * WARPS, i < n_w.
  const int n_w = b.gb1 - b.gb0 - b.warp > 0 ? (b.gb1 - b.gb0 - b.warp + WARPS - 1) / WARPS : 0;
  const uint4* qw[R];
  const u32* sc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    qw[r] = a.qw + (size_t)(b.tile0 + r) * b.chunks * 32 + b.lane;
    sc[r] = a.sc + (size_t)(b.tile0 + r) * b.n_groups * 8 + b.g;
  }
  uint4 wbuf[PF][R][2];
  u32 sbuf[PF][R];
  auto load = [&](int i, uint4 (&w)[R][2], u32 (&s)[R]) {
    const int grp = b.gb0 + b.warp + i * WARPS;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      w[r][0] = ld_stream(qw[r] + (size_t)(2 * grp) * 32);
      w[r][1] = ld_stream(qw[r] + (size_t)(2 * grp + 1) * 32);
      s[r] = ld_nc_u32(sc[r] + grp * 8);
    }
  };
  pdl_launch_dependents();
  // Weights first (they do not depend on the previous kernel): their trip to memory
  // overlaps the previous kernel's tail and this kernel's activation prologue.
#pragma unroll
  for (int p = 0; p < PF; ++p)
    if (p < n_w) load(p, wbuf[p], sbuf[p]);
  LanePairs<MT, R, WARPS> ops;
  ops.load_bias(a, b.tile0, b.warp, b.g, b.t4);
  pdl_wait();
  NIB_TRACE_WAITED();
  ops.load_residual(a, b.tile0, b.warp, b.g, b.t4);

  u16* xs = reinterpret_cast<u16*>(smem);
  float* red = reinterpret_cast<float*>(smem + (SMEM_X ? (size_t)a.groups_per_split * 256 : 0));
  float* scratch = red + (WARPS > 1 ? WARPS * FRAG * 32 : 0);
  if constexpr (SMEM_X) stage_x<WARPS * 32>(a, b, xs, scratch);
  NIB_TRACE_MARK(0);  // activations staged

  float acc[R][MT][4];
  zero(acc);
  u32 bxc[2][MT][8];  // XPF: this warp's next group's activation fragments
  if constexpr (XPF) load_group_b<MT>(a, b, min(b.gb0 + b.warp, b.gb1 - 1), bxc);
  for (int base = 0; base < n_w; base += PF) {
#pragma unroll
    for (int p = 0; p < PF; ++p) {
      const int i = base + p;
      if (i < n_w) {
        if constexpr (XPF) {
          u32 bxn[2][MT][8];  // the group after (clamped: the last group loads itself again)
          load_group_b<MT>(a, b, min(b.gb0 + b.warp + (i + 1) * WARPS, b.gb1 - 1), bxn);
          mma_group_b<MT, R>(bxc, wbuf[p], sbuf[p], acc);
          if (i + PF < n_w) load(i + PF, wbuf[p], sbuf[p]);
          copy_b<MT>(bxn, bxc);
        } else {
          mma_group<MT, R, SMEM_X>(a, b, xs, b.gb0 + b.warp + i * WARPS, wbuf[p], sbuf[p], acc);
          if (i + PF < n_w) load(i + PF, wbuf[p], sbuf[p]);
        }
      }
    }
  }
  NIB_TRACE_MARK(1);  // this warp's weights consumed
  reduce_and_finish<MT, R, WARPS, CL, PICK>(a, b, acc, red, scratch, ops, pk);
}

// Bulk-copy pipeline (sm_90): one thread streams each step's weights (WARPS groups of
// R tiles, contiguous per tile) and scales into NS shared-memory stages with
// cp.async.bulk, completing on an mbarrier per stage; warp w computes group w of a
// step. In flight per block: up to NS x R x WARPS KB without holding registers.
template <int MT, int R, int WARPS, int NS, bool SMEM_X, bool PICK = false, bool XPF = false>
NIB_DEVICE void w4a16_bulk_body(const W4Args& a, const PickPtrs* pk = nullptr) {
  static_assert(!(XPF && SMEM_X), "XPF loads activations from global memory");
#if __CUDA_ARCH__ >= 900
  NIB_TRACE_BLOCK(NIB_KIND_W4A16_BULK);
  constexpr int FRAG = R * MT * 4;
  constexpr int WBYTES = WARPS * 1024;  // one tile's weights per step
  constexpr int SBYTES = WARPS * 32;    // one tile's scales per step
  const Block b = block_of(a, R);
  const int steps = (b.gb1 - b.gb0 + WARPS - 1) / WARPS;
  unsigned char* wsm = smem;                                   // [NS][R][WBYTES]
  unsigned char* ssm = wsm + NS * R * WBYTES;                  // [NS][R][SBYTES]
  u64* bars = reinterpret_cast<u64*>(ssm + NS * R * SBYTES);   // [NS]
  u16* xs = reinterpret_cast<u16*>(bars + 2 * NS);
  float* red = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(xs) +
                                        (SMEM_X ? (size_t)a.groups_per_split * 256 : 0));
  float* scratch = red + (WARPS > 1 ? WARPS * FRAG * 32 : 0);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < NS; ++s) mbar_init(bars + s, 1);
    fence_mbar_init();
  }
  __syncthreads();
  auto issue = [&](int step) {  // thread 0
    const int stage = step % NS;
    const int g0 = b.gb0 + step * WARPS;
    const int ng = min(WARPS, b.gb1 - g0);
    mbar_expect_tx(bars + stage, (u32)(R * ng * (1024 + 32)));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const size_t tile = b.tile0 + r;
      bulk_g2s(wsm + (stage * R + r) * WBYTES, a.qw + (tile * b.chunks + 2 * g0) * 32, ng * 1024,
               bars + stage);
      bulk_g2s(ssm + (stage * R + r) * SBYTES, a.sc + (tile * b.n_groups + g0) * 8, ng * 32,
               bars + stage);
    }
  };
  pdl_launch_dependents();
  if (threadIdx.x == 0)
    for (int s = 0; s < NS && s < steps; ++s) issue(s);
  LanePairs<MT, R, WARPS> ops;
  ops.load_bias(a, b.tile0, b.warp, b.g, b.t4);
  pdl_wait();
  NIB_TRACE_WAITED();
  ops.load_residual(a, b.tile0, b.warp, b.g, b.t4);
  if constexpr (SMEM_X) stage_x<WARPS * 32>(a, b, xs, scratch);
  NIB_TRACE_MARK(0);  // activations staged

  float acc[R][MT][4];
  zero(acc);
  u32 bxc[2][MT][8];  // XPF: this warp's next group's activation fragments
  if constexpr (XPF) load_group_b<MT>(a, b, min(b.gb0 + b.warp, b.gb1 - 1), bxc);
  for (int i = 0; i < steps; ++i) {
    const int stage = i % NS;
    int grp;
    u32 bxn[2][MT][8];  // XPF: the group after, its loads on their way during the wait
    if constexpr (XPF) {
      grp = b.gb0 + i * WARPS + b.warp;
      load_group_b<MT>(a, b, min(grp + WARPS, b.gb1 - 1), bxn);
      mbar_wait(bars + stage, (u32)((i / NS) & 1));
    } else {
      mbar_wait(bars + stage, (u32)((i / NS) & 1));
      grp = b.gb0 + i * WARPS + b.warp;
    }
    if (grp < b.gb1) {
      uint4 w[R][2];
      u32 s[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4* ws = reinterpret_cast<const uint4*>(wsm + (stage * R + r) * WBYTES);
        w[r][0] = ws[(b.warp * 2) * 32 + b.lane];
        w[r][1] = ws[(b.warp * 2 + 1) * 32 + b.lane];
        s[r] = reinterpret_cast<const u32*>(ssm + (stage * R + r) * SBYTES)[b.warp * 8 + b.g];
      }
      if constexpr (XPF)
        mma_group_b<MT, R>(bxc, w, s, acc);
      else
        mma_group<MT, R, SMEM_X>(a, b, xs, grp, w, s, acc);
    }
    if constexpr (XPF) copy_b<MT>(bxn, bxc);
    __syncthreads();  // stage consumed by every warp: refill it
    if (threadIdx.x == 0 && i + NS < steps) issue(i + NS);
  }
  NIB_TRACE_MARK(1);  // every stage consumed
  reduce_and_finish<MT, R, WARPS, false, PICK>(a, b, acc, red, scratch, ops, pk);
#else
  __trap();  // w4a16.py launches these on sm_90 and newer only
#endif
}

// Dequantise a packed weight to fp16 [N, K] in logical row order (prefill: then cuBLAS).
struct DequantArgs {
  const uint4* qw;
  const u32* sc;
  u16* w;
  int tiles;
  int k;
  int glu;    // the weight was packed glu-interleaved
  int inter;
};

extern "C" __global__ void w4_dequant(const DequantArgs a) {
  const int chunks = a.k >> 6;
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)a.tiles * chunks * 32) return;
  const int lane = (int)(idx & 31);
  const int c = (int)((idx >> 5) % chunks);
  const int t = (int)((idx >> 5) / chunks);
  const int g = lane >> 2, t4 = lane & 3;
  const uint4 q = ld_stream(a.qw + idx);
  const u32 s = ld_nc_u32(a.sc + ((size_t)t * (a.k >> 7) + (c >> 1)) * 8 + g);
  const float s0 = lo_h2f(s), s1 = hi_h2f(s);
  const u32 words[4] = {q.x, q.y, q.z, q.w};
  u32 row0[8], row1[8];  // 16 fp16 each: inputs c*64 + 16 t4 + 0..15
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const u32 x = words[j];
    // nibble at bit b: (x >> b) & 15; row g: bits 0,16,8,24 -> inputs 4j+0..3.
    const float a0 = (float)((int)((x >> 0) & 15) - 8), a1 = (float)((int)((x >> 16) & 15) - 8);
    const float a2 = (float)((int)((x >> 8) & 15) - 8), a3 = (float)((int)((x >> 24) & 15) - 8);
    const float b0 = (float)((int)((x >> 4) & 15) - 8), b1 = (float)((int)((x >> 20) & 15) - 8);
    const float b2 = (float)((int)((x >> 12) & 15) - 8), b3 = (float)((int)((x >> 28) & 15) - 8);
    row0[2 * j] = pack_h2(a0 * s0, a1 * s0);
    row0[2 * j + 1] = pack_h2(a2 * s0, a3 * s0);
    row1[2 * j] = pack_h2(b0 * s1, b1 * s1);
    row1[2 * j + 1] = pack_h2(b2 * s1, b3 * s1);
  }
  const bool glu = a.glu != 0;
  const size_t col = (size_t)c * 64 + 16 * t4;
  uint4* d0 = reinterpret_cast<uint4*>(a.w + (size_t)out_row(t, g, glu, a.inter) * a.k + col);
  uint4* d1 = reinterpret_cast<uint4*>(a.w + (size_t)out_row(t, g + 8, glu, a.inter) * a.k + col);
  d0[0] = make_uint4(row0[0], row0[1], row0[2], row0[3]);
  d0[1] = make_uint4(row0[4], row0[5], row0[6], row0[7]);
  d1[0] = make_uint4(row1[0], row1[1], row1[2], row1[3]);
  d1[1] = make_uint4(row1[4], row1[5], row1[6], row1[7]);
}

// The tile shapes w4a16.py may launch: w4a16_m<MT>_r<R>_w<WARPS>_p<PF>_<s|g> (register
// pipeline), the same with a trailing c (split-K merged in a cluster, sm_90 only) and
// w4a16_m<MT>_r<R>_w<WARPS>_n<NS>_<s|g>b (bulk copies, sm_90 only).
#define W4_KERNEL(MT, R, WARPS, PF, SMEM, TAG)                                              \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                  \
      w4a16_m##MT##_r##R##_w##WARPS##_p##PF##_##TAG(const W4Args a) {                       \
    w4a16_body<MT, R, WARPS, PF, SMEM>(a);                                                  \
  }
#define W4_CLUSTER_KERNEL(MT, R, WARPS, PF, SMEM, TAG)                                      \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                  \
      w4a16_m##MT##_r##R##_w##WARPS##_p##PF##_##TAG##c(const W4Args a) {                    \
    w4a16_body<MT, R, WARPS, PF, SMEM, true>(a);                                            \
  }
#define W4_BULK_KERNEL(MT, R, WARPS, NS, SMEM, TAG)                                         \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                  \
      w4a16_m##MT##_r##R##_w##WARPS##_n##NS##_##TAG##b(const W4Args a) {                    \
    w4a16_bulk_body<MT, R, WARPS, NS, SMEM>(a);                                             \
  }
// The `g` shapes with activation fragments one group ahead (XPF): w4a16_m<MT>_..._gx and
// _gbx. The bulk twins promise ptxas no more than one block per SM (launch bounds' second
// argument): without it ptxas held the one-n8-tile r4 twins to 80 registers and spilled.
// The register-pipeline twins leave it out: with it ptxas spends registers that cost
// them resident blocks (r1w4p4: 126 -> 139, four blocks an SM -> three).
#define W4_XPF_KERNEL(MT, R, WARPS, PF)                                                     \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                  \
      w4a16_m##MT##_r##R##_w##WARPS##_p##PF##_gx(const W4Args a) {                          \
    w4a16_body<MT, R, WARPS, PF, false, false, false, true>(a);                             \
  }
#define W4_XPF_BULK_KERNEL(MT, R, WARPS, NS)                                                \
  extern "C" __global__ void __launch_bounds__(WARPS * 32, 1)                               \
      w4a16_m##MT##_r##R##_w##WARPS##_n##NS##_gbx(const W4Args a) {                         \
    w4a16_bulk_body<MT, R, WARPS, NS, false, false, true>(a);                               \
  }
// The same one-row launches with the greedy pick in the epilogue (pick.cuh): separate
// instantiations, so that every other launch compiles exactly as without it.
#define W4_PICK_KERNEL(R, WARPS, PF)                                                        \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                  \
      w4a16_m1_r##R##_w##WARPS##_p##PF##_s_pick(const W4PickArgs a) {                       \
    w4a16_body<1, R, WARPS, PF, true, false, true>(a.w, &a.p);                              \
  }
#define W4_PICK_CLUSTER_KERNEL(R, WARPS, PF)                                                \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                  \
      w4a16_m1_r##R##_w##WARPS##_p##PF##_sc_pick(const W4PickArgs a) {                      \
    w4a16_body<1, R, WARPS, PF, true, true, true>(a.w, &a.p);                               \
  }
#define W4_PICK_BULK_KERNEL(R, WARPS, NS)                                                   \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                  \
      w4a16_m1_r##R##_w##WARPS##_n##NS##_sb_pick(const W4PickArgs a) {                      \
    w4a16_bulk_body<1, R, WARPS, NS, true, true>(a.w, &a.p);                                \
  }

// One row (decode): activations staged in shared memory.
W4_KERNEL(1, 1, 4, 4, true, s)
W4_KERNEL(1, 1, 4, 2, true, s)
W4_KERNEL(1, 1, 4, 3, true, s)
W4_KERNEL(1, 1, 8, 4, true, s)
W4_KERNEL(1, 1, 8, 2, true, s)
W4_KERNEL(1, 2, 4, 2, true, s)
W4_KERNEL(1, 2, 4, 4, true, s)
W4_KERNEL(1, 2, 8, 2, true, s)
W4_KERNEL(1, 4, 4, 2, true, s)
// Long K over few row tiles (the 1.5B down projection: 96 tiles x 70 groups): more warps
// share one tile's K, so that most of a block's weights are in flight before its wait.
W4_KERNEL(1, 1, 12, 6, true, s)
W4_KERNEL(1, 1, 16, 4, true, s)
W4_KERNEL(1, 1, 16, 6, true, s)
W4_BULK_KERNEL(1, 1, 4, 4, true, s)
W4_BULK_KERNEL(1, 1, 4, 6, true, s)
W4_BULK_KERNEL(1, 1, 8, 3, true, s)
W4_BULK_KERNEL(1, 2, 4, 3, true, s)
W4_BULK_KERNEL(1, 2, 4, 4, true, s)
W4_BULK_KERNEL(1, 4, 4, 2, true, s)
W4_BULK_KERNEL(1, 1, 16, 3, true, s)
W4_BULK_KERNEL(1, 1, 16, 5, true, s)
// 2..8 and 9..16 rows (speculative verification, small batches): fp16 from global memory.
W4_KERNEL(1, 1, 4, 4, false, g)
W4_KERNEL(1, 2, 4, 2, false, g)
W4_KERNEL(2, 1, 4, 4, false, g)
W4_KERNEL(2, 2, 4, 2, false, g)
W4_KERNEL(1, 4, 4, 2, false, g)
W4_KERNEL(2, 4, 4, 2, false, g)
// More warps sharing a block's K slice (as for one row): more of its weights on their way.
W4_KERNEL(1, 1, 8, 4, false, g)
W4_KERNEL(2, 1, 8, 4, false, g)
W4_KERNEL(1, 2, 8, 2, false, g)
W4_KERNEL(2, 2, 8, 2, false, g)
W4_KERNEL(1, 1, 16, 2, false, g)
W4_KERNEL(2, 1, 16, 2, false, g)
W4_BULK_KERNEL(1, 1, 4, 4, false, g)
W4_BULK_KERNEL(1, 2, 4, 3, false, g)
W4_BULK_KERNEL(2, 1, 4, 4, false, g)
W4_BULK_KERNEL(2, 2, 4, 3, false, g)
W4_BULK_KERNEL(1, 4, 4, 2, false, g)
W4_BULK_KERNEL(2, 4, 4, 2, false, g)
W4_BULK_KERNEL(1, 2, 8, 3, false, g)
W4_BULK_KERNEL(2, 2, 8, 3, false, g)
W4_BULK_KERNEL(1, 4, 8, 2, false, g)
W4_BULK_KERNEL(2, 4, 8, 2, false, g)
// 2..16 rows with activation fragments one group ahead: every `g` shape that has both n8
// tile counts.
W4_XPF_KERNEL(1, 1, 4, 4)
W4_XPF_KERNEL(2, 1, 4, 4)
W4_XPF_KERNEL(1, 2, 4, 2)
W4_XPF_KERNEL(2, 2, 4, 2)
W4_XPF_KERNEL(1, 4, 4, 2)
W4_XPF_KERNEL(2, 4, 4, 2)
W4_XPF_KERNEL(1, 1, 8, 4)
W4_XPF_KERNEL(2, 1, 8, 4)
W4_XPF_KERNEL(1, 2, 8, 2)
W4_XPF_KERNEL(2, 2, 8, 2)
W4_XPF_KERNEL(1, 1, 16, 2)
W4_XPF_KERNEL(2, 1, 16, 2)
W4_XPF_BULK_KERNEL(1, 1, 4, 4)
W4_XPF_BULK_KERNEL(2, 1, 4, 4)
W4_XPF_BULK_KERNEL(1, 2, 4, 3)
W4_XPF_BULK_KERNEL(2, 2, 4, 3)
W4_XPF_BULK_KERNEL(1, 4, 4, 2)
W4_XPF_BULK_KERNEL(2, 4, 4, 2)
W4_XPF_BULK_KERNEL(1, 2, 8, 3)
W4_XPF_BULK_KERNEL(2, 2, 8, 3)
W4_XPF_BULK_KERNEL(1, 4, 8, 2)
W4_XPF_BULK_KERNEL(2, 4, 8, 2)
// Split-K merged in a thread-block cluster (sm_90): the split configs the step runs.
W4_CLUSTER_KERNEL(1, 1, 4, 4, true, s)
W4_CLUSTER_KERNEL(1, 1, 8, 2, true, s)
W4_CLUSTER_KERNEL(1, 1, 8, 4, true, s)
W4_CLUSTER_KERNEL(1, 2, 4, 2, true, s)
W4_CLUSTER_KERNEL(1, 1, 4, 4, false, g)
W4_CLUSTER_KERNEL(2, 1, 4, 4, false, g)
W4_CLUSTER_KERNEL(1, 2, 4, 2, false, g)
W4_CLUSTER_KERNEL(2, 2, 4, 2, false, g)
// One row with the greedy pick fused (the lm_head of a greedy decode step): every
// one-row shape, since start-up may time any of them for the lm_head.
W4_PICK_KERNEL(1, 4, 4)
W4_PICK_KERNEL(1, 4, 2)
W4_PICK_KERNEL(1, 4, 3)
W4_PICK_KERNEL(1, 8, 4)
W4_PICK_KERNEL(1, 8, 2)
W4_PICK_KERNEL(2, 4, 2)
W4_PICK_KERNEL(2, 4, 4)
W4_PICK_KERNEL(2, 8, 2)
W4_PICK_KERNEL(4, 4, 2)
W4_PICK_KERNEL(1, 12, 6)
W4_PICK_KERNEL(1, 16, 4)
W4_PICK_KERNEL(1, 16, 6)
W4_PICK_BULK_KERNEL(1, 4, 4)
W4_PICK_BULK_KERNEL(1, 4, 6)
W4_PICK_BULK_KERNEL(1, 8, 3)
W4_PICK_BULK_KERNEL(2, 4, 3)
W4_PICK_BULK_KERNEL(2, 4, 4)
W4_PICK_BULK_KERNEL(4, 4, 2)
W4_PICK_BULK_KERNEL(1, 16, 3)
W4_PICK_BULK_KERNEL(1, 16, 5)
W4_PICK_CLUSTER_KERNEL(1, 4, 4)
W4_PICK_CLUSTER_KERNEL(1, 8, 2)
W4_PICK_CLUSTER_KERNEL(1, 8, 4)
W4_PICK_CLUSTER_KERNEL(2, 4, 2)
