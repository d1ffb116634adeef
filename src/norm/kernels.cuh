// CUDA normalization. Forward and grad_input: TPR threads per row, the row
// kept in shared memory when it fits (one read, one write), statistics by
// fixed-order row reductions; long forward rows over a thread-block cluster
// (cluster_forward.cuh). grad_weight / grad_bias: in the same pass as
// grad_input for rows of 1024 to 1024 x V elements (Note [Fused norm
// backward]), else a column pass over the rows; either way split across
// blocks with partial sums merged in split order, so the whole family is
// deterministic without atomics.
#pragma once

#include <atomic>
#include <initializer_list>

#include "core/cuda_async.cuh"
#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "core/row_lanes.hpp"
#include "norm/backward_shape.hpp"
#include "norm/cluster_forward.cuh"
#include "norm/held_row.cuh"
#include "norm/ops.hpp"
#include "reduce/engine.hpp"

namespace baracuda::norm {

using rows::RowLaunch;
using rows::by_row_length;
using rows::kRowCacheBytes;
using rows::launch_cached;
using rows::rows_in_vectors;
using rows::store_16;

/// Element c of the normalised row straight from the inputs.
template <class M, class T>
__device__ __forceinline__ M h_at_input(const T* x, const T* r, int64_t sx, int64_t sr, int64_t c) {
  return r ? convert<M>(x[c * sx]) + convert<M>(r[c * sr]) : convert<M>(x[c * sx]);
}

template <class S, class T, int TPR, int RPB, bool kCache>
__global__ void __launch_bounds__(TPR * RPB)
    forward_kernel(RowLaunch l, rows::OffsetCalc<S::kOperands, int64_t> outer, NormParams p) {
  using M = math_t<T, false>;
  extern __shared__ __align__(16) char cache_bytes[];
  __shared__ M scratch[RPB * (TPR / 32)];
  const rows::RowSlot<TPR, RPB, S::kOperands> slot(l, outer);
  const int64_t cols = l.cols;
  const auto& st = l.inner.stride;
  const T* x = rows::row_operand<const T>(l, S::kInput, slot.off);
  // The cached row: the input (storage type), or input + residual (math type).
  using C = std::conditional_t<S::kResidual, M, T>;
  C* cache = reinterpret_cast<C*>(cache_bytes) + (threadIdx.x / TPR) * cols;
  T* out = rows::row_operand<T>(l, S::kOut, slot.off);
  bool vec = rows::vector_ok<T>(x, st[S::kInput][0], cols) && rows::vector_ok<T>(out, st[S::kOut][0], cols);
  const T* r = S::kResidual ? rows::row_operand<const T>(l, S::kResidualIn, slot.off) : nullptr;
  const int64_t sr = S::kResidual ? st[S::kResidualIn][0] : 0;
  // The normalised row h: the input, or input + residual in the math type.
  auto h_at = [&](int64_t c) -> M {
    if constexpr (kCache) return convert<M>(cache[c]);
    else if constexpr (S::kResidual) return convert<M>(x[c * st[S::kInput][0]]) + convert<M>(r[c * sr]);
    else return convert<M>(x[c * st[S::kInput][0]]);
  };
  // layer: sums of h - h[0], so that a constant row has exactly zero deviation.
  const M shift = S::kRms || !slot.valid ? M(0) : h_at_input<M>(x, r, st[S::kInput][0], sr, 0);
  M sum = 0;
  if (slot.valid) {
    if constexpr (S::kResidual) {
      for (int64_t c = slot.lane; c < cols; c += TPR) {
        const M h = convert<M>(x[c * st[S::kInput][0]]) + convert<M>(r[c * sr]);
        if constexpr (kCache) cache[c] = h;
        sum += S::kRms ? h * h : h - shift;
      }
    } else {
      rows::for_row<TPR>(
          x, st[S::kInput][0], cols, vec, slot.lane,
          [&](int64_t, T v) {
            const M h = convert<M>(v);
            sum += S::kRms ? h * h : h - shift;
          },
          kCache ? reinterpret_cast<T*>(cache) : nullptr);
    }
  }
  sum = rows::row_all_reduce<TPR, RPB>(sum, rows::SumOp{}, scratch);
  M mean = 0, sq = sum;
  if constexpr (!S::kRms) {
    mean = shift + sum / M(cols);
    sq = 0;
    if (slot.valid)
      for (int64_t c = slot.lane; c < cols; c += TPR) {
        const M d = h_at(c) - mean;
        sq += d * d;
      }
    sq = rows::row_all_reduce<TPR, RPB>(sq, rows::SumOp{}, scratch);
  }
  const M rstd = S::rstd(sq, cols, M(p.eps));
  if (!slot.valid) return;
  if (slot.lane == 0) {
    if constexpr (!S::kRms) *rows::row_operand<stat_t<T>>(l, S::kMean, slot.off) = stat_t<T>(mean);
    *rows::row_operand<stat_t<T>>(l, S::kRstd, slot.off) = stat_t<T>(rstd);
  }
  const T* w = S::kWeight ? rows::row_operand<const T>(l, S::kWeightIn, slot.off) : nullptr;
  const T* b = S::kBias ? rows::row_operand<const T>(l, S::kBiasIn, slot.off) : nullptr;
  const int64_t sw = S::kWeight ? st[S::kWeightIn][0] : 0, sb = S::kBias ? st[S::kBiasIn][0] : 0;
  // residual_out is written last: it may alias the residual input.
  T* r_out = S::kResidual ? rows::row_operand<T>(l, S::kResidualOut, slot.off) : nullptr;
  const int64_t sro = S::kResidual ? st[S::kResidualOut][0] : 0;
  if constexpr (S::kResidual) {
    rows::store_row<TPR>(out, st[S::kOut][0], cols, vec, slot.lane, [&](int64_t c) {
      const M h = h_at(c);
      r_out[c * sro] = convert<T>(h);
      M y = (h - mean) * rstd;
      if constexpr (S::kWeight) y *= convert<M>(w[c * sw]);
      if constexpr (S::kBias) y += convert<M>(b[c * sb]);
      return convert<T>(y);
    });
  } else {
    // Sources: the row (cached or not), then weight and bias.
    constexpr int NS = 1 + S::kWeight + S::kBias;
    const T* src[NS];
    int64_t ss[NS];
    src[0] = kCache ? reinterpret_cast<const T*>(cache) : x;
    ss[0] = kCache ? 1 : st[S::kInput][0];
    if constexpr (S::kWeight) src[1] = w, ss[1] = sw;
    if constexpr (S::kBias) src[2] = b, ss[2] = sb;
    bool all_vec = vec;
    for (int k = 1; k < NS; ++k) all_vec = all_vec && rows::vector_ok<T>(src[k], ss[k], cols);
    rows::map_row<TPR>(src, ss, out, st[S::kOut][0], cols, all_vec, slot.lane, [&](int64_t, const T (&v)[NS]) {
      M y = (convert<M>(v[0]) - mean) * rstd;
      if constexpr (S::kWeight) y *= convert<M>(v[1]);
      if constexpr (S::kBias) y += convert<M>(v[2]);
      return convert<T>(y);
    });
  }
}

// Note [Norm rows in registers]
// Forward rows of up to 16384 elements (half or f32, in whole aligned
// vectors) are held in registers: each thread holds up to K = 4 of the row's
// 16-byte vectors (HeldRow; the residual form four each of the input and the
// residual). The row is read once, the two sums of layer_norm run over
// registers, and the output is written straight from them. The rows kernel
// above keeps the row in shared memory instead, and its second pass and the
// output pass go through it: layer_norm bf16 of 32768 x 4096 spent 131 M
// instructions there (rms_norm, one pass, 81 M), mostly waiting on shared
// memory, at 2.75 TB/s (2.93 here); rows of 5120 left most of its 512
// threads' second vectors idle (1.32 TB/s). The plain forms take the fewest
// threads, a power of two from 128, that hold the row, at 40 registers (1536
// threads an SM; 64 at 1024 threads); rows a warp holds take the fewest of
// its lanes (but two from two vectors, as the softmax rows: Note [Softmax
// rows in registers]), 128 threads a block, where a warp a row left bf16
// rows of 8 at 0.10 TB/s (H100).
// The residual form takes a warp (four rows a block) or else the fewest
// whole warps that hold the row (TPR = 0, the width at run time) at 64
// registers: 40 spilled its seven operands' offsets, and power-of-two widths
// at two vectors a thread left rows of 5120 at 2.38-2.87 TB/s (f32: 1024
// threads, one row an SM), where whole warps at three or four vectors
// reached 2.97-3.02 in a standalone harness.
/// TPR == 0: one row a block of blockDim.x threads (whole warps, at most
/// 1024). TPR < 32: RPB rows a warp, each reduced over its own lanes.
template <class S, class T, int TPR, int RPB, int K, int kBlock = TPR ? TPR * RPB : 1024>
__global__ void __launch_bounds__(kBlock, (S::kResidual ? 1024 : 1536) / kBlock)
    held_forward_kernel(RowLaunch l, rows::OffsetCalc<S::kOperands, int64_t> outer, NormParams p) {
  static_assert(RPB == 1 || (TPR > 0 && TPR <= 32), "rows of a block must not share a barrier");
  using M = math_t<T, false>;
  constexpr int V = rows::kVecOf<T>;
  __shared__ M scratch[kBlock / 32];
  const rows::RowSlot<TPR ? TPR : 1024, RPB, S::kOperands> slot(l, outer);  // 1024: lane = threadIdx.x
  // A whole warp's rows past the end leave; narrower rows past the end run
  // alongside their warp's others (reading row 0, storing nothing).
  if (!slot.valid && (TPR == 0 || TPR >= 32)) return;
  const int64_t cols = l.cols;
  const int threads = TPR ? TPR : int(blockDim.x);
  auto col = [&](int k) { return int64_t(k * threads + slot.lane) * V; };
  auto row_sum = [&](int, M v) {
    if constexpr (TPR == 0) {
      return rows::block_all_reduce(v, rows::SumOp{}, scratch);
    } else if constexpr (TPR < 32) {
#pragma unroll
      for (int d = TPR / 2; d >= 1; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
      return v;
    } else {
      return rows::row_all_reduce<TPR, RPB>(v, rows::SumOp{}, scratch);
    }
  };
  HeldRow<S, T, K> row(l, slot.off, cols, col);
  M mean, rstd;
  row.statistics(cols, col, row_sum, M(p.eps), mean, rstd);
  if (!slot.valid) return;
  if (slot.lane == 0) {
    if constexpr (!S::kRms) *rows::row_operand<stat_t<T>>(l, S::kMean, slot.off) = stat_t<T>(mean);
    *rows::row_operand<stat_t<T>>(l, S::kRstd, slot.off) = stat_t<T>(rstd);
  }
  row.store(l, slot.off, cols, col, mean, rstd);
}

/// Runs rows of up to 16384 elements on held_forward_kernel when they suit
/// it (rows_fit_held); false when they do not.
template <class S, class T>
Result<bool> launch_held_forward(const RowLaunch& l, const rows::OffsetCalc<S::kOperands, int64_t>& outer,
                                 const NormParams& p, CUstream_st* stream) {
  if constexpr (!kHoldable<T>) {
    return false;
  } else {
    constexpr int K = 4, V = rows::kVecOf<T>;
    const int64_t vectors = l.cols / V;
    if (l.cols < 1 || l.cols > 16384 || vectors > 1024 * K || l.rows < 1 || l.rows > INT32_MAX ||
        !rows_fit_held<S, T>(l))
      return false;
    auto launch = [&]<int TPR>() {
      constexpr int RPB = TPR <= 32 ? 128 / TPR : 1;
      held_forward_kernel<S, T, TPR, RPB, K>
          <<<unsigned((l.rows + RPB - 1) / RPB), TPR * RPB, 0, stream>>>(l, outer, p);
    };
    // Rows a warp holds take rows::narrow_row_lanes of its lanes, 128 threads a block.
    if (rows::launch_on_narrow_row_lanes(vectors, K, launch)) {
    } else if constexpr (S::kResidual) {
      // The fewest whole warps that hold the row (Note [Norm rows in registers]).
      const int64_t threads = (vectors + 32 * K - 1) / (32 * K) * 32;
      held_forward_kernel<S, T, 0, 1, K><<<unsigned(l.rows), unsigned(threads), 0, stream>>>(l, outer, p);
    } else {
      if (vectors <= 128 * K) launch.template operator()<128>();
      else if (vectors <= 256 * K) launch.template operator()<256>();
      else if (vectors <= 512 * K) launch.template operator()<512>();
      else if constexpr (16384 / V > 512 * K) launch.template operator()<1024>();  // (f32 past 8192)
    }
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return true;
  }
}

template <class S, class T, int TPR, int RPB, bool kCache>
__global__ void __launch_bounds__(TPR * RPB)
    grad_input_kernel(RowLaunch l, rows::OffsetCalc<S::kBackwardOperands, int64_t> outer) {
  using M = math_t<T, false>;
  extern __shared__ __align__(16) char cache_bytes[];
  __shared__ M scratch[RPB * (TPR / 32)];
  const rows::RowSlot<TPR, RPB, S::kBackwardOperands> slot(l, outer);
  const int64_t cols = l.cols;
  const auto& st = l.inner.stride;
  const T* g = rows::row_operand<const T>(l, S::kGradOutput, slot.off);
  const T* x = rows::row_operand<const T>(l, S::kSavedInput, slot.off);
  const T* w = S::kWeight ? rows::row_operand<const T>(l, S::kSavedWeight, slot.off) : nullptr;
  T* dx = rows::row_operand<T>(l, S::kGradInput, slot.off);
  T* cache_g = reinterpret_cast<T*>(cache_bytes) + (threadIdx.x / TPR) * cols * 2;
  T* cache_x = cache_g + cols;
  const int64_t sg = st[S::kGradOutput][0], sx = st[S::kSavedInput][0], sw = S::kWeight ? st[S::kSavedWeight][0] : 0;
  M mean = 0, rstd = 0;
  if (slot.valid) {
    if constexpr (!S::kRms) mean = M(*rows::row_operand<const stat_t<T>>(l, S::kSavedMean, slot.off));
    rstd = M(*rows::row_operand<const stat_t<T>>(l, S::kSavedRstd, slot.off));
  }
  auto wg_at = [&](int64_t c, T gv) {
    M v = convert<M>(gv);
    if constexpr (S::kWeight) v *= convert<M>(w[c * sw]);
    return v;
  };
  M a = 0, b = 0;  // sum(wg), sum(wg * xhat)
  auto accumulate = [&](int64_t c, T gv, T xv) {
    const M wg = wg_at(c, gv), xhat = (convert<M>(xv) - mean) * rstd;
    a += wg;
    b += wg * xhat;
  };
  if (slot.valid) {
    if (kCache && rows::vector_ok<T>(g, sg, cols) && rows::vector_ok<T>(x, sx, cols)) {
      // Whole vectors: grad_output into the cache first, then the input, whose
      // element c this same thread finds beside grad_output's in the cache.
      rows::for_row<TPR>(g, 1, cols, true, slot.lane, [](int64_t, T) {}, cache_g);
      rows::for_row<TPR>(x, 1, cols, true, slot.lane, [&](int64_t c, T xv) { accumulate(c, cache_g[c], xv); }, cache_x);
    } else {
      for (int64_t c = slot.lane; c < cols; c += TPR) {
        const T gv = g[c * sg], xv = x[c * sx];
        if constexpr (kCache) cache_g[c] = gv, cache_x[c] = xv;
        accumulate(c, gv, xv);
      }
    }
  }
  a = rows::row_all_reduce<TPR, RPB>(a, rows::SumOp{}, scratch);
  b = rows::row_all_reduce<TPR, RPB>(b, rows::SumOp{}, scratch);
  if (!slot.valid) return;
  const M mean_wg = a / M(cols), mean_wg_xhat = b / M(cols);
  const T* src[2] = {kCache ? cache_g : g, kCache ? cache_x : x};
  const int64_t ss[2] = {kCache ? 1 : sg, kCache ? 1 : sx};
  const bool vec = rows::vector_ok<T>(dx, st[S::kGradInput][0], cols) && rows::vector_ok<T>(src[0], ss[0], cols) &&
                   rows::vector_ok<T>(src[1], ss[1], cols);
  rows::map_row<TPR>(src, ss, dx, st[S::kGradInput][0], cols, vec, slot.lane, [&](int64_t c, const T (&v)[2]) {
    const M xhat = (convert<M>(v[1]) - mean) * rstd;
    return convert<T>(S::grad_input(wg_at(c, v[0]), xhat, mean_wg, mean_wg_xhat, rstd));
  });
}

/// grad_weight / grad_bias: 32 lanes x V adjacent columns (one 16-byte
/// vector each where the rows allow) x 8 row lanes per block; the row lanes
/// walk the rows of one split; partial sums (split > 1) go to the workspace.
template <class S, class T, bool kRank1>
__global__ void __launch_bounds__(256)
    grad_params_kernel(RowLaunch l, rows::OffsetCalc<S::kBackwardOperands, int64_t> outer, int splits, int64_t chunk) {
  using M = math_t<T, false>;
  constexpr int N = S::kBackwardOperands, kUnroll = 4, V = rows::kVecOf<T>;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32, split = blockIdx.y;
  const int64_t c0 = (int64_t(blockIdx.x) * 32 + tx) * V;
  const auto& st = l.inner.stride;
  const int64_t sg = st[S::kGradOutput][0], sx = st[S::kSavedInput][0];
  M dw[V] = {}, db[V] = {};
  if (c0 < l.cols) {
    const int64_t end = std::min(l.rows, (split + 1) * chunk);
    const bool whole = sg == 1 && sx == 1 && c0 + V <= l.cols;
    auto accumulate = [&](int64_t r) {
      int64_t off[N];
      if constexpr (kRank1) {
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] = r * outer.stride[k][0];
      } else {
        outer.get(r, off);
      }
      const T* g = rows::row_operand<const T>(l, S::kGradOutput, off) + c0 * sg;
      const T* x = rows::row_operand<const T>(l, S::kSavedInput, off) + c0 * sx;
      rows::Vec<T, V> gv, xv;
      if (whole && reinterpret_cast<uintptr_t>(g) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
        gv = *reinterpret_cast<const rows::Vec<T, V>*>(g);
        xv = *reinterpret_cast<const rows::Vec<T, V>*>(x);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const bool in = c0 + e < l.cols;
          gv.v[e] = in ? g[e * sg] : convert<T>(M(0));
          xv.v[e] = in ? x[e * sx] : convert<T>(M(0));
        }
      }
      M mean = 0;
      if constexpr (!S::kRms) mean = M(reinterpret_cast<const stat_t<T>*>(l.data[S::kSavedMean])[off[S::kSavedMean]]);
      const M rstd = M(reinterpret_cast<const stat_t<T>*>(l.data[S::kSavedRstd])[off[S::kSavedRstd]]);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const M gm = convert<M>(gv.v[e]);
        dw[e] += gm * (convert<M>(xv.v[e]) - mean) * rstd;
        db[e] += gm;
      }
    };
    int64_t r = split * chunk + ty;
    for (; r + 8 * (kUnroll - 1) < end; r += 8 * kUnroll)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) accumulate(r + 8 * u);
    for (; r < end; r += 8) accumulate(r);
  }
  // Row lanes merged in order; the padding column keeps lanes off each other's banks.
  __shared__ M acc[2][8][32 * V + 1];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[0][ty][tx * V + e] = dw[e], acc[1][ty][tx * V + e] = db[e];
  __syncthreads();
  for (int j = threadIdx.x; j < 32 * V; j += 256) {
    const int64_t c = int64_t(blockIdx.x) * 32 * V + j;
    if (c >= l.cols) break;
    M w = acc[0][0][j], b = acc[1][0][j];
    for (int y = 1; y < 8; ++y) w += acc[0][y][j], b += acc[1][y][j];
    if (splits == 1) {
      reinterpret_cast<T*>(l.data[S::kGradWeight])[c * st[S::kGradWeight][0]] = convert<T>(w);
      if constexpr (S::kBias) reinterpret_cast<T*>(l.data[S::kGradBias])[c * st[S::kGradBias][0]] = convert<T>(b);
    } else {
      M* partial = reinterpret_cast<M*>(l.workspace);
      partial[(int64_t(split) * 2) * l.cols + c] = w;
      partial[(int64_t(split) * 2 + 1) * l.cols + c] = b;
    }
  }
}

