// Row-wise softmax over the last dimension, float32, x and y of shape [rows, COLS], numerically
// stable (the row maximum subtracted):
//   y[r, c] = exp(x[r, c] - max_r) / sum_c' exp(x[r, c'] - max_r).
//
// A surrotune kernel template: each tuning parameter below appears as a dollar-brace placeholder
// once, in the constexpr block, and the code uses only the constexpr names. COLS is a problem
// size ([sizes] of the experiment), substituted the same way, so every loop over a row has a trip
// count known to the compiler; the number of rows is a run-time argument.
//
// Launch
//   block = THREADS_PER_ROW * ROWS_PER_BLOCK threads, one-dimensional
//   grid  = cdiv(rows, ROWS_PER_BLOCK)
//   shared memory: static only (no dynamic shared memory)
//
// Algorithm: THREADS_PER_ROW consecutive threads of a block (part of a warp, a warp, several
// warps) own one row. A row is read as vectors of W floats (W = VEC where COLS % VEC == 0, else
// the widest of 2, 1 that divides COLS), vector v of the row by thread v % THREADS_PER_ROW, so
// that every warp access is contiguous. Row maxima and sums are reduced with warp shuffles and,
// when a row spans several warps, through shared memory (one __syncthreads per reduction). Where
// the row lives between passes is CACHE: in registers (x read from DRAM once), in shared memory
// (likewise; each thread reads back only what it wrote, so no barrier is needed) or nowhere (each
// later pass loads x again, from the L2 if it is still there; these loads are volatile, so that
// the compiler cannot quietly turn CACHE = 2 into CACHE = 0).
//
// Tuning parameters
//   THREADS_PER_ROW in [16, 32, 64, 128, 256, 512, 1024]   threads that share one row
//   ROWS_PER_BLOCK  in [1, 2, 4, 8, 16, 32]                rows per block
//   VEC             in [1, 2, 4]                           floats per access (float2, float4)
//   ALGO            in [0, 1, 2]                           0 = three passes (max; sum of exp;
//                                                          exp / sum), 1 = online (max and sum
//                                                          in one pass, the sum rescaled once
//                                                          per vector), 2 = three passes, the
//                                                          exponentials kept (in the cache, or
//                                                          with CACHE = 2 in y) and scaled by
//                                                          1 / sum in the last pass
//   CACHE           in [0, 1, 2]                           the row between passes: 0 = registers,
//                                                          1 = shared memory, 2 = none (re-read)
//   UNROLL          in [0, 1, 2, 4]                        unrolling of the loops over a thread's
//                                                          vectors: 0 = full, else that factor
//   FAST_EXP        in [0, 1]                              0 = expf, 1 = __expf (ex2.approx)
//
// Constraints (Python syntax, as the experiment declares them)
//   THREADS_PER_ROW * ROWS_PER_BLOCK >= 32
//   THREADS_PER_ROW * ROWS_PER_BLOCK <= 1024
//   CACHE != 0 or UNROLL == 0
// Feasible configurations: 4212 of 9072.
//
// The first constraint keeps warps full (the shuffles use the full mask), the second is CUDA's
// block limit, the third says that a row cached in registers needs fully unrolled loops (a
// register array indexed by a run-time counter lives in local memory). The kernel is correct for
// any rows >= 1 and COLS >= 1 with finite inputs: a thread's last vector may fall past the row's
// end (skipped), and the rows of the last block past `rows` recompute the last row and store
// nothing. Since COLS % W == 0, every row starts aligned when the arrays do: x and y must be
// aligned to 4 * W bytes (cudaMalloc gives 256); a misaligned one is a launch error (misaligned
// address), never a wrong result. (There is no scalar fallback: a second, unused copy of the
// fully unrolled code would inflate the registers the compiler reports for the kernel.)
//
// Inside the space on purpose, so that the tuner learns where they are:
//   * CACHE = 1 keeps ROWS_PER_BLOCK * COLS floats in static shared memory: over 48 KB
//     (ROWS_PER_BLOCK >= 4 at COLS = 4096: 1008 of the 4212 configurations) ptxas fails ("uses
//     too much shared data"), a resource failure;
//   * CACHE = 0 keeps COLS / THREADS_PER_ROW floats per thread in registers: 256 or 128 (16 or
//     32 threads per row at COLS = 4096) hit the 255-register cap and spill to local memory
//     (slow, not failing), and registers * threads over 65536 compiles but cannot launch ("too
//     many resources requested"): 1024-thread blocks with 32 or more floats per thread, 512-thread
//     blocks with 64 (some ALGO just over, some just under); there is deliberately no
//     __launch_bounds__, which would turn this into silent spilling;
//   * CACHE = 2 with UNROLL = 0 lets ptxas hoist a whole pass of loads: with many vectors per
//     thread this too reaches the register cap and spills;
//   * slow but correct: CACHE = 2 reads x three times (ALGO = 0), twice (ALGO = 1), or twice and
//     writes and re-reads y (ALGO = 2); expf costs more than __expf; VEC = 1 issues four times
//     the loads of VEC = 4.

