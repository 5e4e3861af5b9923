// LayerNorm forward over the last dimension, float32, x and y of shape [rows, HIDDEN]:
//   y[r, :] = (x[r, :] - mean_r) / sqrt(var_r + 1e-5) * gamma + beta,
// mean_r and var_r (biased, as torch.nn.functional.layer_norm) over the HIDDEN elements of row r.
//
// A surrotune kernel template: each tuning parameter below appears as a dollar-brace placeholder
// once, in the constexpr block, and the code uses only the constexpr names. HIDDEN is a problem
// size ([sizes] of the experiment), substituted the same way, so every loop over a row has a trip
// count known to the compiler; the number of rows is a run-time argument.
//
// Launch
//   block = THREADS_PER_ROW * ROWS_PER_BLOCK threads, one-dimensional
//   grid  = cdiv(rows, ROWS_PER_BLOCK)
//   shared memory: static only (no dynamic shared memory)
//
// Algorithm: THREADS_PER_ROW consecutive threads of a block (part of a warp, a warp, several
// warps) own one row. A row is read as vectors of W floats (W = VEC where HIDDEN % VEC == 0,
// else the widest of 2, 1 that divides HIDDEN), vector v of the row by thread
// v % THREADS_PER_ROW, so that every warp access is contiguous. The row statistics are reduced
// with warp shuffles and, when a row spans several warps, through shared memory (one
// __syncthreads per reduction); then each thread normalises its own elements. Where the row lives
// between the statistics and the output is CACHE: in registers (x read from DRAM once), in shared
// memory (likewise; each thread reads back only what it wrote, so no barrier is needed) or
// nowhere (each later pass loads x again, from the L2 if it is still there; these loads are
// volatile, so that the compiler cannot quietly turn CACHE = 2 into CACHE = 0).
//
// Tuning parameters
//   THREADS_PER_ROW in [16, 32, 64, 128, 256, 512, 1024]   threads that share one row
//   ROWS_PER_BLOCK  in [1, 2, 4, 8, 16, 32]                rows per block
//   VEC             in [1, 2, 4]                           floats per access (float2, float4)
//   ALGO            in [0, 1, 2]                           statistics: 0 = two passes (mean,
//                                                          then the squared deviations from
//                                                          it), 1 = one-pass Welford (merged
//                                                          with Chan's formula), 2 = one pass
//                                                          of sum and sum of squares
//   CACHE           in [0, 1, 2]                           the row between passes: 0 = registers,
//                                                          1 = shared memory, 2 = none (re-read)
//   UNROLL          in [0, 1, 2, 4]                        unrolling of the loops over a thread's
//                                                          vectors: 0 = full, else that factor
//
// Constraints (Python syntax, as the experiment declares them)
//   THREADS_PER_ROW * ROWS_PER_BLOCK >= 32
//   THREADS_PER_ROW * ROWS_PER_BLOCK <= 1024
//   CACHE != 0 or UNROLL == 0
// Feasible configurations: 2106 of 4536.
//
// The first constraint keeps warps full (the shuffles use the full mask), the second is CUDA's
// block limit, the third says that a row cached in registers needs fully unrolled loops (a
// register array indexed by a run-time counter lives in local memory). The kernel is correct for
// any rows >= 1 and HIDDEN >= 1: a thread's last vector may fall past the row's end (skipped), and
// the rows of the last block past `rows` recompute the last row and store nothing. Since
// HIDDEN % W == 0, every row starts aligned when the arrays do: x, y, gamma and beta must be
// aligned to 4 * W bytes (cudaMalloc gives 256); a misaligned one is a launch error (misaligned
// address), never a wrong result. (There is no scalar fallback: a second, unused copy of the
// fully unrolled code would inflate the registers the compiler reports for the kernel.)
// ALGO = 2 computes var = E[x^2] - mean^2 in float32: exact enough for data of mean near zero
// (the experiment's inputs), not for rows whose mean is large against their spread.
//
// Inside the space on purpose, so that the tuner learns where they are:
//   * CACHE = 1 keeps ROWS_PER_BLOCK * HIDDEN floats in static shared memory: over 48 KB
//     (ROWS_PER_BLOCK >= 4 at HIDDEN = 4096: 504 of the 2106 configurations) ptxas fails ("uses
//     too much shared data"), a resource failure;
//   * CACHE = 0 keeps HIDDEN / THREADS_PER_ROW floats per thread in registers: 256 or 128 (16 or
//     32 threads per row at HIDDEN = 4096) hit the 255-register cap and spill to local memory
//     (slow, not failing), and registers * threads over 65536 compiles but cannot launch ("too
//     many resources requested"): 1024-thread blocks with 32 or more floats per thread, 512-thread
//     blocks with 64 (some ALGO just over, some just under); there is deliberately no
//     __launch_bounds__, which would turn this into silent spilling;
//   * CACHE = 2 with UNROLL = 0 lets ptxas hoist a whole pass of loads: with many vectors per
//     thread this too reaches the register cap and spills;
//   * slow but correct: CACHE = 2 with ALGO = 0 reads x three times; ALGO = 1 does an IEEE
//     division per element; VEC = 1 issues four times the loads of VEC = 4.