// Note [Fused norm backward]
// With a weight, the backward takes two sums along each row (of wg and of
// wg * xhat, for grad_input) and two down each column (grad_weight = sum of
// g * xhat, grad_bias = sum of g). A column pass would read grad_output and
// the input a second time. Rows of up to 1024 x V elements (V a 16-byte
// vector's elements) take one pass instead (fused_backward_shape; narrow
// rows: Note [Narrow norm backward rows]):
// - a block of TPR threads works on one row at a time: block `split` of
//   `splits` (as many as the GPU holds at once) takes rows split,
//   split + splits, ..., so that the blocks move through memory together.
//   Contiguous chunks of rows a block were 7-10% slower (H100, 32768x4096,
//   TB/s: bf16 layer_norm 2.44 -> 2.69, rms_norm 2.49 -> 2.65, f32
//   2.70-2.73 -> 2.83-2.87; four rows a turn, 2.42-2.86), likely as
//   hundreds of streams each far from the others. The clusters below take
//   rows the same way (8192x32768, a standalone harness: bf16 2.60-2.64 ->
//   2.71-2.72, f32 2.84 -> 2.87);
// - each thread owns the same vector of every row (columns thread * V
//   onwards), so it keeps their column sums in registers across the split
//   and writes them once, as the split's partial; merge_params_kernel adds
//   the partials in split order;
// - the rows stream through shared memory three stages deep (cp.async where
//   every row is unit-stride and 16-byte aligned, else element loads). Each
//   thread copies and reads only its own slots, so the stages need no
//   barrier: the one barrier a row is the row reduction's, over scratch
//   double-buffered by row parity;
// - the kernel sits near its issue limit (ncu), so the weight waits in
//   shared memory already in the math type, the row's sum of wg * xhat is
//   taken as rstd * sum(wg * (x - mean)), and every warp adds the warps'
//   sums in one shuffle tree (it was a loop over them in each thread);
// - rows in whole vectors take an instance without the element loads that
//   loads each row's statistics an iteration early (bf16 layer_norm
//   32768x4096: 2.43 -> 2.50 TB/s; f32 lost 4% with contiguous chunks, but
//   with strided rows each row's statistics are a cache miss of their own:
//   layer_norm f32 2.57 without, 2.85 with).
//
// Note [Narrow norm backward rows]
// Rows of up to 64 vectors in whole vectors (half 512, f32 256 elements)
// take the same kernel with TPR = the fewest threads, a power of two, that
// hold a row (but two from two vectors), kNarrowBlock / TPR rows at once in
// a block of kNarrowBlock: row group g of block `split` takes rows
// split * groups + g, ... . A row's sums run over its own lanes (shuffles;
// two warps at TPR 64 share the block's barrier), and the groups of a block
// turn together, a group past the end finishing nothing. Each thread keeps
// its column sums over its group's rows; the block adds its groups' sums in
// group order through the stages' memory and writes one partial, which
// merge_params_kernel adds in block order. Before, such rows took the two
// passes, a warp a row in the grad_input pass and one vector a lane of 32
// columns in the column pass (H100, bf16 rms_norm_backward of rows of 128:
// 0.67 TB/s, 8: 0.05). f64 rows keep the two passes below 1024 elements.
//
// Note [Norm backward over a cluster]
// Rows of up to kMaxRanks x 1024 vectors (sm_90) take the same pass over a
// thread-block cluster: block `rank` owns columns rank * 1024 * V onwards
// of every row of the cluster's split (512 threads of two vectors, one
// block an SM: a 1024-thread block of one vector a thread hit the 64
// register cap and spent ~450 instructions a thread a row on 8 elements),
// and the row sums are the ranks' block sums added in rank order (the same
// bits in every block). A cluster
// barrier a row stalled every block on the slowest (1.3-1.5 TB/s), so the
// exchange runs one row behind, through mbarriers instead: after its block
// sum of row i, warp 0's lane q sends the pair into slot i % 4 of block q
// with st.async, which counts its 8 bytes on that block's barrier of the
// slot (no fence: a release arrive was a MEMBAR.ALL.GPU behind the row's
// grad_input stores), and thread 0 arms its own barrier for the ranks'
// bytes; then the block waits for row i - 1's barrier, whose bytes its
// peers sent a row earlier, and finishes row i - 1 (grad_input and the
// column sums). A block sends row i + 4 into a peer's slot only after it has
// seen that peer's sum of row i + 2, which the peer sent after the block
// barrier that follows its reads of slot i: four slots are never
// overwritten unread. The rows then stream four stages deep, the extra
// stage holding row i - 1.
inline constexpr int kMaxRanks = kMaxClusterRanks, kExchangeSlots = 4;
/// Rows in flight through shared memory: a fourth stage holds the previous row in a cluster.
template <bool kCluster>
inline constexpr int kFusedStages = kCluster ? 4 : 3;
/// The block of TPR threads a row: narrow rows share a block of kNarrowBlock
/// (Note [Narrow norm backward rows]).
template <int TPR>
inline constexpr int kFusedBlock = TPR < kNarrowBlock ? kNarrowBlock : TPR;

