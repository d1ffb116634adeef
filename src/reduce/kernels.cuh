// CUDA reductions. Every output is reduced by a fixed set of threads in a
// fixed order (per-thread runs, then a tree), so results are bitwise
// deterministic run to run; no atomics.
//  - rows: the reduced elements are contiguous; a warp or a block per output
//    (and per split), 16-byte vector loads;
//  - columns: anything else; 32 outputs x 8 lanes per block, lanes walking the
//    reduced elements (coalesced when the outputs are the input's inner dim);
//  - splits > 1: each (output, split) writes a partial accumulator to the
//    workspace and a second kernel merges them in split order.
#pragma once

#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "reduce/engine.hpp"

namespace baracuda::red {

inline constexpr int kBlock = 256;

/// Shuffles any trivially copyable accumulator, 32 bits at a time.
template <class A>
__device__ __forceinline__ A shfl_down(const A& a, int delta) {
  constexpr int kWords = (sizeof(A) + 3) / 4;
  uint32_t w[kWords] = {};
  memcpy(w, &a, sizeof(A));
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_down_sync(0xffffffffu, w[i], delta);
  A b;
  memcpy(&b, w, sizeof(A));
  return b;
}

/// Merges the accumulators of a warp into lane 0, lower lanes first.
template <class R, class A>
__device__ __forceinline__ A warp_merge(A a, const RParams& r) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    A b = shfl_down(a, d);
    if ((threadIdx.x & 31) % (2 * d) == 0) a = R::merge(a, b, r);
  }
  return a;
}

template <class R, class T, class Out, class A>
__device__ __forceinline__ void emit(const ReduceLaunch& l, const RParams& r, int64_t o, int split, const A& acc,
                                     int64_t out_offset) {
  if (l.splits == 1)
    reinterpret_cast<Out*>(l.kept.data[0])[out_offset] = convert<Out>(R::finish(acc, l.count, r));
  else
    reinterpret_cast<A*>(l.workspace)[int64_t(split) * l.outputs + o] = acc;
}

/// Rows: `kThreads` threads (32 or a block of 256) reduce one output's
/// contiguous elements [split * chunk, ...).
template <class R, class T, class Out, int kThreads>
__global__ void __launch_bounds__(kBlock) rows_kernel(ReduceLaunch l, RParams r, OffsetCalc<2, int64_t> kept) {
  using A = typename R::template Acc<T, false>;
  constexpr int kRowsPerBlock = kBlock / kThreads;
  constexpr int kVec = sizeof(T) >= 16 ? 1 : int(16 / sizeof(T));
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads;
  const int lane = threadIdx.x % kThreads, split = blockIdx.y;
  A acc = R::template init<A>(r);
  int64_t base[2] = {0, 0};
  if (o < l.outputs) {
    if (kept.rank == 1) {  // the common case, without a 64-bit division a thread
      base[0] = o * kept.stride[0][0];
      base[1] = o * kept.stride[1][0];
    } else {
      kept.get(o, base);
    }
    const T* row = reinterpret_cast<const T*>(l.kept.data[1]) + base[1];
    const int64_t begin = int64_t(split) * l.chunk, end = std::min(l.count, begin + l.chunk);
    // Scalar head up to 16-byte alignment, vector body, scalar tail.
    const int misalignment = int(reinterpret_cast<uintptr_t>(row + begin) % 16);
    const int64_t head = std::min(int64_t((16 - misalignment) % 16 / int(sizeof(T))), end - begin);
    if (lane < head) acc = R::step(acc, load_value<T, false>(row[begin + lane]), begin + lane, r);
    const int64_t body = begin + head, vectors = (end - body) / kVec;
    struct alignas(16) Pack {
      T v[kVec];
    };
    const Pack* packs = reinterpret_cast<const Pack*>(row + body);
    int64_t v = lane;
    for (; v + 3 * kThreads < vectors; v += 4 * kThreads) {  // four vectors in flight
      Pack p[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) p[u] = packs[v + u * kThreads];
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          acc = R::step(acc, load_value<T, false>(p[u].v[e]), body + (v + u * kThreads) * kVec + e, r);
    }
    for (; v < vectors; v += kThreads) {
      const Pack p = packs[v];
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc = R::step(acc, load_value<T, false>(p.v[e]), body + v * kVec + e, r);
    }
    for (int64_t i = body + vectors * kVec + lane; i < end; i += kThreads)
      acc = R::step(acc, load_value<T, false>(row[i]), i, r);
  }
  acc = warp_merge<R>(acc, r);
  if constexpr (kThreads > 32) {
    __shared__ A warp_accs[kBlock / 32];
    if (lane % 32 == 0) warp_accs[lane / 32] = acc;
    __syncthreads();
    if (lane != 0) return;
    for (int w = 1; w < kThreads / 32; ++w) acc = R::merge(acc, warp_accs[w], r);
  } else if (lane != 0) {
    return;
  }
  if (o < l.outputs) emit<R, T, Out>(l, r, o, split, acc, base[0]);
}

