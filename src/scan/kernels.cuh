// CUDA scans along rows (the scanned dim moved last). Bitwise deterministic:
// every combine happens in a fixed order, no atomics.
//  - tiles: a block scans TILE = kBlock x kItems elements at a time (loaded
//    coalesced through shared memory, a thread scans kItems in registers,
//    warps combine by shuffles), carrying the total from tile to tile;
//  - long rows on few rows are cut into chunks: chunk totals first (a
//    reduce pass), their exclusive prefix per row, then every chunk is
//    scanned from its prefix (reduce-then-scan: one extra read of the input);
//  - a thread per row when rows are short or strided and many.
#pragma once

#include <cstring>

#include "core/cuda_check.hpp"
#include "core/rows.hpp"
#include "scan/ops.hpp"
#include "scan/register.hpp"

namespace baracuda::scan {

using rows::OffsetCalc;
using rows::RowLaunch;


/// Shared-memory slot of tile element i: one pad per 32 keeps a thread's
/// kItems consecutive reads free of bank conflicts.
__device__ __forceinline__ int padded(int i) { return i + (i >> 5); }

template <class S>
__device__ __forceinline__ S shfl_up(S v, int d) {
  static_assert(sizeof(S) % 4 == 0);
  int words[sizeof(S) / 4];
  memcpy(words, &v, sizeof(S));
#pragma unroll
  for (int k = 0; k < int(sizeof(S) / 4); ++k) words[k] = __shfl_up_sync(0xffffffffu, words[k], d);
  memcpy(&v, words, sizeof(S));
  return v;
}

/// Exclusive prefix (from `carry`) of each thread's `v` in thread order, and
/// the block total combined into `carry`. Every thread of the block calls it.
template <class Op, class S = typename Op::S>
__device__ __forceinline__ S block_exclusive(S v, S& carry, S* warp_totals) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  S inc = v;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const S y = shfl_up(inc, d);
    if (lane >= d) inc = Op::combine(y, inc);
  }
  if (lane == 31) warp_totals[warp] = inc;
  __syncthreads();
  S before = carry;  // carry + the warps before this one
  for (int w = 0; w < warp; ++w) before = Op::combine(before, warp_totals[w]);
  S exclusive = shfl_up(inc, 1);
  exclusive = lane == 0 ? before : Op::combine(before, exclusive);
  S total = carry;
  for (int w = 0; w < kBlock / 32; ++w) total = Op::combine(total, warp_totals[w]);
  __syncthreads();  // warp_totals is reused by the next call
  carry = total;
  return exclusive;
}

/// The operands of a forward scan: load lifts input e, store writes output e.
template <class Op_, class T, class Out>
struct ScanIo {
  using Op = Op_;
  using M = scan_math_t<T>;
  using S = typename Op::S;
  static constexpr int kOperands = 3;
  const T* in;
  Out* out;
  int64_t* idx;
  int64_t si, so, sx;
  static __host__ __device__ int probe(const ScanLaunch& l) { return l.indices ? 2 : 1; }
  __device__ ScanIo(const ScanLaunch& l, const int64_t* off, int64_t) {
    const int i = probe(l);
    const auto& st = l.rows.inner.stride;
    in = reinterpret_cast<const T*>(l.rows.data[i]) + off[i];
    out = reinterpret_cast<Out*>(l.rows.data[0]) + off[0];
    idx = l.indices ? reinterpret_cast<int64_t*>(l.rows.data[1]) + off[1] : nullptr;
    si = st[i][0];
    so = st[0][0];
    sx = l.indices ? st[1][0] : 0;
  }
  __device__ S load(int64_t e) const { return Op::lift(convert<M>(in[e * si]), e); }
  __device__ void store(int64_t e, const S& s) const {
    if constexpr (std::is_same_v<S, Extreme<M>>) {
      out[e * so] = convert<Out>(s.v);
      idx[e * sx] = s.i;
    } else {
      out[e * so] = convert<Out>(s);
    }
  }
};

/// The operands of a gradient scan, every view reversed along the row
/// (Note [Scan gradients as reversed scans]): 0 = grad_input, 1 = grad_output,
/// 2 = input, 3 = the saved output or indices (I: their element type).
template <class T, class I = T>
struct GradIo {
  using M = scan_math_t<T>;
  static constexpr int kOperands = 4;
  T* dx;
  const T *g, *x;
  const I* saved;
  int64_t sd, sg, sx, ss, n;
  static __host__ __device__ int probe(const ScanLaunch&) { return 1; }
  __device__ GradIo(const ScanLaunch& l, const int64_t* off, int64_t cols) : n(cols) {
    const auto& st = l.rows.inner.stride;
    dx = reinterpret_cast<T*>(l.rows.data[0]) + off[0];
    g = reinterpret_cast<const T*>(l.rows.data[1]) + off[1];
    x = reinterpret_cast<const T*>(l.rows.data[2]) + off[2];
    saved = reinterpret_cast<const I*>(l.rows.data[3]) + off[3];
    sd = st[0][0], sg = st[1][0], sx = st[2][0], ss = st[3][0];
  }
  __device__ M G(int64_t e) const { return convert<M>(g[e * sg]); }
  __device__ M X(int64_t e) const { return convert<M>(x[e * sx]); }
};

