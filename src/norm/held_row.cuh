// A layer_norm / rms_norm forward row held in registers: each thread keeps K
// 16-byte vectors of its row, so the row is read once and written once and
// no pass goes through shared memory. The one-block rows kernel
// (held_forward_kernel in kernels.cuh, Note [Norm rows in registers]) and
// the cluster kernel (cluster_forward.cuh) differ only in which columns a
// thread owns and in how a row's sums combine.
#pragma once

#include <type_traits>

#include "core/cluster_rows.cuh"
#include "core/cuda_rows.cuh"
#include "norm/ops.hpp"

namespace baracuda::norm {

/// `col(k)` is the first column of the thread's vector k (vectors at or past
/// `cols` are not held); `row_sum(i, v)` sums v over the row (i: which of the
/// row's sums, 0 or 1, for kernels that keep one slot a sum).
template <class S, class T, int K>
struct HeldRow {
  using M = math_t<T, false>;
  static constexpr int V = rows::kVecOf<T>;
  using P = rows::Vec<T, V>;
  P h[K];

  template <class Col>
  __device__ __forceinline__ void load(const T* x, int64_t cols, Col col) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < cols) h[k] = *reinterpret_cast<const P*>(x + col(k));
  }

  /// The row's mean (0 for rms) and rstd. layer: sums of h - h[0], then of
  /// (h - mean)^2 (the rows kernel's shifted two passes, so a constant row
  /// has exactly zero deviation); rms: one sum of h^2.
  template <class Col, class RowSum>
  __device__ __forceinline__ void statistics(const T* x, int64_t cols, Col col, RowSum row_sum, M eps, M& mean,
                                             M& rstd) {
    mean = 0;
    if constexpr (!S::kRms) {
      const M shift = convert<M>(x[0]);
      M sum = 0;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < cols)
#pragma unroll
          for (int e = 0; e < V; ++e) sum += convert<M>(h[k].v[e]) - shift;
      mean = shift + row_sum(0, sum) / M(cols);
      // The conversions are redone after the sum's barriers, not kept live across them.
#pragma unroll
      for (int k = 0; k < K; ++k) rows::opaque(h[k]);
    }
    M sq = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < cols)
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const M d = convert<M>(h[k].v[e]) - mean;
          sq += d * d;
        }
    rstd = S::rstd(row_sum(S::kRms ? 0 : 1, sq), cols, eps);
#pragma unroll
    for (int k = 0; k < K; ++k) rows::opaque(h[k]);
  }

  /// out = (h - mean) * rstd [* weight] [+ bias], in 16-byte stores.
  template <class Col>
  __device__ __forceinline__ void store(const rows::RowLaunch& l, const int64_t* off, int64_t cols, Col col, M mean,
                                       M rstd) const {
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
  }
};

/// The storage types and forms the held-row kernels serve: half or f32, no residual.
template <class S, class T>
inline constexpr bool kHoldable = !S::kResidual && (std::is_same_v<T, float> || sizeof(T) == 2);

/// Whether the held-row kernels take these rows: a kHoldable form, the row,
/// output, weight and bias in whole aligned vectors.
template <class S, class T>
bool rows_fit_held(const rows::RowLaunch& l) {
  if (!kHoldable<S, T>) return false;
  for (int k : {S::kOut, S::kInput, S::kWeightIn, S::kBiasIn})
    if (k >= 0 && !rows::rows_in_vectors(l, k, sizeof(T))) return false;
  return true;
}

}  // namespace baracuda::norm
