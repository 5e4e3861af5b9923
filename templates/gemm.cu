// Tiled single-precision GEMM: C[M,N] = A[M,K] @ B[K,N], all row-major float32.
//
// A surrotune kernel template: each tuning parameter below appears as a dollar-brace placeholder
// once, in the constexpr block, and the code uses only the constexpr names.
//
// Launch
//   block = (BLOCK_M / TM) * (BLOCK_N / TN) threads, one-dimensional (blockDim.x = THREADS)
//   grid  = (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))
//   shared memory: static only (no dynamic shared memory)
//
// Algorithm: each block computes a BLOCK_M x BLOCK_N tile of C, stepping through K in slices of
// BLOCK_K. A slice of A is staged in shared memory transposed (k-major, As[k][m]) and a slice of B
// as is (Bs[k][n]), so that in the inner loop every thread reads a TM-fragment of A and a
// TN-fragment of B as contiguous (vectorised, when aligned) shared loads and accumulates their outer
// product into TM x TN registers. A thread's rows and columns are interleaved in chunks of the
// shared-load width (4, 2 or 1 floats), so that a warp's fragment loads are free of bank conflicts
// and its stores to C stay coalesced.
//
// Tuning parameters
//   BLOCK_M       in [16, 32, 64, 128, 256]   rows of C per block
//   BLOCK_N       in [16, 32, 64, 128, 256]   columns of C per block
//   BLOCK_K       in [8, 16, 32, 64]          depth of the K slice staged in shared memory
//   TM            in [2, 4, 8, 16]            rows of C per thread (register tile)
//   TN            in [2, 4, 8, 16]            columns of C per thread (register tile)
//   VEC           in [1, 2, 4]                floats per global load (float, float2, float4)
//   PAD           in [0, 1, 4]                floats of padding per shared-memory row (bank conflicts;
//                                             PAD = 1 also disables vectorised shared accesses)
//   UNROLL        in [0, 1]                   unrolling of the k loop: 0 = full, 1 = none
//   DOUBLE_BUFFER in [0, 1]                   two shared stages, next slice prefetched into registers
//
// Constraints (Python syntax, as the experiment declares them)
//   BLOCK_M % TM == 0
//   BLOCK_N % TN == 0
//   (BLOCK_M // TM) * (BLOCK_N // TN) >= 128
//   (BLOCK_M // TM) * (BLOCK_N // TN) <= 1024
//   TM * TN <= 128
//   TM <= 2 * TN and TN <= 2 * TM
//   BLOCK_M <= 2 * BLOCK_N and BLOCK_N <= 2 * BLOCK_M
//   (BLOCK_M * BLOCK_K) % ((BLOCK_M // TM) * (BLOCK_N // TN) * VEC) == 0
//   (BLOCK_N * BLOCK_K) % ((BLOCK_M // TM) * (BLOCK_N // TN) * VEC) == 0
// Feasible configurations: 5952 of 57600.
//
// The last two constraints make every thread load the same number of whole vectors per slice;
// they prune configurations with idle loader threads, the kernel itself does not need them (it
// guards partial rounds). Nothing else restricts the problem size: the kernel is correct for any
// M, N, K >= 0. Vector loads need K % VEC == 0 (rows of A) and N % VEC == 0 (rows of B) and
// 4*VEC-byte aligned pointers; where that does not hold the kernel falls back, uniformly for the
// whole launch, to scalar loads, and tiles on the edges of C load element-wise with bounds checks.
//
// Inside the space on purpose, so that the tuner learns where they are:
//   * shared memory 4 * (1 + DOUBLE_BUFFER) * BLOCK_K * (BLOCK_M + BLOCK_N + 2 * PAD) bytes over
//     48 KB fails in ptxas ("uses too much shared data"): a resource failure;
//   * registers * THREADS over 65536 compiles but cannot launch ("too many resources requested");
//     there is deliberately no __launch_bounds__, which would turn this into silent spilling;
//   * TM * TN = 128 accumulators push a thread to the 255-register cap, where some
//     configurations spill to local memory: slow, not failing.
// 2050 of the 5952 configurations exceed 48 KB. On an H200 (CUDA 13.0, 4096^3, 480 sampled
// configurations) every one that launched verified; every launch failure was predicted by
// registers * THREADS > 65536; the best reached 0.81 of cuBLAS' fp32 SGEMM (39 of 49 TFLOP/s).

