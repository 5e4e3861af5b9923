// Sum of a float32 array: out[0] += x[0] + x[1] + ... + x[n-1], accumulated with atomicAdd.
//
// A surrotune kernel template: each tuning parameter below appears as a dollar-brace placeholder
// once, in the constexpr block, and the code uses only the constexpr names.
//
// Launch
//   block = BLOCK_SIZE threads, one-dimensional
//   grid  = cdiv(n, BLOCK_SIZE * ITEMS_PER_THREAD * VEC) when BLOCKS_PER_SM == 0 (one pass: the
//           grid must cover the array, the kernel has no loop), else SMS * BLOCKS_PER_SM
//           (grid-stride: any grid is correct; SMS = 132 on an H200)
//   shared memory: static only (no dynamic shared memory)
//   out must hold 0 (or the value to add to) before the launch: every block adds its partial sum
//   to it with atomicAdd, so the experiment declares it fill = "zeros".
//
// Algorithm: the array, seen as vectors of VEC floats, is cut into chunks of BLOCK_SIZE *
// ITEMS_PER_THREAD vectors. A block reduces a chunk by having each thread issue its
// ITEMS_PER_THREAD vector loads (BLOCK_SIZE vectors apart, so that a warp's loads are contiguous)
// before it adds any of them: into registers (STAGE = 0; the compiler decides how many of them are
// really in flight at once, which it bounds by the registers it is willing to use), or as
// asynchronous copies into shared memory (STAGE = 1, cp.async, Ampere and newer: all of them are
// in flight, and the staging buffer holds the whole chunk, BLOCK_SIZE * ITEMS_PER_THREAD * VEC * 4
// bytes). In one pass, block b reduces chunk b; with a grid stride, block b reduces chunks b,
// b + grid, b + 2 * grid, ... into one register. The per-thread sums are then reduced over the
// block and the block's sum is added to out with one atomicAdd.
//
// Tuning parameters
//   BLOCK_SIZE       in [32, 64, 128, 256, 512, 1024]   threads per block
//   ITEMS_PER_THREAD in [1, 2, 4, 8, 16, 32]            vector loads per thread and chunk
//   VEC              in [1, 2, 4]                       floats per load (float, float2, float4)
//   STAGE            in [0, 1]                          0: loads into registers (ld.global.nc);
//                                                       1: cp.async copies to shared memory
//   REDUCE           in [0, 1]                          0: warp shuffles, then the warps' sums
//                                                       through shared memory; 1: shared-memory
//                                                       tree, a barrier per level
//   BLOCKS_PER_SM    in [0, 1, 2, 4, 8, 16]             0: one pass, one chunk per block; else a
//                                                       grid-stride loop over SMS * BLOCKS_PER_SM
//                                                       blocks
//
// Constraints (Python syntax, as the experiment declares them)
//   ITEMS_PER_THREAD * VEC <= 64
// Feasible configurations: 2448 of 2592.
//
// The constraint caps a thread's loads per chunk at 64 floats (256 bytes, four times what a float4
// per thread and ITEMS_PER_THREAD = 4 already keep in flight). Nothing restricts the problem size:
// the kernel is correct for any 0 <= n <= 2^30 and any 4-byte aligned x. Vector loads start at the
// first VEC*4-byte aligned element: the elements before it (fewer than VEC) and those after the
// last whole vector (fewer than VEC) are added by block 0, and the last, partial chunk loads with
// bounds checks.
//
// Inside the space on purpose, so that the tuner learns where they are:
//   * STAGE = 1 with BLOCK_SIZE * ITEMS_PER_THREAD * VEC * 4 bytes of staging over 48 KB fails in
//     ptxas ("uses too much shared data"): a resource failure (180 of the 2448 configurations);
//     below it, large staging buffers cap the blocks per SM (228 KB of shared memory per SM);
//   * registers * BLOCK_SIZE over 65536 compiles but cannot launch ("too many resources
//     requested"): with STAGE = 0, ITEMS_PER_THREAD * VEC = 64 floats take 96 registers, so the
//     24 such configurations with 1024 threads fail;
//   * one pass with small chunks launches up to n / 32 blocks and as many atomicAdds on one
//     address, which serialise in the L2: slow, not failing;
//   * a grid-stride grid of SMS * BLOCKS_PER_SM blocks larger than fits on the GPU at once runs
//     in waves, with SMs idle during the last: slow, not failing.
// There is deliberately no __launch_bounds__, which would turn the register failures into silent
// spilling.
//
// Rounding: everything is added in float32, so the result differs from the exact sum by float32
// rounding, mostly that of the atomicAdds into a running total about as large as the partial
// sums; the order of the atomicAdds is not deterministic, so neither are the last bits of the
// result.
// experiments/reduction_reference.py says how large the error gets and why rtol is 1e-3.

