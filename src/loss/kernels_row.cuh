// CUDA row losses (row_losses.hpp): TPR threads own a row and run the loss
// body; sums over a row combine in a fixed order (rows::row_all_reduce) and
// one block takes the mean or sum of the per-row losses in a fixed order, so
// results are bitwise deterministic.
#pragma once

#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "loss/row_losses.hpp"

namespace baracuda::loss {

/// The threads of one row, for the loss bodies.
template <int TPR, int RPB, class M>
struct CudaRow {
  /// Vectors of U in flight a thread in each_of_wide and map_of: at most 16
  /// elements (bf16: 2; f32: 4), so that the unrolled body holds no more
  /// values than for_row's two bf16 vectors (at four bf16 vectors multi_margin
  /// went from 40 to 61 registers, six to four blocks an SM).
  template <class U>
  static constexpr int kWide = rows::kVecOf<U> >= 8 ? 2 : 4;
  int lane;
  int64_t cols;
  M* scratch;  ///< RPB * (TPR / 32) values of shared memory
  template <class F>
  __device__ __forceinline__ void each(F&& f) const {
    for (int64_t c = lane; c < cols; c += TPR) f(c);
  }
  template <class U, class F>
  __device__ __forceinline__ void each_of(const U* p, int64_t stride, F&& f) const {
    rows::for_row<TPR>(p, stride, cols, rows::vector_ok<U>(p, stride, cols), lane, f);
  }
  /// each_of with up to kWide vectors in flight a thread (the same columns a
  /// thread; a short row's few vectors all in flight at once).
  template <class U, class F>
  __device__ __forceinline__ void each_of_wide(const U* p, int64_t stride, F&& f) const {
    constexpr int V = rows::kVecOf<U>, kW = kWide<U>;
    using P = rows::Vec<U, V>;
    if (kW == 2 || !rows::vector_ok<U>(p, stride, cols)) return each_of(p, stride, f);  // for_row keeps two
    const auto* packs = reinterpret_cast<const P*>(p);
    const int64_t n = cols / V;
    for (int64_t i = lane; i < n; i += kW * TPR) {
      P a[kW];
#pragma unroll
      for (int k = 0; k < kW; ++k)
        if (i + k * TPR < n) a[k] = packs[i + k * TPR];
#pragma unroll
      for (int k = 0; k < kW; ++k)
        if (i + k * TPR < n)
#pragma unroll
          for (int e = 0; e < V; ++e) f((i + k * TPR) * V + e, a[k].v[e]);
    }
  }
  /// q[c] = f(c, p[c]): whole vectors in and out when both rows allow, up to
  /// kWide in flight (a vector's elements stored one at a time would cost a
  /// partial sector write each); each thread stores only what it has read.
  template <class U, class F>
  __device__ __forceinline__ void map_of(const U* p, int64_t stride, U* q, int64_t qstride, F&& f) const {
    constexpr int V = rows::kVecOf<U>, kW = kWide<U>;
    using P = rows::Vec<U, V>;
    if (rows::vector_ok<U>(p, stride, cols) && rows::vector_ok<U>(q, qstride, cols)) {
      const auto* in = reinterpret_cast<const P*>(p);
      auto* out = reinterpret_cast<P*>(q);
      const int64_t n = cols / V;
      for (int64_t i = lane; i < n; i += kW * TPR) {
        P a[kW];
#pragma unroll
        for (int k = 0; k < kW; ++k)
          if (i + k * TPR < n) a[k] = in[i + k * TPR];
#pragma unroll
        for (int k = 0; k < kW; ++k) {
          if (i + k * TPR >= n) continue;
          P y;
#pragma unroll
          for (int e = 0; e < V; ++e) y.v[e] = f((i + k * TPR) * V + e, a[k].v[e]);
          out[i + k * TPR] = y;
        }
      }
    } else {
      for (int64_t c = lane; c < cols; c += TPR) q[c * qstride] = f(c, p[c * stride]);
    }
  }
  __device__ __forceinline__ M sum(M v) const { return rows::row_all_reduce<TPR, RPB>(v, rows::SumOp{}, scratch); }
  __device__ __forceinline__ M max(M v) const { return rows::row_all_reduce<TPR, RPB>(v, rows::MaxOp{}, scratch); }
  __device__ __forceinline__ void sync() const {
    if constexpr (TPR == 32) __syncwarp();
    else __syncthreads();
  }
  __device__ __forceinline__ bool leader() const { return lane == 0; }
};

template <class T>
using row_scratch_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Asks L2 for the 128-byte lines of a unit-stride row, spread over the row's
/// threads (no registers, nothing waits on it).
template <int TPR, class U>
__device__ __forceinline__ void prefetch_row(const U* p, int64_t stride, int64_t cols, int lane) {
  if (stride != 1) return;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p + cols);
  for (uintptr_t a = (reinterpret_cast<uintptr_t>(p) & ~uintptr_t(127)) + uintptr_t(lane) * 128; a < end; a += TPR * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// Note [Row loss kernels]
// Forward and backward are separate kernels (kBackward), so that a forward
// does not carry the registers of its backward (multilabel_margin's kernel
// had 125 registers a thread: two 256-thread blocks an SM). A warp-per-row
// kernel with class targets first asks L2 for its rows: the target, then
// x[target], then the row are dependent reads, and the last two then come
// from L2 instead of HBM.
template <class L, class T, class Index, int TPR, int RPB, bool kBackward>
__global__ void __launch_bounds__(TPR * RPB)
    row_loss_kernel(RowLossLaunch rl, RowParams prm, rows::OffsetCalc<rows::kMaxOperands, int64_t> outer,
                    uint8_t* mask) {
  // A row's body may loop a data-dependent number of times over row barriers:
  // a block holds one row, or rows of one warp each.
  static_assert(RPB == 1 || TPR == 32);
  using M = math_t<T, false>;
  __shared__ M scratch[RPB * (TPR / 32)];
  RowParams p = prm;
  p.backward = kBackward;
  const rows::RowLaunch& l = rl.rows;
  const int64_t row = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  if (row >= l.rows) return;
  int64_t off[rows::kMaxOperands];
  outer.get(row, off);
  RowOperands<T, Index> r = bind_row<L, T, Index>(l, off, p);
  if constexpr (L::meta.target == TargetKind::index_list) r.mask = mask + row * l.cols;
  const CudaRow<TPR, RPB, M> ctx{int(threadIdx.x % TPR), l.cols, scratch};
  if constexpr (TPR == 32 && L::meta.target != TargetKind::none && L::meta.target != TargetKind::sign) {
    if constexpr (L::meta.target == TargetKind::index_list) prefetch_row<TPR>(r.target, r.st, l.cols, ctx.lane);
    prefetch_row<TPR>(r.x[0], r.sx[0], l.cols, ctx.lane);
  }
  M go = 0;
  if constexpr (kBackward) {
    const T* g = p.reduction == 0 ? reinterpret_cast<const T*>(l.data[0]) + off[0] : static_cast<const T*>(rl.scalar_grad);
    go = convert<M>(*g) * (p.reduction == 1 ? M(1) / M(l.rows) : M(1));
  }
  const M loss = row_loss<L, M>(ctx, r, p, go);
  if (kBackward || !ctx.leader()) return;
  constexpr int kOut = L::meta.inputs;
  if (p.reduction == 0) reinterpret_cast<T*>(l.data[kOut])[off[kOut]] = convert<T>(loss);
  else static_cast<row_scratch_t<T>*>(rl.workspace)[row] = row_scratch_t<T>(loss);
}

/// The mean or sum of the per-row losses into `out` (one block, fixed order).
template <class T>
__global__ void __launch_bounds__(1024) row_finalize_kernel(const row_scratch_t<T>* terms, int64_t n, int reduction, T* out) {
  using W = row_scratch_t<T>;
  __shared__ W scratch[32];
  constexpr int kLoads = 8;  // independent loads in flight per thread; the sum keeps the thread's order
  W s = 0;
  int64_t r = threadIdx.x;
  for (; r + (kLoads - 1) * 1024 < n; r += kLoads * 1024) {
    W v[kLoads];
#pragma unroll
    for (int e = 0; e < kLoads; ++e) v[e] = terms[r + e * 1024];
#pragma unroll
    for (int e = 0; e < kLoads; ++e) s += v[e];
  }
  for (; r < n; r += 1024) s += terms[r];
  s = rows::row_all_reduce<1024, 1>(s, rows::SumOp{}, scratch);
  if (threadIdx.x == 0) *out = convert<T>(reduction == 1 ? s / W(n) : s);  // a mean of no rows is NaN, as torch
}

template <class L, class T, class Index, int TPR, int RPB>
void launch_row_loss(const RowLossLaunch& rl, const RowParams& p, const rows::OffsetCalc<rows::kMaxOperands, int64_t>& outer,
                     uint8_t* mask, CUstream_st* stream) {
  const unsigned blocks = unsigned((rl.rows.rows + RPB - 1) / RPB);
  if (p.backward) row_loss_kernel<L, T, Index, TPR, RPB, true><<<blocks, TPR * RPB, 0, stream>>>(rl, p, outer, mask);
  else row_loss_kernel<L, T, Index, TPR, RPB, false><<<blocks, TPR * RPB, 0, stream>>>(rl, p, outer, mask);
}

template <class L, class T, class Index>
Status row_loss_on_cuda(const RowLossLaunch& rl, const RowParams& p, CUstream_st* stream) {
  using W = row_scratch_t<T>;
  const rows::OffsetCalc<rows::kMaxOperands, int64_t> outer(rl.rows.outer);
  const int64_t n = rl.rows.rows, C = rl.rows.cols;
  const bool reduced = !p.backward && p.reduction != 0;
  // Workspace: the per-row losses (reduced forward), then the index lists' masks.
  uint8_t* mask = static_cast<uint8_t*>(rl.workspace) + (reduced ? (size_t(n) * sizeof(W) + 255) / 256 * 256 : 0);
  if (n > 0) {
    if (C <= 1024) launch_row_loss<L, T, Index, 32, 8>(rl, p, outer, mask, stream);
    else if (C <= 16384) launch_row_loss<L, T, Index, 256, 1>(rl, p, outer, mask, stream);
    else launch_row_loss<L, T, Index, 1024, 1>(rl, p, outer, mask, stream);
  }
  if (reduced)
    row_finalize_kernel<T><<<1, 1024, 0, stream>>>(static_cast<const W*>(rl.workspace), n, p.reduction,
                                                   static_cast<T*>(rl.scalar_out));
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace baracuda::loss