constexpr int BLOCK_M = ${BLOCK_M};
constexpr int BLOCK_N = ${BLOCK_N};
constexpr int BLOCK_K = ${BLOCK_K};
constexpr int TM = ${TM};
constexpr int TN = ${TN};
constexpr int VEC = ${VEC};
constexpr int PAD = ${PAD};
constexpr int UNROLL = ${UNROLL};
constexpr int DOUBLE_BUFFER = ${DOUBLE_BUFFER};

constexpr int THREADS_M = BLOCK_M / TM;  // threads along m
constexpr int THREADS_N = BLOCK_N / TN;  // threads along n
constexpr int THREADS = THREADS_M * THREADS_N;
constexpr int STAGES = DOUBLE_BUFFER ? 2 : 1;
constexpr int AS_LD = BLOCK_M + PAD;  // row stride of As[k][m]
constexpr int BS_LD = BLOCK_N + PAD;  // row stride of Bs[k][n]
constexpr int K_UNROLL = UNROLL == 0 ? BLOCK_K : UNROLL;

// A slice (BLOCK_M x BLOCK_K) is read as vectors along k, a B slice (BLOCK_K x BLOCK_N) along n.
constexpr int A_VECS_PER_ROW = BLOCK_K / VEC;
constexpr int A_VECS = BLOCK_M * A_VECS_PER_ROW;
constexpr int A_LOADS = (A_VECS + THREADS - 1) / THREADS;
constexpr int B_VECS_PER_ROW = BLOCK_N / VEC;
constexpr int B_VECS = BLOCK_K * B_VECS_PER_ROW;
constexpr int B_LOADS = (B_VECS + THREADS - 1) / THREADS;

// The widest access (4, 2 or 1 floats) that a fragment of n floats at a multiple of n in a row of
// stride ld can use while staying aligned.
constexpr int fragment_width(int n, int ld) {
  return (n % 4 == 0 && ld % 4 == 0) ? 4 : (n % 2 == 0 && ld % 2 == 0) ? 2 : 1;
}
constexpr int WA = fragment_width(TM, AS_LD);  // shared-load width of an A fragment
constexpr int WB = fragment_width(TN, BS_LD);  // shared-load width of a B fragment (and C store)

static_assert(VEC == 1 || VEC == 2 || VEC == 4, "VEC must be 1, 2 or 4");
static_assert(BLOCK_M % TM == 0 && BLOCK_N % TN == 0, "the thread tile must divide the block");
static_assert(BLOCK_K % VEC == 0 && BLOCK_N % VEC == 0, "VEC must divide BLOCK_K and BLOCK_N");
static_assert(THREADS >= 1 && THREADS <= 1024, "1..1024 threads per block");
static_assert(UNROLL >= 0, "UNROLL is 0 (full) or a positive unroll factor");

template <int W> struct VecType;
template <> struct VecType<1> { using type = float; };
template <> struct VecType<2> { using type = float2; };
template <> struct VecType<4> { using type = float4; };

// W contiguous floats from an address aligned to W floats, as one access.
template <int W>
__device__ __forceinline__ void load_vec(float (&dst)[W], const float* src) {
  if constexpr (W == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
  } else if constexpr (W == 2) {
    const float2 v = *reinterpret_cast<const float2*>(src);
    dst[0] = v.x; dst[1] = v.y;
  } else {
    dst[0] = *src;
  }
}

template <int W>
__device__ __forceinline__ void store_vec(float* dst, const float* src) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  } else if constexpr (W == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
  } else {
    *dst = src[0];
  }
}

