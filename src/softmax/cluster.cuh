// Long softmax rows over a thread-block cluster (sm_90).
//
// Note [Softmax over a cluster]
// A row whose cached operands pass 64 KiB (forward f32 rows past 16384
// elements, backward rows past 8192 f32 / 16384 half elements) left one
// block an SM in the rows kernel, or no cache at all (f32 backward of 32768:
// three passes), and an SM with one block has nothing to do while that
// block reduces: f32 softmax of 8192 x 32768 ran 2.48 TB/s, its backward
// 2.24. Here a row is split over the `ranks` blocks of a cluster (2 to 16;
// core/cluster_rows.cuh), 512 threads each, and a thread keeps its 16-byte
// vectors in registers (eight of the input, or four each of grad_output and
// output; twice that where 16 ranks would not hold the row): the row is read
// once and written once, and two blocks of 64 registers a thread share an
// SM. The row's reduction runs once, through distributed shared memory:
//  - forward: each thread takes the maximum m of its elements and the sum s
//    of exp(z - m) (keeping the exponentials where they are the output's
//    storage type, f32), the pairs (m, s) combine as online-softmax pairs
//    (a shuffle tree a warp, then the warps in order, then the ranks in
//    order: the same bits in every block); the output is the kept
//    exponential times exp(m - max) / sum, one exponential an element
//    (half types recompute exp(z - max) with the fast exponential instead:
//    they are bound by registers, not arithmetic). log_softmax needs no
//    exponential for its output.
//  - backward: one sum, t = sum term(g, y), then grad(g, y, t).
// Warp 0's lane q sends the block's pair into slot `rank` of block q with
// st.async, counted on block q's barrier (no fence in the sender). A block
// arms its barrier for the ranks' bytes and announces its start to the
// cluster (a relaxed arrive) before it loads its row; it waits for the
// cluster only before its first remote store, by when every peer has long
// started. No block exits before its barrier has every peer's bytes, so no
// store reaches a block that has left. Four vectors a thread at four ranks
// (32 KiB a block) ran the f32 forward of 8192 x 32768 at 2.50 TB/s, eight
// at two ranks 2.99: a block's fixed cost (launch, barriers, the exchange)
// wants 64 KiB to spread over. The layer_norm / rms_norm forward takes the
// same rows (src/norm/cluster_forward.cuh).
#pragma once

#include "core/cluster_rows.cuh"
#include "softmax/ops.hpp"

namespace baracuda::smax {

using rows::RowLaunch;

/// exp(m - max), 0 for an empty part (m = -inf).
template <class M, bool kFast>
__device__ __forceinline__ M part_weight(M m, M max) {
  if (m == M(-INFINITY)) return M(0);
  if constexpr (kFast) return __expf(m - max);
  else return exp(m - max);
}

/// Forward: operand 0 = out, 1 = input. Backward: 0 = grad_input, 1 =
/// grad_output, 2 = output, the gradient times `scale`. Rows in whole
/// aligned vectors (rows::rows_in_vectors); block rank of cluster
/// blockIdx.x / ranks owns columns rank * K * 512 * V onwards of that row.
template <class Op, class T, bool kBackward, int K>
__global__ void __launch_bounds__(rows::kClusterThreads, K * (kBackward ? 2 : 1) <= 8 ? 2 : 1)
    cluster_rows_kernel(RowLaunch l, rows::OffsetCalc<3, int64_t> outer, math_t<T, false> scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using M = math_t<T, false>;
  constexpr int V = rows::kVecOf<T>, kThreads = rows::kClusterThreads;
  using P = rows::Vec<T, V>;
  using rows::opaque;
  __shared__ rows::ClusterPairs<M, 1> pairs;
  uint32_t rank, ranks;
  rows::cluster_rank(rank, ranks);
  pairs.start(ranks);

  int64_t off[3];
  outer.get(int64_t(blockIdx.x / ranks), off);
  const int64_t cols = l.cols;
  auto col = [&](int k) { return ((int64_t(rank) * K + k) * kThreads + threadIdx.x) * V; };
  P x[K], y[K];  // forward: the input; backward: grad_output, output
  const T* src = rows::row_operand<const T>(l, 1, off);
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (col(k) < cols) x[k] = *reinterpret_cast<const P*>(src + col(k));
  if constexpr (kBackward) {
    const T* saved = rows::row_operand<const T>(l, 2, off);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < cols) y[k] = *reinterpret_cast<const P*>(saved + col(k));
  }
  T* out = rows::row_operand<T>(l, 0, off);

