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
// before it adds any of them, so that ITEMS_PER_THREAD * VEC * 4 bytes per thread are in flight.
// In one pass, block b reduces chunk b; with a grid stride, block b reduces chunks b, b + grid,
// b + 2 * grid, ... into one register. The per-thread sums are then reduced over the block and the
// block's sum (or each warp's) is added to out with one atomicAdd.
//
// Tuning parameters
//   BLOCK_SIZE       in [32, 64, 128, 256, 512, 1024]   threads per block
//   ITEMS_PER_THREAD in [1, 2, 4, 8, 16, 32]            vector loads in flight per thread and chunk
//   VEC              in [1, 2, 4]                       floats per load (float, float2, float4)
//   REDUCE           in [0, 1, 2]                       0: warp shuffles, then the warps' sums in
//                                                       shared memory, one atomicAdd per block;
//                                                       1: shared-memory tree (a barrier per
//                                                       level), one atomicAdd per block;
//                                                       2: warp shuffles, one atomicAdd per warp
//   BLOCKS_PER_SM    in [0, 1, 2, 4, 8, 16, 32]         0: one pass, one chunk per block; else a
//                                                       grid-stride loop over SMS * BLOCKS_PER_SM
//                                                       blocks
//
// Constraints (Python syntax, as the experiment declares them)
//   ITEMS_PER_THREAD * VEC <= 64
// Feasible configurations: 2142 of 2268.
//
// The constraint caps a thread's loads in flight at 64 floats (256 bytes, four times what a
// float4 per thread and ITEMS_PER_THREAD = 4 already keep in flight); it prunes configurations
// whose only effect is more registers. Nothing restricts the problem size: the kernel is correct
// for any n >= 0 (n < 2^31) and any 4-byte aligned x. Vector loads start at the first
// VEC*4-byte aligned element: the elements before it (fewer than VEC) and the ones after the last
// whole vector (fewer than VEC) are added by block 0, and the last, partial chunk loads with
// bounds checks.
//
// Inside the space on purpose, so that the tuner learns where they are:
//   * registers * BLOCK_SIZE over 65536 compiles but cannot launch ("too many resources
//     requested"): ITEMS_PER_THREAD * VEC = 64 needs more than 64 registers per thread, so every
//     such configuration with 1024 threads fails; there is deliberately no __launch_bounds__,
//     which would turn this into silent spilling;
//   * one pass with small chunks launches up to n / 32 blocks and as many atomicAdds on one
//     address, which serialise in the L2: slow, not failing;
//   * a grid-stride grid of SMS * BLOCKS_PER_SM blocks larger than fits on the GPU at once runs
//     in several waves, with a tail of idle SMs: slow, not failing.
//
// Rounding: every thread adds its loads in float32, so the result differs from the exact sum by
// float32 rounding; for uniform [-1, 1) inputs the relative error stays below 1e-4 at n = 2^26
// (see experiments/reduction_reference.py). The order of the atomicAdds is not deterministic, so
// neither are the last bits of the result.

constexpr int BLOCK_SIZE = ${BLOCK_SIZE};
constexpr int ITEMS_PER_THREAD = ${ITEMS_PER_THREAD};
constexpr int VEC = ${VEC};
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
static_assert(ITEMS_PER_THREAD * VEC <= 64, "at most 64 floats in flight per thread");
static_assert(REDUCE >= 0 && REDUCE <= 2, "REDUCE is 0 (shuffle), 1 (shared tree) or 2 (per warp)");
static_assert(BLOCKS_PER_SM >= 0, "BLOCKS_PER_SM is 0 (one pass) or the blocks per SM");

template <int W> struct VecType;
template <> struct VecType<1> { using type = float; };
template <> struct VecType<2> { using type = float2; };
template <> struct VecType<4> { using type = float4; };
using Vec = VecType<VEC>::type;

__device__ __forceinline__ float vec_sum(float v) { return v; }
__device__ __forceinline__ float vec_sum(float2 v) { return v.x + v.y; }
__device__ __forceinline__ float vec_sum(float4 v) { return (v.x + v.y) + (v.z + v.w); }

__device__ __forceinline__ Vec vec_zero() {
  Vec v;
  float* f = reinterpret_cast<float*>(&v);
#pragma unroll
  for (int e = 0; e < VEC; ++e) f[e] = 0.0f;
  return v;
}

// This thread's share of chunk c: vectors c * CHUNK + threadIdx.x + i * BLOCK_SIZE, all loads
// issued before the first add. CHECKED: the chunk may run past the last vector, nv.
template <bool CHECKED>
__device__ __forceinline__ float chunk_sum(const Vec* __restrict__ xv, int c, int nv) {
  const int first = c * CHUNK + static_cast<int>(threadIdx.x);
  Vec v[ITEMS_PER_THREAD];
#pragma unroll
  for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
    const int index = first + i * BLOCK_SIZE;
    v[i] = (!CHECKED || index < nv) ? __ldg(xv + index) : vec_zero();
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS_PER_THREAD; ++i) sum += vec_sum(v[i]);
  return sum;
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
  const bool partial = full * CHUNK < nv;  // and one more with

  float acc = 0.0f;
  if constexpr (ONE_PASS) {
    const int c = static_cast<int>(blockIdx.x);
    if (c < full) {
      acc = chunk_sum<false>(xv, c, nv);
    } else if (c == full && partial) {
      acc = chunk_sum<true>(xv, c, nv);
    }
  } else {
    const int grid = static_cast<int>(gridDim.x);
    for (int c = static_cast<int>(blockIdx.x); c < full; c += grid) {
      acc += chunk_sum<false>(xv, c, nv);
    }
    if (partial && static_cast<int>(blockIdx.x) == full % grid) {
      acc += chunk_sum<true>(xv, full, nv);
    }
  }
  if (blockIdx.x == 0) {  // the scalars: fewer than VEC before the vectors, fewer than VEC after
    if (tid < head) acc += x[tid];
    const int rest = head + nv * VEC;
    if (tid < n - rest) acc += x[rest + tid];
  }

  const int lane = tid % WARP;
  const int warp = tid / WARP;
  if constexpr (REDUCE == 0) {
    __shared__ float warp_sums[WARPS];
    float sum = warp_sum(acc);
    if constexpr (WARPS == 1) {
      if (lane == 0) atomicAdd(out, sum);
    } else {
      if (lane == 0) warp_sums[warp] = sum;
      __syncthreads();
      if (warp == 0) {
        sum = warp_sum(lane < WARPS ? warp_sums[lane] : 0.0f);
        if (lane == 0) atomicAdd(out, sum);
      }
    }
  } else if constexpr (REDUCE == 1) {
    __shared__ float partials[BLOCK_SIZE];
    partials[tid] = acc;
    __syncthreads();
#pragma unroll
    for (int stride = BLOCK_SIZE / 2; stride > 0; stride >>= 1) {
      if (tid < stride) partials[tid] += partials[tid + stride];
      __syncthreads();
    }
    if (tid == 0) atomicAdd(out, partials[0]);
  } else {
    const float sum = warp_sum(acc);
    if (lane == 0) atomicAdd(out, sum);
  }
}