/// kWhole: every row is in whole aligned vectors (the element loads left
/// out: fewer registers). Its unclustered instance also loads each row's
/// statistics an iteration early, as the clustered kernel always does; the
/// launcher takes it wherever the rows allow (Note [Fused norm backward]).
template <class S, class T, int TPR, int K, bool kCluster, bool kWhole = false>
__global__ void __launch_bounds__(kFusedBlock<TPR>, 1024 / (kFusedBlock<TPR> * K))
    fused_backward_kernel(RowLaunch l, rows::OffsetCalc<S::kBackwardOperands, int64_t> outer, bool vec_rows) {
  const bool vec = kWhole || vec_rows;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (kCluster) {
    __trap();  // launched on sm_90 and later only (fused_backward_shape)
    return;
  }
#endif
  using M = math_t<T, false>;
  constexpr int V = rows::kVecOf<T>, kStages = kFusedStages<kCluster>;
  using P = rows::Vec<T, V>;
  extern __shared__ __align__(16) char smem_bytes[];
  // [stage][grad_output, input][vector k][thread], then the weight in the
  // math type, [vector k][16-byte chunk][thread] (no bank conflicts).
  constexpr int kBlock = kFusedBlock<TPR>, kGroups = kBlock / TPR, kRowWarps = TPR / 32, kChunk = 16 / sizeof(M);
  static_assert(kGroups == 1 || (!kCluster && kWhole), "narrow rows: whole vectors, no cluster");
  using WeightChunk = rows::Vec<M, kChunk>;
  P* slots = reinterpret_cast<P*>(smem_bytes);
  auto slot = [&](int stage, int operand, int k) -> P& {
    return slots[((stage * 2 + operand) * K + k) * kBlock + threadIdx.x];
  };
  WeightChunk* weight = reinterpret_cast<WeightChunk*>(slots + kStages * 2 * K * kBlock) + threadIdx.x;
  auto weight_at = [&](int k, int e) -> M& { return weight[(k * (V / kChunk) + e / kChunk) * kBlock].v[e % kChunk]; };
  __shared__ M scratch[2][2][kBlock / 32];  // [row parity][sum][warp]
  int rank = 0, ranks = 1;
  if constexpr (kCluster) {
    uint32_t r, n;
    rows::cluster_rank(r, n);
    rank = int(r), ranks = int(n);
  }
  const int64_t split = blockIdx.x / ranks, splits = gridDim.x / ranks;
  // Block (or cluster) `split` takes rows split, split + splits, ... (Note [Fused norm backward]);
  // a narrow block's row group g rows split kGroups + g, ... (Note [Narrow norm backward rows]).
  const int group = int(threadIdx.x) / TPR, row_lane = int(threadIdx.x) % TPR;
  const int64_t cols = l.cols, first = split * kGroups + group, step = splits * kGroups, end = l.rows;
  // This thread's columns: c0(k) .. c0(k) + V for each of its K vectors (vector k of the threads adjacent).
  auto c0 = [&](int k) { return ((int64_t(rank) * K + k) * TPR + row_lane) * V; };
  const auto& st = l.inner.stride;
  const int64_t sg = st[S::kGradOutput][0], sx = st[S::kSavedInput][0], sdx = st[S::kGradInput][0];
  const T zero = convert<T>(M(0));
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e)
      weight_at(k, e) = c0(k) + e < cols ? convert<M>(reinterpret_cast<const T*>(
                                                l.data[S::kSavedWeight])[(c0(k) + e) * st[S::kSavedWeight][0]])
                                          : M(0);
  // Operand k's row r (one operand at a time: fewer live registers than a whole offset array).
  auto row_of = [&]<class U>(int k, int64_t r, U*) {
    int64_t off = 0;
    if (outer.rank <= 1) {
      off = r * outer.stride[k][0];
    } else {
      for (int d = 0; d < outer.rank; ++d) off += (r % outer.shape[d]) * outer.stride[k][d], r /= outer.shape[d];
    }
    return reinterpret_cast<U*>(l.data[k]) + off;
  };
  auto load_row = [&](int64_t r, int stage) {
    if (r < end) {
      const T* g = row_of(S::kGradOutput, r, (const T*)nullptr);
      const T* x = row_of(S::kSavedInput, r, (const T*)nullptr);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t c = c0(k);
        if (vec) {
          cp_async_16(&slot(stage, 0, k), g + (c < cols ? c : 0), c < cols);
          cp_async_16(&slot(stage, 1, k), x + (c < cols ? c : 0), c < cols);
        } else {
          P gv, xv;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const bool in = c + e < cols;
            gv.v[e] = in ? g[(c + e) * sg] : zero;
            xv.v[e] = in ? x[(c + e) * sx] : zero;
          }
          slot(stage, 0, k) = gv, slot(stage, 1, k) = xv;
        }
      }
    }
    cp_async_commit();  // empty past the split: the group count stays uniform
  };
  auto mean_of = [&](int64_t r) {
    if constexpr (S::kRms) return M(0);
    else return M(*row_of(S::kSavedMean, r, (const stat_t<T>*)nullptr));
  };
  auto rstd_of = [&](int64_t r) { return M(*row_of(S::kSavedRstd, r, (const stat_t<T>*)nullptr)); };
  // This thread's share of row r's sums, sum(wg) and sum(wg * (x - mean)) (rstd applied once to the row's sum).
  auto thread_sums = [&](int stage, M mean, M& a, M& b) {
    a = 0, b = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const P gv = slot(stage, 0, k), xv = slot(stage, 1, k);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const M wg = convert<M>(gv.v[e]) * weight_at(k, e);
        a += wg;
        b += wg * (convert<M>(xv.v[e]) - mean);
      }
    }
  };
  auto warp_sum = [](M& u, M& w) {
#pragma unroll
    for (int d = 16; d >= 1; d /= 2) u += __shfl_xor_sync(0xffffffffu, u, d), w += __shfl_xor_sync(0xffffffffu, w, d);
  };
  // The block's sums through scratch (one barrier), added in one fixed tree by every warp that asks.
  const int lane = threadIdx.x % 32;
  auto block_sums = [&](int parity, M& a, M& b, bool want) {
    if constexpr (TPR <= 32) {  // a row within a warp: its own lanes
#pragma unroll
      for (int d = TPR / 2; d >= 1; d /= 2)
        a += __shfl_xor_sync(0xffffffffu, a, d), b += __shfl_xor_sync(0xffffffffu, b, d);
      return;
    }
    warp_sum(a, b);
    if (lane == 0) scratch[parity][0][threadIdx.x / 32] = a, scratch[parity][1][threadIdx.x / 32] = b;
    __syncthreads();
    if (!want) return;
    const int w0 = group * kRowWarps;  // the row's first warp
    a = lane < kRowWarps ? scratch[parity][0][w0 + lane] : M(0);
    b = lane < kRowWarps ? scratch[parity][1][w0 + lane] : M(0);
    warp_sum(a, b);
  };
  const M inv_cols = M(1) / M(cols);
  M dw[K][V] = {}, db[K][V] = {};
  // grad_input of row r from the row's sums a = sum(wg), b = sum(wg * (x - mean)), and its column sums.
  auto finish_row = [&](int stage, int64_t r, M mean, M rstd, M a, M b) {
    const auto terms = S::grad_input_terms(a * inv_cols, b * rstd * inv_cols, rstd);
    T* dx = row_of(S::kGradInput, r, (T*)nullptr);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t c = c0(k);
      if (c >= cols) continue;
      const P gv = slot(stage, 0, k), xv = slot(stage, 1, k);
      P out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const M g = convert<M>(gv.v[e]), centred = convert<M>(xv.v[e]) - mean, g_rstd = g * rstd;
        out.v[e] = convert<T>(S::grad_input_from(g_rstd, weight_at(k, e), centred, terms));
        dw[k][e] += g_rstd * centred;
        if constexpr (S::kBias) db[k][e] += g;
      }
      if (vec) {
        store_16(dx + c, out);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e)
          if (c + e < cols) dx[(c + e) * sdx] = out.v[e];
      }
    }
  };

  if constexpr (!kCluster) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) load_row(first + s * step, s);
    int stage = 0, parity = 0;  // parity: the row's half of the double-buffered scratch
    // kWhole: a row's statistics are loaded an iteration before its sums need them.
    M mean_next = 0, rstd_next = 0;
    if (kWhole && first < end) mean_next = mean_of(first), rstd_next = rstd_of(first);
    // The block's row groups turn together (their sums share shuffles or a
    // barrier): the loop runs while the first group has a row; a later
    // group past the end sums what its stages hold and finishes nothing.
    for (int64_t r = first, lead = split * kGroups; lead < end; r += step, lead += step) {
      load_row(r + (kStages - 1) * step, (stage + kStages - 1) % kStages);
      M mean = mean_next, rstd = rstd_next;
      if constexpr (kWhole) {
        if (r + step < end) mean_next = mean_of(r + step), rstd_next = rstd_of(r + step);
      } else {
        mean = mean_of(r), rstd = rstd_of(r);
      }
      cp_async_wait<kStages - 1>();  // row r's copies (this thread's) have landed
      M a, b;
      thread_sums(stage, mean, a, b);
      block_sums(parity, a, b, true);
      if (kGroups == 1 || r < end) finish_row(stage, r, mean, rstd, a, b);
      stage = (stage + 1) % kStages, parity ^= 1;
    }
  } else {
    // Note [Norm backward over a cluster]: [slot][rank][sum], and a barrier a slot.
    __shared__ __align__(16) M exchange[kExchangeSlots][kMaxRanks][2];
    __shared__ __align__(8) uint64_t arrived[kExchangeSlots];
    if (threadIdx.x == 0) {
      for (int q = 0; q < kExchangeSlots; ++q) mbar_init(shared_address(&arrived[q]), 1);
      mbar_fence_init();
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) load_row(first + s * step, s);
    // A row's statistics are loaded an iteration before its sums need them, and kept for its grad_input.
    M mean_next = 0, rstd_next = 0, mean_prev = 0, rstd_prev = 0;
    if (first < end) mean_next = mean_of(first), rstd_next = rstd_of(first);
    const int64_t count = first < end ? (end - first + step - 1) / step : 0;  // the split's rows
    for (int64_t i = 0; i <= count && count > 0; ++i) {
      const int64_t r = first + i * step;
      const M mean = mean_next, rstd = rstd_next;
      if (i + 1 < count) mean_next = mean_of(r + step), rstd_next = rstd_of(r + step);
      if (i < count) {
        cp_async_wait<kStages - 2>();  // row r's copies (this thread's) have landed
        M a, b;
        thread_sums(int(i % kStages), mean, a, b);
        block_sums(int(i & 1), a, b, threadIdx.x < 32);
        const int q = int(i % kExchangeSlots);
        if (threadIdx.x == 0) mbar_expect_tx(shared_address(&arrived[q]), unsigned(ranks * 2 * sizeof(M)));
        if (threadIdx.x < ranks)
          st_async_pair(cluster_address(shared_address(&exchange[q][rank][0]), int(threadIdx.x)), a, b,
                        cluster_address(shared_address(&arrived[q]), int(threadIdx.x)));
      }
      if (i > 0) {  // the previous row, whose sums the peers sent a row ago
        const int q = int((i - 1) % kExchangeSlots);
        mbar_wait(shared_address(&arrived[q]), uint32_t((i - 1) / kExchangeSlots) & 1u);
        M a = 0, b = 0;
#pragma unroll
        for (int k = 0; k < kMaxRanks; ++k)
          if (k < ranks) a += exchange[q][k][0], b += exchange[q][k][1];
        finish_row(int((i - 1) % kStages), r - step, mean_prev, rstd_prev, a, b);
      }
      mean_prev = mean, rstd_prev = rstd;
      if (i < count) load_row(r + (kStages - 1) * step, int((i + kStages - 1) % kStages));
    }
    // No block leaves while a peer may still arrive on its barriers.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
  }
  cp_async_wait<0>();
  M* partial = reinterpret_cast<M*>(l.workspace);
  auto put = [&](int64_t c, M w, M b) {  // the split's column sums of column c
    if (c >= cols) return;
    if (splits == 1) {
      reinterpret_cast<T*>(l.data[S::kGradWeight])[c * st[S::kGradWeight][0]] = convert<T>(w);
      if constexpr (S::kBias) reinterpret_cast<T*>(l.data[S::kGradBias])[c * st[S::kGradBias][0]] = convert<T>(b);
    } else {
      partial[(split * 2) * cols + c] = w;
      if constexpr (S::kBias) partial[(split * 2 + 1) * cols + c] = b;
    }
  };
  if constexpr (kGroups == 1) {
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) put(c0(k) + e, dw[k][e], db[k][e]);
  } else {
    // The row groups' sums, added in group order through the stages' memory:
    // [group][sum][k * V + e][row lane]; thread i adds item i (and i + kBlock, ...).
    constexpr int kItems = K * V * TPR;
    M* sums = reinterpret_cast<M*>(smem_bytes);
    static_assert(size_t(kGroups) * 2 * kItems * sizeof(M) <= size_t(kStages) * 2 * K * kBlock * 16);
    __syncthreads();  // every group is done with the stages
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) {
        sums[((group * 2) * K * V + k * V + e) * TPR + row_lane] = dw[k][e];
        sums[((group * 2 + 1) * K * V + k * V + e) * TPR + row_lane] = db[k][e];
      }
    __syncthreads();
    for (int i = int(threadIdx.x); i < kItems; i += kBlock) {
      const int kv = i / TPR, item_lane = i % TPR;
      M w = 0, b = 0;
      for (int g = 0; g < kGroups; ++g) {
        w += sums[((g * 2) * K * V + kv) * TPR + item_lane];
        b += sums[((g * 2 + 1) * K * V + kv) * TPR + item_lane];
      }
      put((int64_t(kv / V) * TPR + item_lane) * V + kv % V, w, b);
    }
  }
}