/// cumprod: lifts r -> x_{i+1} r + g_i; stores out_{i-1} * R_i.
template <class T>
struct CumProdGradIo : GradIo<T> {
  using M = scan_math_t<T>;
  using Op = AffineScan<M>;
  using S = typename Op::S;
  using GradIo<T>::GradIo;
  __device__ S load(int64_t e) const { return S{e > 0 ? this->X(e - 1) : M(1), this->G(e)}; }
  __device__ void store(int64_t e, const S& s) const {
    const M before = e + 1 < this->n ? convert<M>(this->saved[(e + 1) * this->ss]) : M(1);
    this->dx[e * this->sd] = convert<T>(before * s.b);
  }
};

/// logcumsumexp: lifts g_j exp(-y_j); stores exp(x_i) times the running sum.
template <class T>
struct LogCumSumExpGradIo : GradIo<T> {
  using M = scan_math_t<T>;
  using Op = ScaledSum<M>;
  using S = typename Op::S;
  using GradIo<T>::GradIo;
  __device__ S load(int64_t e) const { return S{-convert<M>(this->saved[e * this->ss]), this->G(e)}; }
  __device__ void store(int64_t e, const S& s) const { this->dx[e * this->sd] = convert<T>(Op::scale(s, this->X(e))); }
};

/// cummax/cummin: heads where the index changes; position k keeps its run's sum when idx_k == k.
template <class T>
struct CumExtremeGradIo : GradIo<T, int64_t> {
  using M = scan_math_t<T>;
  using Op = SegmentedSum<M>;
  using S = typename Op::S;
  using GradIo<T, int64_t>::GradIo;
  __device__ int64_t index(int64_t e) const { return this->saved[e * this->ss]; }
  __device__ S load(int64_t e) const { return S{this->G(e), e == 0 || index(e) != index(e - 1)}; }
  __device__ void store(int64_t e, const S& s) const {
    this->dx[e * this->sd] = convert<T>(index(e) == this->n - 1 - e ? s.sum : M(0));
  }
};

/// The operands of this block's (row, chunk) and the chunk's element range.
template <class Io>
struct Chunk {
  Io io;
  int64_t begin, end;
};
template <class Io>
__device__ __forceinline__ Chunk<Io> chunk_of(const ScanLaunch& l, const OffsetCalc<Io::kOperands, int64_t>& outer) {
  const int64_t row = blockIdx.x / l.chunks, chunk = blockIdx.x % l.chunks;
  int64_t off[Io::kOperands];
  outer.get(row, off);
  const int64_t begin = chunk * l.chunk_len;
  return {Io(l, off, l.rows.cols), begin, min(l.rows.cols, begin + l.chunk_len)};
}

/// Phase 1 (chunks > 1): the total of each (row, chunk) into the workspace,
/// combined in element order (the gradients' affine maps and segmented sums
/// do not commute): tile by tile through shared memory as in phase 3, each
/// thread combining its kItems consecutive elements, the threads in order.
template <class Io>
__global__ void __launch_bounds__(kBlock) chunk_totals_kernel(ScanLaunch l, OffsetCalc<Io::kOperands, int64_t> outer) {
  using Op = typename Io::Op;
  using S = typename Op::S;
  __shared__ S tile[kTile + kTile / 32];
  __shared__ S warp_totals[kBlock / 32];
  const Chunk<Io> c = chunk_of<Io>(l, outer);
  const auto& io = c.io;
  const int64_t begin = c.begin, end = c.end;
  S carry = Op::identity();
  for (int64_t base = begin; base < end; base += kTile) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {  // coalesced loads
      const int64_t e = base + k * kBlock + threadIdx.x;
      tile[padded(k * kBlock + threadIdx.x)] = e < end ? io.load(e) : Op::identity();
    }
    __syncthreads();
    S acc = tile[padded(threadIdx.x * kItems)];
#pragma unroll
    for (int k = 1; k < kItems; ++k) acc = Op::combine(acc, tile[padded(threadIdx.x * kItems + k)]);
    block_exclusive<Op>(acc, carry, warp_totals);  // its barriers also guard the tile's reuse
  }
  if (threadIdx.x == 0) static_cast<S*>(l.workspace)[blockIdx.x] = carry;
}

