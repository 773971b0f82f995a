// The greedy pick's arithmetic, shared by greedy.cu (a kernel of its own over the
// logits) and w4a16.cu (the lm_head's epilogue, where the decode step fuses the pick):
// a running argmax in torch.argmax's order beside a running logsumexp, merged across
// threads, blocks and, through a workspace and a self-resetting ticket counter, the
// blocks of one launch; the last block writes the token, its log-probability and the
// advanced decode position.
#pragma once
#include "common.cuh"

constexpr int PICK_NONE = 0x7fffffff;  // no index beat -inf yet
constexpr float PICK_LOG2E = 1.4426950408889634f;
constexpr int PICK_PARTIAL_FLOATS = 8;  // one block's partial in a workspace
constexpr int PICK_MAX_WARPS = 32;

NIB_DEVICE float pick_neg_inf() { return __int_as_float(0xff800000); }
NIB_DEVICE bool is_nan(float x) { return x != x; }
// The logsumexp's reference point: the max, or 0 while nothing above -inf was seen.
NIB_DEVICE float ref_of(float m) { return m == pick_neg_inf() ? 0.f : m; }

struct Best {
  float c;  // best chosen score
  int i;    // its index (PICK_NONE while nothing beat -inf)
  float x;  // the row's value at i
  float m;  // max of the row
  float s;  // sum of exp(row - ref_of(m))
};

NIB_DEVICE Best empty_best() {
  return Best{pick_neg_inf(), PICK_NONE, 0.f, pick_neg_inf(), 0.f};
}

// One element, visited in increasing index order within a thread: strictly greater
// keeps the first of equal scores; a NaN replaces anything but an earlier NaN.
NIB_DEVICE void take(Best& b, float c, float x, int i) {
  if (c > b.c || (is_nan(c) && !is_nan(b.c))) {
    b.c = c;
    b.i = i;
    b.x = x;
  }
}

// Whether (ac, ai) comes before (bc, bi) in torch.argmax's order.
NIB_DEVICE bool before(float ac, int ai, float bc, int bi) {
  if (is_nan(ac)) return !is_nan(bc) || ai < bi;
  if (is_nan(bc)) return false;
  return ac > bc || (ac == bc && ai < bi);
}

NIB_DEVICE Best merge(const Best& a, const Best& b) {
  Best r;
  const bool first = before(a.c, a.i, b.c, b.i);
  r.c = first ? a.c : b.c;
  r.i = first ? a.i : b.i;
  r.x = first ? a.x : b.x;
  r.m = fmaxf(a.m, b.m);
  const float ref = ref_of(r.m);
  // A side whose m is -inf has s = 0 and gets the factor 2^-inf = 0 (ref is finite).
  r.s = a.s * ex2((a.m - ref) * PICK_LOG2E) + b.s * ex2((b.m - ref) * PICK_LOG2E);
  return r;
}

// One element x (chosen score c) as a Best of its own: the argmax order and the
// logsumexp, in any merge order.
NIB_DEVICE Best best_of(float c, float x, int i) {
  Best one = empty_best();
  one.m = x;
  one.s = ex2((x - ref_of(x)) * PICK_LOG2E);  // 1, or 0 for -inf
  take(one, c, x, i);
  return one;
}

NIB_DEVICE Best shfl_xor(const Best& b, int o) {
  Best r;
  r.c = __shfl_xor_sync(0xffffffffu, b.c, o);
  r.i = __shfl_xor_sync(0xffffffffu, b.i, o);
  r.x = __shfl_xor_sync(0xffffffffu, b.x, o);
  r.m = __shfl_xor_sync(0xffffffffu, b.m, o);
  r.s = __shfl_xor_sync(0xffffffffu, b.s, o);
  return r;
}

NIB_DEVICE Best warp_merge(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) b = merge(b, shfl_xor(b, o));
  return b;
}

// The block's merge (every thread calls it; scratch holds one Best per warp); thread 0
// gets the result.
NIB_DEVICE Best block_merge(Best b, Best* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  b = warp_merge(b);
  if (lane == 0) scratch[warp] = b;
  __syncthreads();
  if (warp == 0) {
    b = lane < warps ? scratch[lane] : empty_best();
    b = warp_merge(b);
  }
  return b;
}

// Where a pick's results go (device or mapped pinned host addresses).
struct PickOut {
  long long* token;      // int64 or null: the next step's input, on the device
  long long* out_token;  // int64: mapped pinned host memory or a device buffer
  float* out_logprob;    // fp32: likewise
  long long* advance;    // int64 or null: the decode position, + 1 once the token is out
  int sys_fence;         // fence the stores at system scope before the kernel ends
};

// One block's partial into slot `slot` of a workspace (thread 0).
NIB_DEVICE void write_partial(float* ws, int slot, const Best& b) {
  float4* mine = reinterpret_cast<float4*>(ws + (size_t)slot * PICK_PARTIAL_FLOATS);
  mine[0] = make_float4(b.c, __int_as_float(b.i), b.x, b.m);
  mine[1] = make_float4(b.s, 0.f, 0.f, 0.f);
}

