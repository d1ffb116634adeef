// The bespoke CUDA GEMM kernel: the generic path for every layout (any
// strides, broadcast, negative), batch and reduction dims, integer and fp8
// dtypes (A and B may differ: scaled_mm) and every epilogue in one kernel. A
// shared-memory tiled kernel with a fixed summation order (deterministic);
// cuBLASLt is the fast path. Included by the files that instantiate it.
#pragma once

#include "core/cuda_check.hpp"
#include "gemm/epilogue.hpp"

namespace baracuda::gemm::tiled {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kThreads = 256;
constexpr int kPerThread = kTileM / 16;  // a 16 x 16 thread grid, 4 x 4 outputs each
constexpr int kFlushTiles = 16;

/// Loads a kRows x kCols tile (rows along M or N, cols along K) of `src`
/// into shared memory as sTile[k][row]; out-of-range elements read as 0. The
/// thread-to-element map follows the operand's contiguous direction.
/// kScaled: each element times its block-wise scale (Note [scaled_mm scales]).
template <int kRows, bool kScaled, class T, class Acc, class Scale>
__device__ void load_tile(Acc (*sTile)[kRows + 1], const T* src, int64_t row0, int64_t k0, int64_t rows, int64_t ks,
                          int64_t row_stride, int64_t k_stride, const ScaleOperand& scale) {
  const bool rows_fast = (row_stride < 0 ? -row_stride : row_stride) <= (k_stride < 0 ? -k_stride : k_stride);
#pragma unroll
  for (int q = 0; q < kRows * kTileK / kThreads; ++q) {
    const int e = threadIdx.x + q * kThreads;
    const int r = rows_fast ? e % kRows : e / kTileK;
    const int k = rows_fast ? e / kRows : e % kTileK;
    const int64_t gr = row0 + r, gk = k0 + k;
    Acc v = gr < rows && gk < ks ? convert<Acc>(src[gr * row_stride + gk * k_stride]) : Acc(0);
    if constexpr (kScaled) {
      if (gr < rows && gk < ks) v *= scale_at<Acc, Scale>(scale, gr, gk / kScaleBlock);
    }
    sTile[k][r] = v;
  }
}

/// The sums of one thread of the 16 x 16 grid (tx, ty) over a kTileM x
/// kTileN output tile: outputs (ty + 16 i, tx + 16 j). Two-level sums: each
/// run of kFlushTiles K tiles adds into `part`, which then adds into `acc`,
/// so the rounding error grows with K / 256 + 256 rather than with K (long
/// reductions: the gradients of broadcast weights). Shared by the dense and
/// the grouped kernels.
template <class Acc>
struct TileSums {
  Acc acc[kPerThread][kPerThread] = {}, part[kPerThread][kPerThread] = {};
  int tiles_in_part = 0;

  /// Adds the product of the K tile in shared memory (sA [k][m], sB [k][n]).
  __device__ __forceinline__ void add(const Acc (*sA)[kTileM + 1], const Acc (*sB)[kTileN + 1], int tx, int ty) {
#pragma unroll
    for (int k = 0; k < kTileK; ++k) {
      Acc rA[kPerThread], rB[kPerThread];
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) rA[i] = sA[k][ty + 16 * i], rB[i] = sB[k][tx + 16 * i];
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) part[i][j] += rA[i] * rB[j];
    }
    if (++tiles_in_part == kFlushTiles) flush();
  }

  __device__ __forceinline__ void flush() {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) acc[i][j] += part[i][j], part[i][j] = Acc(0);
    tiles_in_part = 0;
  }

  /// Output (i, j) of this thread: the flushed sums plus the open run.
  __device__ __forceinline__ Acc total(int i, int j) const { return acc[i][j] + part[i][j]; }
};