/// Phase 2: per row, the chunk totals become exclusive prefixes, in order.
template <class Op>
__global__ void chunk_prefix_kernel(ScanLaunch l) {
  using S = typename Op::S;
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= l.rows.rows) return;
  S* t = static_cast<S*>(l.workspace) + row * l.chunks;
  S run = Op::identity();
  for (int64_t c = 0; c < l.chunks; ++c) {
    const S next = Op::combine(run, t[c]);
    t[c] = run;
    run = next;
  }
}

/// Phase 3: a block scans one (row, chunk), tile by tile, from the chunk's prefix.
template <class Io>
__global__ void __launch_bounds__(kBlock) tile_scan_kernel(ScanLaunch l, OffsetCalc<Io::kOperands, int64_t> outer) {
  using Op = typename Io::Op;
  using S = typename Op::S;
  __shared__ S tile[kTile + kTile / 32];
  __shared__ S warp_totals[kBlock / 32];
  const Chunk<Io> c = chunk_of<Io>(l, outer);
  const auto& io = c.io;
  const int64_t begin = c.begin, end = c.end;
  S carry = l.chunks > 1 ? static_cast<const S*>(l.workspace)[blockIdx.x] : Op::identity();
  S next[kItems];  // the next tile, loaded (coalesced) while this one is scanned
  auto load_tile = [&](int64_t base) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t e = base + k * kBlock + threadIdx.x;
      next[k] = e < end ? io.load(e) : Op::identity();
    }
  };
  load_tile(begin);
  for (int64_t base = begin; base < end; base += kTile) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) tile[padded(k * kBlock + threadIdx.x)] = next[k];
    __syncthreads();
    if (base + kTile < end) load_tile(base + kTile);
    S v[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) v[k] = tile[padded(threadIdx.x * kItems + k)];
#pragma unroll
    for (int k = 1; k < kItems; ++k) v[k] = Op::combine(v[k - 1], v[k]);
    const S prefix = block_exclusive<Op>(v[kItems - 1], carry, warp_totals);
#pragma unroll
    for (int k = 0; k < kItems; ++k) tile[padded(threadIdx.x * kItems + k)] = Op::combine(prefix, v[k]);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kItems; ++k) {  // coalesced stores
      const int64_t e = base + k * kBlock + threadIdx.x;
      if (e < end) io.store(e, tile[padded(k * kBlock + threadIdx.x)]);
    }
    __syncthreads();
  }
}

/// One thread per row, sequential along it.
template <class Io>
__global__ void __launch_bounds__(256) row_per_thread_kernel(ScanLaunch l, OffsetCalc<Io::kOperands, int64_t> outer) {
  using Op = typename Io::Op;
  using S = typename Op::S;
  const int64_t row = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (row >= l.rows.rows) return;
  int64_t off[Io::kOperands];
  outer.get(row, off);
  const Io io(l, off, l.rows.cols);
  S run = Op::identity();
  for (int64_t e = 0; e < l.rows.cols; ++e) {
    run = Op::combine(run, io.load(e));
    io.store(e, run);
  }
}

/// True when a thread per row serves better than blocks: short rows, or
/// strided rows whose neighbours are adjacent in memory (a warp then reads
/// 32 neighbouring rows at once).
inline bool thread_per_row(const ScanLaunch& l, int in) {
  const RowLaunch& r = l.rows;
  if (r.cols <= 32 && r.rows >= 256) return true;
  return r.inner.stride[in][0] != 1 && r.outer.rank >= 1 && r.outer.stride[in][0] == 1 && r.rows >= 2048;
}

template <class Io>
Status scan_on_cuda(const ScanLaunch& l, CUstream_st* stream) {
  static_assert(sizeof(typename Io::S) <= kMaxStateBytes, "the plan sizes the workspace for kMaxStateBytes");
  if (l.rows.rows == 0 || l.rows.cols == 0) return Status::ok();
  const OffsetCalc<Io::kOperands, int64_t> outer(l.rows.outer);
  if (thread_per_row(l, Io::probe(l))) {
    row_per_thread_kernel<Io><<<unsigned((l.rows.rows + 255) / 256), 256, 0, stream>>>(l, outer);
  } else {
    const int64_t blocks = l.rows.rows * l.chunks;
    if (blocks > int64_t(0x7fffffff)) return unsupported("scan: ", blocks, " blocks exceed the grid limit");
    if (l.chunks > 1) {
      chunk_totals_kernel<Io><<<unsigned(blocks), kBlock, 0, stream>>>(l, outer);
      chunk_prefix_kernel<typename Io::Op><<<unsigned((l.rows.rows + 127) / 128), 128, 0, stream>>>(l);
    }
    tile_scan_kernel<Io><<<unsigned(blocks), kBlock, 0, stream>>>(l, outer);
  }
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace baracuda::scan
