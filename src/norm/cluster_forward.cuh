// Long layer_norm / rms_norm forward rows over a thread-block cluster
// (sm_90): the rows of Note [Softmax over a cluster] (src/softmax/cluster.cuh),
// the input held in registers, read once and written once. layer_norm takes
// two cluster sums (of h - h[0], then of (h - mean)^2: the rows kernel's
// shifted two passes, so a constant row still has exactly zero deviation),
// rms_norm one (of h^2). Rank 0 writes the row's statistics.
#pragma once

#include "core/cluster_rows.cuh"
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
  using P = rows::Vec<T, V>;
  __shared__ rows::ClusterPairs<M, S::kRms ? 1 : 2> pairs;
  uint32_t rank, ranks;
  rows::cluster_rank(rank, ranks);
  pairs.start(ranks);

  int64_t off[S::kOperands];
  outer.get(int64_t(blockIdx.x / ranks), off);
  const int64_t cols = l.cols;
  auto col = [&](int k) { return ((int64_t(rank) * K + k) * kThreads + threadIdx.x) * V; };
  const T* x = rows::row_operand<const T>(l, S::kInput, off);
  P h[K];
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (col(k) < cols) h[k] = *reinterpret_cast<const P*>(x + col(k));
  auto sum_pair = [](M& a, M&, M b, M) { a += b; };
  M mean = 0, sq = 0, unused = 0;
  if constexpr (!S::kRms) {
    const M shift = convert<M>(x[0]);
    M sum = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < cols)
#pragma unroll
        for (int e = 0; e < V; ++e) sum += convert<M>(h[k].v[e]) - shift;
    pairs.combine(0, sum, unused, sum_pair, rank, ranks);
    mean = shift + sum / M(cols);
#pragma unroll
    for (int k = 0; k < K; ++k) rows::opaque(h[k]);
  }
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (col(k) < cols)
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const M d = convert<M>(h[k].v[e]) - mean;
        sq += d * d;
      }
  pairs.combine(S::kRms ? 0 : 1, sq, unused, sum_pair, rank, ranks);
  const M rstd = S::rstd(sq, cols, M(p.eps));
  if (rank == 0 && threadIdx.x == 0) {
    if constexpr (!S::kRms) *rows::row_operand<stat_t<T>>(l, S::kMean, off) = stat_t<T>(mean);
    *rows::row_operand<stat_t<T>>(l, S::kRstd, off) = stat_t<T>(rstd);
  }
#pragma unroll
  for (int k = 0; k < K; ++k) rows::opaque(h[k]);
  T* out = rows::row_operand<T>(l, S::kOut, off);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t c = col(k);
    if (c >= cols) continue;
    P w, b, o;
    if constexpr (S::kWeight) w = *reinterpret_cast<const P*>(rows::row_operand<const T>(l, S::kWeightIn, off) + c);
    if constexpr (S::kBias) b = *reinterpret_cast<const P*>(rows::row_operand<const T>(l, S::kBiasIn, off) + c);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      M y = (convert<M>(h[k].v[e]) - mean) * rstd;
      if constexpr (S::kWeight) y *= convert<M>(w.v[e]);
      if constexpr (S::kBias) y += convert<M>(b.v[e]);
      o.v[e] = convert<T>(y);
    }
    rows::store_16(out + c, o);
  }
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
  if constexpr (S::kResidual || (!std::is_same_v<T, float> && sizeof(T) != 2)) {
    return false;
  } else {
    // Past 32 KiB: the rows kernel ran half rows of 32768 at 2.63-2.72 TB/s.
    const rows::ClusterRowShape shape = rows::cluster_row_shape(l.cols, int(sizeof(T)), 1, 32 * 1024);
    if (!shape || current_sm_version() < 90) return false;
    for (int k : {S::kOut, S::kInput, S::kWeightIn, S::kBiasIn})
      if (k >= 0 && !rows::rows_in_vectors(l, k, sizeof(T))) return false;
    auto kernel = shape.vectors == 8 ? cluster_forward_kernel<S, T, 8> : cluster_forward_kernel<S, T, 16>;
    return rows::launch_cluster_rows(kernel, shape.ranks, l.rows, stream, l, outer, p);
  }
}

}  // namespace baracuda::norm
