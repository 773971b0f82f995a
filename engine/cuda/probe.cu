// Probes of what a kernel boundary costs, for bench/micro_boundary.py (not used by the
// engine): a decode step is ~150 small dependent kernels, so the fixed cost of one
// launch inside a CUDA graph (with and without programmatic dependent launch) and the
// ramp of a kernel that streams a few MB set how close a kernel-per-op design can get
// to the floor.
//
// probe_phases(_count, _flags): the same work as `phases` launches of probe_stream, in
// one persistent launch whose blocks meet at a grid-wide barrier between phases instead
// of at kernel boundaries (every block must be resident at once: the bench sizes the
// grid by the occupancy query). A phase's loads are issued before the block waits for the previous
// phase (as the next kernel's weights before griddepcontrol.wait), and its output adds
// a neighbouring block's output of the previous phase, so a barrier that lets a block
// through early shows up as a wrong sum. A wait that spins past its limit sets *err
// and gives up rather than hanging the GPU. The three kernels differ only in the
// barrier (BAR_GEN, BAR_COUNT, BAR_FLAGS below).
//
// probe_stream: each block sums its `per_block` 16-byte vectors of `src` and writes one
// float, then adds the previous launch's value of its slot (the data dependency a layer
// has on the one before). Loads are issued before griddepcontrol.wait, as nib's GEMVs
// issue their weight loads; `per_block` 0 makes it a pure boundary: wait, read, write.
//
// probe_stream_red_u64 / probe_stream_red_f32: probe_stream, then every block adds its
// contribution to each of `red_words` shared words in global memory, as a kernel that
// fuses two ops whose second is split over the first's outputs (a layer's gate_up and
// down, each block owning a slice of the intermediate) must reduce every block's partial
// output. _u64: one `red.add.u64` a word (fixed-point, so the sum is the same in any
// order: deterministic); _f32: one `red.add.v4.f32` per four words (order-dependent
// rounding). Block b adds b + 1 to each of the `red_words` words from (b % red_spread) x
// red_words on: with red_spread C, the blocks of a cluster of C that reduced their
// partials in shared memory first, each adding its own 1/C of the cluster's sum (so a
// word takes blocks / C additions, not one from every block).
#include "common.cuh"

struct ProbeArgs {
  const uint4* src;  // [blocks][per_block] 16-byte vectors (may be null when per_block = 0)
  const float* prev;  // [blocks] the previous launch's outputs
  float* out;         // [blocks]
  int per_block;      // vectors per block
  void* red;          // probe_stream_red_*: [red_words] u64 or f32 words every block adds to
  int red_words;      // per block (a multiple of 4 for _f32)
  int red_spread;     // blocks b and b + red_spread add to the same words
};

// The next U of this thread's vectors (stride `step`, `n` in all; zeros past the end).
template <int U>
NIB_DEVICE void fill_buf(uint4 (&buf)[U], const uint4* p, int i, int step, int n) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    buf[u] = i + u * step < n ? ld_stream(p + i + u * step) : make_uint4(0, 0, 0, 0);
}

// Sum what buf holds (filled from i), then stream and sum the rest of the n vectors.
template <int U>
NIB_DEVICE float stream_rest(uint4 (&buf)[U], const uint4* p, int i, int step, int n) {
  float s = 0.f;
  for (;;) {
#pragma unroll
    for (int u = 0; u < U; ++u) s += (float)(buf[u].x & 1u) + (float)(buf[u].w & 1u);
    i += U * step;
    if (i >= n) break;
    fill_buf(buf, p, i, step, n);
  }
  return s;
}

enum { RED_NONE = 0, RED_U64 = 1, RED_F32 = 2 };

template <int U, int RED>
NIB_DEVICE void probe_body(const ProbeArgs& a) {
  pdl_launch_dependents();
  const uint4* p = a.src + (size_t)blockIdx.x * a.per_block;
  const int step = (int)blockDim.x;
  uint4 buf[U];
  fill_buf(buf, p, (int)threadIdx.x, step, a.per_block);
  pdl_wait();
  float s = stream_rest(buf, p, (int)threadIdx.x, step, a.per_block);
  extern __shared__ float scratch[];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) a.out[blockIdx.x] = s + ld_cg(a.prev + blockIdx.x);
  if constexpr (RED == RED_U64) {
    unsigned long long* w =
        static_cast<unsigned long long*>(a.red) + (size_t)(blockIdx.x % a.red_spread) * a.red_words;
    for (int i = threadIdx.x; i < a.red_words; i += blockDim.x)
      atomicAdd(w + i, (unsigned long long)blockIdx.x + 1ull);
  } else if constexpr (RED == RED_F32) {
    float* w = static_cast<float*>(a.red) + (size_t)(blockIdx.x % a.red_spread) * a.red_words;
    const float v = (float)blockIdx.x + 1.f;
    for (int i = 4 * threadIdx.x; i < a.red_words; i += 4 * blockDim.x)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                   ::"l"(w + i), "f"(v), "f"(v), "f"(v), "f"(v) : "memory");
  }
}