constexpr int COLS = ${COLS};
constexpr int THREADS_PER_ROW = ${THREADS_PER_ROW};
constexpr int ROWS_PER_BLOCK = ${ROWS_PER_BLOCK};
constexpr int VEC = ${VEC};
constexpr int ALGO = ${ALGO};
constexpr int CACHE = ${CACHE};
constexpr int UNROLL = ${UNROLL};
constexpr int FAST_EXP = ${FAST_EXP};

constexpr int THREADS = THREADS_PER_ROW * ROWS_PER_BLOCK;
// the vector width actually used: VEC where it divides COLS, so that every row starts aligned
constexpr int W = COLS % VEC == 0 ? VEC : (VEC >= 2 && COLS % 2 == 0) ? 2 : 1;
constexpr int ROW_VECS = COLS / W;                                       // vectors per row
constexpr int ITEMS = (ROW_VECS + THREADS_PER_ROW - 1) / THREADS_PER_ROW;  // vectors per thread
constexpr bool EVEN = ROW_VECS % THREADS_PER_ROW == 0;  // no thread's last vector is past the end
constexpr int ITEM_UNROLL = UNROLL == 0 ? ITEMS : UNROLL;
constexpr int WARP = THREADS_PER_ROW < 32 ? THREADS_PER_ROW : 32;  // shuffle width
constexpr int WARPS_PER_ROW = THREADS_PER_ROW / WARP;
constexpr int SLOTS = ALGO == 1 ? 1 : 2;  // reductions per row, each with its own shared slot
constexpr int ROW_CACHE_FLOATS = CACHE == 1 ? ROWS_PER_BLOCK * COLS : 1;
constexpr int PARTIAL_FLOATS = WARPS_PER_ROW > 1 ? SLOTS * ROWS_PER_BLOCK * WARPS_PER_ROW * 2 : 1;
// the identity of max: finite, so that merging two empty partial results gives no inf - inf
constexpr float LOWEST = -3.402823466e38f;

static_assert(COLS >= 1, "COLS must be positive");
static_assert(VEC == 1 || VEC == 2 || VEC == 4, "VEC must be 1, 2 or 4");
static_assert(THREADS_PER_ROW >= 1 && THREADS_PER_ROW <= 1024 &&
                  (THREADS_PER_ROW & (THREADS_PER_ROW - 1)) == 0,
              "THREADS_PER_ROW must be a power of two up to 1024");
static_assert(ROWS_PER_BLOCK >= 1, "ROWS_PER_BLOCK must be positive");
static_assert(THREADS % 32 == 0, "a block must be whole warps (32 <= threads per block)");
static_assert(THREADS <= 1024, "at most 1024 threads per block");
static_assert(ALGO >= 0 && ALGO <= 2, "ALGO is 0 (three-pass), 1 (online) or 2 (exp kept)");
static_assert(CACHE >= 0 && CACHE <= 2, "CACHE is 0 (registers), 1 (shared) or 2 (none)");
static_assert(UNROLL >= 0, "UNROLL is 0 (full) or a positive unroll factor");
static_assert(CACHE != 0 || UNROLL == 0, "a row cached in registers needs UNROLL = 0 (full)");
static_assert(FAST_EXP == 0 || FAST_EXP == 1, "FAST_EXP is 0 or 1");

__device__ __forceinline__ float exp_(float v) {
  if constexpr (FAST_EXP) {
    return __expf(v);
  } else {
    return expf(v);
  }
}

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