/// Columns: 32 outputs x 8 lanes; lane y walks reduced elements y, y + 8, ...
/// of its split.
template <class R, class T, class Out, bool kRank1>
__global__ void __launch_bounds__(kBlock)
    columns_kernel(ReduceLaunch l, RParams r, OffsetCalc<2, int64_t> kept, OffsetCalc<2, int64_t> reduced) {
  using A = typename R::template Acc<T, false>;
  constexpr int kLanes = kBlock / 32;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32, split = blockIdx.y;
  const int64_t o = int64_t(blockIdx.x) * 32 + tx;
  A acc = R::template init<A>(r);
  int64_t base[2] = {0, 0};
  if (o < l.outputs) {
    kept.get(o, base);
    const T* in = reinterpret_cast<const T*>(l.kept.data[1]) + base[1];
    const int64_t begin = int64_t(split) * l.chunk, end = std::min(l.count, begin + l.chunk);
    const int64_t stride = reduced.stride[1][0];
    int64_t i = begin + ty;
    if constexpr (kRank1) {
      for (; i + 3 * kLanes < end; i += 4 * kLanes) {  // four loads in flight
        T x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) x[u] = in[(i + u * kLanes) * stride];
#pragma unroll
        for (int u = 0; u < 4; ++u) acc = R::step(acc, load_value<T, false>(x[u]), i + u * kLanes, r);
      }
    }
    for (; i < end; i += kLanes) {
      int64_t off[2];
      if constexpr (kRank1) off[1] = i * stride;
      else reduced.get(i, off);
      acc = R::step(acc, load_value<T, false>(in[off[1]]), i, r);
    }
  }
  __shared__ A accs[kLanes][33];
  accs[ty][tx] = acc;
  __syncthreads();
  if (ty != 0) return;
  for (int y = 1; y < kLanes; ++y) acc = R::merge(acc, accs[y][tx], r);
  if (o < l.outputs) emit<R, T, Out>(l, r, o, split, acc, base[0]);
}

/// Columns with vectors: the outputs are the input's unit-stride dim; each
/// thread owns V adjacent outputs and loads them as one 16-byte vector per
/// reduced element (32 x V outputs x 8 lanes per block), eight vectors in
/// flight a thread (H100, sums over the first dim of 8192 x 8192 with the
/// plan's 8 splits: bf16 2.40 -> 2.56 TB/s from two to eight, f32 2.87 ->
/// 2.89; torch 2.35 and 2.73).
template <class R, class T, class Out, int V>
__global__ void __launch_bounds__(kBlock) vector_columns_kernel(ReduceLaunch l, RParams r) {
  using A = typename R::template Acc<T, false>;
  constexpr int kLanes = kBlock / 32, kInFlight = 8;
  struct alignas(16) Pack {
    T v[V];
  };
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32, split = blockIdx.y;
  const int64_t o0 = (int64_t(blockIdx.x) * 32 + tx) * V;
  A acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = R::template init<A>(r);
  if (o0 < l.outputs) {
    const T* in = reinterpret_cast<const T*>(l.kept.data[1]) + o0;
    const int64_t begin = int64_t(split) * l.chunk, end = std::min(l.count, begin + l.chunk);
    const int64_t stride = l.reduced.stride[1][0];
    int64_t i = begin + ty;
    for (; i + (kInFlight - 1) * kLanes < end; i += kInFlight * kLanes) {
      Pack p[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) p[u] = *reinterpret_cast<const Pack*>(in + (i + u * kLanes) * stride);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = R::step(acc[e], load_value<T, false>(p[u].v[e]), i + u * kLanes, r);
    }
    for (; i < end; i += kLanes) {
      const Pack a = *reinterpret_cast<const Pack*>(in + i * stride);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = R::step(acc[e], load_value<T, false>(a.v[e]), i, r);
    }
  }
  __shared__ A accs[kLanes][32 * V + 1];
#pragma unroll
  for (int e = 0; e < V; ++e) accs[ty][tx * V + e] = acc[e];
  __syncthreads();
  if (ty != 0 || o0 >= l.outputs) return;
  const int64_t out_stride = l.kept.stride[0][0];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    A a = acc[e];
    for (int y = 1; y < kLanes; ++y) a = R::merge(a, accs[y][tx * V + e], r);
    emit<R, T, Out>(l, r, o0 + e, split, a, (o0 + e) * out_stride);
  }
}

