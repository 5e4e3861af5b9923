// 2D single-channel float32 convolution (a correlation, as in deep learning and Kernel Tuner):
//   output[y][x] = sum_{i < FH, j < FW} input[y + i][x + j] * filter[i][j]
// for 0 <= y < H, 0 <= x < W. The input is already padded: (H + FH - 1) x (W + FW - 1), row-major,
// so the output is H x W, row-major. This is torch.nn.functional.conv2d(input[None, None],
// filter[None, None])[0, 0] with no further padding.
//
// A surrotune kernel template: each tuning parameter below appears as a dollar-brace placeholder
// once, in the constexpr block, and the code uses only the constexpr names. The filter size FW x FH
// is a problem size, rendered into the source as well (the register arrays are sized by it); the
// image size W x H is a run-time argument.
//
// Launch
//   block = (BLOCK_X, BLOCK_Y) threads, two-dimensional
//   grid  = (cdiv(W, BLOCK_X * TILE_X), cdiv(H, BLOCK_Y * TILE_Y))
//   shared memory: static only (no dynamic shared memory)
//   arguments: input, filter, output, W, H
//
// Algorithm: a block computes a (BLOCK_Y * TILE_Y) x (BLOCK_X * TILE_X) tile of the output, and
// each thread a TILE_Y x TILE_X patch of it: TILE_X contiguous columns in each of TILE_Y contiguous
// rows. For every filter row i the thread holds that row of the filter in registers and, for each
// of its output rows, the TILE_X + FW - 1 input values that the row needs (its "segment"), so every
// value it loads feeds up to TILE_X (input) or TILE_X * TILE_Y (filter) fused multiply-adds. Where
// the segment is read from is USE_SHARED's choice: the block's input tile, halo included, staged
// once in shared memory by coalesced (vectorised, when aligned) loads; or global memory directly,
// through the L1 cache. Segments and filter rows are read with VEC-wide loads where aligned.
//
// Tuning parameters
//   BLOCK_X       in [16, 32, 64, 128]   threads per block along x
//   BLOCK_Y       in [1, 2, 4, 8, 16]    threads per block along y
//   TILE_X        in [1, 2, 4, 8]        output columns per thread (contiguous)
//   TILE_Y        in [1, 2, 4, 8]        output rows per thread (contiguous)
//   VEC           in [1, 2, 4]           floats per load and store (float, float2, float4)
//   USE_SHARED    in [0, 1]              stage the input tile in shared memory (1) or read global
//   PAD           in [0, 1]              floats of padding per shared input row (bank conflicts;
//                                        PAD = 1 also disables vectorised reads of the shared tile)
//   READ_ONLY     in [0, 1]              input loads through the read-only path (__ldg) or plain
//   FILTER_SHARED in [0, 1]              filter staged in shared memory (1, vectorised broadcast
//                                        reads) or read from global memory (__ldg, scalar)
//
// Constraints (Python syntax, as the experiment declares them)
//   TILE_X % VEC == 0
//   USE_SHARED == 1 or PAD == 0
//   BLOCK_X * BLOCK_Y >= 64
//   BLOCK_X * BLOCK_Y <= 1024
// Feasible configurations: 6912 of 15360.
//
// A __constant__ filter (Kernel Tuner's use_cmem) is not offered: the backend passes arrays as
// global pointers and device code cannot write constant memory; FILTER_SHARED = 1 is the nearest
// equivalent (every read of the filter is a warp-wide broadcast).
//
// Nothing restricts the problem size: the kernel is correct for any W, H >= 1 and FW, FH >= 1.
// Vector loads and stores need (W + FW - 1) % VEC == 0 (input rows), W % VEC == 0 (output rows)
// and VEC*4-byte aligned pointers; where that does not hold the kernel falls back, uniformly for
// the whole launch, to scalar accesses. Threads whose columns reach past the image's right edge
// read element-wise with bounds checks; rows past its bottom edge read the last input row (their
// results are never stored).
//
// Inside the space on purpose, so that the tuner learns where they are:
//   * static shared memory (in bytes; the input tile, then the filter)
//       4 * (USE_SHARED * (BLOCK_Y * TILE_Y + FH - 1)
//                * (round_up(BLOCK_X * TILE_X + FW - 1, 4) + PAD)
//            + FILTER_SHARED * FH * round_up(FW, 4))
//     over 48 KB fails in ptxas ("uses too much shared data"): a resource failure, for 1360 of the
//     6912 configurations at FW = FH = 17 (all with USE_SHARED = 1);
//   * registers * BLOCK_X * BLOCK_Y over 65536 compiles but cannot launch ("too many resources
//     requested"): large register tiles (TILE_X * TILE_Y up to 64 accumulators, plus a filter row
//     and a segment) in blocks of 512 or 1024 threads. There is deliberately no __launch_bounds__,
//     which would turn this into silent spilling.
// Slow on purpose too: scalar reads of a segment with TILE_X > 1 are TILE_X-way bank conflicts;
// TILE_X = TILE_Y = 1 loads every input value FW * FH times (once per output it feeds).

