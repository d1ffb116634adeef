// CUDA normalization. Forward and grad_input: TPR threads per row, the row
// kept in shared memory when it fits (one read, one write), statistics by
// fixed-order row reductions. grad_weight / grad_bias: a column pass over the
// rows, split across blocks with partial sums merged in split order, so the
// whole family is deterministic without atomics.
#pragma once

#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "norm/ops.hpp"
#include "reduce/engine.hpp"

namespace baracuda::norm {

using rows::RowLaunch;
using rows::by_row_length;
using rows::kRowCacheBytes;
using rows::launch_cached;

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

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

template <class S, class T>
__global__ void __launch_bounds__(256) merge_params_kernel(RowLaunch l, int splits) {
  using M = math_t<T, false>;
  const int64_t c = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (c >= l.cols) return;
  const M* partial = reinterpret_cast<const M*>(l.workspace);
  M dw = 0, db = 0;
  for (int s = 0; s < splits; ++s) dw += partial[(int64_t(s) * 2) * l.cols + c], db += partial[(int64_t(s) * 2 + 1) * l.cols + c];
  const auto& st = l.inner.stride;
  reinterpret_cast<T*>(l.data[S::kGradWeight])[c * st[S::kGradWeight][0]] = convert<T>(dw);
  if constexpr (S::kBias) reinterpret_cast<T*>(l.data[S::kGradBias])[c * st[S::kGradBias][0]] = convert<T>(db);
}

template <class S, class T>
Status norm_forward_on_cuda(const RowLaunch& l, const NormParams& p, int, CUstream_st* stream) {
  const rows::OffsetCalc<S::kOperands, int64_t> outer(l.outer);
  using C = std::conditional_t<S::kResidual, math_t<T, false>, T>;
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
  // Parameter gradients first: grad_input may overwrite grad_output (in place).
  if constexpr (S::kWeight) {
    const int64_t chunk = (l.rows + splits - 1) / splits;
    const int64_t block_cols = 32 * rows::kVecOf<T>;
    const dim3 grid(unsigned((l.cols + block_cols - 1) / block_cols), unsigned(splits));
    if (l.outer.rank <= 1) grad_params_kernel<S, T, true><<<grid, 256, 0, stream>>>(l, outer, splits, chunk);
    else grad_params_kernel<S, T, false><<<grid, 256, 0, stream>>>(l, outer, splits, chunk);
    BARACUDA_CUDA_TRY(cudaGetLastError());
    if (splits > 1) {
      merge_params_kernel<S, T><<<unsigned((l.cols + 255) / 256), 256, 0, stream>>>(l, splits);
      BARACUDA_CUDA_TRY(cudaGetLastError());
    }
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