/// Merges the partial accumulators of every split, in split order.
template <class R, class T, class Out>
__global__ void __launch_bounds__(kBlock) merge_splits_kernel(ReduceLaunch l, RParams r, OffsetCalc<2, int64_t> kept) {
  using A = typename R::template Acc<T, false>;
  const int64_t o = int64_t(blockIdx.x) * kBlock + threadIdx.x;
  if (o >= l.outputs) return;
  const A* partial = reinterpret_cast<const A*>(l.workspace);
  A acc = partial[o];
  for (int s = 1; s < l.splits; ++s) acc = R::merge(acc, partial[int64_t(s) * l.outputs + o], r);
  int64_t base[2];
  kept.get(o, base);
  reinterpret_cast<Out*>(l.kept.data[0])[base[0]] = convert<Out>(R::finish(acc, l.count, r));
}

template <class R, class T, class Out>
Status reduce_on_cuda(const ReduceLaunch& planned, const RParams& r, CUstream_st* stream) {
  const OffsetCalc<2, int64_t> kept(planned.kept), reduced(planned.reduced);
  const bool contiguous = planned.reduced.rank == 1 && planned.reduced.stride[1][0] == 1;
  // The plan splits by shape alone (its workspace is fixed before the
  // strides are seen). Contiguous rows need no split when their outputs fill
  // the GPU anyway: rows of 1024 vectors or more, numerous enough for eight
  // blocks an SM, take a block of 256 a row (H100, f32 sums of 8192 x 8192,
  // this kernel in a standalone A/B: a block of 256 a row 3.06 TB/s, of 512
  // 2.55, a warp a row 2.85, eight splits of a warp and a merge 2.81, torch
  // 2.86); rows enough for a warp each on every resident warp slot take a
  // warp a row, however long.
  const int sm_count = current_sm_count();
  constexpr int V = sizeof(T) >= 16 ? 1 : int(16 / sizeof(T));  // elements a 16-byte vector
  const int64_t row_vectors = planned.count / V;
  const bool block_rows = contiguous && planned.outputs >= int64_t(sm_count) * 8 && row_vectors >= 1024;
  const bool warp_rows = contiguous && planned.outputs * 32 >= int64_t(sm_count) * 2048;
  ReduceLaunch l = planned;
  if (block_rows || warp_rows) l.splits = 1, l.chunk = l.count;
  const unsigned splits = unsigned(l.splits);
  // Vector columns where the per-thread accumulators stay small.
  constexpr bool kVectorColumns = V > 1 && sizeof(typename R::template Acc<T, false>) * V <= 64;
  bool vector_columns = false;
  if constexpr (kVectorColumns)
    vector_columns = l.kept.rank == 1 && l.kept.stride[1][0] == 1 && l.reduced.rank == 1 && l.outputs % V == 0 &&
                     reinterpret_cast<uintptr_t>(l.kept.data[1]) % 16 == 0 &&
                     (l.reduced.stride[1][0] * int64_t(sizeof(T))) % 16 == 0;
  if (contiguous && !block_rows && (l.chunk <= 2048 || warp_rows)) {
    rows_kernel<R, T, Out, 32><<<dim3(unsigned((l.outputs + 7) / 8), splits), kBlock, 0, stream>>>(l, r, kept);
  } else if (contiguous) {
    rows_kernel<R, T, Out, kBlock><<<dim3(unsigned(l.outputs), splits), kBlock, 0, stream>>>(l, r, kept);
  } else if (vector_columns) {
    if constexpr (kVectorColumns)
      vector_columns_kernel<R, T, Out, V>
          <<<dim3(unsigned((l.outputs / V + 31) / 32), splits), kBlock, 0, stream>>>(l, r);
  } else if (l.reduced.rank <= 1) {
    columns_kernel<R, T, Out, true>
        <<<dim3(unsigned((l.outputs + 31) / 32), splits), kBlock, 0, stream>>>(l, r, kept, reduced);
  } else {
    columns_kernel<R, T, Out, false>
        <<<dim3(unsigned((l.outputs + 31) / 32), splits), kBlock, 0, stream>>>(l, r, kept, reduced);
  }
  BARACUDA_CUDA_TRY(cudaGetLastError());
  if (l.splits > 1) {
    merge_splits_kernel<R, T, Out><<<unsigned((l.outputs + kBlock - 1) / kBlock), kBlock, 0, stream>>>(l, r, kept);
    BARACUDA_CUDA_TRY(cudaGetLastError());
  }
  return Status::ok();
}

}  // namespace baracuda::red