constexpr int HIDDEN = ${HIDDEN};
constexpr int THREADS_PER_ROW = ${THREADS_PER_ROW};
constexpr int ROWS_PER_BLOCK = ${ROWS_PER_BLOCK};
constexpr int VEC = ${VEC};
constexpr int ALGO = ${ALGO};
constexpr int CACHE = ${CACHE};
constexpr int UNROLL = ${UNROLL};

constexpr float EPS = 1e-5f;
constexpr int THREADS = THREADS_PER_ROW * ROWS_PER_BLOCK;
// the vector width actually used: VEC where it divides HIDDEN, so that every row starts aligned
constexpr int W = HIDDEN % VEC == 0 ? VEC : (VEC >= 2 && HIDDEN % 2 == 0) ? 2 : 1;
constexpr int ROW_VECS = HIDDEN / W;                                     // vectors per row
constexpr int ITEMS = (ROW_VECS + THREADS_PER_ROW - 1) / THREADS_PER_ROW;  // vectors per thread
constexpr bool EVEN = ROW_VECS % THREADS_PER_ROW == 0;  // no thread's last vector is past the end
constexpr int ITEM_UNROLL = UNROLL == 0 ? ITEMS : UNROLL;
constexpr int WARP = THREADS_PER_ROW < 32 ? THREADS_PER_ROW : 32;  // shuffle width
constexpr int WARPS_PER_ROW = THREADS_PER_ROW / WARP;
constexpr int SLOTS = ALGO == 0 ? 2 : 1;  // reductions per row, each with its own shared slot
constexpr int ROW_CACHE_FLOATS = CACHE == 1 ? ROWS_PER_BLOCK * HIDDEN : 1;
constexpr int PARTIAL_FLOATS = WARPS_PER_ROW > 1 ? SLOTS * ROWS_PER_BLOCK * WARPS_PER_ROW * 3 : 1;

static_assert(HIDDEN >= 1, "HIDDEN must be positive");
static_assert(VEC == 1 || VEC == 2 || VEC == 4, "VEC must be 1, 2 or 4");
static_assert(THREADS_PER_ROW >= 1 && THREADS_PER_ROW <= 1024 &&
                  (THREADS_PER_ROW & (THREADS_PER_ROW - 1)) == 0,
              "THREADS_PER_ROW must be a power of two up to 1024");
static_assert(ROWS_PER_BLOCK >= 1, "ROWS_PER_BLOCK must be positive");
static_assert(THREADS % 32 == 0, "a block must be whole warps (32 <= threads per block)");
static_assert(THREADS <= 1024, "at most 1024 threads per block");
static_assert(ALGO >= 0 && ALGO <= 2, "ALGO is 0 (two-pass), 1 (Welford) or 2 (sum of squares)");
static_assert(CACHE >= 0 && CACHE <= 2, "CACHE is 0 (registers), 1 (shared) or 2 (none)");
static_assert(UNROLL >= 0, "UNROLL is 0 (full) or a positive unroll factor");
static_assert(CACHE != 0 || UNROLL == 0, "a row cached in registers needs UNROLL = 0 (full)");

// W contiguous floats at p (aligned to W floats), as one access.
__device__ __forceinline__ void load_vec(float (&dst)[W], const float* p) {
  if constexpr (W == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
  } else if constexpr (W == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    dst[0] = v.x; dst[1] = v.y;
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) dst[e] = p[e];
  }
}

__device__ __forceinline__ void store_vec(float* p, const float (&src)[W]) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(src[0], src[1], src[2], src[3]);
  } else if constexpr (W == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(src[0], src[1]);
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) p[e] = src[e];
  }
}

