// Out-of-place transpose of a float32 matrix: out[c][r] = in[r][c], in is rows x cols and out is
// cols x rows, both row-major.
//
// A surrotune kernel template: each tuning parameter below appears as a dollar-brace placeholder
// once, in the constexpr block, and the code uses only the constexpr names.
//
// Launch
//   block = (TILE_DIM / VEC, BLOCK_ROWS) threads, two-dimensional
//   grid  = (cdiv(cols, TILE_DIM * TILES_PER_BLOCK), cdiv(rows, TILE_DIM))
//   shared memory: static only (no dynamic shared memory)
//
// Algorithm: a block moves TILES_PER_BLOCK tiles of TILE_DIM x TILE_DIM elements, side by side
// along the rows of `in`. Thread (tx, ty) reads VEC consecutive elements of a tile row (one
// float, float2 or float4 load; a warp reads whole row segments) for rows ty, ty + BLOCK_ROWS,
// ty + 2 * BLOCK_ROWS, ..., so TILE_DIM / BLOCK_ROWS loads per thread and tile. With SHARED the
// tile goes through shared memory, where thread (tx, ty) then reads a column segment and writes it
// as VEC consecutive elements of a row of `out` (one vector store; a warp writes whole row
// segments). Without SHARED each loaded element is written straight to its place in `out`, VEC
// scalar stores down a column (a warp's stores are rows apart: uncoalesced). PAD floats at the end
// of each shared row move a column's elements onto distinct banks. DIAGONAL renumbers the blocks
// along diagonals (Ruetsch and Micikevicius, "Optimizing Matrix Transpose in CUDA"), so that the
// blocks running at once do not all write the same rows of `out`.
//
// Tuning parameters
//   TILE_DIM        in [8, 16, 32, 64, 128]     tile side, in elements
//   BLOCK_ROWS      in [1, 2, 4, 8, 16, 32]     rows of threads: each thread moves TILE_DIM /
//                                               BLOCK_ROWS vectors per tile
//   VEC             in [1, 2, 4]                floats per global load and store (float, float2,
//                                               float4)
//   SHARED          in [0, 1]                   0: straight from registers to `out`; 1: through a
//                                               shared-memory tile, coalesced on both sides
//   PAD             in [0, 1]                   floats of padding per shared-memory row
//   DIAGONAL        in [0, 1]                   diagonal block order
//   TILES_PER_BLOCK in [1, 2, 4]                tiles per block, along the rows of `in`
//
// Constraints (Python syntax, as the experiment declares them)
//   TILE_DIM % BLOCK_ROWS == 0
//   SHARED == 1 or PAD == 0
// Feasible configurations: 1458 of 2160.
//
// The second constraint drops padding where there is no shared memory to pad. Nothing restricts
// the problem size: the kernel is correct for any rows, cols >= 1 (rows * cols < 2^31, and
// cdiv(rows, TILE_DIM) <= 65535, the grid's y limit). Vector loads need cols % VEC == 0 and a
// VEC*4-byte aligned `in`, vector stores rows % VEC == 0 and an aligned `out`; where that does
// not hold the kernel falls back, uniformly for the whole launch, to scalar accesses, and tiles on
// the edges of the matrix move element by element with bounds checks.
//
// Inside the space on purpose, so that the tuner learns where they are:
//   * SHARED with TILE_DIM = 128 needs 4 * 128 * (128 + PAD) bytes = 64 KB or more of static shared
//     memory, over 48 KB: ptxas fails ("uses too much shared data"), a resource failure;
//   * TILE_DIM / VEC * BLOCK_ROWS threads over 1024 cannot launch (for TILE_DIM = 64 with VEC = 1
//     and BLOCK_ROWS = 32, and for TILE_DIM = 128 with VEC = 1 and BLOCK_ROWS >= 16 or VEC = 2 and
//     BLOCK_ROWS = 32);
//   * registers * threads over 65536 compiles but cannot launch ("too many resources requested"):
//     without SHARED, TILE_DIM = 128, VEC = 1 and BLOCK_ROWS = 8 keep 16 loads per thread in
//     flight in 80 registers, times 1024 threads;
//   * fewer than 32 threads per block (small tiles, wide vectors, few rows of threads) leave lanes
//     of every warp idle and hit the limit of 32 blocks per SM: slow, not failing;
//   * PAD = 0 with SHARED makes the column reads of a warp hit few banks (up to 32-way conflicts):
//     slow, not failing.
// 216 of the 1458 configurations exceed 48 KB, 72 exceed 1024 threads (36 do both). There is
// deliberately no __launch_bounds__, which would turn the register failures into silent spilling.

constexpr int TILE_DIM = ${TILE_DIM};
constexpr int BLOCK_ROWS = ${BLOCK_ROWS};
constexpr int VEC = ${VEC};
constexpr int SHARED = ${SHARED};
constexpr int PAD = ${PAD};
constexpr int DIAGONAL = ${DIAGONAL};
constexpr int TILES_PER_BLOCK = ${TILES_PER_BLOCK};

constexpr int LD = TILE_DIM + PAD;  // row stride of the shared tile