// W floats at p again, in a later pass of CACHE = 2: a volatile load, so that the compiler cannot
// reuse the values of an earlier pass instead (it would, with fully unrolled loops, and the
// configuration would silently become CACHE = 0). x is read through the non-coherent path; y
// (ALGO = 2: the exponentials this thread stored) coherently, after a compiler memory barrier so
// that those stores are neither dropped nor forwarded.
template <bool FROM_Y>
__device__ __forceinline__ void reload_vec(float (&dst)[W], const float* p) {
  const size_t g = __cvta_generic_to_global(p);
  if constexpr (FROM_Y && W == 4) {
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(dst[0]), "=f"(dst[1]), "=f"(dst[2]), "=f"(dst[3])
                 : "l"(g)
                 : "memory");
  } else if constexpr (FROM_Y && W == 2) {
    asm volatile("ld.global.v2.f32 {%0, %1}, [%2];"
                 : "=f"(dst[0]), "=f"(dst[1])
                 : "l"(g)
                 : "memory");
  } else if constexpr (FROM_Y) {
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(dst[0]) : "l"(g) : "memory");
  } else if constexpr (W == 4) {
    asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(dst[0]), "=f"(dst[1]), "=f"(dst[2]), "=f"(dst[3])
                 : "l"(g));
  } else if constexpr (W == 2) {
    asm volatile("ld.global.nc.v2.f32 {%0, %1}, [%2];" : "=f"(dst[0]), "=f"(dst[1]) : "l"(g));
  } else {
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(dst[0]) : "l"(g));
  }
}

// Offset of partial k of warp w of row r in reduction `slot`.
__device__ __forceinline__ int partial_index(int slot, int r, int w, int k) {
  return ((slot * ROWS_PER_BLOCK + r) * WARPS_PER_ROW + w) * 2 + k;
}

// Running (max, sum of exp(x - max)) pairs, merged: commutative, so both partners of a
// butterfly get bit-identical results.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  s = s * exp_(m - top) + s2 * exp_(m2 - top);
  m = top;
}

// The maximum (IS_MAX) or the sum of v over the THREADS_PER_ROW threads of a row; every thread of
// the row gets the same (bit-identical) result.
template <int SLOT, bool IS_MAX>
__device__ __forceinline__ float row_reduce(float v, float* partials, int r, int lane) {
#pragma unroll
  for (int offset = WARP / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = IS_MAX ? fmaxf(v, other) : v + other;
  }
  if constexpr (WARPS_PER_ROW > 1) {
    if (lane % 32 == 0) partials[partial_index(SLOT, r, lane / 32, 0)] = v;
    __syncthreads();  // each reduction has its own slot: no second barrier before reuse
    v = partials[partial_index(SLOT, r, 0, 0)];
#pragma unroll
    for (int w = 1; w < WARPS_PER_ROW; ++w) {
      const float other = partials[partial_index(SLOT, r, w, 0)];
      v = IS_MAX ? fmaxf(v, other) : v + other;
    }
  }
  return v;
}

// The online pairs (m, s) merged over the threads of a row, the same on every thread of the row.
__device__ __forceinline__ void row_online(float& m, float& s, float* partials, int r, int lane) {
#pragma unroll
  for (int offset = WARP / 2; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    merge(m, s, m2, s2);
  }
  if constexpr (WARPS_PER_ROW > 1) {
    if (lane % 32 == 0) {
      partials[partial_index(0, r, lane / 32, 0)] = m;
      partials[partial_index(0, r, lane / 32, 1)] = s;
    }
    __syncthreads();
    m = partials[partial_index(0, r, 0, 0)];
    s = partials[partial_index(0, r, 0, 1)];
#pragma unroll
    for (int w = 1; w < WARPS_PER_ROW; ++w) {
      merge(m, s, partials[partial_index(0, r, w, 0)], partials[partial_index(0, r, w, 1)]);
    }
  }
}

// Vector i of this thread: element offset in the row, and whether it lies inside the row.
__device__ __forceinline__ int item_offset(int lane, int i) {
  return (lane + i * THREADS_PER_ROW) * W;
}
__device__ __forceinline__ bool item_valid(int lane, int i) {
  return EVEN || i < ITEMS - 1 || lane + i * THREADS_PER_ROW < ROW_VECS;
}

using Cache = float[CACHE == 0 ? ITEMS : 1][W];  // a thread's vectors of the row (CACHE = 0)

// Vector i of this thread's row from wherever CACHE keeps it (after the first pass); with
// CACHE = 2 from `src`: x, or (FROM_Y) the exponentials this thread already stored in y.
template <bool FROM_Y>
__device__ __forceinline__ void fetch(float (&v)[W], const Cache& regs, const float* srow,
                                      const float* src, int o, int i) {
  if constexpr (CACHE == 0) {
#pragma unroll
    for (int e = 0; e < W; ++e) v[e] = regs[i][e];
  } else if constexpr (CACHE == 1) {
    load_vec(v, srow + o);  // shared rows are 16-byte aligned and COLS % W == 0
  } else {
    reload_vec<FROM_Y>(v, src + o);
  }
}