// W floats of x at p again, in a later pass of CACHE = 2: a volatile load, so that the compiler
// cannot reuse the values of the first pass instead (it would, with fully unrolled loops, and the
// configuration would silently become CACHE = 0).
__device__ __forceinline__ void reload_vec(float (&dst)[W], const float* p) {
  const size_t g = __cvta_generic_to_global(p);
  if constexpr (W == 4) {
    asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(dst[0]), "=f"(dst[1]), "=f"(dst[2]), "=f"(dst[3])
                 : "l"(g));
  } else if constexpr (W == 2) {
    asm volatile("ld.global.nc.v2.f32 {%0, %1}, [%2];" : "=f"(dst[0]), "=f"(dst[1]) : "l"(g));
  } else {
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(dst[0]) : "l"(g));
  }
}

// Welford's running statistics: count, mean, sum of squared deviations from the mean.
struct Moments {
  float n, mean, m2;
};

// Chan's merge of two sets of moments; `a` comes first, so that both partners of a butterfly
// (which call it with the same operands in the same order) get bit-identical results.
__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  const float n = a.n + b.n;
  if (n == 0.0f) return a;
  const float nb_n = b.n / n;
  const float delta = b.mean - a.mean;
  return {n, a.mean + delta * nb_n, a.m2 + b.m2 + delta * delta * a.n * nb_n};
}

// Offset of partial k of warp w of row r in reduction `slot`.
__device__ __forceinline__ int partial_index(int slot, int r, int w, int k) {
  return ((slot * ROWS_PER_BLOCK + r) * WARPS_PER_ROW + w) * 3 + k;
}

// Sums of N values over the THREADS_PER_ROW threads of a row; every thread of the row gets the
// same (bit-identical) totals.
template <int SLOT, int N>
__device__ __forceinline__ void row_sum(float (&v)[N], float* partials, int r, int lane) {
#pragma unroll
  for (int offset = WARP / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], offset);
  }
  if constexpr (WARPS_PER_ROW > 1) {
    if (lane % 32 == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) partials[partial_index(SLOT, r, lane / 32, k)] = v[k];
    }
    __syncthreads();  // each reduction has its own slot: no second barrier before reuse
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS_PER_ROW; ++w) total += partials[partial_index(SLOT, r, w, k)];
      v[k] = total;
    }
  }
}

// Welford moments merged over the threads of a row, the same on every thread of the row.
__device__ __forceinline__ Moments row_moments(Moments m, float* partials, int r, int lane) {
#pragma unroll
  for (int offset = WARP / 2; offset > 0; offset /= 2) {
    const Moments other = {__shfl_xor_sync(0xffffffffu, m.n, offset),
                           __shfl_xor_sync(0xffffffffu, m.mean, offset),
                           __shfl_xor_sync(0xffffffffu, m.m2, offset)};
    m = (lane & offset) ? merge(other, m) : merge(m, other);  // lower lane's moments first
  }
  if constexpr (WARPS_PER_ROW > 1) {
    if (lane % 32 == 0) {
      partials[partial_index(0, r, lane / 32, 0)] = m.n;
      partials[partial_index(0, r, lane / 32, 1)] = m.mean;
      partials[partial_index(0, r, lane / 32, 2)] = m.m2;
    }
    __syncthreads();
    m = {partials[partial_index(0, r, 0, 0)], partials[partial_index(0, r, 0, 1)],
         partials[partial_index(0, r, 0, 2)]};
#pragma unroll
    for (int w = 1; w < WARPS_PER_ROW; ++w) {
      m = merge(m, {partials[partial_index(0, r, w, 0)], partials[partial_index(0, r, w, 1)],
                    partials[partial_index(0, r, w, 2)]});
    }
  }
  return m;
}

// Vector i of this thread: element offset in the row, and whether it lies inside the row.
__device__ __forceinline__ int item_offset(int lane, int i) {
  return (lane + i * THREADS_PER_ROW) * W;
}
__device__ __forceinline__ bool item_valid(int lane, int i) {
  return EVEN || i < ITEMS - 1 || lane + i * THREADS_PER_ROW < ROW_VECS;
}

using Cache = float[CACHE == 0 ? ITEMS : 1][W];  // a thread's vectors of the row (CACHE = 0)

// Vector i of this thread's row from wherever CACHE keeps it (after the first pass).
__device__ __forceinline__ void fetch(float (&v)[W], const Cache& regs, const float* srow,
                                      const float* xr, int o, int i) {
  if constexpr (CACHE == 0) {
#pragma unroll
    for (int e = 0; e < W; ++e) v[e] = regs[i][e];
  } else if constexpr (CACHE == 1) {
    load_vec(v, srow + o);  // shared rows are 16-byte aligned and HIDDEN % W == 0
  } else {
    reload_vec(v, xr + o);
  }
}

