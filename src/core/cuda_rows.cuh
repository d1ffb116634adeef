// Device helpers for row kernels: `TPR` threads (a warp or several) own one
// row; `RPB` rows per block. Row reductions combine warps in a fixed order so
// every thread gets the same, deterministic value.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "core/cuda_async.cuh"
#include "core/cuda_check.hpp"
#include "core/device_memo.hpp"
#include "core/rows.hpp"

namespace baracuda::rows {

template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

/// Elements per 16-byte vector.
template <class T>
inline constexpr int kVecOf = sizeof(T) >= 16 ? 1 : int(16 / sizeof(T));

struct SumOp {
  template <class M> __device__ __forceinline__ M operator()(M a, M b) const { return a + b; }
};
struct MaxOp {
  template <class M> __device__ __forceinline__ M operator()(M a, M b) const { return a > b || a != a ? a : b; }
};

/// The row a thread works on (TPR threads a row, RPB rows a block): its
/// index, the thread's lane in it, whether it exists (a block's last rows may
/// not), and the row's offset in each of the N operands (0 past the end).
template <int TPR, int RPB, int N>
struct RowSlot {
  int64_t row;
  int lane;
  bool valid;
  int64_t off[N] = {};

  __device__ __forceinline__ RowSlot(const RowLaunch& l, const OffsetCalc<N, int64_t>& outer)
      : row(int64_t(blockIdx.x) * RPB + threadIdx.x / TPR), lane(int(threadIdx.x % TPR)), valid(row < l.rows) {
    if (valid) outer.get(row, off);
  }
};

/// Operand k's row at offset off[k] (T const for an input).
template <class T>
__device__ __forceinline__ T* row_operand(const RowLaunch& l, int k, const int64_t* off) {
  return reinterpret_cast<T*>(l.data[k]) + off[k];
}

/// Combines `v` over the TPR threads of a row, and makes the row's shared
/// memory writes visible to the other threads of the row. `scratch` holds RPB * (TPR / 32)
/// values; every thread of the block must call this (it synchronises).
template <int TPR, int RPB, class M, class Op>
__device__ __forceinline__ M row_all_reduce(M v, Op op, M* scratch) {
  if constexpr (TPR == 32) __syncwarp();  // also orders the row's shared-memory cache between passes
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, d));
  if constexpr (TPR == 32) {
    return v;
  } else {
    constexpr int kWarps = TPR / 32;
    const int row_in_block = threadIdx.x / TPR, warp = (threadIdx.x % TPR) / 32;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (threadIdx.x % 32 == 0) scratch[row_in_block * kWarps + warp] = v;
    __syncthreads();
    M r = scratch[row_in_block * kWarps];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) r = op(r, scratch[row_in_block * kWarps + w]);
    return r;
  }
}

/// row_all_reduce for one row a block of blockDim.x threads, a whole number
/// of warps known only at run time (`scratch` holds blockDim.x / 32 values).
/// The warps combine in order: the same bits for the same block width.
template <class M, class Op>
__device__ __forceinline__ M block_all_reduce(M v, Op op, M* scratch) {
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, d));
  const int warps = int(blockDim.x / 32);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  M r = scratch[0];
  for (int w = 1; w < warps; ++w) r = op(r, scratch[w]);
  return r;
}

/// Calls f(index, value) for the elements of a row this thread owns: 16-byte
/// vectors when `vector` (unit stride, aligned, cols % V == 0), else scalars.
/// With `cache` (16-byte aligned shared memory), also stores the row there,
/// whole vectors at a time (no bank conflicts).
template <int TPR, class T, class F>
__device__ __forceinline__ void for_row(const T* row, int64_t stride, int64_t cols, bool vector, int lane, F&& f,
                                        T* cache = nullptr) {
  constexpr int V = kVecOf<T>;
  using P = Vec<T, V>;
  if (vector) {
    const auto* packs = reinterpret_cast<const P*>(row);
    auto* cached = reinterpret_cast<P*>(cache);
    const int64_t n = cols / V;
    int64_t i = lane;
    for (; i + TPR < n; i += 2 * TPR) {  // two vectors in flight
      const P a = packs[i], b = packs[i + TPR];
      if (cached) cached[i] = a, cached[i + TPR] = b;
#pragma unroll
      for (int e = 0; e < V; ++e) f(i * V + e, a.v[e]);
#pragma unroll
      for (int e = 0; e < V; ++e) f((i + TPR) * V + e, b.v[e]);
    }
    for (; i < n; i += TPR) {
      const P a = packs[i];
      if (cached) cached[i] = a;
#pragma unroll
      for (int e = 0; e < V; ++e) f(i * V + e, a.v[e]);
    }
  } else {
    for (int64_t c = lane; c < cols; c += TPR) {
      const T x = row[c * stride];
      if (cache) cache[c] = x;
      f(c, x);
    }
  }
}