  if constexpr (!kBackward) {
    constexpr bool kFastExp = sizeof(T) == 2;  // as the rows kernel: half rounding dwarfs its error
    constexpr bool kKeepExp = !Op::kLog && std::is_same_v<T, M>;
    auto expo = [](M v) -> M {
      if constexpr (kFastExp) return __expf(v);
      else return exp(v);
    };
    const M sign = Op::template sign<M>();
    M m = -INFINITY, s = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < cols)
#pragma unroll
        for (int e = 0; e < V; ++e) m = rows::MaxOp{}(m, sign * convert<M>(x[k].v[e]));
    const M shift = m == M(-INFINITY) ? M(0) : m;  // exp(-inf - -inf) would be NaN
    if constexpr (!kKeepExp)
#pragma unroll
      for (int k = 0; k < K; ++k) opaque(x[k]);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < cols)
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const M p = expo(sign * convert<M>(x[k].v[e]) - shift);
          s += p;
          if constexpr (kKeepExp) x[k].v[e] = p;
        }
    M max = m, sum = s;
    pairs.combine(
        0, max, sum,
        [](M& ma, M& sa, M mb, M sb) {
          const M mx = rows::MaxOp{}(ma, mb);
          sa = sa * part_weight<M, kFastExp>(ma, mx) + sb * part_weight<M, kFastExp>(mb, mx);
          ma = mx;
        },
        rank, ranks);
#pragma unroll
    for (int k = 0; k < K; ++k) opaque(x[k]);
    // The kept exponentials' factor; m = -inf kept zeros (0 * NaN = NaN only where the whole row is -inf).
    const M factor = part_weight<M, kFastExp>(m, max) / sum, inverse_sum = M(1) / sum;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (col(k) >= cols) continue;
      P o;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if constexpr (kKeepExp) o.v[e] = convert<T>(x[k].v[e] * factor);
        else if constexpr (Op::kLog) o.v[e] = convert<T>(Op::out(sign * convert<M>(x[k].v[e]), max, sum));
        else o.v[e] = convert<T>(expo(sign * convert<M>(x[k].v[e]) - max) * inverse_sum);
      }
      rows::store_16(out + col(k), o);
    }
  } else {
    M t = 0, unused = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < cols)
#pragma unroll
        for (int e = 0; e < V; ++e) t += Op::term(convert<M>(x[k].v[e]), convert<M>(y[k].v[e]));
    pairs.combine(0, t, unused, [](M& ta, M&, M tb, M) { ta += tb; }, rank, ranks);
#pragma unroll
    for (int k = 0; k < K; ++k) opaque(x[k]), opaque(y[k]);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (col(k) >= cols) continue;
      P o;
#pragma unroll
      for (int e = 0; e < V; ++e)
        o.v[e] = convert<T>(Op::grad(convert<M>(x[k].v[e]), convert<M>(y[k].v[e]), t) * scale);
      rows::store_16(out + col(k), o);
    }
  }
#else
  __trap();  // launched on sm_90 and later only (launch_clustered_softmax)
#endif
}

/// Runs the rows on the cluster kernel when they suit it (sm_90, half or f32
/// storage, every operand in whole aligned vectors, a cluster_row_shape);
/// false when they do not, or the device cannot hold the cluster.
template <class Op, class T, bool kBackward>
Result<bool> launch_clustered_softmax(const RowLaunch& l, const rows::OffsetCalc<3, int64_t>& outer,
                                      math_t<T, false> scale, CUstream_st* stream) {
  if constexpr (!std::is_same_v<T, float> && sizeof(T) != 2) {
    return false;
  } else {
    constexpr int operands = kBackward ? 2 : 1;
    const rows::ClusterRowShape shape = rows::cluster_row_shape(l.cols, int(sizeof(T)), operands);
    if (!shape || current_sm_version() < 90) return false;
    for (int k = 0; k <= operands; ++k)
      if (!rows::rows_in_vectors(l, k, sizeof(T))) return false;
    constexpr int kFirst = 8 / operands;  // cluster_row_shape's vectors a thread, or twice that
    auto kernel = shape.vectors == kFirst ? cluster_rows_kernel<Op, T, kBackward, kFirst>
                                          : cluster_rows_kernel<Op, T, kBackward, 2 * kFirst>;
    return rows::launch_cluster_rows(kernel, shape.ranks, l.rows, stream, l, outer, scale);
  }
}

}  // namespace baracuda::smax