__device__ __forceinline__ void layernorm_row(const float* __restrict__ xr,
                                              const float* __restrict__ gamma,
                                              const float* __restrict__ beta,
                                              float* __restrict__ yr, bool row_ok, int r, int lane,
                                              float* srow, float* partials) {
  Cache regs;
  float sum = 0.0f, sumsq = 0.0f;  // ALGO 0 and 2
  Moments m = {0.0f, 0.0f, 0.0f};  // ALGO 1

  // pass 1: read x (the only read of DRAM when the row is cached) and accumulate
  if constexpr (CACHE == 0) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {  // every load issued before any arithmetic
      if (item_valid(lane, i)) load_vec(regs[i], xr + item_offset(lane, i));
    }
  }
#pragma unroll ITEM_UNROLL
  for (int i = 0; i < ITEMS; ++i) {
    if (!item_valid(lane, i)) continue;
    const int o = item_offset(lane, i);
    float v[W];
    if constexpr (CACHE == 0) {
#pragma unroll
      for (int e = 0; e < W; ++e) v[e] = regs[i][e];
    } else {
      load_vec(v, xr + o);
      if constexpr (CACHE == 1) store_vec(srow + o, v);
    }
#pragma unroll
    for (int e = 0; e < W; ++e) {
      if constexpr (ALGO == 1) {
        m.n += 1.0f;
        const float delta = v[e] - m.mean;
        m.mean += delta / m.n;
        m.m2 += delta * (v[e] - m.mean);
      } else {
        sum += v[e];
        if constexpr (ALGO == 2) sumsq = fmaf(v[e], v[e], sumsq);
      }
    }
  }

  float mean, var;
  if constexpr (ALGO == 0) {
    float t[1] = {sum};
    row_sum<0>(t, partials, r, lane);
    mean = t[0] / HIDDEN;
    // pass 2: squared deviations from the mean
    float dev = 0.0f;
#pragma unroll ITEM_UNROLL
    for (int i = 0; i < ITEMS; ++i) {
      if (!item_valid(lane, i)) continue;
      const int o = item_offset(lane, i);
      float v[W];
      fetch(v, regs, srow, xr, o, i);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float d = v[e] - mean;
        dev = fmaf(d, d, dev);
      }
    }
    t[0] = dev;
    row_sum<1>(t, partials, r, lane);
    var = t[0] / HIDDEN;
  } else if constexpr (ALGO == 1) {
    m = row_moments(m, partials, r, lane);
    mean = m.mean;
    var = m.m2 / HIDDEN;
  } else {
    float t[2] = {sum, sumsq};
    row_sum<0>(t, partials, r, lane);
    mean = t[0] / HIDDEN;
    var = fmaxf(t[1] / HIDDEN - mean * mean, 0.0f);
  }
  const float rstd = rsqrtf(var + EPS);
  if (!row_ok) return;  // a row past the end: computed (no barrier follows), not stored

  // last pass: normalise, scale, shift, store
#pragma unroll ITEM_UNROLL
  for (int i = 0; i < ITEMS; ++i) {
    if (!item_valid(lane, i)) continue;
    const int o = item_offset(lane, i);
    float v[W], g[W], b[W], out[W];
    fetch(v, regs, srow, xr, o, i);
    load_vec(g, gamma + o);
    load_vec(b, beta + o);
#pragma unroll
    for (int e = 0; e < W; ++e) out[e] = fmaf((v[e] - mean) * rstd, g[e], b[e]);
    store_vec(yr + o, out);
  }
}

extern "C" __global__ void layernorm(const float* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ beta, float* __restrict__ y,
                                     int rows) {
  __shared__ __align__(16) float row_cache[ROW_CACHE_FLOATS];  // CACHE = 1: the block's rows
  __shared__ float partials[PARTIAL_FLOATS];  // per-warp partial statistics, rows over warps

  const int tid = static_cast<int>(threadIdx.x);
  const int r = tid / THREADS_PER_ROW;     // row within the block
  const int lane = tid % THREADS_PER_ROW;  // thread within the row
  const int row = static_cast<int>(blockIdx.x) * ROWS_PER_BLOCK + r;
  const bool row_ok = row < rows;
  // a row past the end recomputes the last row, so that every thread takes part in the shuffles
  // and barriers with valid data; it stores nothing
  const int src_row = row_ok ? row : rows - 1;
  const float* xr = x + static_cast<size_t>(src_row) * HIDDEN;
  float* yr = y + static_cast<size_t>(row_ok ? row : 0) * HIDDEN;
  float* srow = row_cache + (CACHE == 1 ? r * HIDDEN : 0);

  layernorm_row(xr, gamma, beta, yr, row_ok, r, lane, srow, partials);
}
