// CUDA kernels of gumbel_softmax (forward) and sparsemax (forward and
// backward): TPR threads own a row (the softmax rows kernel's schedule),
// reductions in a fixed order (deterministic).
//  - gumbel_softmax: one pass for the max, the first argmax and the sum of
//    exponentials (online: the sum is rescaled when the max grows), one pass
//    that writes `soft` and `out`; z = (x + g) / tau is kept in shared
//    memory between them when the row fits, else recomputed.
//  - sparsemax: Note [Sparsemax threshold]; the row stays in shared memory
//    when it fits, passes re-read it from memory (L2) otherwise.
#pragma once

#include <cstdint>

#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "softmax/ops.hpp"

namespace baracuda::smax {

using rows::RowLaunch;

inline constexpr int64_t kNoIndex = INT64_MAX;

struct MinIndexOp {
  __device__ __forceinline__ int64_t operator()(int64_t a, int64_t b) const { return a < b ? a : b; }
};

/// gumbel_softmax: operands out, soft, logits. A thread owns whole groups
/// of kGroup columns (one Philox call each); with kCache, z = (x + g) / tau
/// of pass 1 stays in shared memory for pass 2.
template <class T, int TPR, int RPB, bool kCache>
__device__ void gumbel_row(const RowLaunch& l, const rows::OffsetCalc<3, int64_t>& outer, const RowParams& p,
                           math_t<T, false>* cache, math_t<T, false>* scratch, int64_t* index_scratch) {
  using M = math_t<T, false>;
  constexpr int G = GumbelSoftmax::kGroup;
  const rows::RowSlot<TPR, RPB, 3> slot(l, outer);
  T* out = rows::row_operand<T>(l, 0, slot.off);
  T* soft = rows::row_operand<T>(l, 1, slot.off);
  const T* x = rows::row_operand<const T>(l, 2, slot.off);
  const int64_t so = l.inner.stride[0][0], ss = l.inner.stride[1][0], sx = l.inner.stride[2][0];
  const int64_t cols = l.cols, groups = (cols + G - 1) / G;
  const M inv_tau = M(1 / p.tau);
  auto group_z = [&](int64_t q, M (&z)[G]) {  // -inf past the row's end
    M g[G];
    GumbelSoftmax::noise(p, slot.row, q, g);
#pragma unroll
    for (int e = 0; e < G; ++e) {
      const int64_t c = q * G + e;
      z[e] = c < cols ? (convert<M>(x[c * sx]) + g[e]) * inv_tau : M(-INFINITY);
    }
  };
  M m = -INFINITY, s = 0;
  int64_t arg = kNoIndex;
  if (slot.valid)
    for (int64_t q = slot.lane; q < groups; q += TPR) {
      M z[G];
      group_z(q, z);
#pragma unroll
      for (int e = 0; e < G; ++e) {
        if constexpr (kCache)
          if (q * G + e < cols) cache[q * G + e] = z[e];
        if (z[e] > m || (z[e] != z[e] && m == m)) {
          s = s * exp(m - z[e]) + 1, m = z[e], arg = q * G + e;
        } else if (z[e] != -INFINITY) {
          s += exp(z[e] - m);
        }
      }
    }
  const M max = rows::row_all_reduce<TPR, RPB>(m, rows::MaxOp{}, scratch);
  const bool mine = m == max || (m != m && max != max);
  const M sum = rows::row_all_reduce<TPR, RPB>(m == max ? s : s * exp(m - max), rows::SumOp{}, scratch);
  if (p.hard) arg = rows::row_all_reduce<TPR, RPB>(mine ? arg : kNoIndex, MinIndexOp{}, index_scratch);
  if (arg == kNoIndex) arg = 0;  // a row of -inf: as the host reference
  if (!slot.valid) return;
  for (int64_t q = slot.lane; q < groups; q += TPR) {
    M z[G];
    if constexpr (kCache) {
#pragma unroll
      for (int e = 0; e < G; ++e) z[e] = q * G + e < cols ? cache[q * G + e] : M(0);
    } else {
      group_z(q, z);
    }
#pragma unroll
    for (int e = 0; e < G; ++e) {
      const int64_t c = q * G + e;
      if (c >= cols) break;
      const M y = exp(z[e] - max) / sum;
      soft[c * ss] = convert<T>(y);
      out[c * so] = convert<T>(p.hard ? M(c == arg) : y);
    }
  }
}

/// Note [Sparsemax threshold]: tau solves sum_c max(z_c - tau, 0) = 1 and
/// lies in [max - 1, max). Every lower bound t of tau gives another, the
/// Michelot step t' = t + (sum_{z >= t} (z - t) - 1) / |{z >= t}| >= t
/// (sums taken relative to t, which is close to tau, for accuracy), and the
/// support {z >= t} only shrinks; the step is a fixed point exactly when t
/// = tau. Each pass also bisects [t, hi] at mid (a lower bound when
/// sum_{z >= mid} (z - mid) >= 1, else the new hi) and keeps the larger of
/// the two steps, so the passes are at most min(|support| steps, the bits
/// of the math type) + 2. The pass that finds the count unchanged computes
/// tau = (sum over the support - 1) / |support| from that support.
/// Operands: out, input.
template <class T, int TPR, int RPB, bool kCache>
__device__ void sparsemax_row(const RowLaunch& l, const rows::OffsetCalc<3, int64_t>& outer, T* cache,
                              math_t<T, false>* scratch, int64_t* index_scratch) {
  using M = math_t<T, false>;
  const rows::RowSlot<TPR, RPB, 3> slot(l, outer);
  T* out = rows::row_operand<T>(l, 0, slot.off);
  const T* x = rows::row_operand<const T>(l, 1, slot.off);
  const int64_t so = l.inner.stride[0][0], sx = l.inner.stride[1][0];
  auto z_at = [&](int64_t c) -> M {
    if constexpr (kCache) return convert<M>(cache[c]);
    else return convert<M>(x[c * sx]);
  };
  M m = -INFINITY;
  if (slot.valid)
    for (int64_t c = slot.lane; c < l.cols; c += TPR) {
      const T v = x[c * sx];
      if constexpr (kCache) cache[c] = v;
      const M z = convert<M>(v);
      m = z > m || z != z ? z : m;
    }
  const M max = rows::row_all_reduce<TPR, RPB>(m, rows::MaxOp{}, scratch);
  M t = max - 1, hi = max, tau = max;  // a NaN row keeps tau = NaN
  for (int64_t prev = -1; max == max;) {  // every thread of the block runs the same passes
    const M mid = t + (hi - t) / 2;
    M s1 = 0, s2 = 0;
    int64_t n1 = 0, n2 = 0;
    if (slot.valid)
      for (int64_t c = slot.lane; c < l.cols; c += TPR) {
        const M z = z_at(c);
        if (z >= t) s1 += z - t, ++n1;
        if (z >= mid) s2 += z - mid, ++n2;
      }
    s1 = rows::row_all_reduce<TPR, RPB>(s1, rows::SumOp{}, scratch);
    s2 = rows::row_all_reduce<TPR, RPB>(s2, rows::SumOp{}, scratch);
    n1 = rows::row_all_reduce<TPR, RPB>(n1, rows::SumOp{}, index_scratch);
    n2 = rows::row_all_reduce<TPR, RPB>(n2, rows::SumOp{}, index_scratch);
    const M step = t + (s1 - 1) / M(n1);
    if (n1 == prev || !slot.valid) {
      tau = step;
      break;
    }
    M next = step > t ? step : t;
    prev = n1;
    if (s2 >= 1) {
      const M bisected = mid + (s2 - 1) / M(n2);
      if (bisected > next) next = bisected, prev = n2;
    } else {
      hi = mid;
    }
    t = next;
  }
  if (!slot.valid) return;
  for (int64_t c = slot.lane; c < l.cols; c += TPR) {
    const M d = z_at(c) - tau;
    out[c * so] = convert<T>(d > 0 || d != d ? d : M(0));
  }
}

/// sparsemax_backward: operands grad_input, grad_output, output.
template <class T, int TPR, int RPB>
__device__ void sparsemax_backward_row(const RowLaunch& l, const rows::OffsetCalc<3, int64_t>& outer,
                                       math_t<T, false>* scratch, int64_t* index_scratch) {
  using M = math_t<T, false>;
  const rows::RowSlot<TPR, RPB, 3> slot(l, outer);
  T* dx = rows::row_operand<T>(l, 0, slot.off);
  const T* g = rows::row_operand<const T>(l, 1, slot.off);
  const T* y = rows::row_operand<const T>(l, 2, slot.off);
  const int64_t sd = l.inner.stride[0][0], sg = l.inner.stride[1][0], sy = l.inner.stride[2][0];
  M sum = 0;
  int64_t n = 0;
  if (slot.valid)
    for (int64_t c = slot.lane; c < l.cols; c += TPR)
      if (convert<M>(y[c * sy]) > 0) sum += convert<M>(g[c * sg]), ++n;
  sum = rows::row_all_reduce<TPR, RPB>(sum, rows::SumOp{}, scratch);
  n = rows::row_all_reduce<TPR, RPB>(n, rows::SumOp{}, index_scratch);
  if (!slot.valid) return;
  const M mean = sum / M(n);
  for (int64_t c = slot.lane; c < l.cols; c += TPR)
    dx[c * sd] = convert<T>(convert<M>(y[c * sy]) > 0 ? convert<M>(g[c * sg]) - mean : M(0));
}

template <class Op, class T, bool kBackward, int TPR, int RPB, bool kCache>
__global__ void __launch_bounds__(TPR * RPB) sparse_kernel(RowLaunch l, rows::OffsetCalc<3, int64_t> outer, RowParams p) {
  using M = math_t<T, false>;
  extern __shared__ __align__(16) char cache_bytes[];
  __shared__ M scratch[RPB * (TPR / 32)];
  __shared__ int64_t index_scratch[RPB * (TPR / 32)];
  if constexpr (std::is_same_v<Op, GumbelSoftmax>) {
    M* cache = reinterpret_cast<M*>(cache_bytes) + (threadIdx.x / TPR) * l.cols;
    gumbel_row<T, TPR, RPB, kCache>(l, outer, p, cache, scratch, index_scratch);
  } else if constexpr (kBackward) {
    sparsemax_backward_row<T, TPR, RPB>(l, outer, scratch, index_scratch);
  } else {
    T* cache = reinterpret_cast<T*>(cache_bytes) + (threadIdx.x / TPR) * l.cols;
    sparsemax_row<T, TPR, RPB, kCache>(l, outer, cache, scratch, index_scratch);
  }
}

/// The softmax rows kernel's threads-per-row schedule. The forward kernels
/// keep a row in shared memory: sparsemax its input, gumbel_softmax z (math type).
template <class Op, class T, bool kBackward>
Status sparse_on_cuda(const RowLaunch& l, const RowParams& p, CUstream_st* stream) {
  const rows::OffsetCalc<3, int64_t> outer(l.outer);
  constexpr bool kMayCache = !kBackward;
  constexpr size_t kElement = std::is_same_v<Op, GumbelSoftmax> ? sizeof(math_t<T, false>) : sizeof(T);
  return rows::by_row_length(l.cols, [&]<int TPR, int RPB>() {
    const size_t cache = kMayCache ? size_t(RPB) * size_t(l.cols) * kElement : 0;
    return rows::launch_cached(sparse_kernel<Op, T, kBackward, TPR, RPB, kMayCache>,
                               sparse_kernel<Op, T, kBackward, TPR, RPB, false>, cache, /*max_carveout=*/false,
                               unsigned((l.rows + RPB - 1) / RPB), TPR * RPB, stream, l, outer, p);
  });
}

/// The launcher the tables record.
template <class Op, class T, bool kBackward>
struct CudaSparse {
  static Status run(const RowLaunch& l, const RowParams& p, CUstream_st* s) { return sparse_on_cuda<Op, T, kBackward>(l, p, s); }
};

}  // namespace baracuda::smax