// The merge of partials [first, first + n) of ws, which other blocks wrote (every
// thread calls it; thread 0 gets the result). Each thread issues a batch of loads
// before it merges them: one trip to L2 a batch, not one a partial.
NIB_DEVICE Best gather_partials(const float* ws, int first, int n, Best* scratch) {
  constexpr int BATCH = 4;
  const float4* all = reinterpret_cast<const float4*>(ws) + 2 * (size_t)first;
  const int tid = threadIdx.x, step = blockDim.x;
  Best b = empty_best();
  for (int p0 = tid; p0 < n; p0 += BATCH * step) {
    float4 q0[BATCH], q1[BATCH];
#pragma unroll
    for (int j = 0; j < BATCH; ++j) {
      const int p = p0 + j * step;
      if (p < n) {
        q0[j] = ld_cg4(all + 2 * p);
        q1[j] = ld_cg4(all + 2 * p + 1);
      }
    }
#pragma unroll
    for (int j = 0; j < BATCH; ++j)
      if (p0 + j * step < n)
        b = merge(b, Best{q0[j].x, __float_as_int(q0[j].y), q0[j].z, q0[j].w, q1[j].x});
  }
  return block_merge(b, scratch);
}

constexpr int PICK_ONE_LEVEL = 0x7fffffff;  // every partial merged by the last block

// Thread 0 of each of `parts` blocks brings its block's Best (every thread of the block
// calls this; `b` matters in thread 0 only), and the block that draws the last ticket
// merges them and writes the results. With more than GROUP parts the merge takes two
// levels: the last block of each GROUP consecutive parts merges its group into slot
// parts + group, and the last of those merges the groups, so that no block reads
// thousands of partials one L2 trip after another (an lm_head has up to 9,496 blocks
// of tiles). Workspace: parts (+ ceil(parts / GROUP)) partials; counters: the final
// ticket, then one per group, all zero between launches (each is reset by the block
// that drew its last ticket, so a CUDA graph replays this with nothing to clear).
// value0() gives the row's value at index 0 (every chosen score -inf: torch.argmax
// says 0). Returns in every block.
template <int GROUP, typename Value0>
NIB_DEVICE void pick_across_blocks(Best b, float* ws, int* counter, int part, int parts,
                                   const PickOut& out, int row, Value0 value0, Best* scratch) {
  __shared__ int ticket;
  const int tid = threadIdx.x;
  // (Between each ticket's barrier and the next merge, scratch is free: warp 0 read it
  // in the block merge before thread 0, of warp 0, drew the ticket.)
  if (parts > GROUP) {
    const int group = part / GROUP, first = group * GROUP;
    const int n = min(GROUP, parts - first), groups = (parts + GROUP - 1) / GROUP;
    if (tid == 0) {
      write_partial(ws, part, b);
      __threadfence();  // the partial is visible device-wide before the ticket is drawn
      ticket = atomicAdd(counter + 1 + group, 1);
    }
    __syncthreads();
    if (ticket != n - 1) return;
    __threadfence();  // every partial of the group is visible
    b = gather_partials(ws, first, n, scratch);
    if (tid == 0) {
      counter[1 + group] = 0;
      write_partial(ws, parts + group, b);
      __threadfence();
      ticket = atomicAdd(counter, 1);
    }
    __syncthreads();
    if (ticket != groups - 1) return;
    __threadfence();
    b = gather_partials(ws, parts, groups, scratch);
  } else {
    if (tid == 0) {
      write_partial(ws, part, b);
      __threadfence();
      ticket = atomicAdd(counter, 1);
    }
    __syncthreads();
    if (ticket != parts - 1) return;
    // The last block: every other block's partial (and whatever it wrote before its
    // fence) is visible.
    __threadfence();
    b = gather_partials(ws, 0, parts, scratch);
  }
  if (tid == 0) {
    int token = b.i;
    float x = b.x;
    if (token == PICK_NONE) {
      token = 0;
      x = value0();
    }
    const float logprob = x - (ref_of(b.m) + logf(b.s));
    if (out.token) out.token[row] = token;
    // The decode step's position moves on here rather than in a kernel of its own
    // after the pick: that kernel neither started early nor let this one launch while
    // the one before finished. Every kernel of the step that reads the position has
    // ended by now (each waited for the one before it).
    if (out.advance && row == 0) *out.advance += 1;
    out.out_token[row] = token;
    out.out_logprob[row] = logprob;
    // The host reads these after waiting on an event recorded behind this kernel.
    // The event completes only after the kernel has, and a completed kernel's stores,
    // to mapped pinned memory too, are visible to the host that synchronised with it
    // (the CUDA guide's rule for mapped memory: order accesses with streams or
    // events). sys_fence adds an explicit system-scope fence on top: the stores are
    // then performed for the host before this thread goes on, whatever the
    // interconnect; micro_greedy.py measures what it costs.
    if (out.sys_fence) __threadfence_system();
    *counter = 0;
  }
}
