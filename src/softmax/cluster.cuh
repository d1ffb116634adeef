// Long softmax rows over a thread-block cluster (sm_90).
//
// Note [Softmax over a cluster]
// A row whose cached operands pass 64 KiB (forward f32 rows past 16384
// elements, backward rows past 8192 f32 / 16384 half elements) left one
// block an SM in the rows kernel, or no cache at all (f32 backward of 32768:
// three passes), and an SM with one block has nothing to do while that
// block reduces: f32 softmax of 8192 x 32768 ran 2.48 TB/s, its backward
// 2.24. Here a row is split over the `ranks` blocks of a cluster, 512
// threads each, and a thread keeps its K 16-byte vectors of each operand in
// registers: the row is read once and written once, and two to three
// blocks share an SM. The row's reduction runs once, through distributed
// shared memory:
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
// store reaches a block that has left.
#pragma once

#include <atomic>
#include <climits>

#include "core/cuda_async.cuh"
#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "softmax/ops.hpp"

namespace baracuda::smax {

using rows::RowLaunch;

/// Up to 16 ranks: past the portable 8, with the kernel's non-portable opt-in (Hopper holds 16).
inline constexpr int kClusterThreads = 512, kMaxClusterRanks = 16, kMaxPortableRanks = 8;

/// A cluster row's shape: vectors a thread an operand (K) and blocks a row.
struct ClusterRowShape {
  int vectors = 0;  ///< 0: not a cluster row
  int ranks = 0;
  explicit operator bool() const { return vectors > 0; }
};

/// The shape for rows of `cols` elements (`operands` cached a row): 64 KiB
/// a block (a forward thread holds eight vectors, a backward thread four of
/// each operand: two blocks an SM by registers), else twice that where 16
/// ranks would not hold the row; none when the row fits 64 KiB of cache
/// (the rows kernel keeps three blocks an SM) or needs more ranks.
inline ClusterRowShape cluster_row_shape(int64_t cols, int elem_bytes, int operands) {
  if (cols * elem_bytes * operands <= 64 * 1024) return {};
  const int64_t v = 16 / elem_bytes;
  for (int k : {8 / operands, 16 / operands}) {
    const int64_t per_block = int64_t(kClusterThreads) * k * v;
    const int64_t ranks = (cols + per_block - 1) / per_block;
    if (ranks <= kMaxClusterRanks) return {k, int(ranks)};
  }
  return {};
}

/// NaN-propagating maximum (as rows::MaxOp).
template <class M>
__device__ __forceinline__ M nan_max(M a, M b) {
  return a > b || a != a ? a : b;
}

/// exp(m - max), 0 for an empty part (m = -inf).
template <class M, bool kFast>
__device__ __forceinline__ M part_weight(M m, M max) {
  if (m == M(-INFINITY)) return M(0);
  if constexpr (kFast) return __expf(m - max);
  else return exp(m - max);
}

/// Hides a vector's value from the compiler, so that the conversions of its
/// elements before a barrier are redone after it rather than kept live
/// across it (bf16 kept 64 converted floats a thread and spilled).
template <class P>
__device__ __forceinline__ void opaque(P& p) {
  static_assert(sizeof(P) == 16);
  uint32_t w[4];
  memcpy(w, &p, 16);
  asm volatile("" : "+r"(w[0]), "+r"(w[1]), "+r"(w[2]), "+r"(w[3]));
  memcpy(&p, w, 16);
}

/// Combines the pairs (a, b) of every thread of the cluster with `combine`
/// (lane 0 of a shuffle tree a warp, the warps in order, then the ranks in
/// order), once a block; every thread gets the same bits.
template <class M, class Combine>
__device__ __forceinline__ void cluster_combine(M& a, M& b, Combine combine, M (*warp_part)[2], M (*exchange)[2],
                                                uint32_t arrived, uint32_t rank, uint32_t ranks) {
  constexpr int kWarps = kClusterThreads / 32;
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) {
    const M oa = __shfl_down_sync(0xffffffffu, a, d), ob = __shfl_down_sync(0xffffffffu, b, d);
    combine(a, b, oa, ob);
  }
  const int lane = int(threadIdx.x % 32);
  if (lane == 0) warp_part[threadIdx.x / 32][0] = a, warp_part[threadIdx.x / 32][1] = b;
  __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");  // every peer has started
#endif
  if (threadIdx.x < ranks) {
    a = warp_part[0][0], b = warp_part[0][1];
    for (int w = 1; w < kWarps; ++w) combine(a, b, warp_part[w][0], warp_part[w][1]);
    st_async_pair(cluster_address(shared_address(&exchange[rank][0]), int(threadIdx.x)), a, b,
                  cluster_address(arrived, int(threadIdx.x)));
  }
  mbar_wait(arrived, 0);
  a = exchange[0][0], b = exchange[0][1];
  for (uint32_t r = 1; r < ranks; ++r) combine(a, b, exchange[r][0], exchange[r][1]);
}