static_assert(VEC == 1 || VEC == 2 || VEC == 4, "VEC must be 1, 2 or 4");
static_assert(TILE_DIM % VEC == 0, "VEC must divide TILE_DIM");
static_assert(TILE_DIM % BLOCK_ROWS == 0, "BLOCK_ROWS must divide TILE_DIM");
static_assert(SHARED == 0 || SHARED == 1, "SHARED is 0 or 1");
static_assert(PAD >= 0 && (SHARED == 1 || PAD == 0), "PAD only pads a shared tile");
static_assert(DIAGONAL == 0 || DIAGONAL == 1, "DIAGONAL is 0 or 1");
static_assert(TILES_PER_BLOCK >= 1, "TILES_PER_BLOCK must be at least 1");

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
__device__ __forceinline__ void store_vec(float* dst, const float (&src)[W]) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  } else if constexpr (W == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
  } else {
    *dst = src[0];
  }
}

// in[gr][gc .. gc + VEC), zero where it lies outside the matrix (CHECKED: on an edge tile, or
// where vector loads are not allowed).
template <bool CHECKED>
__device__ __forceinline__ void load_row(float (&v)[VEC], const float* __restrict__ in, int rows,
                                         int cols, int gr, int gc, bool vector_ok) {
  if (!CHECKED) {
    load_vec<VEC>(v, in + static_cast<size_t>(gr) * cols + gc);
  } else if (gr < rows) {
    const float* p = in + static_cast<size_t>(gr) * cols;
    if (vector_ok && gc + VEC <= cols) {
      load_vec<VEC>(v, p + gc);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = gc + e < cols ? p[gc + e] : 0.0f;
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = 0.0f;
  }
}

// One tile through shared memory: rows r0.. of `in`, columns c0.. (rows c0.. of `out`).
template <bool CHECKED>
__device__ __forceinline__ void tile_shared(float (*tile)[LD], const float* __restrict__ in,
                                            float* __restrict__ out, int rows, int cols, int r0,
                                            int c0, bool in_vector_ok, bool out_vector_ok) {
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
#pragma unroll
  for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS) {
    const int r = ty + j;  // row of the tile
    float v[VEC];
    load_row<CHECKED>(v, in, rows, cols, r0 + r, c0 + tx * VEC, in_vector_ok);
    if constexpr (LD % VEC == 0) {
      store_vec<VEC>(&tile[r][tx * VEC], v);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) tile[r][tx * VEC + e] = v[e];
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS) {
    const int c = ty + j;  // column of the tile, row of the out tile
    float v[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = tile[tx * VEC + e][c];
    const int orow = c0 + c;
    const int ocol = r0 + tx * VEC;
    if (!CHECKED) {
      store_vec<VEC>(out + static_cast<size_t>(orow) * rows + ocol, v);
    } else if (orow < cols) {
      float* q = out + static_cast<size_t>(orow) * rows;
      if (out_vector_ok && ocol + VEC <= rows) {
        store_vec<VEC>(q + ocol, v);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (ocol + e < rows) q[ocol + e] = v[e];
        }
      }
    }
  }
}

// One tile without shared memory: each loaded element goes straight to its place in `out`.
template <bool CHECKED>
__device__ __forceinline__ void tile_direct(const float* __restrict__ in, float* __restrict__ out,
                                            int rows, int cols, int r0, int c0,
                                            bool in_vector_ok) {
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
#pragma unroll
  for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS) {
    const int gr = r0 + ty + j;
    const int gc = c0 + tx * VEC;
    float v[VEC];
    load_row<CHECKED>(v, in, rows, cols, gr, gc, in_vector_ok);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      if (!CHECKED || (gr < rows && gc + e < cols)) {
        out[static_cast<size_t>(gc + e) * rows + gr] = v[e];
      }
    }
  }
}

extern "C" __global__ void transpose(const float* __restrict__ in, float* __restrict__ out,
                                     int rows, int cols) {
  int bx = static_cast<int>(blockIdx.x);
  int by = static_cast<int>(blockIdx.y);
  if constexpr (DIAGONAL) {  // a bijection of the grid onto itself, square or not
    const int gx = static_cast<int>(gridDim.x);
    const int gy = static_cast<int>(gridDim.y);
    const int bid = bx + gx * by;
    by = bid % gy;
    bx = (bid / gy + by) % gx;
  }
  // uniform for the whole launch: vector accesses only where every row starts aligned
  const bool in_vector_ok =
      cols % VEC == 0 && reinterpret_cast<unsigned long long>(in) % (sizeof(float) * VEC) == 0;
  const bool out_vector_ok =
      rows % VEC == 0 && reinterpret_cast<unsigned long long>(out) % (sizeof(float) * VEC) == 0;
  const int r0 = by * TILE_DIM;

#pragma unroll 1
  for (int t = 0; t < TILES_PER_BLOCK; ++t) {
    const int c0 = (bx * TILES_PER_BLOCK + t) * TILE_DIM;
    if (c0 >= cols) break;  // the same for every thread of the block
    const bool inside = r0 + TILE_DIM <= rows && c0 + TILE_DIM <= cols;  // no edge in the tile
    if constexpr (SHARED) {
      __shared__ __align__(16) float tile[TILE_DIM][LD];
      if (t > 0) __syncthreads();  // everyone has read the previous tile out of `tile`
      if (inside && in_vector_ok && out_vector_ok) {
        tile_shared<false>(tile, in, out, rows, cols, r0, c0, in_vector_ok, out_vector_ok);
      } else {
        tile_shared<true>(tile, in, out, rows, cols, r0, c0, in_vector_ok, out_vector_ok);
      }
    } else {
      if (inside && in_vector_ok) {
        tile_direct<false>(in, out, rows, cols, r0, c0, in_vector_ok);
      } else {
        tile_direct<true>(in, out, rows, cols, r0, c0, in_vector_ok);
      }
    }
  }
}
