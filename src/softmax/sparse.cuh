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
/// of kGroup columns (one Philox call each; one vector load or store where
/// the row allows); with kCache, z = (x + g) / tau stays in shared memory
/// between the passes. Note [Gumbel rows in a pipeline]: a block (RPB row
/// slots) takes rows b, b + grid, ..., and the writing pass of a row also
/// computes the next row's z group by group: the Philox and log work of one
/// row runs beside the other's stores instead of after them. The launcher
/// cuts the grid to what the GPU holds at once for rows of 1024 threads
/// (past 16384 columns: one block an SM with the 128 KiB cache; H200 f32
/// 8192x32768 0.71 -> 1.21 TB/s, bf16 0.48 -> 0.62); shorter rows keep a
/// block a row (a resident grid took bf16 32768x4096 from 0.66 to 0.56).
/// A thread reads and overwrites only its own groups' cache slots, so the
/// cache needs no barrier; the sums per thread run in column order as
/// before, so the bits do not depend on the grid.
template <class T, int TPR, int RPB, bool kCache>
__device__ void gumbel_rows(const RowLaunch& l, const rows::OffsetCalc<3, int64_t>& outer, const RowParams& p,
                            math_t<T, false>* cache, math_t<T, false>* scratch, int64_t* index_scratch) {
  using M = math_t<T, false>;
  constexpr int G = GumbelSoftmax::kGroup;
  constexpr bool kMayVector = sizeof(T) * G <= 16;
  using Group = rows::Vec<T, G>;
  const int lane = int(threadIdx.x % TPR);
  const int64_t cols = l.cols, groups = (cols + G - 1) / G, step = int64_t(gridDim.x) * RPB;
  const int64_t so = l.inner.stride[0][0], ss = l.inner.stride[1][0], sx = l.inner.stride[2][0];
  const M inv_tau = M(1 / p.tau);
  // A row slot's operands; `vec` when its three rows are unit-stride and group-aligned.
  struct Row {
    int64_t index;
    bool valid, vec;
    T *out, *soft;
    const T* x;
  };
  auto row_at = [&](int64_t r) {
    Row row{r, r < l.rows, false, nullptr, nullptr, nullptr};
    if (!row.valid) return row;
    int64_t off[3];
    outer.get(r, off);
    row.out = rows::row_operand<T>(l, 0, off), row.soft = rows::row_operand<T>(l, 1, off);
    row.x = rows::row_operand<const T>(l, 2, off);
    if constexpr (kMayVector) {
      const uintptr_t any = uintptr_t(row.out) | uintptr_t(row.soft) | uintptr_t(row.x);
      row.vec = so == 1 && ss == 1 && sx == 1 && cols % G == 0 && any % sizeof(Group) == 0;
    }
    return row;
  };
  auto group_z = [&](const Row& row, int64_t q, M (&z)[G]) {  // -inf past the row's end
    M g[G];
    GumbelSoftmax::noise(p, row.index, q, g);
    if (kMayVector && row.vec) {
      const Group xv = reinterpret_cast<const Group*>(row.x)[q];
#pragma unroll
      for (int e = 0; e < G; ++e) z[e] = (convert<M>(xv.v[e]) + g[e]) * inv_tau;
      return;
    }
#pragma unroll
    for (int e = 0; e < G; ++e) {
      const int64_t c = q * G + e;
      z[e] = c < cols ? (convert<M>(row.x[c * sx]) + g[e]) * inv_tau : M(-INFINITY);
    }
  };
  // The online max, first argmax and rescaled sum of exponentials of a row's groups.
  struct Online {
    M m = -INFINITY, s = 0;
    int64_t arg = kNoIndex;
  };
  auto take = [&](Online& o, int64_t q, const M (&z)[G]) {
#pragma unroll
    for (int e = 0; e < G; ++e) {
      if constexpr (kCache)
        if (q * G + e < cols) cache[q * G + e] = z[e];
      if (z[e] > o.m || (z[e] != z[e] && o.m == o.m)) {
        o.s = o.s * exp(o.m - z[e]) + 1, o.m = z[e], o.arg = q * G + e;
      } else if (z[e] != -INFINITY) {
        o.s += exp(z[e] - o.m);
      }
    }
  };
  Row row = row_at(int64_t(blockIdx.x) * RPB + threadIdx.x / TPR);
  Online online;
  if (row.valid)
    for (int64_t q = lane; q < groups; q += TPR) {
      M z[G];
      group_z(row, q, z);
      take(online, q, z);
    }
  // Every thread of the block takes the same turns (the reductions synchronise): while slot 0 has a row.
  for (int64_t lead = int64_t(blockIdx.x) * RPB; lead < l.rows; lead += step) {
    const M max = rows::row_all_reduce<TPR, RPB>(online.m, rows::MaxOp{}, scratch);
    const bool mine = online.m == max || (online.m != online.m && max != max);
    const M sum = rows::row_all_reduce<TPR, RPB>(online.m == max ? online.s : online.s * exp(online.m - max),
                                                 rows::SumOp{}, scratch);
    int64_t arg = online.arg;
    if (p.hard) arg = rows::row_all_reduce<TPR, RPB>(mine ? arg : kNoIndex, MinIndexOp{}, index_scratch);
    if (arg == kNoIndex) arg = 0;  // a row of -inf: as the host reference
    const Row next = row_at(row.index + step);
    Online ahead;
    if (row.valid)
      for (int64_t q = lane; q < groups; q += TPR) {
        M z[G];
        if constexpr (kCache) {
#pragma unroll
          for (int e = 0; e < G; ++e) z[e] = q * G + e < cols ? cache[q * G + e] : M(0);
        } else {
          group_z(row, q, z);
        }
        if (next.valid) {  // the next row's z of this group (overwriting the cache slots just read)
          M z_next[G];
          group_z(next, q, z_next);
          take(ahead, q, z_next);
        }
        Group soft, out;
#pragma unroll
        for (int e = 0; e < G; ++e) {
          const M y = exp(z[e] - max) / sum;
          soft.v[e] = convert<T>(y);
          out.v[e] = convert<T>(p.hard ? M(q * G + e == arg) : y);
        }
        if (kMayVector && row.vec) {
          reinterpret_cast<Group*>(row.soft)[q] = soft;
          reinterpret_cast<Group*>(row.out)[q] = out;
        } else {
#pragma unroll
          for (int e = 0; e < G; ++e) {
            const int64_t c = q * G + e;
            if (c >= cols) break;
            row.soft[c * ss] = soft.v[e];
            row.out[c * so] = out.v[e];
          }
        }
      }
    row = next, online = ahead;
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
    gumbel_rows<T, TPR, RPB, kCache>(l, outer, p, cache, scratch, index_scratch);
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
    return rows::launch_cached_grid(sparse_kernel<Op, T, kBackward, TPR, RPB, kMayCache>,
                                    sparse_kernel<Op, T, kBackward, TPR, RPB, false>, cache, /*max_carveout=*/false,
                                    /*loops_over_rows=*/std::is_same_v<Op, GumbelSoftmax> && TPR == 1024,
                                    unsigned((l.rows + RPB - 1) / RPB), TPR * RPB, stream, l, outer, p);
  });
}

/// The launcher the tables record.
template <class Op, class T, bool kBackward>
struct CudaSparse {
  static Status run(const RowLaunch& l, const RowParams& p, CUstream_st* s) { return sparse_on_cuda<Op, T, kBackward>(l, p, s); }
};

}  // namespace baracuda::smax
