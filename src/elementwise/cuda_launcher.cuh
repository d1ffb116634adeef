// The CUDA elementwise launcher: one path per layout class.
//  - contiguous: 16-byte vector loads/stores, several vectors in flight per
//    thread, a scalar tail in the last block;
//  - strided: coalesced dims, 32-bit offsets when they fit, else 64-bit;
//  - reduce: one output summed over broadcast dims (gradients), deterministic.
#pragma once

#include <array>

#include <cuda/std/tuple>
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "elementwise/ops.hpp"

namespace baracuda::ew {

inline constexpr int kBlock = 256;

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int N>
struct Ptrs {
  char* p[N > 0 ? N : 1];
};

template <class Out, int NOut, class... Ins>
struct Config {
  static constexpr int kIn = sizeof...(Ins);
  static constexpr int N = NOut + kIn;
  static constexpr size_t kWidest = std::max({sizeof(Out), sizeof(Ins)...});
  static constexpr int kVec = kWidest >= 16 ? 1 : int(16 / kWidest);
  static constexpr int kUnroll = 2;  // vectors per input in flight per thread (1, 2, 4 measured: 2 best)
  static constexpr int kStridedUnroll = 4;                // elements in flight per thread
};

template <int V, class... Ins, size_t... I>
__device__ __forceinline__ cuda::std::tuple<Pack<Ins, V>...> load_packs(char* const* in, int64_t elem,
                                                                       std::index_sequence<I...>) {
  return {*reinterpret_cast<const Pack<Ins, V>*>(in[I] + elem * int64_t(sizeof(Ins)))...};
}

template <int V, class Out, int NOut, class... Ins, class Fn, size_t... I>
__device__ __forceinline__ void compute_packs(const Fn& fn, const cuda::std::tuple<Pack<Ins, V>...>& in,
                                              Pack<Out, V> (&out)[NOut], std::index_sequence<I...>) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    auto r = fn(cuda::std::get<I>(in).v[e]...);
#pragma unroll
    for (int j = 0; j < NOut; ++j) out[j].v[e] = convert<Out>(component(r, j));
  }
}

template <int V, int U, class Out, int NOut, class Fn, class... Ins>
__global__ void __launch_bounds__(kBlock) contiguous_kernel(Fn fn, Ptrs<NOut + sizeof...(Ins)> ptrs, int64_t n) {
  using Seq = std::index_sequence_for<Ins...>;
  constexpr int64_t kTile = int64_t(kBlock) * U * V;
  const int64_t base = int64_t(blockIdx.x) * kTile;
  if (base + kTile <= n) {
    cuda::std::tuple<Pack<Ins, V>...> in[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      in[u] = load_packs<V, Ins...>(ptrs.p + NOut, base + (int64_t(u) * kBlock + threadIdx.x) * V, Seq{});
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t elem = base + (int64_t(u) * kBlock + threadIdx.x) * V;
      Pack<Out, V> out[NOut];
      compute_packs<V, Out, NOut, Ins...>(fn, in[u], out, Seq{});
#pragma unroll
      for (int j = 0; j < NOut; ++j) *reinterpret_cast<Pack<Out, V>*>(ptrs.p[j] + elem * int64_t(sizeof(Out))) = out[j];
    }
  } else {
    for (int64_t i = base + threadIdx.x; i < n; i += kBlock) {
      int64_t off[NOut + sizeof...(Ins)];
#pragma unroll
      for (auto& o : off) o = i;
      apply_at<Out, NOut, Ins...>(fn, ptrs.p, off, Seq{});
    }
  }
}