extern "C" __global__ void __launch_bounds__(256) probe_stream(const ProbeArgs a) {
  probe_body<8, RED_NONE>(a);
}
extern "C" __global__ void __launch_bounds__(256) probe_stream_red_u64(const ProbeArgs a) {
  probe_body<8, RED_U64>(a);
}
extern "C" __global__ void __launch_bounds__(256) probe_stream_red_f32(const ProbeArgs a) {
#if __CUDA_ARCH__ >= 900
  probe_body<8, RED_F32>(a);
#endif
}

// ---- the grid barrier of probe_phases ----------------------------------------------
NIB_DEVICE unsigned ld_acquire_u32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
NIB_DEVICE void st_release_u32(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

struct PhaseArgs {
  const uint4* src;  // [phases][blocks][per_block] 16-byte vectors (phase regions may repeat)
  float* out;        // [phases][blocks]
  unsigned* count;   // arrivals at the current barrier, zero between launches
  unsigned* gen;     // barrier generation: grows by `phases` per launch, never reset
  int* err;          // set when a wait gave up
  long long region;  // vectors between consecutive phases' data (wraps modulo `wrap`)
  long long wrap;    // vectors in the source pool
  unsigned* flags;    // [blocks] per-block phase counters (BAR_FLAGS), never reset
  int per_block;
  int phases;
  int spin_limit;
};

// How the blocks meet between phases:
//   BAR_GEN   one atomic count; the last block in resets it and publishes a generation.
//   BAR_COUNT one monotonic count (release add, no return); every block polls it until
//             all blocks' arrivals of this phase are in: no last-arriver round trip.
//   BAR_FLAGS each block release-stores its own phase counter; warp 0 of every block
//             polls all of them: no atomics, no single hot word.
enum { BAR_GEN = 0, BAR_COUNT = 1, BAR_FLAGS = 2 };

// This block has written its output of the phase: count it in; the last block in starts
// the next generation (count back to zero first, published by the release store).
NIB_DEVICE void grid_arrive(const PhaseArgs& a, unsigned next_gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.count, 1u) == gridDim.x - 1) {
      *a.count = 0u;
      __threadfence();
      st_release_u32(a.gen, next_gen);
    }
  }
}

// Thread 0 spins until *word reaches `target` (or the spin limit), then the block goes on.
NIB_DEVICE void spin_until(const PhaseArgs& a, const unsigned* word, unsigned target) {
  if (threadIdx.x == 0) {
    int spins = 0;
    while ((int)(ld_acquire_u32(word) - target) < 0) {
      if (++spins > a.spin_limit) {
        atomicExch(a.err, 1);
        break;
      }
    }
  }
  __syncthreads();
}

// Until every block has arrived at generation `target` (or the spin limit).
NIB_DEVICE void grid_wait(const PhaseArgs& a, unsigned target) { spin_until(a, a.gen, target); }

NIB_DEVICE void red_release_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// BAR_COUNT: arrivals only ever grow, so phase ph's barrier is "count >= base + nb (ph + 1)".
NIB_DEVICE void count_arrive(const PhaseArgs& a) {
  __syncthreads();
  if (threadIdx.x == 0) red_release_add(a.count, 1u);
}
NIB_DEVICE void count_wait(const PhaseArgs& a, unsigned target) { spin_until(a, a.count, target); }

// BAR_FLAGS: block b's flag is the number of phases it has finished (plus its base).
NIB_DEVICE void flag_arrive(const PhaseArgs& a, unsigned done) {
  __syncthreads();
  if (threadIdx.x == 0) st_release_u32(a.flags + blockIdx.x, done);
}
NIB_DEVICE void flag_wait(const PhaseArgs& a, unsigned target) {
  if (threadIdx.x < 32) {
    int spins = 0;
    for (;;) {
      bool mine = true;
      for (unsigned b = threadIdx.x; b < gridDim.x; b += 32)
        mine = mine && (int)(ld_acquire_u32(a.flags + b) - target) >= 0;
      if (__all_sync(0xffffffffu, mine)) break;
      if (++spins > a.spin_limit) {
        if (threadIdx.x == 0) atomicExch(a.err, 1);
        break;
      }
    }
  }
  __syncthreads();
}