constexpr int BLOCK_X = ${BLOCK_X};
constexpr int BLOCK_Y = ${BLOCK_Y};
constexpr int TILE_X = ${TILE_X};
constexpr int TILE_Y = ${TILE_Y};
constexpr int VEC = ${VEC};
constexpr int USE_SHARED = ${USE_SHARED};
constexpr int PAD = ${PAD};
constexpr int READ_ONLY = ${READ_ONLY};
constexpr int FILTER_SHARED = ${FILTER_SHARED};
constexpr int FW = ${FW};  // filter width (a problem size)
constexpr int FH = ${FH};  // filter height (a problem size)

constexpr int round_up(int a, int b) { return (a + b - 1) / b * b; }
constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

constexpr int THREADS = BLOCK_X * BLOCK_Y;
constexpr int OUT_X = BLOCK_X * TILE_X;  // output columns per block
constexpr int OUT_Y = BLOCK_Y * TILE_Y;  // output rows per block
constexpr int SEG = TILE_X + FW - 1;     // input values a thread reads per input row

// The shared input tile: the block's outputs plus the filter's halo, rows of stride S_LD.
constexpr int S_COLS = OUT_X + FW - 1;
constexpr int S_ROWS = OUT_Y + FH - 1;
constexpr int S_LD = round_up(S_COLS, 4) + PAD;
constexpr int SV = S_LD % VEC == 0 ? VEC : 1;  // width of shared reads of a segment
constexpr int TILE_VECS_PER_ROW = cdiv(S_COLS, VEC);
constexpr int TILE_VECS = S_ROWS * TILE_VECS_PER_ROW;
constexpr int TILE_LOADS = cdiv(TILE_VECS, THREADS);
constexpr int TILE_UNROLL = TILE_LOADS <= 16 ? TILE_LOADS : 4;

// The shared filter: rows of F_LD floats, zero beyond FW, so any VEC-wide read stays aligned.
constexpr int F_LD = round_up(FW, 4);
constexpr int F_ELEMS = FH * F_LD;
constexpr int F_LOADS = cdiv(F_ELEMS, THREADS);
constexpr int FV = FILTER_SHARED ? VEC : 1;  // width of the reads of a filter row
constexpr int F_REGS = round_up(FW, FV);     // a filter row in registers (padding included)

static_assert(VEC == 1 || VEC == 2 || VEC == 4, "VEC must be 1, 2 or 4");
static_assert(TILE_X % VEC == 0, "VEC must divide TILE_X");
static_assert(OUT_X % 4 == 0, "BLOCK_X * TILE_X must be a multiple of 4");
static_assert(USE_SHARED == 1 || PAD == 0, "PAD needs USE_SHARED");
static_assert(THREADS >= 1 && THREADS <= 1024, "1..1024 threads per block");
static_assert(TILE_X >= 1 && TILE_Y >= 1 && FW >= 1 && FH >= 1, "sizes must be positive");

template <int W> struct VecType;
template <> struct VecType<1> { using type = float; };
template <> struct VecType<2> { using type = float2; };
template <> struct VecType<4> { using type = float4; };