/// Copies the vectors of a row in whole vectors (unit stride, 16-byte
/// aligned, cols % V == 0) that this thread owns (the ownership of for_row)
/// into `cache` (16-byte aligned shared memory) by cp.async, every copy in
/// flight at once, and waits for them: the thread may then read back its
/// own vectors, no barrier needed. (for_row's cache fill keeps two vectors
/// in flight through registers.)
template <int TPR, class T>
__device__ __forceinline__ void cache_row_async(const T* row, int64_t cols, int lane, T* cache) {
  constexpr int V = kVecOf<T>;
  using P = Vec<T, V>;
  const auto* packs = reinterpret_cast<const P*>(row);
  auto* cached = reinterpret_cast<P*>(cache);
  for (int64_t i = lane; i < cols / V; i += TPR) cp_async_16(&cached[i], &packs[i], true);
  cp_async_commit();
  cp_async_wait<0>();
}

/// dst[c] = f(c, {src_k[c]...}) over the elements of a row this thread owns
/// (the ownership of for_row): whole vectors from every source and to dst
/// when `vector` (every source unit-stride and 16-byte aligned).
template <int TPR, int NS, class T, class F>
__device__ __forceinline__ void map_row(const T* const (&src)[NS], const int64_t (&src_stride)[NS], T* dst,
                                        int64_t dst_stride, int64_t cols, bool vector, int lane, F&& f) {
  constexpr int V = kVecOf<T>;
  using P = Vec<T, V>;
  if (vector) {
    for (int64_t i = lane; i < cols / V; i += TPR) {
      P in[NS], out;
#pragma unroll
      for (int k = 0; k < NS; ++k) in[k] = reinterpret_cast<const P*>(src[k])[i];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        T x[NS];
#pragma unroll
        for (int k = 0; k < NS; ++k) x[k] = in[k].v[e];
        out.v[e] = f(i * V + e, x);
      }
      reinterpret_cast<P*>(dst)[i] = out;
    }
  } else {
    for (int64_t c = lane; c < cols; c += TPR) {
      T x[NS];
#pragma unroll
      for (int k = 0; k < NS; ++k) x[k] = src[k][c * src_stride[k]];
      dst[c * dst_stride] = f(c, x);
    }
  }
}

/// Stores value_at(index) for the elements of a row this thread owns, with
/// the same ownership as for_row.
template <int TPR, class T, class F>
__device__ __forceinline__ void store_row(T* row, int64_t stride, int64_t cols, bool vector, int lane, F&& value_at) {
  constexpr int V = kVecOf<T>;
  if (vector) {
    auto* packs = reinterpret_cast<Vec<T, V>*>(row);
    for (int64_t i = lane; i < cols / V; i += TPR) {
      Vec<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = value_at(i * V + e);
      packs[i] = out;
    }
  } else {
    for (int64_t c = lane; c < cols; c += TPR) row[c * stride] = value_at(c);
  }
}

/// Shared memory a block may keep rows in (the opt-in limit on Hopper is 227 KiB).
inline constexpr size_t kRowCacheBytes = 200 * 1024;

/// Raises `kernel`'s dynamic shared-memory limit to `cap` bytes on the current
/// device once (and, with `max_carveout`, gives it all of L1 as shared memory,
/// so that several blocks' rows fit on an SM); later calls find it done
/// instead of calling the driver.
inline cudaError_t allow_dynamic_smem(const void* kernel, int cap, bool max_carveout = false) {
  static std::mutex mutex;
  static std::set<std::tuple<const void*, int, int, bool>> raised;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const std::lock_guard lock(mutex);
  if (raised.count({kernel, device, cap, max_carveout})) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, cap);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             max_carveout ? int(cudaSharedmemCarveoutMaxShared) : int(cudaSharedmemCarveoutDefault));
  if (e == cudaSuccess) raised.insert({kernel, device, cap, max_carveout});
  return e;
}