template <int U, int BAR>
NIB_DEVICE void phases_body(const PhaseArgs& a) {
  extern __shared__ float scratch[];
  __shared__ unsigned base;
  const int nb = gridDim.x, step = (int)blockDim.x;
  if (threadIdx.x == 0) {
    if (BAR == BAR_GEN) {
      base = ld_acquire_u32(a.gen);  // moves only once every block has arrived
    } else if (BAR == BAR_COUNT) {
      // Every launch adds nb * phases; blocks already in this launch's first phase have
      // added fewer than nb, so rounding down finds where this launch started.
      const unsigned c = ld_acquire_u32(a.count), per = (unsigned)nb * (unsigned)a.phases;
      base = c - c % per;
    } else {
      base = ld_acquire_u32(a.flags + blockIdx.x);  // only this block writes it
    }
  }
  __syncthreads();
  const unsigned g0 = base;
  uint4 buf[U];
  for (int ph = 0; ph < a.phases; ++ph) {
    const long long off = ((long long)ph * a.region) % a.wrap;
    const uint4* p = a.src + off + (size_t)blockIdx.x * a.per_block;
    // This phase's "weights": independent of the previous phase.
    fill_buf(buf, p, (int)threadIdx.x, step, a.per_block);
    if (ph > 0) {  // the previous phase's outputs are all written
      if (BAR == BAR_GEN) grid_wait(a, g0 + ph);
      if (BAR == BAR_COUNT) count_wait(a, g0 + (unsigned)nb * ph);
      if (BAR == BAR_FLAGS) flag_wait(a, g0 + ph);
    }
    float s = stream_rest(buf, p, (int)threadIdx.x, step, a.per_block);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
      const float prev = ph > 0 ? ld_cg(a.out + (size_t)(ph - 1) * nb + (blockIdx.x + 1) % nb) : 0.f;
      a.out[(size_t)ph * nb + blockIdx.x] = s + prev;
    }
    if (BAR == BAR_GEN) grid_arrive(a, g0 + ph + 1);
    if (BAR == BAR_COUNT) count_arrive(a);
    if (BAR == BAR_FLAGS) flag_arrive(a, g0 + ph + 1);
  }
}

extern "C" __global__ void __launch_bounds__(256) probe_phases(const PhaseArgs a) {
  phases_body<8, BAR_GEN>(a);
}
extern "C" __global__ void __launch_bounds__(256) probe_phases_count(const PhaseArgs a) {
  phases_body<8, BAR_COUNT>(a);
}
// (256, 1): without the occupancy hint ptxas caps the spin loop's kernel at 32 registers
// on sm_80 and spills the eight buffered vectors.
extern "C" __global__ void __launch_bounds__(256, 1) probe_phases_flags(const PhaseArgs a) {
  phases_body<8, BAR_FLAGS>(a);
}

// ---- probe_ring: a persistent kernel whose weight stream never waits for a barrier -----
// What a whole-step persistent ("mega") kernel could gain over kernel-per-op. A decode
// step's weights do not depend on its activations, so one warp of every block (the
// producer) streams the block's share of every phase's data, phase after phase, into a
// ring of shared-memory slots by bulk copies (cp.async.bulk, completing on an mbarrier
// per slot), limited only by the ring's depth, never by the grid barrier. The other 8
// warps (the consumers) wait at the grid barrier (BAR_COUNT's monotonic count) for the
// previous phase, then read its output (the "activation", from L2: every consumer thread
// waits for it before its first multiply-add, as a GEMV's products wait for their
// input), consume the phase's slots as they fill and hand each slot back (an arrival on
// its `empty` mbarrier). Phases may differ in size (a layer's q/k/v, attention, o_proj,
// gate_up and down), given per phase. sm_90 only (bulk copies); every block must be
// resident at once (one block per SM: the ring takes most of shared memory).
struct RingArgs {
  const uint4* src;            // the data pool
  float* out;                  // [phases][blocks]
  unsigned* count;             // arrivals (monotonic: every launch adds blocks x phases)
  int* err;                    // set when a grid-barrier wait gave up
  const long long* offs;       // [phases] the phase's first vector in src
  const int* per_block;        // [phases] vectors of 16 bytes per block in the phase
  int phases;
  int chunk_vecs;              // vectors per ring slot
  int stages;                  // ring slots (at most RING_MAX_STAGES)
  int spin_limit;
  int mode;                    // RING_* bits below; 0 for the probe as described
  unsigned long long* stamps;  // [phases][blocks][2] or null: %globaltimer when the block
                               // passed the phase's barrier and when it arrived at the next
};

// Diagnostic modes (outputs are then not the reference's; the bench does not check them):
enum { RING_NO_BARRIER = 1,  // consumers do not wait for the previous phase
       RING_NO_READ = 2 };   // consumers hand every slot back unread