// W contiguous floats from an address aligned to W floats, as one access (shared or generic).
template <int W>
__device__ __forceinline__ void load_vec(float* dst, const float* src) {
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

// The same from global memory, through the read-only path when READ_ONLY.
template <int W>
__device__ __forceinline__ void load_global(float* dst, const float* src) {
  if constexpr (READ_ONLY) {
    using T = typename VecType<W>::type;
    const T v = __ldg(reinterpret_cast<const T*>(src));
    if constexpr (W == 4) {
      dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
    } else if constexpr (W == 2) {
      dst[0] = v.x; dst[1] = v.y;
    } else {
      dst[0] = v;
    }
  } else {
    load_vec<W>(dst, src);
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

// N contiguous floats in chunks of W (src aligned to W floats), then the N % W left one by one.
template <int N, int W>
__device__ __forceinline__ void load_row(float (&dst)[N], const float* src) {
#pragma unroll
  for (int k = 0; k + W <= N; k += W) load_vec<W>(dst + k, src + k);
#pragma unroll
  for (int k = N / W * W; k < N; ++k) dst[k] = src[k];
}

template <int N, int W>
__device__ __forceinline__ void load_row_global(float (&dst)[N], const float* src) {
#pragma unroll
  for (int k = 0; k + W <= N; k += W) load_global<W>(dst + k, src + k);
#pragma unroll
  for (int k = N / W * W; k < N; ++k) load_global<1>(dst + k, src + k);
}

__device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return reinterpret_cast<unsigned long long>(p) % bytes == 0;
}

// The input pointer carries no __restrict__, so that READ_ONLY = 0 really is a plain load (the
// compiler may not move it to the read-only path on its own); the filter is always read-only.
extern "C" __global__ void convolution(const float* input, const float* __restrict__ filter,
                                       float* output, int W, int H) {
  __shared__ __align__(16) float s_tile[USE_SHARED ? S_ROWS * S_LD : 1];
  __shared__ __align__(16) float s_filter[FILTER_SHARED ? F_ELEMS : 1];

  const int IW = W + FW - 1;  // input row length
  const int IH = H + FH - 1;  // input rows
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const int tid = ty * BLOCK_X + tx;
  const int gx0 = static_cast<int>(blockIdx.x) * OUT_X;  // the block's first output column
  const int gy0 = static_cast<int>(blockIdx.y) * OUT_Y;  // and row
  const int x0 = gx0 + tx * TILE_X;                       // this thread's first output column
  const int y0 = gy0 + ty * TILE_Y;                       // and row

  // uniform for the whole launch: vector global loads only where every input row starts aligned
  const bool in_vector_ok = VEC > 1 && IW % VEC == 0 && aligned(input, 4 * VEC);

  if constexpr (USE_SHARED) {
    // input rows gy0 .. gy0 + S_ROWS - 1, columns gx0 .. gx0 + S_COLS - 1 (zero outside the input)
#pragma unroll TILE_UNROLL
    for (int l = 0; l < TILE_LOADS; ++l) {
      const int v = tid + l * THREADS;
      if (TILE_VECS % THREADS == 0 || v < TILE_VECS) {
        const int r = v / TILE_VECS_PER_ROW;
        const int c = (v % TILE_VECS_PER_ROW) * VEC;
        const int gy = gy0 + r;
        const int gx = gx0 + c;
        const float* p = input + static_cast<size_t>(gy) * IW + gx;
        float val[VEC];
        if (in_vector_ok && gy < IH && gx + VEC <= IW) {
          load_global<VEC>(val, p);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            val[e] = 0.0f;
            if (gy < IH && gx + e < IW) load_global<1>(&val[e], p + e);
          }
        }
        float* s = &s_tile[r * S_LD + c];  // c + VEC <= round_up(S_COLS, 4) <= S_LD
        if constexpr (SV == VEC) {
          store_vec<VEC>(s, val);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) s[e] = val[e];
        }
      }
    }
  }
  if constexpr (FILTER_SHARED) {
#pragma unroll
    for (int l = 0; l < F_LOADS; ++l) {
      const int e = tid + l * THREADS;
      if (F_ELEMS % THREADS == 0 || e < F_ELEMS) {
        const int i = e / F_LD;
        const int j = e % F_LD;
        s_filter[e] = j < FW ? __ldg(filter + i * FW + j) : 0.0f;
      }
    }
  }
  if constexpr (USE_SHARED || FILTER_SHARED) __syncthreads();

  // A thread whose columns all lie inside the image reads its segments without bounds checks:
  // its last input column is x0 + TILE_X - 1 + FW - 1 <= IW - 1.
  const bool interior = x0 + TILE_X <= W;
  const bool segment_vector = in_vector_ok && interior;

  float acc[TILE_Y][TILE_X];
#pragma unroll
  for (int r = 0; r < TILE_Y; ++r) {
#pragma unroll
    for (int c = 0; c < TILE_X; ++c) acc[r][c] = 0.0f;
  }

#pragma unroll 1
  for (int i = 0; i < FH; ++i) {
    float f[F_REGS];
    if constexpr (FILTER_SHARED) {
      load_row<F_REGS, FV>(f, &s_filter[i * F_LD]);  // F_REGS <= F_LD, zero-padded
    } else {
#pragma unroll
      for (int j = 0; j < FW; ++j) f[j] = __ldg(filter + i * FW + j);
    }

#pragma unroll
    for (int r = 0; r < TILE_Y; ++r) {
      float s[SEG];
      if constexpr (USE_SHARED) {
        // shared row ty * TILE_Y + r + i <= S_ROWS - 1; columns tx * TILE_X + SEG - 1 <= S_COLS - 1
        load_row<SEG, SV>(s, &s_tile[(ty * TILE_Y + r + i) * S_LD + tx * TILE_X]);
      } else {
        // rows past the input's end belong to outputs past the image's bottom: read the last one
        const int gy = min(y0 + r + i, IH - 1);
        const float* p = input + static_cast<size_t>(gy) * IW + x0;
        if (segment_vector) {
          load_row_global<SEG, VEC>(s, p);
        } else if (interior) {
          load_row_global<SEG, 1>(s, p);
        } else {
#pragma unroll
          for (int k = 0; k < SEG; ++k) {
            s[k] = 0.0f;
            if (x0 + k < IW) load_global<1>(&s[k], p + k);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < FW; ++j) {
#pragma unroll
        for (int c = 0; c < TILE_X; ++c) acc[r][c] = fmaf(s[c + j], f[j], acc[r][c]);
      }
    }
  }

  const bool out_vector_ok = VEC > 1 && W % VEC == 0 && aligned(output, 4 * VEC);
#pragma unroll
  for (int r = 0; r < TILE_Y; ++r) {
    const int y = y0 + r;
    if (y >= H) break;
    float* row = output + static_cast<size_t>(y) * W;
#pragma unroll
    for (int c = 0; c < TILE_X; c += VEC) {
      const int x = x0 + c;
      if (out_vector_ok && x + VEC <= W) {
        store_vec<VEC>(row + x, &acc[r][c]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (x + e < W) row[x + e] = acc[r][c + e];
        }
      }
    }
  }
}