/// Forward: operand 0 = out, 1 = input. Backward: 0 = grad_input, 1 =
/// grad_output, 2 = output, the gradient times `scale`. Rows in whole
/// aligned vectors (rows::rows_in_vectors); block rank of cluster
/// blockIdx.x / ranks owns columns rank * K * 512 * V onwards of that row.
template <class Op, class T, bool kBackward, int K>
__global__ void __launch_bounds__(kClusterThreads, K * (kBackward ? 2 : 1) <= 8 ? 2 : 1)
    cluster_rows_kernel(RowLaunch l, rows::OffsetCalc<3, int64_t> outer, math_t<T, false> scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using M = math_t<T, false>;
  constexpr int V = rows::kVecOf<T>;
  using P = rows::Vec<T, V>;
  __shared__ M warp_part[kClusterThreads / 32][2];
  __shared__ __align__(16) M exchange[kMaxClusterRanks][2];
  __shared__ __align__(8) uint64_t arrived_bar;
  uint32_t rank, ranks;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  asm("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(ranks));
  const uint32_t arrived = shared_address(&arrived_bar);
  if (threadIdx.x == 0) {
    mbar_init(arrived, 1);
    mbar_expect_tx(arrived, ranks * 2 * uint32_t(sizeof(M)));
    mbar_fence_init();
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");

  int64_t off[3];
  outer.get(int64_t(blockIdx.x / ranks), off);
  const int64_t cols = l.cols;
  auto col = [&](int k) { return ((int64_t(rank) * K + k) * kClusterThreads + threadIdx.x) * V; };
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
        for (int e = 0; e < V; ++e) m = nan_max(m, sign * convert<M>(x[k].v[e]));
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
    cluster_combine(
        max, sum,
        [](M& ma, M& sa, M mb, M sb) {
          const M mx = nan_max(ma, mb);
          sa = sa * part_weight<M, kFastExp>(ma, mx) + sb * part_weight<M, kFastExp>(mb, mx);
          ma = mx;
        },
        warp_part, exchange, arrived, rank, ranks);
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
    cluster_combine(
        t, unused, [](M& ta, M&, M tb, M) { ta += tb; }, warp_part, exchange, arrived, rank, ranks);
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
  __trap();  // launched on sm_90 and later only (launch_cluster_rows)
#endif
}

/// Runs the rows on the cluster kernel when they suit it (sm_90, half or f32
/// storage, every operand in whole aligned vectors, a cluster_row_shape);
/// false when they do not, or the device cannot hold the cluster.
template <class Op, class T, bool kBackward>
Result<bool> launch_cluster_rows(const RowLaunch& l, const rows::OffsetCalc<3, int64_t>& outer,
                                 math_t<T, false> scale, CUstream_st* stream) {
  constexpr bool kSuits = std::is_same_v<T, float> || sizeof(T) == 2;
  if constexpr (!kSuits) {
    return false;
  } else {
    const int operands = kBackward ? 2 : 1;
    const ClusterRowShape shape = cluster_row_shape(l.cols, int(sizeof(T)), operands);
    if (!shape || l.rows < 1 || l.rows * shape.ranks > int64_t(INT32_MAX) || current_sm_version() < 90) return false;
    for (int k = 0; k <= operands; ++k)
      if (!rows::rows_in_vectors(l, k, sizeof(T))) return false;
    constexpr int kFirst = kBackward ? 4 : 8;  // cluster_row_shape's vectors a thread
    auto kernel = shape.vectors == kFirst ? cluster_rows_kernel<Op, T, kBackward, kFirst>
                                          : cluster_rows_kernel<Op, T, kBackward, 2 * kFirst>;
    cudaLaunchConfig_t config{};
    config.blockDim = dim3(kClusterThreads);
    config.stream = stream;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = unsigned(shape.ranks), cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    // Whether the device holds such a cluster, asked once per device, shape and kernel (microseconds a query).
    static std::atomic<int8_t> fits[64][2][kMaxClusterRanks + 1] = {};
    int device = 0;
    BARACUDA_CUDA_TRY(cudaGetDevice(&device));
    const int slot = shape.vectors == kFirst ? 0 : 1;
    int8_t known = device < 64 ? fits[device][slot][shape.ranks].load(std::memory_order_relaxed) : 0;
    if (known == 0) {
      int clusters = 0;
      config.gridDim = dim3(unsigned(shape.ranks));
      cudaError_t e = shape.ranks > kMaxPortableRanks
                          ? cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)
                          : cudaSuccess;
      if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
      if (e != cudaSuccess) (void)cudaGetLastError(), clusters = 0;  // a size this device refuses: the rows kernel
      known = clusters > 0 ? 1 : -1;
      if (device < 64) fits[device][slot][shape.ranks].store(known, std::memory_order_relaxed);
    }
    if (known < 0) return false;
    config.gridDim = dim3(unsigned(l.rows * shape.ranks));
    BARACUDA_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, l, outer, scale));
    return true;
  }
}

}  // namespace baracuda::smax