template <int U, class Index, class Out, int NOut, class Fn, class... Ins>
__global__ void __launch_bounds__(kBlock)
    strided_kernel(Fn fn, Ptrs<NOut + sizeof...(Ins)> ptrs, OffsetCalc<NOut + sizeof...(Ins), Index> calc, Index n) {
  constexpr int N = NOut + sizeof...(Ins);
  using Seq = std::index_sequence_for<Ins...>;
  const Index base = Index(blockIdx.x) * (kBlock * U) + Index(threadIdx.x);
  Index off[U][N];
  cuda::std::tuple<Pack<Ins, 1>...> in[U];
  char* const* in_ptrs = ptrs.p + NOut;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const Index i = base + Index(u) * kBlock;
    if (i < n) {
      calc.get(i, off[u]);
      in[u] = [&]<size_t... I>(std::index_sequence<I...>) {
        return cuda::std::tuple<Pack<Ins, 1>...>{Pack<Ins, 1>{{at<Ins>(in_ptrs[I], off[u][NOut + I])}}...};
      }(Seq{});
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (base + Index(u) * kBlock < n) {
      Pack<Out, 1> out[NOut];
      compute_packs<1, Out, NOut, Ins...>(fn, in[u], out, Seq{});
#pragma unroll
      for (int j = 0; j < NOut; ++j) reinterpret_cast<Out*>(ptrs.p[j])[off[u][j]] = out[j].v[0];
    }
  }
}

/// Inner dim unit-stride (or broadcast, stride 0) for every operand: each
/// thread handles V consecutive elements of a row, with one offset
/// computation per vector and 16-byte accesses where the stride is 1.
template <int V, int U, class Index, class Out, int NOut, class Fn, class... Ins>
__global__ void __launch_bounds__(kBlock)
    rows_kernel(Fn fn, Ptrs<NOut + sizeof...(Ins)> ptrs, OffsetCalc<NOut + sizeof...(Ins), Index> outer,
                Index vectors_per_row, Index vectors, uint32_t unit_stride_mask) {
  constexpr int N = NOut + sizeof...(Ins);
  using Seq = std::index_sequence_for<Ins...>;
  const Index base = Index(blockIdx.x) * (kBlock * U) + Index(threadIdx.x);
  Index off[U][N];
  cuda::std::tuple<Pack<Ins, V>...> in[U];
  char* const* in_ptrs = ptrs.p + NOut;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const Index v = base + Index(u) * kBlock;
    if (v < vectors) {
      const Index row = v / vectors_per_row;
      const Index col = (v - row * vectors_per_row) * V;
      outer.get(row, off[u]);
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (unit_stride_mask >> k & 1u) off[u][k] += col;
      in[u] = [&]<size_t... I>(std::index_sequence<I...>) {
        auto load = [&]<class T>(TypeTag<T>, int k) {
          const T* p = reinterpret_cast<const T*>(in_ptrs[k]) + off[u][NOut + k];
          if (unit_stride_mask >> (NOut + k) & 1u) return *reinterpret_cast<const Pack<T, V>*>(p);
          Pack<T, V> broadcast;
#pragma unroll
          for (int e = 0; e < V; ++e) broadcast.v[e] = *p;
          return broadcast;
        };
        return cuda::std::tuple<Pack<Ins, V>...>{load(TypeTag<Ins>{}, int(I))...};
      }(Seq{});
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (base + Index(u) * kBlock < vectors) {
      Pack<Out, V> out[NOut];
      compute_packs<V, Out, NOut, Ins...>(fn, in[u], out, Seq{});
#pragma unroll
      for (int j = 0; j < NOut; ++j)
        *reinterpret_cast<Pack<Out, V>*>(reinterpret_cast<Out*>(ptrs.p[j]) + off[u][j]) = out[j];
    }
  }
}

/// Side of the square shared-memory tile of transpose_kernel: 64 keeps more
/// bytes in flight per thread; 32 where the staged inputs would not fit in 48 KiB.
template <class... Ins>
inline constexpr int kTileDimFor = [] {
  constexpr size_t widest = std::max({sizeof(Ins)..., size_t(1)});
  return sizeof...(Ins) * widest * 64 * 65 <= 48 * 1024 ? 64 : 32;
}();

/// Extents and strides of a rank-2 problem, for transpose_kernel.
template <int N>
struct Rank2 {
  int64_t n0, n1, s0[N], s1[N];
};