template <class TA, class TB, class Out, bool kScaled>
__global__ void __launch_bounds__(kThreads) gemm_tiled(const Problem p, int64_t batch0, int64_t tiles_n) {
  using Acc = acc_t<TA, false>;
  using Scale = scale_t<TA>;
  __shared__ Acc sA[kTileK][kTileM + 1];  // [k][m]
  __shared__ Acc sB[kTileK][kTileN + 1];  // [k][n]
  const int64_t batch = batch0 + blockIdx.y;
  const int64_t m0 = int64_t(blockIdx.x / tiles_n) * kTileM, n0 = int64_t(blockIdx.x % tiles_n) * kTileN;
  const TA* gA = reinterpret_cast<const TA*>(p.a.data) + offset_of(batch, p.batch_rank, p.batch_shape, p.a.batch_stride);
  const TB* gB = reinterpret_cast<const TB*>(p.b.data) + offset_of(batch, p.batch_rank, p.batch_shape, p.b.batch_stride);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  TileSums<Acc> sums;
  const int64_t reds = p.red_count();
  for (int64_t r = 0; r < reds; ++r) {
    const TA* gAr = gA + offset_of(r, p.red_rank, p.red_shape, p.a.red_stride);
    const TB* gBr = gB + offset_of(r, p.red_rank, p.red_shape, p.b.red_stride);
    for (int64_t k0 = 0; k0 < p.k; k0 += kTileK) {
      load_tile<kTileM, kScaled, TA, Acc, Scale>(sA, gAr, m0, k0, p.m, p.k, p.a.row_stride, p.a.col_stride, p.scale_a);
      load_tile<kTileN, kScaled, TB, Acc, Scale>(sB, gBr, n0, k0, p.n, p.k, p.b.col_stride, p.b.row_stride, p.scale_b);
      __syncthreads();
      sums.add(sA, sB, tx, ty);
      __syncthreads();
    }
  }
  Out* gD = reinterpret_cast<Out*>(p.d.data) + offset_of(batch, p.batch_rank, p.batch_shape, p.d.batch_stride);
  const Out* gC = p.reads_c() ? reinterpret_cast<const Out*>(p.c.data) +
                                    offset_of(batch, p.batch_rank, p.batch_shape, p.c.batch_stride)
                              : nullptr;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t m = m0 + ty + 16 * i;
    if (m >= p.m) break;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n >= p.n) break;
      gD[m * p.d.row_stride + n * p.d.col_stride] =
          finish<Out, Acc, Scale>(p, sum_scale<Acc, Scale>(p, m, n), sums.total(i, j),
                                  gC ? gC + m * p.c.row_stride + n * p.c.col_stride : nullptr, n);
    }
  }
}

/// Launches the tiled kernel over every output tile and batch.
template <class TA, class TB, class Out>
struct CudaGemm {
  static Status run(const Problem& p, CUstream_st* stream) {
    const int64_t batches = p.batch_count();
    if (p.m == 0 || p.n == 0 || batches == 0) return Status::ok();
    const int64_t tiles_n = (p.n + kTileN - 1) / kTileN, tiles = tiles_n * ((p.m + kTileM - 1) / kTileM);
    if (tiles > INT32_MAX) return unsupported("gemm: ", tiles, " output tiles exceed one launch");
    constexpr int64_t kMaxGridY = 65535;
    for (int64_t b0 = 0; b0 < batches; b0 += kMaxGridY) {
      const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min(kMaxGridY, batches - b0)));
      if constexpr (is_fp8_v<TA> || std::is_same_v<TA, double>) {  // scaled_mm and its oracle
        if (p.scales_in_k()) gemm_tiled<TA, TB, Out, true><<<grid, kThreads, 0, stream>>>(p, b0, tiles_n);
        else gemm_tiled<TA, TB, Out, false><<<grid, kThreads, 0, stream>>>(p, b0, tiles_n);
      } else {
        gemm_tiled<TA, TB, Out, false><<<grid, kThreads, 0, stream>>>(p, b0, tiles_n);
      }
      BARACUDA_CUDA_TRY(cudaGetLastError());
    }
    return Status::ok();
  }
};

}  // namespace baracuda::gemm::tiled