/// grad_weight / grad_bias from the splits' partial sums: 32 columns x
/// kMergeLanes split lanes a block; lane y adds splits y, y + kMergeLanes,
/// ..., then the lanes are added in order (a fixed order: deterministic).
/// 32 lanes, not 8: 264 partials a column took 2-3% of the bf16 backward.
inline constexpr int kMergeLanes = 32;
template <class S, class T>
__global__ void __launch_bounds__(32 * kMergeLanes) merge_params_kernel(RowLaunch l, int splits) {
  using M = math_t<T, false>;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t c = int64_t(blockIdx.x) * 32 + tx, cols = l.cols;
  const M* partial = reinterpret_cast<const M*>(l.workspace);
  M dw = 0, db = 0;
  if (c < cols)
#pragma unroll 4
    for (int s = ty; s < splits; s += kMergeLanes) {
      dw += partial[(int64_t(s) * 2) * cols + c];
      if constexpr (S::kBias) db += partial[(int64_t(s) * 2 + 1) * cols + c];
    }
  __shared__ M acc[2][kMergeLanes][32];
  acc[0][ty][tx] = dw, acc[1][ty][tx] = db;
  __syncthreads();
  if (ty != 0 || c >= cols) return;
  for (int y = 1; y < kMergeLanes; ++y) dw += acc[0][y][tx], db += acc[1][y][tx];
  const auto& st = l.inner.stride;
  reinterpret_cast<T*>(l.data[S::kGradWeight])[c * st[S::kGradWeight][0]] = convert<T>(dw);
  if constexpr (S::kBias) reinterpret_cast<T*>(l.data[S::kGradBias])[c * st[S::kGradBias][0]] = convert<T>(db);
}

