// Long layer_norm / rms_norm forward rows over a thread-block cluster
// (sm_90): the rows of Note [Softmax over a cluster] (src/softmax/cluster.cuh),
// the input held in registers (HeldRow), read once and written once; the
// row's sums combine over the cluster. Rank 0 writes the row's statistics.
#pragma once

#include "core/cluster_rows.cuh"
#include "norm/held_row.cuh"
#include "norm/ops.hpp"

namespace baracuda::norm {

/// Operands as NormSpec's forward (no residual); block rank of cluster
/// blockIdx.x / ranks owns columns rank * K * 512 * V onwards of that row.
template <class S, class T, int K>
__global__ void __launch_bounds__(rows::kClusterThreads, K <= 8 ? 2 : 1)
    cluster_forward_kernel(rows::RowLaunch l, rows::OffsetCalc<S::kOperands, int64_t> outer, NormParams p) {
  static_assert(!S::kResidual);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using M = math_t<T, false>;
  constexpr int V = rows::kVecOf<T>, kThreads = rows::kClusterThreads;
  __shared__ rows::ClusterPairs<M, S::kRms ? 1 : 2> pairs;
  uint32_t rank, ranks;
  rows::cluster_rank(rank, ranks);
  pairs.start(ranks);

  int64_t off[S::kOperands];
  outer.get(int64_t(blockIdx.x / ranks), off);
  const int64_t cols = l.cols;
  auto col = [&](int k) { return ((int64_t(rank) * K + k) * kThreads + threadIdx.x) * V; };
  auto row_sum = [&](int slot, M v) {
    M unused = 0;
    pairs.combine(slot, v, unused, [](M& a, M&, M b, M) { a += b; }, rank, ranks);
    return v;
  };
  HeldRow<S, T, K> row(l, off, cols, col);
  M mean, rstd;
  row.statistics(cols, col, row_sum, M(p.eps), mean, rstd);
  if (rank == 0 && threadIdx.x == 0) {
    if constexpr (!S::kRms) *rows::row_operand<stat_t<T>>(l, S::kMean, off) = stat_t<T>(mean);
    *rows::row_operand<stat_t<T>>(l, S::kRstd, off) = stat_t<T>(rstd);
  }
  row.store(l, off, cols, col, mean, rstd);
#else
  __trap();  // launched on sm_90 and later only (launch_cluster_forward)
#endif
}

/// Runs the rows on the cluster kernel when they suit it (sm_90, half or f32
/// storage, no residual, the row, output, weight and bias in whole aligned
/// vectors, a cluster_row_shape); false when they do not.
template <class S, class T>
Result<bool> launch_cluster_forward(const rows::RowLaunch& l, const rows::OffsetCalc<S::kOperands, int64_t>& outer,
                                    const NormParams& p, CUstream_st* stream) {
  if constexpr (S::kResidual || !kHoldable<T>) {
    return false;
  } else {
    // Past 32 KiB: the rows kernel ran half rows of 32768 at 2.63-2.72 TB/s.
    const rows::ClusterRowShape shape = rows::cluster_row_shape(l.cols, int(sizeof(T)), 1, 32 * 1024);
    if (!shape || current_sm_version() < 90 || !rows_fit_held<S, T>(l)) return false;
    auto kernel = shape.vectors == 8 ? cluster_forward_kernel<S, T, 8> : cluster_forward_kernel<S, T, 16>;
    return rows::launch_cluster_rows(kernel, shape.ranks, l.rows, stream, l, outer, p);
  }
}

}  // namespace baracuda::norm