/// Rank-2 problems where an input walks dim 1 with unit stride while the
/// outputs walk dim 0 (a transpose): those inputs are staged through a shared
/// memory tile so that reads and writes are both coalesced. Offsets advance by
/// addition (no per-element multiplies); interior tiles skip the bounds checks.
template <class Out, int NOut, class Fn, class... Ins>
__global__ void __launch_bounds__(kBlock)
    transpose_kernel(Fn fn, Ptrs<NOut + sizeof...(Ins)> ptrs, Rank2<NOut + sizeof...(Ins)> g, int64_t tiles0,
                     uint32_t staged_mask) {
  constexpr int kDim = kTileDimFor<Ins...>, kRows = kBlock / kDim, kPitch = kDim + 1, kSteps = kDim / kRows;
  constexpr size_t kWidest = std::max({sizeof(Ins)..., size_t(1)});
  __shared__ alignas(16) char tiles[sizeof...(Ins) > 0 ? sizeof...(Ins) : 1][kDim * kPitch * kWidest];
  const int64_t i0 = (blockIdx.x % tiles0) * kDim, j0 = (blockIdx.x / tiles0) * kDim;
  const bool interior = i0 + kDim <= g.n0 && j0 + kDim <= g.n1;
  const int tx = threadIdx.x % kDim, ty = threadIdx.x / kDim;
  char* const* in_ptrs = ptrs.p + NOut;
  // Stage: row r of the tile holds dim0 = i0 + r, read along dim 1 (coalesced).
  [&]<size_t... I>(std::index_sequence<I...>) {
    ([&] {
      if (!(staged_mask >> (NOut + I) & 1u)) return;
      using T = cuda::std::tuple_element_t<I, cuda::std::tuple<Ins...>>;
      T* tile = reinterpret_cast<T*>(tiles[I]);
      const T* src = reinterpret_cast<const T*>(in_ptrs[I]);
      const int64_t s0 = g.s0[NOut + I], s1 = g.s1[NOut + I];
      int64_t off = (i0 + ty) * s0 + (j0 + tx) * s1;
      for (int step = 0; step < kSteps; ++step, off += kRows * s0) {  // constant trip count: unrolled
        const int r = ty + step * kRows;
        if (interior || (i0 + r < g.n0 && j0 + tx < g.n1)) tile[r * kPitch + tx] = src[off];
      }
    }(), ...);
  }(std::index_sequence_for<Ins...>{});
  __syncthreads();
  // Compute: thread tx walks dim 0 (the outputs' unit stride), c walks dim 1.
  int64_t off[NOut + sizeof...(Ins)];
#pragma unroll
  for (int k = 0; k < NOut + int(sizeof...(Ins)); ++k) off[k] = (i0 + tx) * g.s0[k] + (j0 + ty) * g.s1[k];
  for (int step = 0; step < kSteps; ++step) {
    const int c = ty + step * kRows;
    if (interior || (i0 + tx < g.n0 && j0 + c < g.n1)) {
      auto r = [&]<size_t... I>(std::index_sequence<I...>) {
        return fn([&] {
          using T = cuda::std::tuple_element_t<I, cuda::std::tuple<Ins...>>;
          if (staged_mask >> (NOut + I) & 1u) return reinterpret_cast<const T*>(tiles[I])[tx * kPitch + c];
          return reinterpret_cast<const T*>(in_ptrs[I])[off[NOut + I]];
        }()...);
      }(std::index_sequence_for<Ins...>{});
#pragma unroll
      for (int k = 0; k < NOut; ++k) reinterpret_cast<Out*>(ptrs.p[k])[off[k]] = convert<Out>(component(r, k));
    }
#pragma unroll
    for (int k = 0; k < NOut + int(sizeof...(Ins)); ++k) off[k] += kRows * g.s1[k];
  }
}