// A fragment of N floats in chunks of W contiguous floats, chunk c at src + c * CHUNK_STRIDE;
// src and CHUNK_STRIDE are multiples of W floats.
template <int N, int W, int CHUNK_STRIDE>
__device__ __forceinline__ void load_fragment(float (&dst)[N], const float* src) {
#pragma unroll
  for (int c = 0; c < N / W; ++c) {
    float v[W];
    load_vec<W>(v, src + c * CHUNK_STRIDE);
#pragma unroll
    for (int e = 0; e < W; ++e) dst[c * W + e] = v[e];
  }
}

// Global -> registers: this thread's vectors of the A slice starting at column k0.
__device__ __forceinline__ void load_a(float (&stage)[A_LOADS][VEC], const float* __restrict__ A,
                                       int M, int K, int row0, int k0, bool vector_ok) {
#pragma unroll
  for (int l = 0; l < A_LOADS; ++l) {
    const int v = static_cast<int>(threadIdx.x) + l * THREADS;
    if (A_VECS % THREADS == 0 || v < A_VECS) {
      const int gm = row0 + v / A_VECS_PER_ROW;
      const int gk = k0 + (v % A_VECS_PER_ROW) * VEC;
      const float* p = A + static_cast<size_t>(gm) * K + gk;
      if (vector_ok && gm < M && gk + VEC <= K) {
        load_vec<VEC>(stage[l], p);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) stage[l][e] = (gm < M && gk + e < K) ? p[e] : 0.0f;
      }
    }
  }
}

// Registers -> shared: the A slice transposed, As[k][m].
__device__ __forceinline__ void store_a(float* as, const float (&stage)[A_LOADS][VEC]) {
#pragma unroll
  for (int l = 0; l < A_LOADS; ++l) {
    const int v = static_cast<int>(threadIdx.x) + l * THREADS;
    if (A_VECS % THREADS == 0 || v < A_VECS) {
      const int m = v / A_VECS_PER_ROW;
      const int k = (v % A_VECS_PER_ROW) * VEC;
#pragma unroll
      for (int e = 0; e < VEC; ++e) as[(k + e) * AS_LD + m] = stage[l][e];
    }
  }
}

// Global -> registers: this thread's vectors of the B slice starting at row k0.
__device__ __forceinline__ void load_b(float (&stage)[B_LOADS][VEC], const float* __restrict__ B,
                                       int N, int K, int col0, int k0, bool vector_ok) {
#pragma unroll
  for (int l = 0; l < B_LOADS; ++l) {
    const int v = static_cast<int>(threadIdx.x) + l * THREADS;
    if (B_VECS % THREADS == 0 || v < B_VECS) {
      const int gk = k0 + v / B_VECS_PER_ROW;
      const int gn = col0 + (v % B_VECS_PER_ROW) * VEC;
      const float* p = B + static_cast<size_t>(gk) * N + gn;
      if (vector_ok && gk < K && gn + VEC <= N) {
        load_vec<VEC>(stage[l], p);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) stage[l][e] = (gk < K && gn + e < N) ? p[e] : 0.0f;
      }
    }
  }
}

// Registers -> shared: the B slice as is, Bs[k][n].
__device__ __forceinline__ void store_b(float* bs, const float (&stage)[B_LOADS][VEC]) {
#pragma unroll
  for (int l = 0; l < B_LOADS; ++l) {
    const int v = static_cast<int>(threadIdx.x) + l * THREADS;
    if (B_VECS % THREADS == 0 || v < B_VECS) {
      const int k = v / B_VECS_PER_ROW;
      const int n = (v % B_VECS_PER_ROW) * VEC;
      if constexpr (BS_LD % VEC == 0) {
        store_vec<VEC>(bs + k * BS_LD + n, stage[l]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) bs[k * BS_LD + n + e] = stage[l][e];
      }
    }
  }
}

