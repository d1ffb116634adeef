// Rows split over the blocks of a thread-block cluster (sm_90), each thread
// holding its 16-byte vectors of the row in registers: the parts the
// clustered softmax (src/softmax/cluster.cuh) and norm forward share. See
// Note [Softmax over a cluster] there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda_async.cuh"
#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"

namespace baracuda::rows {

/// Up to 16 ranks: past the portable 8, with the kernel's non-portable opt-in (Hopper holds 16).
inline constexpr int kClusterThreads = 512, kMaxClusterRanks = 16, kMaxPortableRanks = 8;

/// A cluster row's shape: vectors a thread an operand and blocks a row.
struct ClusterRowShape {
  int vectors = 0;  ///< 0: not a cluster row
  int ranks = 0;
  explicit operator bool() const { return vectors > 0; }
};

/// The shape for rows of `cols` elements (`operands` held a row): 64 KiB a
/// block (eight vectors a thread of one operand, four of two: two blocks an
/// SM by registers), else twice that where 16 ranks would not hold the row;
/// none when the row fits `past_bytes` (64 KiB of cache: the single-block
/// row kernels keep three blocks an SM there) or needs more ranks.
inline ClusterRowShape cluster_row_shape(int64_t cols, int elem_bytes, int operands, int64_t past_bytes = 64 * 1024) {
  if (cols * elem_bytes * operands <= past_bytes) return {};
  const int64_t v = 16 / elem_bytes;
  for (int k : {8 / operands, 16 / operands}) {
    const int64_t per_block = int64_t(kClusterThreads) * k * v;
    const int64_t ranks = (cols + per_block - 1) / per_block;
    if (ranks <= kMaxClusterRanks) return {k, int(ranks)};
  }
  return {};
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

/// This block's rank in its cluster and the cluster's size.
__device__ __forceinline__ void cluster_rank(uint32_t& rank, uint32_t& ranks) {
  rank = 0, ranks = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  asm("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(ranks));
#endif
}

/// Shared memory for kRounds cluster-wide combines of (a, b) pairs, one
/// barrier and one slot a rank each: warp 0's lane q sends the block's pair
/// into slot `rank` of block q with st.async, counted on block q's barrier
/// (no fence in the sender).
template <class M, int kRounds>
struct ClusterPairs {
  M warp_part[kRounds][kClusterThreads / 32][2];
  alignas(16) M slots[kRounds][kMaxClusterRanks][2];
  alignas(8) uint64_t arrived[kRounds];

  /// Arms the barriers for the ranks' bytes and announces the block to the
  /// cluster (a relaxed arrive, waited for before the first remote store).
  /// Every thread, first thing.
  __device__ __forceinline__ void start(uint32_t ranks) {
    if (threadIdx.x == 0) {
      for (int round = 0; round < kRounds; ++round) {
        mbar_init(shared_address(&arrived[round]), 1);
        mbar_expect_tx(shared_address(&arrived[round]), ranks * 2 * uint32_t(sizeof(M)));
      }
      mbar_fence_init();
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
  }

  /// Combines the pairs (a, b) of every thread of the cluster with
  /// combine(a, b, other_a, other_b): lane 0 of a shuffle tree a warp, the
  /// warps in order, then the ranks in order, so every thread of every block
  /// gets the same bits. Every thread; rounds in order, each once.
  template <class Combine>
  __device__ __forceinline__ void combine(int round, M& a, M& b, Combine op, uint32_t rank, uint32_t ranks) {
    constexpr int kWarps = kClusterThreads / 32;
#pragma unroll
    for (int d = 16; d >= 1; d /= 2) {
      const M oa = __shfl_down_sync(0xffffffffu, a, d), ob = __shfl_down_sync(0xffffffffu, b, d);
      op(a, b, oa, ob);
    }
    if (threadIdx.x % 32 == 0) warp_part[round][threadIdx.x / 32][0] = a, warp_part[round][threadIdx.x / 32][1] = b;
    __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (round == 0) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");  // every peer has started
#endif
    if (threadIdx.x < ranks || ranks == 1) {
      a = warp_part[round][0][0], b = warp_part[round][0][1];
      for (int w = 1; w < kWarps; ++w) op(a, b, warp_part[round][w][0], warp_part[round][w][1]);
      if (ranks == 1) return;  // a row one block holds: no exchange (memcheck refuses st.async in a cluster of one)
      st_async_pair(cluster_address(shared_address(&slots[round][rank][0]), int(threadIdx.x)), a, b,
                    cluster_address(shared_address(&arrived[round]), int(threadIdx.x)));
    }
    // No block leaves before its barriers have every peer's bytes: no store reaches a block that has left.
    mbar_wait(shared_address(&arrived[round]), 0);
    a = slots[round][0][0], b = slots[round][0][1];
    for (uint32_t r = 1; r < ranks; ++r) op(a, b, slots[round][r][0], slots[round][r][1]);
  }
};

/// Whether the device holds a cluster of `ranks` blocks of `kernel` under
/// `config` (its block and shared memory), asked once per kernel, device and
/// size (a query costs microseconds); sizes past the portable 8 get the
/// kernel's opt-in first.
inline bool cluster_fits(const void* kernel, int ranks, cudaLaunchConfig_t config) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, bool> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return (void)cudaGetLastError(), false;
  const std::lock_guard lock(mutex);
  const auto key = std::make_tuple(kernel, device, ranks);
  if (auto it = known.find(key); it != known.end()) return it->second;
  int clusters = 0;
  config.gridDim = dim3(unsigned(ranks));
  cudaError_t e = ranks > kMaxPortableRanks
                      ? cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)
                      : cudaSuccess;
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  if (e != cudaSuccess) (void)cudaGetLastError(), clusters = 0;  // a size this device refuses
  return known[key] = clusters > 0;
}

/// Launches `kernel` with `rows` clusters of `ranks` blocks of
/// kClusterThreads (cluster r on row r); false, launching nothing, when the
/// device cannot hold such a cluster or the grid would be too large.
template <class... Params, class... Args>
Result<bool> launch_cluster_rows(void (*kernel)(Params...), int ranks, int64_t rows, CUstream_st* stream,
                                 const Args&... args) {
  if (rows < 1 || rows * ranks > int64_t(INT32_MAX)) return false;
  cudaLaunchAttribute cluster;
  cudaLaunchConfig_t config = cluster_launch_config(kClusterThreads, 0, stream, ranks, cluster);
  if (!cluster_fits(reinterpret_cast<const void*>(kernel), ranks, config)) return false;
  config.gridDim = dim3(unsigned(rows * ranks));
  BARACUDA_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, args...));
  return true;
}

}  // namespace baracuda::rows