template <class Out, class Fn, class... Ins>
__global__ void __launch_bounds__(kBlock)
    reduce_kernel(Fn fn, int output_index, Ptrs<1 + sizeof...(Ins)> ptrs, OffsetCalc<1 + sizeof...(Ins), int64_t> kept,
                  OffsetCalc<1 + sizeof...(Ins), int64_t> reduced, int64_t n, int64_t reduced_n) {
  for (int64_t i = int64_t(blockIdx.x) * kBlock + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    int64_t off[1 + sizeof...(Ins)];
    kept.get(i, off);
    reduce_at<Out, Ins...>(fn, output_index, ptrs.p, off, reduced, reduced_n, std::index_sequence_for<Ins...>{});
  }
}

/// True when every operand's offsets fit in int32 (and the index space too).
inline bool fits_int32(const Problem& p) {
  constexpr int64_t kLimit = (int64_t(1) << 31) - (int64_t(1) << 16);
  if (p.numel() >= kLimit) return false;
  for (int k = 0; k < p.n_operands; ++k) {
    int64_t reach = 0;
    for (int d = 0; d < p.rank; ++d) reach += (p.stride[k][d] < 0 ? -p.stride[k][d] : p.stride[k][d]) * (p.shape[d] - 1);
    if (reach >= kLimit) return false;
  }
  return true;
}

inline bool is_dense(const Problem& p) {
  if (p.rank != 1) return false;
  for (int k = 0; k < p.n_operands; ++k)
    if (p.stride[k][0] != 1) return false;
  return true;
}

/// The problem without its innermost dim (the rows of rows_kernel).
inline Problem outer_dims(const Problem& p) {
  Problem o = p;
  o.rank = p.rank - 1;
  for (int d = 0; d < o.rank; ++d) {
    o.shape[d] = p.shape[d + 1];
    for (int k = 0; k < p.n_operands; ++k) o.stride[k][d] = p.stride[k][d + 1];
  }
  return o;
}

/// Bit k set when operand k walks the inner dim with stride 1; 0 when the
/// problem does not suit rows_kernel (inner strides other than 0/1, rows not a
/// multiple of `vec`, or rows that start off the vector alignment).
inline uint32_t row_vector_mask(const Problem& p, const size_t* bytes, int vec) {
  if (p.rank < 2 || p.shape[0] % vec != 0) return 0;
  uint32_t mask = 0;
  for (int k = 0; k < p.n_operands; ++k) {
    if (p.stride[k][0] == 0) continue;
    if (p.stride[k][0] != 1 || reinterpret_cast<uintptr_t>(p.data[k]) % (bytes[k] * vec) != 0) return 0;
    for (int d = 1; d < p.rank; ++d)
      if (p.stride[k][d] % vec != 0) return 0;
    mask |= 1u << k;
  }
  return mask;
}

/// Bit k set for inputs to stage through shared memory (transpose_kernel);
/// 0 when the problem is not a rank-2 transpose with unit-stride outputs.
inline uint32_t transposed_input_mask(const Problem& p, int n_out) {
  if (p.rank != 2) return 0;
  for (int k = 0; k < n_out; ++k)
    if (p.stride[k][0] != 1) return 0;
  uint32_t mask = 0;
  for (int k = n_out; k < p.n_operands; ++k)
    if ((p.stride[k][1] == 1 || p.stride[k][1] == -1) && p.stride[k][0] != 1 && p.stride[k][0] != 0) mask |= 1u << k;
  return mask;
}

template <int N>
Rank2<N> rank2(const Problem& p) {
  Rank2<N> g{p.shape[0], p.shape[1], {}, {}};
  for (int k = 0; k < N; ++k) g.s0[k] = p.stride[k][0], g.s1[k] = p.stride[k][1];
  return g;
}

inline unsigned blocks_for(int64_t n, int64_t per_block) { return unsigned((n + per_block - 1) / per_block); }