constexpr int BLOCK_SIZE = ${BLOCK_SIZE};
constexpr int ITEMS_PER_THREAD = ${ITEMS_PER_THREAD};
constexpr int VEC = ${VEC};
constexpr int STAGE = ${STAGE};
constexpr int REDUCE = ${REDUCE};
constexpr int BLOCKS_PER_SM = ${BLOCKS_PER_SM};

constexpr bool ONE_PASS = BLOCKS_PER_SM == 0;
constexpr int WARP = 32;
constexpr int WARPS = BLOCK_SIZE / WARP;
constexpr int CHUNK = BLOCK_SIZE * ITEMS_PER_THREAD;  // vectors per chunk

static_assert(VEC == 1 || VEC == 2 || VEC == 4, "VEC must be 1, 2 or 4");
static_assert(BLOCK_SIZE >= WARP && BLOCK_SIZE <= 1024 && (BLOCK_SIZE & (BLOCK_SIZE - 1)) == 0,
              "BLOCK_SIZE must be a power of two from 32 to 1024");
static_assert(ITEMS_PER_THREAD >= 1, "ITEMS_PER_THREAD must be at least 1");
static_assert(ITEMS_PER_THREAD * VEC <= 64, "at most 64 floats per thread and chunk");
static_assert(STAGE == 0 || STAGE == 1, "STAGE is 0 (registers) or 1 (cp.async to shared)");
static_assert(REDUCE == 0 || REDUCE == 1, "REDUCE is 0 (warp shuffles) or 1 (shared tree)");
static_assert(BLOCKS_PER_SM >= 0, "BLOCKS_PER_SM is 0 (one pass) or the blocks per SM");

template <int W> struct VecType;
template <> struct VecType<1> { using type = float; };
template <> struct VecType<2> { using type = float2; };
template <> struct VecType<4> { using type = float4; };
using Vec = VecType<VEC>::type;

__device__ __forceinline__ float vec_sum(float v) { return v; }
__device__ __forceinline__ float vec_sum(float2 v) { return v.x + v.y; }
__device__ __forceinline__ float vec_sum(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// Asynchronous copy of one vector from global to shared memory (4, 8 or 16 bytes; both addresses
// aligned to the size). .cg (L2 only) exists for 16 bytes alone.
__device__ __forceinline__ void copy_async(Vec* dst, const Vec* src) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (VEC == 4) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(src)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(address), "l"(src),
                 "n"(VEC * 4)
                 : "memory");
  }
}

// Wait until this thread's copies have landed; they are then visible to this thread.
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// This thread's share of chunk c: vectors c * CHUNK + threadIdx.x + i * BLOCK_SIZE, all loads
// issued before the first add. CHECKED: the chunk may run past the last vector, nv. With STAGE,
// `stage` is the block's staging buffer, of which this thread uses only its own slots.
template <bool CHECKED>
__device__ __forceinline__ float chunk_sum(const Vec* __restrict__ xv, int c, int nv,
                                           Vec* stage) {
  const int tid = static_cast<int>(threadIdx.x);
  const int first = c * CHUNK + tid;
  float sum = 0.0f;
  if constexpr (STAGE) {
#pragma unroll
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
      const int index = first + i * BLOCK_SIZE;
      if (!CHECKED || index < nv) copy_async(stage + i * BLOCK_SIZE + tid, xv + index);
    }
    wait_copies();
#pragma unroll
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
      const int index = first + i * BLOCK_SIZE;
      if (!CHECKED || index < nv) sum += vec_sum(stage[i * BLOCK_SIZE + tid]);
    }
    // The next chunk's copies overwrite these slots: order them after the reads above.
    __syncwarp();
  } else {
    Vec v[ITEMS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
      const int index = first + i * BLOCK_SIZE;
      if (!CHECKED || index < nv) v[i] = __ldg(xv + index);
    }
#pragma unroll
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
      const int index = first + i * BLOCK_SIZE;
      if (!CHECKED || index < nv) sum += vec_sum(v[i]);
    }
  }
  return sum;
}