/// Launches the fused backward over at most `splits` row splits; returns the
/// splits it took (the partials merge_params_kernel adds), or 0, launching
/// nothing, for narrow rows not in whole vectors.
template <class S, class T, int TPR, int K, bool kCluster>
Result<int> launch_fused_backward(const RowLaunch& l, const rows::OffsetCalc<S::kBackwardOperands, int64_t>& outer,
                                  int ranks, int splits, CUstream_st* stream) {
  const bool vec = rows_in_vectors(l, S::kGradOutput, sizeof(T)) && rows_in_vectors(l, S::kSavedInput, sizeof(T)) &&
                   rows_in_vectors(l, S::kGradInput, sizeof(T));
  constexpr int kBlock = kFusedBlock<TPR>, kGroups = kBlock / TPR;
  auto kernel = fused_backward_kernel<S, T, TPR, K, kCluster, true>;
  if constexpr (kGroups > 1) {
    if (!vec) return 0;  // narrow rows not in whole vectors: the two-pass path (the caller's)
  } else if (!vec) {
    kernel = fused_backward_kernel<S, T, TPR, K, kCluster, false>;
  }
  // The stages of two operands, and the weight in the math type.
  const int smem = (kFusedStages<kCluster> * 2 * 16 + rows::kVecOf<T> * int(sizeof(math_t<T, false>))) * K * kBlock;
  BARACUDA_CUDA_TRY(rows::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, /*max_carveout=*/true));
  cudaLaunchAttribute cluster;
  cudaLaunchConfig_t config = rows::cluster_launch_config(kBlock, size_t(smem), stream, ranks, cluster);
  if constexpr (!kCluster) config.numAttrs = 0;  // a plain launch
  if constexpr (kCluster) {
    // As many clusters as the device holds at once: a second wave would double the time.
    // The count is asked once per device and cluster size (the query costs microseconds).
    static std::atomic<int> known[64][2][kMaxRanks + 1] = {};
    int device = 0;
    BARACUDA_CUDA_TRY(cudaGetDevice(&device));
    int resident = device < 64 ? known[device][vec][ranks].load(std::memory_order_relaxed) : 0;
    if (resident == 0) {
      config.gridDim = dim3(unsigned(ranks));
      BARACUDA_CUDA_TRY(cudaOccupancyMaxActiveClusters(&resident, kernel, &config));
      if (device < 64 && resident > 0) known[device][vec][ranks].store(resident, std::memory_order_relaxed);
    }
    if (resident < 1)
      return unsupported("norm backward: no cluster of ", ranks, " blocks of ", TPR, " threads and ", smem,
                         " bytes of shared memory fits on this device");
    splits = std::min(splits, resident);
  }
  splits = int(std::clamp<int64_t>((l.rows + kGroups - 1) / kGroups, 1, splits));  // no split without rows
  config.gridDim = dim3(unsigned(splits * ranks));
  BARACUDA_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, l, outer, vec));
  return splits;
}