struct CudaLauncher {
  template <class Out, int NOut, class Fn, class... Ins>
  static Status launch(const Launch& launch, const Params& params, CUstream_st* stream) {
    using C = Config<Out, NOut, Ins...>;
    const Fn fn{params};
    if (launch.reduce) {
      if constexpr (Reducible<Fn>) {
        constexpr int N = 1 + C::kIn;
        Ptrs<N> ptrs;
        for (int k = 0; k < N; ++k) ptrs.p[k] = launch.kept.data[k];
        const int64_t n = launch.kept.numel();
        const unsigned grid = unsigned(std::min<int64_t>(blocks_for(n, kBlock), 65535 * 16));
        reduce_kernel<Out, Fn, Ins...><<<grid, kBlock, 0, stream>>>(
            fn, launch.output_index, ptrs, OffsetCalc<N, int64_t>(launch.kept), OffsetCalc<N, int64_t>(launch.reduced),
            n, launch.reduced.numel());
      }
    } else {
      constexpr int N = C::N;
      const Problem& p = launch.kept;
      const int64_t n = p.numel();
      Ptrs<N> ptrs;
      for (int k = 0; k < N; ++k) ptrs.p[k] = p.data[k];
      constexpr auto kBytes = [] {
        std::array<size_t, N> bytes{};
        const size_t in_bytes[] = {sizeof(Ins)..., 0};
        for (int k = 0; k < N; ++k) bytes[k] = k < NOut ? sizeof(Out) : in_bytes[k - NOut];
        return bytes;
      }();
      bool aligned = true;
      for (int k = 0; k < N; ++k)
        aligned = aligned && reinterpret_cast<uintptr_t>(p.data[k]) % (kBytes[k] * C::kVec) == 0;
      if (is_dense(p) && aligned) {
        constexpr int64_t kTile = int64_t(kBlock) * C::kUnroll * C::kVec;
        contiguous_kernel<C::kVec, C::kUnroll, Out, NOut, Fn, Ins...>
            <<<blocks_for(n, kTile), kBlock, 0, stream>>>(fn, ptrs, n);
      } else if (uint32_t staged = transposed_input_mask(p, NOut); staged != 0) {
        constexpr int kDim = kTileDimFor<Ins...>;
        const int64_t tiles0 = (p.shape[0] + kDim - 1) / kDim, tiles1 = (p.shape[1] + kDim - 1) / kDim;
        transpose_kernel<Out, NOut, Fn, Ins...>
            <<<unsigned(tiles0 * tiles1), kBlock, 0, stream>>>(fn, ptrs, rank2<N>(p), tiles0, staged);
      } else if (uint32_t mask = C::kVec > 1 ? row_vector_mask(p, kBytes.data(), C::kVec) : 0;
                 mask != 0 && (mask & ((1u << NOut) - 1)) == ((1u << NOut) - 1) && fits_int32(p)) {
        const int32_t per_row = int32_t(p.shape[0] / C::kVec), vectors = int32_t(n / C::kVec);
        rows_kernel<C::kVec, C::kStridedUnroll, int32_t, Out, NOut, Fn, Ins...>
            <<<blocks_for(vectors, kBlock * C::kStridedUnroll), kBlock, 0, stream>>>(
                fn, ptrs, OffsetCalc<N, int32_t>(outer_dims(p)), per_row, vectors, mask);
      } else if (fits_int32(p)) {
        strided_kernel<C::kStridedUnroll, int32_t, Out, NOut, Fn, Ins...>
            <<<blocks_for(n, kBlock * C::kStridedUnroll), kBlock, 0, stream>>>(fn, ptrs, OffsetCalc<N, int32_t>(p),
                                                                                int32_t(n));
      } else {
        strided_kernel<C::kStridedUnroll, int64_t, Out, NOut, Fn, Ins...>
            <<<blocks_for(n, kBlock * C::kStridedUnroll), kBlock, 0, stream>>>(fn, ptrs, OffsetCalc<N, int64_t>(p), n);
      }
    }
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  }
};

}  // namespace baracuda::ew
