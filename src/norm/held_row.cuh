// A layer_norm / rms_norm forward row held in registers: each thread keeps K
// 16-byte vectors of its row (and of the residual, in the fused residual
// form), so the row is read once and written once and no pass goes through
// shared memory. The one-block rows kernel
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
/// row's sums, 0 or 1, for kernels that keep one slot a sum). The residual
/// form holds the input's and the residual's vectors, and forms their sum h
/// in the math type where it needs it, as the rows kernel does.
template <class S, class T, int K>
struct HeldRow {
  using M = math_t<T, false>;
  static constexpr int V = rows::kVecOf<T>;
  using P = rows::Vec<T, V>;
  P xv[K];
  P rv[S::kResidual ? K : 1];
  M shift = 0;  ///< layer: h[0]

  template <class Col>
  __device__ __forceinline__ HeldRow(const rows::RowLaunch& l, const int64_t* off, int64_t cols, Col col) {
    const T* x = rows::row_operand<const T>(l, S::kInput, off);
    const T* r = S::kResidual ? rows::row_operand<const T>(l, S::kResidualIn, off) : nullptr;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < cols) {
        xv[k] = *reinterpret_cast<const P*>(x + col(k));
        if constexpr (S::kResidual) rv[k] = *reinterpret_cast<const P*>(r + col(k));
      }
    if constexpr (!S::kRms) shift = S::kResidual ? convert<M>(x[0]) + convert<M>(r[0]) : convert<M>(x[0]);
  }

  /// Element e of vector k of h (input + residual).
  __device__ __forceinline__ M h(int k, int e) const {
    if constexpr (S::kResidual) return convert<M>(xv[k].v[e]) + convert<M>(rv[k].v[e]);
    else return convert<M>(xv[k].v[e]);
  }

  /// The conversions are redone after a barrier, not kept live across it
  /// (bf16 kept 64 converted floats a thread and spilled).
  __device__ __forceinline__ void forget_conversions() {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      rows::opaque(xv[k]);
      if constexpr (S::kResidual) rows::opaque(rv[k]);
    }
  }

  /// The row's mean (0 for rms) and rstd. layer: sums of h - h[0], then of
  /// (h - mean)^2 (the rows kernel's shifted two passes, so a constant row
  /// has exactly zero deviation); rms: one sum of h^2.
  template <class Col, class RowSum>
  __device__ __forceinline__ void statistics(int64_t cols, Col col, RowSum row_sum, M eps, M& mean, M& rstd) {
    mean = 0;
    if constexpr (!S::kRms) {
      M sum = 0;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < cols)
#pragma unroll
          for (int e = 0; e < V; ++e) sum += h(k, e) - shift;
      mean = shift + row_sum(0, sum) / M(cols);
      forget_conversions();
    }
    M sq = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < cols)
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const M d = h(k, e) - mean;
          sq += d * d;
        }
    rstd = S::rstd(row_sum(S::kRms ? 0 : 1, sq), cols, eps);
    forget_conversions();
  }

  /// out = (h - mean) * rstd [* weight] [+ bias], and residual_out = h in the
  /// storage type, in 16-byte stores.
  template <class Col>
  __device__ __forceinline__ void store(const rows::RowLaunch& l, const int64_t* off, int64_t cols, Col col, M mean,
                                       M rstd) const {
    T* out = rows::row_operand<T>(l, S::kOut, off);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t c = col(k);
      if (c >= cols) continue;
      P w, b, o, ro;
      if constexpr (S::kWeight) w = *reinterpret_cast<const P*>(rows::row_operand<const T>(l, S::kWeightIn, off) + c);
      if constexpr (S::kBias) b = *reinterpret_cast<const P*>(rows::row_operand<const T>(l, S::kBiasIn, off) + c);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const M hv = h(k, e);
        if constexpr (S::kResidual) ro.v[e] = convert<T>(hv);
        M y = (hv - mean) * rstd;
        if constexpr (S::kWeight) y *= convert<M>(w.v[e]);
        if constexpr (S::kBias) y += convert<M>(b.v[e]);
        o.v[e] = convert<T>(y);
      }
      if constexpr (S::kResidual) rows::store_16(rows::row_operand<T>(l, S::kResidualOut, off) + c, ro);
      rows::store_16(out + c, o);
    }
  }
};

/// The storage types the held-row kernels serve: half or f32.
template <class T>
inline constexpr bool kHoldable = std::is_same_v<T, float> || sizeof(T) == 2;

/// Whether the held-row kernels take these rows: a kHoldable type, every
/// operand row but the statistics in whole aligned vectors.
template <class S, class T>
bool rows_fit_held(const rows::RowLaunch& l) {
  if (!kHoldable<T>) return false;
  for (int k : {S::kOut, S::kResidualOut, S::kInput, S::kResidualIn, S::kWeightIn, S::kBiasIn})
    if (k >= 0 && !rows::rows_in_vectors(l, k, sizeof(T))) return false;
  return true;
}

}  // namespace baracuda::norm