template <class S, class T>
Status norm_forward_on_cuda(const RowLaunch& l, const NormParams& p, int, CUstream_st* stream) {
  const rows::OffsetCalc<S::kOperands, int64_t> outer(l.outer);
  using C = std::conditional_t<S::kResidual, math_t<T, false>, T>;
  for (auto held : {launch_cluster_forward<S, T>, launch_held_forward<S, T>}) {  // the row in registers
    Result<bool> ran = held(l, outer, p, stream);
    BARACUDA_TRY(ran.status());
    if (*ran) return Status::ok();
  }
  return by_row_length(
      l.cols,
      [&]<int TPR, int RPB>() {
        const size_t cache = size_t(RPB) * size_t(l.cols) * sizeof(C);
        return launch_cached(forward_kernel<S, T, TPR, RPB, true>, forward_kernel<S, T, TPR, RPB, false>, cache,
                             /*max_carveout=*/2 * cache <= kRowCacheBytes, unsigned((l.rows + RPB - 1) / RPB),
                             TPR * RPB, stream, l, outer, p);
      },
      /*narrow_long_rows=*/sizeof(C) == 2);
}

template <class S, class T>
Status norm_backward_on_cuda(const RowLaunch& l, const NormParams&, int splits, CUstream_st* stream) {
  const rows::OffsetCalc<S::kBackwardOperands, int64_t> outer(l.outer);
  if constexpr (S::kWeight) {
    // The splits' partial parameter gradients (either path) into grad_weight / grad_bias.
    auto merge_partials = [&](int taken) -> Status {
      if (taken > 1) {
        merge_params_kernel<S, T><<<unsigned((l.cols + 31) / 32), 32 * kMergeLanes, 0, stream>>>(l, taken);
        BARACUDA_CUDA_TRY(cudaGetLastError());
      }
      return Status::ok();
    };
    if (const FusedBackwardShape fused = fused_backward_shape(l.cols, sizeof(T), current_sm_version() >= 90)) {
      auto launch = [&]<int TPR>() { return launch_fused_backward<S, T, TPR, 1, false>(l, outer, 1, splits, stream); };
      auto launch_fused = [&]() -> Result<int> {
        if (fused.ranks > 1)
          return launch_fused_backward<S, T, kClusterThreads, kClusterVectors, true>(l, outer, fused.ranks, splits,
                                                                                     stream);
        if (fused.threads < kNarrowBlock) {
          if constexpr (sizeof(T) < 8) {  // (no narrow f64 rows: fused_backward_shape)
            switch (fused.threads) {
              case 1: return launch.template operator()<1>();
              case 2: return launch.template operator()<2>();
              case 4: return launch.template operator()<4>();
              case 8: return launch.template operator()<8>();
              case 16: return launch.template operator()<16>();
              case 32: return launch.template operator()<32>();
              default: return launch.template operator()<64>();
            }
          }
          return 0;
        }
        return fused.threads == 128   ? launch.template operator()<128>()
               : fused.threads == 256 ? launch.template operator()<256>()
               : fused.threads == 512 ? launch.template operator()<512>()
                                      : launch.template operator()<1024>();
      };
      Result<int> taken = launch_fused();
      BARACUDA_TRY(taken.status());
      // 0: narrow rows not in whole vectors, for the two-pass path below (the plan's splits).
      if (*taken > 0) return merge_partials(*taken);
    }
    // Parameter gradients first: grad_input may overwrite grad_output (in place).
    const int64_t chunk = (l.rows + splits - 1) / splits;
    const int64_t block_cols = 32 * rows::kVecOf<T>;
    const dim3 grid(unsigned((l.cols + block_cols - 1) / block_cols), unsigned(splits));
    if (l.outer.rank <= 1) grad_params_kernel<S, T, true><<<grid, 256, 0, stream>>>(l, outer, splits, chunk);
    else grad_params_kernel<S, T, false><<<grid, 256, 0, stream>>>(l, outer, splits, chunk);
    BARACUDA_CUDA_TRY(cudaGetLastError());
    BARACUDA_TRY(merge_partials(splits));
  }
  BARACUDA_TRY(by_row_length(l.cols, [&]<int TPR, int RPB>() {
    const size_t cache = size_t(RPB) * size_t(l.cols) * 2 * sizeof(T);
    return launch_cached(grad_input_kernel<S, T, TPR, RPB, true>, grad_input_kernel<S, T, TPR, RPB, false>, cache,
                         /*max_carveout=*/2 * cache <= kRowCacheBytes, unsigned((l.rows + RPB - 1) / RPB), TPR * RPB,
                         stream, l, outer);
  }));
  return Status::ok();
}

/// The launcher the tables record (one dtype file each: the build runs in parallel).
template <class S, class T, bool kBackward>
struct CudaNorm {
  static Status run(const RowLaunch& l, const NormParams& p, int splits, CUstream_st* s) {
    if constexpr (kBackward) return norm_backward_on_cuda<S, T>(l, p, splits, s);
    else return norm_forward_on_cuda<S, T>(l, p, splits, s);
  }
};

}  // namespace baracuda::norm