// This thread's sum over the chunks its block reduces. full chunks need no bound check; with
// `partial`, chunk `full` is the last and does.
__device__ __forceinline__ float thread_sum(const Vec* __restrict__ xv, int nv, int full,
                                            bool partial, Vec* stage) {
  float acc = 0.0f;
  const int block = static_cast<int>(blockIdx.x);
  if constexpr (ONE_PASS) {
    if (block < full) {
      acc = chunk_sum<false>(xv, block, nv, stage);
    } else if (block == full && partial) {
      acc = chunk_sum<true>(xv, block, nv, stage);
    }
  } else {
    const int grid = static_cast<int>(gridDim.x);
    for (int c = block; c < full; c += grid) acc += chunk_sum<false>(xv, c, nv, stage);
    if (partial && block == full % grid) acc += chunk_sum<true>(xv, full, nv, stage);
  }
  return acc;
}

// The sum over a warp, in lane 0 (the other lanes hold partial sums).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = WARP / 2; offset > 0; offset >>= 1) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

extern "C" __global__ void reduction(const float* __restrict__ x, float* __restrict__ out, int n) {
  const int tid = static_cast<int>(threadIdx.x);

  // Vectors start at the first element whose address is a multiple of VEC * 4 bytes.
  const int misaligned =
      static_cast<int>((reinterpret_cast<unsigned long long>(x) / sizeof(float)) % VEC);
  const int head = min(n, misaligned == 0 ? 0 : VEC - misaligned);
  const int nv = (n - head) / VEC;  // whole vectors after the head
  const Vec* xv = reinterpret_cast<const Vec*>(x + head);
  const int full = nv / CHUNK;  // chunks without a bound check
  const bool partial = full * CHUNK < nv;  // and one more, with

  float acc;
  if constexpr (STAGE) {
    __shared__ __align__(16) Vec stage[CHUNK];
    acc = thread_sum(xv, nv, full, partial, stage);
  } else {
    acc = thread_sum(xv, nv, full, partial, nullptr);
  }
  if (blockIdx.x == 0) {  // the scalars: fewer than VEC before the vectors, fewer than VEC after
    if (tid < head) acc += x[tid];
    const int rest = head + nv * VEC;
    if (tid < n - rest) acc += x[rest + tid];
  }

  if constexpr (REDUCE == 0) {
    const int lane = tid % WARP;
    const int warp = tid / WARP;
    float sum = warp_sum(acc);
    if constexpr (WARPS == 1) {
      if (lane == 0) atomicAdd(out, sum);
    } else {
      __shared__ float warp_sums[WARPS];
      if (lane == 0) warp_sums[warp] = sum;
      __syncthreads();
      if (warp == 0) {
        sum = warp_sum(lane < WARPS ? warp_sums[lane] : 0.0f);
        if (lane == 0) atomicAdd(out, sum);
      }
    }
  } else {
    __shared__ float partials[BLOCK_SIZE];
    partials[tid] = acc;
    __syncthreads();
#pragma unroll
    for (int stride = BLOCK_SIZE / 2; stride > 0; stride >>= 1) {
      if (tid < stride) partials[tid] += partials[tid + stride];
      __syncthreads();
    }
    if (tid == 0) atomicAdd(out, partials[0]);
  }
}