extern "C" __global__ void gemm(const float* __restrict__ A, const float* __restrict__ B,
                                float* __restrict__ C, int M, int N, int K) {
  __shared__ __align__(16) float As[STAGES][BLOCK_K][AS_LD];
  __shared__ __align__(16) float Bs[STAGES][BLOCK_K][BS_LD];

  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % THREADS_N;
  const int ty = tid / THREADS_N;
  const int row0 = static_cast<int>(blockIdx.y) * BLOCK_M;
  const int col0 = static_cast<int>(blockIdx.x) * BLOCK_N;

  // uniform for the whole launch: vector loads only where every row starts aligned
  const bool a_vector_ok =
      K % VEC == 0 && reinterpret_cast<unsigned long long>(A) % (sizeof(float) * VEC) == 0;
  const bool b_vector_ok =
      N % VEC == 0 && reinterpret_cast<unsigned long long>(B) % (sizeof(float) * VEC) == 0;

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
  }
  float a_stage[A_LOADS][VEC];
  float b_stage[B_LOADS][VEC];
  float a_frag[TM];
  float b_frag[TN];

  const int tiles = (K + BLOCK_K - 1) / BLOCK_K;
  if (tiles > 0) {
    load_a(a_stage, A, M, K, row0, 0, a_vector_ok);
    load_b(b_stage, B, N, K, col0, 0, b_vector_ok);
    store_a(&As[0][0][0], a_stage);
    store_b(&Bs[0][0][0], b_stage);
  }
  __syncthreads();

  for (int t = 0; t < tiles; ++t) {
    const int s = DOUBLE_BUFFER ? (t & 1) : 0;
    const bool more = t + 1 < tiles;
    if (DOUBLE_BUFFER && more) {  // issue the next slice's loads before computing on this one
      load_a(a_stage, A, M, K, row0, (t + 1) * BLOCK_K, a_vector_ok);
      load_b(b_stage, B, N, K, col0, (t + 1) * BLOCK_K, b_vector_ok);
    }

    // thread (ty, tx) owns rows c * THREADS_M * WA + ty * WA + e and columns likewise
    const float* as = &As[s][0][ty * WA];
    const float* bs = &Bs[s][0][tx * WB];
#pragma unroll K_UNROLL
    for (int k = 0; k < BLOCK_K; ++k) {
      load_fragment<TM, WA, THREADS_M * WA>(a_frag, as + k * AS_LD);
      load_fragment<TN, WB, THREADS_N * WB>(b_frag, bs + k * BS_LD);
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a_frag[i], b_frag[j], acc[i][j]);
      }
    }

    if constexpr (DOUBLE_BUFFER) {
      if (more) {  // the other stage was last read before the previous barrier
        store_a(&As[s ^ 1][0][0], a_stage);
        store_b(&Bs[s ^ 1][0][0], b_stage);
      }
      __syncthreads();
    } else {
      __syncthreads();  // everyone is done reading the single stage
      if (more) {
        load_a(a_stage, A, M, K, row0, (t + 1) * BLOCK_K, a_vector_ok);
        load_b(b_stage, B, N, K, col0, (t + 1) * BLOCK_K, b_vector_ok);
        store_a(&As[0][0][0], a_stage);
        store_b(&Bs[0][0][0], b_stage);
      }
      __syncthreads();
    }
  }

  // C: row i of the fragment is row (i / WA) * THREADS_M * WA + ty * WA + i % WA of the tile;
  // column j likewise with WB, THREADS_N and tx, so WB columns are contiguous: one store.
  constexpr int WS = WB;
  const bool c_vector_ok =
      N % WS == 0 && reinterpret_cast<unsigned long long>(C) % (sizeof(float) * WS) == 0;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int gm = row0 + (i / WA) * THREADS_M * WA + ty * WA + i % WA;
    if (gm >= M) continue;
    float* c_row = C + static_cast<size_t>(gm) * N;
#pragma unroll
    for (int j = 0; j < TN; j += WS) {
      const int gn = col0 + (j / WB) * THREADS_N * WB + tx * WB + j % WB;
      if (c_vector_ok && gn + WS <= N) {
        store_vec<WS>(c_row + gn, &acc[i][j]);
      } else {
#pragma unroll
        for (int e = 0; e < WS; ++e) {
          if (gn + e < N) c_row[gn + e] = acc[i][j + e];
        }
      }
    }
  }
}