// Writes vector i back to the cache (ALGO = 2: the exponentials replace x).
__device__ __forceinline__ void keep(Cache& regs, float* srow, const float (&v)[W], int o, int i) {
  if constexpr (CACHE == 0) {
#pragma unroll
    for (int e = 0; e < W; ++e) regs[i][e] = v[e];
  } else if constexpr (CACHE == 1) {
    store_vec(srow + o, v);
  }
}

__device__ __forceinline__ void softmax_row(const float* __restrict__ xr, float* __restrict__ yr,
                                            bool row_ok, int r, int lane, float* srow,
                                            float* partials) {
  Cache regs;
  float m = LOWEST, s = 0.0f;  // this thread's running max and (ALGO 1) sum of exp(x - m)

  // pass 1: read x (the only read of DRAM when the row is cached); the max, or (m, s) online
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
    float top = v[0];
#pragma unroll
    for (int e = 1; e < W; ++e) top = fmaxf(top, v[e]);
    if constexpr (ALGO == 1) {  // one rescale per vector
      top = fmaxf(m, top);
      float add = 0.0f;
#pragma unroll
      for (int e = 0; e < W; ++e) add += exp_(v[e] - top);
      s = s * exp_(m - top) + add;
    }
    m = fmaxf(m, top);
  }

  if constexpr (ALGO == 1) {
    row_online(m, s, partials, r, lane);
  } else {
    m = row_reduce<0, true>(m, partials, r, lane);
    // pass 2: the sum of exp(x - max); ALGO 2 keeps the exponentials (CACHE = 2: in y)
    s = 0.0f;
#pragma unroll ITEM_UNROLL
    for (int i = 0; i < ITEMS; ++i) {
      if (!item_valid(lane, i)) continue;
      const int o = item_offset(lane, i);
      float v[W];
      fetch<false>(v, regs, srow, xr, o, i);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        v[e] = exp_(v[e] - m);
        s += v[e];
      }
      if constexpr (ALGO == 2) {
        if constexpr (CACHE == 2) {
          if (row_ok) store_vec(yr + o, v);
        } else {
          keep(regs, srow, v, o, i);
        }
      }
    }
    s = row_reduce<1, false>(s, partials, r, lane);
  }
  const float inv = 1.0f / s;
  if (!row_ok) return;  // a row past the end: computed (no barrier follows), not stored

  // last pass: y = exp(x - max) / sum (ALGO 2: the kept exponentials times 1 / sum)
#pragma unroll ITEM_UNROLL
  for (int i = 0; i < ITEMS; ++i) {
    if (!item_valid(lane, i)) continue;
    const int o = item_offset(lane, i);
    float v[W];
    // ALGO 2 with CACHE = 2 reads back what this thread stored in y in pass 2
    fetch<ALGO == 2>(v, regs, srow, ALGO == 2 ? yr : xr, o, i);
#pragma unroll
    for (int e = 0; e < W; ++e) v[e] = (ALGO == 2 ? v[e] : exp_(v[e] - m)) * inv;
    store_vec(yr + o, v);
  }
}

extern "C" __global__ void softmax(const float* __restrict__ x, float* __restrict__ y, int rows) {
  __shared__ __align__(16) float row_cache[ROW_CACHE_FLOATS];  // CACHE = 1: the block's rows
  __shared__ float partials[PARTIAL_FLOATS];  // per-warp partial results, rows over warps

  const int tid = static_cast<int>(threadIdx.x);
  const int r = tid / THREADS_PER_ROW;     // row within the block
  const int lane = tid % THREADS_PER_ROW;  // thread within the row
  const int row = static_cast<int>(blockIdx.x) * ROWS_PER_BLOCK + r;
  const bool row_ok = row < rows;
  // a row past the end recomputes the last row, so that every thread takes part in the shuffles
  // and barriers with valid data; it stores nothing
  const int src_row = row_ok ? row : rows - 1;
  const float* xr = x + static_cast<size_t>(src_row) * COLS;
  float* yr = y + static_cast<size_t>(row_ok ? row : 0) * COLS;
  float* srow = row_cache + (CACHE == 1 ? r * COLS : 0);

  softmax_row(xr, yr, row_ok, r, lane, srow, partials);
}