constexpr int RING_CONSUMER_WARPS = 8;
constexpr int RING_CONSUMERS = RING_CONSUMER_WARPS * 32;
constexpr int RING_MAX_STAGES = 64;

#if __CUDA_ARCH__ >= 900
NIB_DEVICE void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
NIB_DEVICE unsigned long long ring_clock() {  // ns, one clock for all SMs
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// The consumer warps only (the producer warp never joins): named barrier 1.
NIB_DEVICE void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(RING_CONSUMERS) : "memory"); }
#endif

extern "C" __global__ void __launch_bounds__(RING_CONSUMERS + 32, 1) probe_ring(const RingArgs a) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint4 ring[];
  __shared__ __align__(8) u64 full[RING_MAX_STAGES];
  __shared__ __align__(8) u64 empty[RING_MAX_STAGES];
  __shared__ float part[RING_CONSUMER_WARPS];
  __shared__ unsigned base;
  const int nb = gridDim.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < a.stages; ++s) {
      mbar_init(&full[s], 1);                     // the producer's expect_tx arrival
      mbar_init(&empty[s], RING_CONSUMER_WARPS);  // one arrival per consumer warp
    }
    fence_mbar_init();
    // As probe_phases_count: blocks of this launch already in phase 0 added fewer than nb.
    const unsigned c = ld_acquire_u32(a.count), per = (unsigned)nb * (unsigned)a.phases;
    base = c - c % per;
  }
  __syncthreads();  // the last block-wide barrier: the producer warp leaves below
  if (warp == RING_CONSUMER_WARPS) {
    if (lane == 0) {
      unsigned fill = 0;
      for (int ph = 0; ph < a.phases; ++ph) {
        const int n = a.per_block[ph];
        const uint4* p = a.src + a.offs[ph] + (size_t)blockIdx.x * n;
        for (int i = 0; i < n; i += a.chunk_vecs, ++fill) {
          const int slot = (int)(fill % (unsigned)a.stages);
          const unsigned round = fill / (unsigned)a.stages;
          if (round > 0) mbar_wait(&empty[slot], (round - 1) & 1u);  // consumers are done with it
          const int v = min(a.chunk_vecs, n - i);
          mbar_expect_tx(&full[slot], (u32)v * 16u);
          bulk_g2s(ring + (size_t)slot * a.chunk_vecs, p + i, (u32)v * 16u, &full[slot]);
        }
      }
    }
    return;
  }
  unsigned use = 0;
  for (int ph = 0; ph < a.phases; ++ph) {
    const int n = a.per_block[ph];
    if (ph > 0 && !(a.mode & RING_NO_BARRIER)) {  // every block's output of the previous phase is written
      if (threadIdx.x == 0) {
        const unsigned target = base + (unsigned)nb * (unsigned)ph;
        int spins = 0;
        while ((int)(ld_acquire_u32(a.count) - target) < 0) {
          if (++spins > a.spin_limit) {
            atomicExch(a.err, 1);
            break;
          }
        }
      }
      consumers_sync();
    }
    if (a.stamps && threadIdx.x == 0) a.stamps[((size_t)ph * nb + blockIdx.x) * 2] = ring_clock();
    // The "activation": a neighbour's output of the previous phase, read by every thread.
    // The sums are never negative, so w is 1, but no multiply-add can start before it.
    const float act = ph > 0 ? ld_cg(a.out + (size_t)(ph - 1) * nb + (blockIdx.x + 1) % nb) : 0.f;
    const float w = act >= 0.f ? 1.f : 2.f;
    float s = 0.f;
    for (int i = 0; i < n; i += a.chunk_vecs, ++use) {
      const int slot = (int)(use % (unsigned)a.stages);
      mbar_wait(&full[slot], (use / (unsigned)a.stages) & 1u);
      const int v = min(a.chunk_vecs, n - i);
      const uint4* c = ring + (size_t)slot * a.chunk_vecs;
      for (int j = threadIdx.x; j < ((a.mode & RING_NO_READ) ? 0 : v); j += RING_CONSUMERS) {
        const uint4 x = c[j];
        s = fmaf((float)(x.x & 1u) + (float)(x.w & 1u), w, s);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
    }
    s = warp_sum(s);
    if (lane == 0) part[warp] = s;
    consumers_sync();
    if (threadIdx.x == 0) {
      float t = 0.f;
#pragma unroll
      for (int k = 0; k < RING_CONSUMER_WARPS; ++k) t += part[k];
      a.out[(size_t)ph * nb + blockIdx.x] = t + act;
      red_release_add(a.count, 1u);  // orders the store above before the arrival
      if (a.stamps) a.stamps[((size_t)ph * nb + blockIdx.x) * 2 + 1] = ring_clock();
    }
  }
#endif
}