/// Calls f.template operator()<TPR, RPB>() with the row-kernel shape for rows
/// of `cols` elements: threads per row and rows per block. `narrow_long_rows`:
/// rows past 16384 keep 512 threads, so that several cached rows share an SM
/// (one's arithmetic hides another's loads).
template <class F>
Status by_row_length(int64_t cols, F&& f, bool narrow_long_rows = false) {
  if (cols <= 128) return f.template operator()<32, 8>();
  if (cols <= 1024) return f.template operator()<32, 4>();
  if (cols <= 4096) return f.template operator()<128, 1>();
  if (cols <= 16384 || narrow_long_rows) return f.template operator()<512, 1>();
  return f.template operator()<1024, 1>();
}

/// At most `blocks`, and no more blocks of `kernel` than the GPU holds at
/// once: the grid of a kernel whose blocks loop over rows by the grid.
template <class Kernel>
unsigned resident_grid(Kernel kernel, unsigned threads, size_t smem, unsigned blocks) {
  const int per_sm = blocks_per_sm(kernel, int(threads), smem);
  if (per_sm <= 0) return blocks;  // the whole grid then: still correct
  return unsigned(std::min<int64_t>(blocks, int64_t(per_sm) * std::max(current_sm_count(), 1)));
}

/// Launches `cached` with `cache` bytes of dynamic shared memory when that
/// fits kRowCacheBytes (raising the kernel's limit past 48 KiB; with
/// `max_carveout`, all of L1 as shared memory), else `uncached` without.
/// `loops_over_rows`: the kernels' blocks take rows by the grid, which is
/// then cut to what the GPU holds at once (resident_grid).
template <class Kernel, class... Args>
Status launch_cached_grid(Kernel cached, Kernel uncached, size_t cache, bool max_carveout, bool loops_over_rows,
                          unsigned blocks, unsigned threads, CUstream_st* stream, const Args&... args) {
  if (cache <= kRowCacheBytes) {
    if (cache > 48 * 1024)
      BARACUDA_CUDA_TRY(allow_dynamic_smem(reinterpret_cast<const void*>(cached), int(kRowCacheBytes), max_carveout));
    if (loops_over_rows) blocks = resident_grid(cached, threads, cache, blocks);
    cached<<<blocks, threads, cache, stream>>>(args...);
  } else {
    if (loops_over_rows) blocks = resident_grid(uncached, threads, 0, blocks);
    uncached<<<blocks, threads, 0, stream>>>(args...);
  }
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

template <class Kernel, class... Args>
Status launch_cached(Kernel cached, Kernel uncached, size_t cache, bool max_carveout, unsigned blocks,
                     unsigned threads, CUstream_st* stream, const Args&... args) {
  return launch_cached_grid(cached, uncached, cache, max_carveout, false, blocks, threads, stream, args...);
}

/// A launch of `threads`-thread blocks with `smem` bytes of dynamic shared
/// memory in clusters of `ranks` blocks along x (the cluster attribute lives
/// in `attr`, which must outlive the launch); the caller sets the grid.
inline cudaLaunchConfig_t cluster_launch_config(unsigned threads, size_t smem, CUstream_st* stream, int ranks,
                                                cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(ranks), attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  return config;
}

/// One 16-byte store of a vector to global `dst` (16-byte aligned). A copy
/// of the struct, or of a uint4, may compile to four 4-byte stores (the
/// clustered norm backward's did: four times the store requests).
template <class T, int V>
__device__ __forceinline__ void store_16(T* dst, const Vec<T, V>& v) {
  static_assert(sizeof(Vec<T, V>) == 16);
  uint32_t w[4];
  memcpy(w, &v, 16);
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
               : "memory");
}

/// Whether every row of operand k is unit-stride and 16-byte aligned, in whole vectors.
inline bool rows_in_vectors(const RowLaunch& l, int k, size_t elem_bytes) {
  const int64_t v = int64_t(16 / elem_bytes);
  if (l.inner.stride[k][0] != 1 || reinterpret_cast<uintptr_t>(l.data[k]) % 16 != 0 || l.cols % v != 0) return false;
  for (int d = 0; d < l.outer.rank; ++d)
    if (l.outer.shape[d] > 1 && l.outer.stride[k][d] % v != 0) return false;
  return true;
}

/// True when `p` can be read in 16-byte vectors of T over `cols` elements.
template <class T>
__device__ __forceinline__ bool vector_ok(const void* p, int64_t stride, int64_t cols) {
  return stride == 1 && reinterpret_cast<uintptr_t>(p) % 16 == 0 && cols % kVecOf<T> == 0;
}

}  // namespace baracuda::rows
