// CUDA class losses (cross_entropy, nll_loss). Three kernels, all with a
// fixed reduction order (bitwise deterministic):
//  - prep (one block): sum of d_r over rows and of the class weights, for
//    the gradients of a mean;
//  - rows: TPR threads per row; one pass keeps a running max and sum of
//    exponentials per thread (one exp per element), then the gradient pass
//    (fused / backward) re-reads the row, which L2 usually still holds;
//    the fused cross_entropy of long rows on sm_90 holds a row in the
//    registers of a cluster of blocks instead (Note [Cross entropy rows held
//    over a cluster]), or cuts it into slices kept in their shared memory
//    (Note [Cross entropy over a cluster]);
//  - finalize (one block): the mean or sum of the per-row terms.
#pragma once

#include <cooperative_groups.h>

#include "core/cluster_rows.cuh"
#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "loss/class_losses.hpp"

namespace baracuda::loss {

using rows::OffsetCalc;
using rows::RowLaunch;

template <class T>
using scratch_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T, class Index>
struct RowTarget {
  int64_t index = 0;
  bool ignored = false, bad = false;
};

template <class T, class Index>
__device__ __forceinline__ RowTarget<T, Index> row_target(const RowLaunch& l, const int64_t* off, const ClassParams& p) {
  RowTarget<T, Index> r;
  if constexpr (!is_float_v<Index>) {
    r.index = index_of(reinterpret_cast<const Index*>(l.data[kTarget])[off[kTarget]]);
    r.ignored = r.index == p.ignore_index;
    r.bad = !r.ignored && (r.index < 0 || r.index >= l.cols);
  }
  return r;
}

template <class T, class M>
__device__ __forceinline__ M weight_at(const RowLaunch& l, const ClassParams& p, int64_t c) {
  return p.weighted ? convert<M>(reinterpret_cast<const T*>(l.data[kWeight])[c * l.inner.stride[kWeight][0]]) : M(1);
}

/// Whether operands a and b walk every row with unit stride from addresses
/// aligned to their elements and equally far from a 16-byte boundary (whole
/// vectors of both from the first boundary on; rows of any length).
inline bool rows_share_vector_offsets(const RowLaunch& l, int a, int b, size_t elem_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(l.data[a]), pb = reinterpret_cast<uintptr_t>(l.data[b]);
  if (l.inner.stride[a][0] != 1 || l.inner.stride[b][0] != 1 || pa % elem_bytes != 0 || pa % 16 != pb % 16) return false;
  for (int d = 0; d < l.outer.rank; ++d)
    if (l.outer.shape[d] > 1 && (l.outer.stride[a][d] - l.outer.stride[b][d]) * int64_t(elem_bytes) % 16 != 0) return false;
  return true;
}

/// Elements of T before the first 16-byte boundary of unit-stride rows at
/// `p` and `q` when both are that far from one (read in vectors from there
/// on, the head and the tail element by element), else -1.
template <class T>
__device__ __forceinline__ int64_t shared_vector_head(const void* p, int64_t stride_p, const void* q, int64_t stride_q) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  if (stride_p != 1 || stride_q != 1 || a % sizeof(T) != 0 || a % 16 != b % 16) return -1;
  return int64_t((16 - a % 16) % 16 / sizeof(T));
}

/// scratch[0] = sum of d_r over rows, scratch[1] = sum of the class weights.
template <class T, class Index>
__global__ void __launch_bounds__(1024) prep_kernel(ClassLaunch cl, ClassParams p, OffsetCalc<kSlots, int64_t> outer) {
  using M = scratch_of<T>;
  __shared__ M scratch[32];
  const RowLaunch& l = cl.rows;
  M d = 0, w = 0;
  for (int64_t r = threadIdx.x; r < l.rows; r += 1024) {
    if constexpr (is_float_v<Index>) {
      d += M(1);
    } else {
      int64_t off[kSlots];
      outer.get(r, off);
      const auto t = row_target<T, Index>(l, off, p);
      if (!t.ignored && !t.bad) d += weight_at<T, M>(l, p, t.index);
    }
  }
  for (int64_t c = threadIdx.x; c < l.cols; c += 1024) w += weight_at<T, M>(l, p, c);
  d = rows::row_all_reduce<1024, 1>(d, rows::SumOp{}, scratch);
  w = rows::row_all_reduce<1024, 1>(w, rows::SumOp{}, scratch);
  if (threadIdx.x == 0) {
    M* ws = static_cast<M*>(cl.scratch);
    ws[0] = d;
    ws[1] = w;
  }
}

/// 2^x: one MUFU.EX2 for f32 (flushing results under 2^-126 to 0: exp2f's
/// fix-up for subnormals cost three more instructions an exponential).
template <class M>
__device__ __forceinline__ M exp2_(M x) {
  if constexpr (std::is_same_v<M, float>) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  } else {
    return exp2(x);
  }
}

template <class M>
inline constexpr M kLog2e = M(1.4426950408889634074);

/// Folds `n` values into a running (max m, sum s of 2^((z - m) log2 e)):
/// one rescale per call, the exponentials independent of each other. The
/// max skips NaN (fmax); a NaN still reaches s through its exponential.
template <int N, class M>
__device__ __forceinline__ void absorb(const M (&z)[N], M& m, M& s) {
  M vmax = z[0];
#pragma unroll
  for (int e = 1; e < N; ++e) vmax = fmax(vmax, z[e]);
  const M nm = fmax(m, vmax);
  if (nm == -INFINITY) return;  // only -inf so far (masked logits): nothing to add
  const M shift = nm * kLog2e<M>;
  M acc = 0;
#pragma unroll
  for (int e = 0; e < N; ++e) acc += exp2_(z[e] * kLog2e<M> - shift);
  s = s * exp2_(m * kLog2e<M> - shift) + acc;
  m = nm;
}

/// Running max and sum of exponentials over this thread's elements of a row
/// (the ownership of rows::for_row), kInFlight vectors a thread in flight.
/// With `cache`, also keeps the first `cache_packs` vectors of the row in
/// shared memory (`vector` rows only). A unit-stride row that is not in
/// whole aligned vectors is read element by element up to its first 16-byte
/// boundary, then in vectors, then its tail.
template <int TPR, int kInFlight, class T, class M>
__device__ __forceinline__ void online_logsumexp(const T* row, int64_t stride, int64_t cols, bool vector, int lane,
                                                 M& m, M& s, T* cache = nullptr, int64_t cache_packs = 0) {
  constexpr int V = rows::kVecOf<T>;
  using P = rows::Vec<T, V>;
  auto absorb_one = [&](T x) {
    const M z[1] = {convert<M>(x)};
    absorb(z, m, s);
  };
  // Whole vectors packs[lane], packs[lane + TPR], ..., the first cache_packs of them kept in `cached`.
  auto absorb_vectors = [&](const P* packs, int64_t n, P* cached, int64_t cache_packs) {
    int64_t i = lane;
    for (; i + (kInFlight - 1) * TPR < n; i += kInFlight * TPR) {
      P a[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) a[k] = packs[i + k * TPR];
      M z[kInFlight * V];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        if (i + k * TPR < cache_packs) cached[i + k * TPR] = a[k];
#pragma unroll
        for (int e = 0; e < V; ++e) z[k * V + e] = convert<M>(a[k].v[e]);
      }
      absorb(z, m, s);
    }
    for (; i < n; i += TPR) {
      const P a = packs[i];
      if (i < cache_packs) cached[i] = a;
      M z[V];
#pragma unroll
      for (int e = 0; e < V; ++e) z[e] = convert<M>(a.v[e]);
      absorb(z, m, s);
    }
  };
  const auto address = reinterpret_cast<uintptr_t>(row);
  if (vector) {
    absorb_vectors(reinterpret_cast<const P*>(row), cols / V, reinterpret_cast<P*>(cache), cache_packs);
  } else if (stride == 1 && address % sizeof(T) == 0) {  // the head, whole vectors, the tail
    const int64_t head = min(cols, int64_t((16 - address % 16) % 16 / sizeof(T))), n = (cols - head) / V;
    if (lane < head) absorb_one(row[lane]);
    absorb_vectors(reinterpret_cast<const P*>(row + head), n, nullptr, 0);
    for (int64_t c = head + n * V + lane; c < cols; c += TPR) absorb_one(row[c]);
  } else {
    for (int64_t c = lane; c < cols; c += TPR) absorb_one(row[c * stride]);
  }
}

/// dst[c] = f(c, x[c]) over whole vectors, x read from `cache` for its first `cache_packs` vectors.
template <int TPR, class T, class F>
__device__ __forceinline__ void map_cached_row(const T* row, const T* cache, int64_t cache_packs, T* dst, int64_t cols,
                                               int lane, F&& f) {
  constexpr int V = rows::kVecOf<T>;
  using P = rows::Vec<T, V>;
  for (int64_t i = lane; i < cols / V; i += TPR) {
    const P a = i < cache_packs ? reinterpret_cast<const P*>(cache)[i] : reinterpret_cast<const P*>(row)[i];
    P out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = f(i * V + e, a.v[e]);
    reinterpret_cast<P*>(dst)[i] = out;
  }
}

/// A row's loss (reduction none) or its terms nll, smooth and d for the finalize.
template <class T, bool kProbs, class M>
__device__ __forceinline__ void store_row_terms(const ClassLaunch& cl, const ClassParams& p, const int64_t* off, int64_t row,
                                                M nll, M smooth, M d) {
  using W = scratch_of<T>;
  const RowLaunch& l = cl.rows;
  if (p.reduction == Reduction::none) {
    const RowScale<M> sc = row_scale<M>(effective<kProbs>(p), l.cols, l.rows, M(1));
    const M loss = sc.nll * nll + sc.smooth * smooth;
    if (p.stat_out) reinterpret_cast<W*>(l.data[kOut])[off[kOut]] = W(loss);
    else reinterpret_cast<T*>(l.data[kOut])[off[kOut]] = convert<T>(loss);
  } else {
    W* terms = static_cast<W*>(cl.scratch) + 2;
    terms[row] = W(nll);
    terms[l.rows + row] = W(smooth);
    terms[2 * l.rows + row] = W(d);
  }
}

/// The gradient at logit x of class c of a row with class-index target
/// `target`: a_t (p_c - [c == target]) + b (w_total p_c - w_c) + bad, with
/// p_c = 2^(x log2 e - lse log2 e) (a_t: the scaled target weight, b: the
/// scaled smoothing, bad: NaN for a target out of range).
template <class T, class M>
struct IndexTargetGrad {
  const RowLaunch& l;
  const ClassParams& p;
  M a_t, b, w_total, lse_log2, bad;
  int64_t target;
  __device__ __forceinline__ T operator()(int64_t c, T x) const {
    const M pc = exp2_(convert<M>(x) * kLog2e<M> - lse_log2);
    M g = a_t * (pc - (c == target ? M(1) : M(0)));
    if (b != M(0)) g += b * (w_total * pc - weight_at<T, M>(l, p, c));
    return convert<T>(g + bad);
  }
};

/// Shared memory a block may keep a row in (the gradient pass then reads it from there).
inline constexpr int kCacheBytes = int(rows::kRowCacheBytes);

template <class L, class T, class Index, int TPR, int RPB, bool kCache = false>
__global__ void __launch_bounds__(TPR * RPB) rows_kernel(ClassLaunch cl, ClassParams p, OffsetCalc<kSlots, int64_t> outer) {
  using M = math_t<T, false>;
  using W = scratch_of<T>;
  constexpr bool kProbs = is_float_v<Index>;
  __shared__ M scratch[RPB * (TPR / 32)];
  extern __shared__ __align__(16) char cache_bytes[];
  T* cache = kCache ? reinterpret_cast<T*>(cache_bytes) : nullptr;
  const RowLaunch& l = cl.rows;
  const int64_t cache_packs = kCache ? kCacheBytes / 16 : 0;
  const int64_t row = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  const int lane = threadIdx.x % TPR;
  const bool valid = row < l.rows;
  const int64_t C = l.cols;
  int64_t off[kSlots] = {};
  if (valid) outer.get(row, off);
  const T* in = reinterpret_cast<const T*>(l.data[kInput]) + off[kInput];
  const T* probs = reinterpret_cast<const T*>(l.data[kTarget]) + off[kTarget];
  const int64_t s_in = l.inner.stride[kInput][0], s_probs = l.inner.stride[kTarget][0];
  RowTarget<T, Index> t;
  if (valid) t = row_target<T, Index>(l, off, p);
  const bool vec = rows::vector_ok<T>(in, s_in, C) && (!kProbs || rows::vector_ok<T>(probs, s_probs, C));
  const M e = kProbs ? M(p.smoothing) : M(0), uniform = e / M(C);
  auto smoothed = [&](M target) { return (M(1) - e) * target + uniform; };

  // The target's logit (lane 0), read before the barriers that come before
  // any gradient write: the gradient may overwrite the logits (in place, as
  // linear_cross_entropy runs).
  M z_t = 0;
  auto read_target_logit = [&] {
    if (!kProbs && valid && lane == 0 && !t.ignored && !t.bad) z_t = convert<M>(in[t.index * s_in]);
  };

  // Pass 1: logsumexp (forward, fused) and the weighted sums of the row.
  M lse = 0, wz = 0, a = 0;  // indices: wz = sum w_c z_c; probs: a = sum w_c p'_c, wz = sum w_c p'_c z_c
  const bool smoothing_sums = kProbs || p.smoothing != 0;
  if constexpr (L::kLogits) {
    if (p.mode == Mode::backward) {
      if (valid) lse = M(reinterpret_cast<const W*>(l.data[kLse])[off[kLse]]);
      if (kProbs) {
        if (valid)
          for (int64_t c = lane; c < C; c += TPR) a += weight_at<T, M>(l, p, c) * smoothed(convert<M>(probs[c * s_probs]));
        a = rows::row_all_reduce<TPR, RPB>(a, rows::SumOp{}, scratch);
      }
    } else {
      M m = -INFINITY, s = 0;
      if (valid) {
        if (!smoothing_sums) {
          // Four vectors in flight cover the memory latency of a 1024-thread block; the cached
          // (fused) kernel keeps two: at four its gradient pass spills (64 registers a thread).
          online_logsumexp<TPR, kCache ? 2 : 4>(in, s_in, C, vec, lane, m, s, cache, cache_packs);
        } else {
          for (int64_t c = lane; c < C; c += TPR) {
            const M z[1] = {convert<M>(in[c * s_in])};
            absorb(z, m, s);
            M w = weight_at<T, M>(l, p, c);
            if constexpr (kProbs) {
              w *= smoothed(convert<M>(probs[c * s_probs]));
              a += w;
            }
            wz += w * z[0];
          }
        }
      }
      read_target_logit();
      const M gm = rows::row_all_reduce<TPR, RPB>(m, rows::MaxOp{}, scratch);
      s = m == -INFINITY ? M(0) : s * exp2_((m - gm) * kLog2e<M>);
      s = rows::row_all_reduce<TPR, RPB>(s, rows::SumOp{}, scratch);
      lse = gm + log(s);
      if (smoothing_sums) {
        wz = rows::row_all_reduce<TPR, RPB>(wz, rows::SumOp{}, scratch);
        if (kProbs) a = rows::row_all_reduce<TPR, RPB>(a, rows::SumOp{}, scratch);
      }
    }
  }
  const W* ws = static_cast<const W*>(cl.scratch);
  const M w_t = kProbs || t.ignored || t.bad ? M(0) : weight_at<T, M>(l, p, t.index);
  if constexpr (!L::kLogits) read_target_logit();

  if (p.mode != Mode::backward && valid && lane == 0) {
    M nll, smooth = 0, d;
    if constexpr (kProbs) {
      nll = lse * a - wz;
      d = 1;
    } else {
      d = t.ignored ? M(0) : w_t;
      nll = t.ignored ? M(0) : L::kLogits ? w_t * (lse - z_t) : -w_t * z_t;
      if (L::kLogits && p.smoothing != 0 && !t.ignored) smooth = (p.weighted ? M(ws[1]) : M(C)) * lse - wz;
      if (t.bad) nll = NAN;
    }
    if (L::kLogits && p.mode == Mode::forward) reinterpret_cast<W*>(l.data[kLse])[off[kLse]] = W(lse);
    store_row_terms<T, kProbs>(cl, p, off, row, nll, smooth, d);
  }
  if (p.mode == Mode::forward || !valid) return;

  // Pass 2: the gradient of the row.
  RowScale<M> sc = row_scale<M>(effective<kProbs>(p), C, l.rows, p.reduction == Reduction::mean ? M(ws[0]) : M(1));
  const M go = p.mode == Mode::fused ? (cl.grad_scale ? M(*static_cast<const W*>(cl.grad_scale)) : M(1)) : convert<M>(reinterpret_cast<const T*>(l.data[kGradOutput])[off[kGradOutput]]);
  sc.nll *= go, sc.smooth *= go;
  T* grad = reinterpret_cast<T*>(l.data[kGradInput]) + off[kGradInput];
  const int64_t s_grad = l.inner.stride[kGradInput][0];
  const bool vec_out = vec && rows::vector_ok<T>(grad, s_grad, C);
  const M bad = t.bad ? M(NAN) : M(0);
  if constexpr (!L::kLogits) {  // nll: -scale w_t at the target, 0 elsewhere
    const M g_t = t.ignored ? M(0) : -sc.nll * w_t;
    rows::store_row<TPR>(grad, s_grad, C, vec_out, lane, [&](int64_t c) { return convert<T>(bad + (c == t.index ? g_t : M(0))); });
  } else if constexpr (kProbs) {
    const T* src[2] = {in, probs};
    const int64_t ss[2] = {s_in, s_probs};
    rows::map_row<TPR>(src, ss, grad, s_grad, C, vec_out, lane, [&](int64_t c, const T (&x)[2]) {
      const M pc = exp2_((convert<M>(x[0]) - lse) * kLog2e<M>);
      return convert<T>(sc.nll * (pc * a - weight_at<T, M>(l, p, c) * smoothed(convert<M>(x[1]))));
    });
  } else {
    const IndexTargetGrad<T, M> grad_at{l,
                                        p,
                                        t.ignored ? M(0) : sc.nll * w_t,
                                        t.ignored ? M(0) : sc.smooth,
                                        p.weighted ? M(ws[1]) : M(C),
                                        lse * kLog2e<M>,
                                        bad,
                                        t.index};
    // The cache holds the row when pass 1 took the vector path without smoothing sums.
    if (kCache && vec_out && p.smoothing == 0) {
      map_cached_row<TPR>(in, cache, cache_packs, grad, C, lane, grad_at);
    } else {
      const T* src[1] = {in};
      const int64_t ss[1] = {s_in};
      rows::map_row<TPR>(src, ss, grad, s_grad, C, vec_out, lane,
                         [&](int64_t c, const T (&x)[1]) { return grad_at(c, x[0]); });
    }
  }
}

// Note [Cross entropy over a cluster]
// The fused cross_entropy of long rows (class indices, logits, no
// smoothing, f32/f16/bf16) on sm_90 that the held kernel below does not
// take (rows of up to 32 KiB; strided rows, or logits and gradient at
// different offsets from the 16-byte grid): a row is cut into `ranks` slices of at
// most kSliceBytes, one block each, the blocks of a row one thread-block
// cluster. A block keeps its slice in shared memory, so the row is read
// once and its gradient written once (the one-block kernel caches 200 KiB
// and re-reads the rest: half an f32 row of 128256 classes, from DRAM), and
// three blocks an SM, of different rows, overlap one row's reads with
// another's gradient writes. Each block folds its slice into (max, sum of
// exponentials), leaves the pair in its shared memory, and after a cluster
// barrier every block merges the ranks' pairs in rank order through
// distributed shared memory: the same bits in every block, run to run. A
// second barrier keeps each pair alive until every block has read it.
// A row takes the fewest of 1, 2, 4, 8 or 16 slices of at most
// kMaxSliceBytes; a block keeps the first kSliceBytes of its slice and
// re-reads the rest (from L2, a few microseconds later). Past the portable
// 8 only where the device holds such a cluster (rows::cluster_fits);
// longer rows, or no cluster: the one-block kernel.
inline constexpr int kSliceBytes = 64 * 1024, kMaxSliceBytes = 80 * 1024, kSliceThreads = 256,
                     kMaxSliceRanks = rows::kMaxClusterRanks;

template <class T, class Index>
__global__ void __launch_bounds__(kSliceThreads, 3)
    cluster_rows_kernel(ClassLaunch cl, ClassParams p, OffsetCalc<kSlots, int64_t> outer, int64_t slice_packs,
                        int64_t cache_packs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // launched on sm_90 and later only (class_loss_on_cuda)
#else
  using M = math_t<T, false>;
  using W = scratch_of<T>;
  constexpr int V = rows::kVecOf<T>;
  __shared__ M scratch[kSliceThreads / 32];
  __shared__ M pair[2];
  extern __shared__ __align__(16) char cache_bytes[];
  T* cache = reinterpret_cast<T*>(cache_bytes);
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ranks = int(cluster.num_blocks());
  const RowLaunch& l = cl.rows;
  const int64_t row = blockIdx.x / ranks, C = l.cols;
  const int lane = threadIdx.x;
  int64_t off[kSlots];
  outer.get(row, off);
  const T* in = reinterpret_cast<const T*>(l.data[kInput]) + off[kInput];
  T* grad = reinterpret_cast<T*>(l.data[kGradInput]) + off[kGradInput];
  const int64_t s_in = l.inner.stride[kInput][0], s_grad = l.inner.stride[kGradInput][0];
  // Whole vectors from the first 16-byte boundary (rows of any length and
  // offset, as long as the logits and the gradient share it); rank 0 takes
  // the head before it and the tail after the last whole vector, an element
  // a thread. Else (strided, or offsets that differ) elements throughout.
  const int64_t head = min(C, shared_vector_head<T>(in, s_in, grad, s_grad));
  const bool vec = head >= 0;
  const int64_t body = vec ? (C - head) / V * V : C;  // the elements the slices cut
  const int64_t c0 = (vec ? head : 0) + min(body, rank * slice_packs * V), cols = min(body + (vec ? head : 0) - c0, slice_packs * V);
  const T* slice = in + c0 * s_in;
  // This thread's head or tail element (rank 0, vector rows), or -1.
  const int64_t tail = vec ? C - head - body : 0;
  const int64_t edge = !vec || rank != 0 ? -1 : lane < head ? lane : lane >= 32 && lane - 32 < tail ? head + body + lane - 32 : -1;

  const RowTarget<T, Index> t = row_target<T, Index>(l, off, p);
  M m = -INFINITY, s = 0;
  online_logsumexp<kSliceThreads, 4>(slice, s_in, cols, vec, lane, m, s, cache, vec ? cache_packs : 0);
  if (edge >= 0) {
    const M z[1] = {convert<M>(in[edge])};
    absorb(z, m, s);
  }
  // The target's logit, read before the cluster barriers: after them another
  // block may already write its gradient over it (in place, as linear_cross_entropy runs).
  const M z_t = rank == 0 && lane == 0 && !t.ignored && !t.bad ? convert<M>(in[t.index * s_in]) : M(0);
  const M gm = rows::row_all_reduce<kSliceThreads, 1>(m, rows::MaxOp{}, scratch);
  s = m == -INFINITY ? M(0) : s * exp2_((m - gm) * kLog2e<M>);
  s = rows::row_all_reduce<kSliceThreads, 1>(s, rows::SumOp{}, scratch);
  if (lane == 0) pair[0] = gm, pair[1] = s;
  cluster.sync();
  M rm = -INFINITY, rs = 0;
  for (int r = 0; r < ranks; ++r) {
    const M* theirs = cluster.map_shared_rank(&pair[0], r);
    const M tm = theirs[0], ts = theirs[1], nm = fmax(rm, tm);
    if (nm == -INFINITY) continue;
    rs = rs * exp2_((rm - nm) * kLog2e<M>) + ts * exp2_((tm - nm) * kLog2e<M>);
    rm = nm;
  }
  cluster.sync();
  const M lse = rm + log(rs);

  const M w_t = t.ignored || t.bad ? M(0) : weight_at<T, M>(l, p, t.index);
  if (rank == 0 && lane == 0) {
    const M nll = t.bad ? M(NAN) : t.ignored ? M(0) : w_t * (lse - z_t);
    store_row_terms<T, false>(cl, p, off, row, nll, M(0), t.ignored ? M(0) : w_t);
  }
  // The gradient of the slice (no smoothing term).
  const W* ws = static_cast<const W*>(cl.scratch);
  const RowScale<M> sc = row_scale<M>(effective<false>(p), C, l.rows, p.reduction == Reduction::mean ? M(ws[0]) : M(1));
  const M go = cl.grad_scale ? M(*static_cast<const W*>(cl.grad_scale)) : M(1);
  const IndexTargetGrad<T, M> grad_of{
      l, p, t.ignored ? M(0) : sc.nll * go * w_t, M(0), M(0), lse * kLog2e<M>, t.bad ? M(NAN) : M(0), t.index};
  auto grad_at = [&](int64_t c, T x) { return grad_of(c0 + c, x); };  // c within the slice
  if (vec) {
    map_cached_row<kSliceThreads>(slice, cache, cache_packs, grad + c0, cols, lane, grad_at);
    if (edge >= 0) grad[edge] = grad_of(edge, in[edge]);
  } else {
    const T* src[1] = {slice};
    const int64_t ss[1] = {s_in};
    rows::map_row<kSliceThreads>(src, ss, grad + c0 * s_grad, s_grad, cols, false, lane,
                                 [&](int64_t c, const T (&x)[1]) { return grad_at(c, x[0]); });
  }
#endif
}

/// 16-byte vectors of a slice when rows of `cols` are cut into `ranks` slices.
template <class T>
int64_t cluster_slice_packs(int64_t cols, int ranks) {
  const int64_t packs = (cols + rows::kVecOf<T> - 1) / rows::kVecOf<T>;
  return (packs + ranks - 1) / ranks;
}

/// Launches cluster_rows_kernel: `ranks` blocks a row, one cluster each;
/// false, launching nothing, where the device cannot hold such a cluster.
template <class T, class Index>
Result<bool> launch_cluster_rows(const ClassLaunch& cl, const ClassParams& p, const OffsetCalc<kSlots, int64_t>& outer,
                                 int ranks, CUstream_st* stream) {
  const int64_t slice_packs = cluster_slice_packs<T>(cl.rows.cols, ranks), cache_packs = std::min<int64_t>(slice_packs, kSliceBytes / 16);
  auto kernel = cluster_rows_kernel<T, Index>;
  BARACUDA_CUDA_TRY(rows::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSliceBytes, true));
  cudaLaunchAttribute cluster;
  cudaLaunchConfig_t config = rows::cluster_launch_config(kSliceThreads, size_t(cache_packs) * 16, stream, ranks, cluster);
  if (!rows::cluster_fits(reinterpret_cast<const void*>(kernel), ranks, config)) return false;
  config.gridDim = dim3(unsigned(cl.rows.rows * ranks));
  BARACUDA_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, cl, p, outer, slice_packs, cache_packs));
  return true;
}

/// The largest of a thread's held elements (vectors k with valid(k); NaN if
/// one is NaN): half types compare pairs, one instruction for two elements.
template <class M, class T, int V, int K, class Valid>
__device__ __forceinline__ M held_max(const rows::Vec<T, V> (&x)[K], Valid valid) {
  if constexpr (sizeof(T) == 2) {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    T2 most;
    const T lowest = convert<T>(-INFINITY);
    most.x = lowest, most.y = lowest;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (valid(k))
#pragma unroll
        for (int j = 0; j < V / 2; ++j) {
          T2 pair;
          memcpy(&pair, &x[k].v[2 * j], sizeof(T2));
          most = __hmax2_nan(most, pair);
        }
    return rows::MaxOp{}(convert<M>(most.x), convert<M>(most.y));
  } else {
    M most = -INFINITY;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (valid(k))
#pragma unroll
        for (int e = 0; e < V; ++e) most = rows::MaxOp{}(most, convert<M>(x[k].v[e]));
    return most;
  }
}

// Note [Cross entropy rows held over a cluster]
// The fused cross_entropy (class indices, logits, no smoothing; f32/f16/bf16)
// of unit-stride rows past 32 KiB, on sm_90, where the logits and the
// gradient lie equally far from the 16-byte grid (whole vectors from the
// first boundary; off the grid, as odd class counts put rows, rank 0's
// threads hold the few elements before and after them: kEdges): the softmax
// cluster's layout (Note [Softmax over a cluster]): a row over `ranks`
// blocks of 512 threads (one block up to 64 KiB), each thread holding up to K
// 16-byte vectors of logits in registers, two blocks an SM (one at K = 16;
// rows past 16 blocks of eight vectors), so the row is read once and
// its gradient written once with every load of a thread in flight at once
// (the slice kernel streams four vectors a thread into shared memory). The
// pairs (max, sum of 2^((z - max) log2 e)) combine through
// rows::ClusterPairs (a warp's shuffle tree, the warps in order, the ranks
// in order: the same bits in every block, run to run; one st.async
// exchange, no cluster-wide barrier after it). f32 keeps its exponentials
// for the gradient; half types recompute them (bound by registers, not
// arithmetic). The thread that holds the target's logit writes the row's
// loss terms (rank 0's thread 0 where the target is ignored or out of
// range): no logit is read twice, and the gradient may overwrite the logits
// (linear_cross_entropy's chunks run in place).
template <class T, class Index, int K, bool kEdges>
__global__ void __launch_bounds__(rows::kClusterThreads, K <= 8 ? 2 : 1)
    held_cluster_kernel(ClassLaunch cl, ClassParams p, OffsetCalc<kSlots, int64_t> outer) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using M = math_t<T, false>;
  using W = scratch_of<T>;
  constexpr int V = rows::kVecOf<T>, kThreads = rows::kClusterThreads;
  constexpr bool kKeepExp = std::is_same_v<T, M>;
  using P = rows::Vec<T, V>;
  __shared__ rows::ClusterPairs<M, 1> pairs;
  uint32_t rank, ranks;
  rows::cluster_rank(rank, ranks);
  pairs.start(ranks);

  const RowLaunch& l = cl.rows;
  const int64_t row = blockIdx.x / ranks, C = l.cols;
  int64_t off[kSlots];
  outer.get(row, off);
  const T* in = reinterpret_cast<const T*>(l.data[kInput]) + off[kInput];
  T* grad = reinterpret_cast<T*>(l.data[kGradInput]) + off[kGradInput];
  // Whole vectors cover classes [head, body_end); with kEdges (a row off the
  // 16-byte grid, its gradient at the same offset) rank 0's threads 0 ..
  // head - 1 and 32 .. 32 + C - body_end - 1 hold one element each before
  // and after them (`edge`, else -1).
  int head = 0, edge = -1;  // rows of at most 16 x 16 x 512 vectors: int classes
  int64_t body_end = C;
  if constexpr (kEdges) {
    head = int(min(C, int64_t((16 - reinterpret_cast<uintptr_t>(in) % 16) % 16 / sizeof(T))));
    body_end = head + (C - head) / V * V;
    const int tid = int(threadIdx.x);
    if (rank == 0) edge = tid < head ? tid : tid >= 32 && tid - 32 < C - body_end ? int(body_end) + tid - 32 : -1;
  }
  // The row's whole vectors, split evenly over the ranks (a last rank of a
  // few vectors left most SMs of its cluster idle: f32 50257 classes ran at
  // 2.45 TB/s): rank r holds vectors r * per_rank + k * 512 + thread.
  const int64_t vectors = (body_end - head) / V, per_rank = (vectors + ranks - 1) / ranks;
  const int64_t first = int64_t(rank) * per_rank, mine = min(per_rank, vectors - first);
  auto held = [&](int k) { return int64_t(k) * kThreads + threadIdx.x < mine; };
  auto col = [&](int k) { return (first + int64_t(k) * kThreads + threadIdx.x) * V; };  // from `head`
  P x[K];
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (held(k)) x[k] = *reinterpret_cast<const P*>(in + head + col(k));
  T x_edge = convert<T>(M(0));
  if (kEdges && edge >= 0) x_edge = in[edge];
  const RowTarget<T, Index> t = row_target<T, Index>(l, off, p);
  const bool counted = !t.ignored && !t.bad;
  const M w_t = counted ? weight_at<T, M>(l, p, t.index) : M(0);
  // The thread holding the target's logit (none for an ignored or bad
  // target): x[kt].v[et], or its edge element.
  const int64_t target_slot = (t.index - head) / V - first;  // k * 512 + thread in this rank
  const bool owner = counted && t.index >= head && t.index < body_end && target_slot >= 0 && target_slot < mine &&
                     target_slot % kThreads == threadIdx.x;
  const bool edge_owner = kEdges && counted && edge >= 0 && edge == t.index;
  const int kt = int(target_slot / kThreads), et = int((t.index - head) % V);
  M z_t = edge_owner ? convert<M>(x_edge) : M(0);
  if (owner)
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e)
        if (k == kt && e == et) z_t = convert<M>(x[k].v[e]);

  // This thread's (max, sum of exponentials), f32 keeping the exponentials in x.
  M m = held_max<M>(x, held);
  if (kEdges && edge >= 0) m = rows::MaxOp{}(m, convert<M>(x_edge));
  const M shift = (m == M(-INFINITY) ? M(0) : m) * kLog2e<M>;  // -inf - -inf would be NaN
  if constexpr (!kKeepExp)
#pragma unroll
    for (int k = 0; k < K; ++k) rows::opaque(x[k]);
  M s = kEdges && edge >= 0 ? exp2_(convert<M>(x_edge) * kLog2e<M> - shift) : M(0);
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (held(k))
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const M q = exp2_(convert<M>(x[k].v[e]) * kLog2e<M> - shift);
        s += q;
        if constexpr (kKeepExp) x[k].v[e] = q;
      }
  auto part = [](M part_max, M max) { return part_max == M(-INFINITY) ? M(0) : exp2_((part_max - max) * kLog2e<M>); };
  M max = m, sum = s;
  pairs.combine(
      0, max, sum,
      [&](M& ma, M& sa, M mb, M sb) {
        const M mx = rows::MaxOp{}(ma, mb);
        sa = sa * part(ma, mx) + sb * part(mb, mx);
        ma = mx;
      },
      rank, ranks);
  if constexpr (!kKeepExp)
#pragma unroll
    for (int k = 0; k < K; ++k) rows::opaque(x[k]);
  const M lse = max + log(sum);
  if (owner || edge_owner || (!counted && rank == 0 && threadIdx.x == 0))  // the row's loss terms, once
    store_row_terms<T, false>(cl, p, off, row, t.bad ? M(NAN) : w_t * (lse - z_t), M(0), w_t);

  // The gradient a_t (p_c - [c == target]) + bad, p_c = 2^((z_c - max) log2 e) / sum.
  const W* ws = static_cast<const W*>(cl.scratch);
  const RowScale<M> sc = row_scale<M>(effective<false>(p), C, l.rows, p.reduction == Reduction::mean ? M(ws[0]) : M(1));
  const M go = cl.grad_scale ? M(*static_cast<const W*>(cl.grad_scale)) : M(1);
  const M a_t = t.ignored ? M(0) : sc.nll * go * w_t;
  // NaN for a target out of range: every gradient of its row.
  const M scale = t.bad ? M(NAN) : kKeepExp ? a_t * part(m, max) / sum : a_t / sum, max_log2 = max * kLog2e<M>;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!held(k)) continue;
    const M at_target = owner && k == kt ? a_t : M(0);
    P o;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const M q = kKeepExp ? convert<M>(x[k].v[e]) : exp2_(convert<M>(x[k].v[e]) * kLog2e<M> - max_log2);
      o.v[e] = convert<T>(q * scale - (e == et ? at_target : M(0)));
    }
    rows::store_16(grad + head + col(k), o);
  }
  if (kEdges && edge >= 0) {
    const M q = exp2_(convert<M>(x_edge) * kLog2e<M> - max_log2);
    grad[edge] = convert<T>(q * (t.bad ? M(NAN) : a_t / sum) - (edge_owner ? a_t : M(0)));
  }
#else
  __trap();  // launched on sm_90 and later only (launch_held_cluster)
#endif
}

/// Runs the fused rows on held_cluster_kernel when they suit it (unit-stride
/// rows of logits and gradient at the same offsets from the 16-byte grid,
/// 32 KiB to 16 ranks); false, launching nothing, when they do not or the
/// device cannot hold the cluster.
template <class T, class Index>
Result<bool> launch_held_cluster(const ClassLaunch& cl, const ClassParams& p, const OffsetCalc<kSlots, int64_t>& outer,
                                 CUstream_st* stream) {
  const bool whole = rows::rows_in_vectors(cl.rows, kInput, sizeof(T)) && rows::rows_in_vectors(cl.rows, kGradInput, sizeof(T));
  if (!whole && !rows_share_vector_offsets(cl.rows, kInput, kGradInput, sizeof(T))) return false;
  const int64_t vectors = (cl.rows.cols + rows::kVecOf<T> - 1) / rows::kVecOf<T>;
  rows::ClusterRowShape shape = rows::cluster_row_shape(cl.rows.cols, int(sizeof(T)), 1);
  // Rows of 32 to 64 KiB: one block of eight vectors a thread. Shorter ones
  // stay sliced (one block, 256 threads): half a block's registers would
  // sit idle, and a block's fixed cost wants 64 KiB (Note [Softmax over a cluster]).
  if (vectors > 4 * rows::kClusterThreads && vectors <= 8 * rows::kClusterThreads) shape = {8, 1};
  if (!shape) return false;  // up to 32 KiB, or past 16 ranks
  auto kernel = whole ? (shape.vectors == 8 ? held_cluster_kernel<T, Index, 8, false> : held_cluster_kernel<T, Index, 16, false>)
                     : (shape.vectors == 8 ? held_cluster_kernel<T, Index, 8, true> : held_cluster_kernel<T, Index, 16, true>);
  return rows::launch_cluster_rows(kernel, shape.ranks, cl.rows.rows, stream, cl, p, outer);
}

/// The mean or sum of the per-row terms (scratch) into `scalar_out`.
template <class T, bool kProbs>
__global__ void __launch_bounds__(1024) finalize_kernel(ClassLaunch cl, ClassParams p) {
  using M = scratch_of<T>;
  __shared__ M scratch[32];
  const int64_t n = cl.rows.rows;
  const M* terms = static_cast<const M*>(cl.scratch) + 2;
  M nll = 0, smooth = 0, d = 0;
  for (int64_t r = threadIdx.x; r < n; r += 1024) nll += terms[r], smooth += terms[n + r], d += terms[2 * n + r];
  nll = rows::row_all_reduce<1024, 1>(nll, rows::SumOp{}, scratch);
  smooth = rows::row_all_reduce<1024, 1>(smooth, rows::SumOp{}, scratch);
  d = rows::row_all_reduce<1024, 1>(d, rows::SumOp{}, scratch);
  if (threadIdx.x == 0) {
    const RowScale<M> sc = row_scale<M>(effective<kProbs>(p), cl.rows.cols, n, d);
    *static_cast<T*>(cl.scalar_out) = convert<T>(sc.nll * nll + sc.smooth * smooth);
  }
}

template <class L, class T, class Index, int TPR, int RPB>
void launch_rows(const ClassLaunch& cl, const ClassParams& p, const OffsetCalc<kSlots, int64_t>& outer, CUstream_st* s) {
  const unsigned blocks = unsigned((cl.rows.rows + RPB - 1) / RPB);
  rows_kernel<L, T, Index, TPR, RPB><<<blocks, TPR * RPB, 0, s>>>(cl, p, outer);
}

template <class L, class T, class Index>
Status class_loss_on_cuda(const ClassLaunch& cl, const ClassParams& p, CUstream_st* stream) {
  const OffsetCalc<kSlots, int64_t> outer(cl.rows.outer);
  if (p.mode != Mode::forward || (L::kLogits && p.smoothing != 0 && p.weighted))
    prep_kernel<T, Index><<<1, 1024, 0, stream>>>(cl, p, outer);
  const int64_t C = cl.rows.cols;
  const bool cached_grad = p.mode == Mode::fused && !is_float_v<Index> && L::kLogits && C > 8192;
  bool launched = cl.rows.rows == 0;
  // Long fused rows without smoothing on sm_90: held over a cluster
  // (Note [Cross entropy rows held over a cluster]), else sliced over one
  // (Note [Cross entropy over a cluster]), else the one-block kernel below.
  if constexpr (L::kLogits && !is_float_v<Index> && !std::is_same_v<T, double>) {
    auto take = [&](const Result<bool>& r) {
      if (r) launched = r.value();
      return r.status();
    };
    if (!launched && cached_grad && p.smoothing == 0 && current_sm_version() >= 90) {
      BARACUDA_TRY(take(launch_held_cluster<T, Index>(cl, p, outer, stream)));
      int ranks = 0;  // the fewest slices of at most kMaxSliceBytes
      for (int r = 1; r <= kMaxSliceRanks && !ranks; r *= 2)
        if (cluster_slice_packs<T>(C, r) * 16 <= kMaxSliceBytes) ranks = r;
      if (!launched && ranks && cl.rows.rows * ranks <= int64_t(INT32_MAX))
        BARACUDA_TRY(take(launch_cluster_rows<T, Index>(cl, p, outer, ranks, stream)));
    }
  }
  if (launched) {
  } else if (cached_grad) {  // one long row per block, kept in shared memory for the gradient pass
    auto kernel = rows_kernel<L, T, Index, 1024, 1, true>;
    BARACUDA_CUDA_TRY(rows::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kCacheBytes));
    kernel<<<unsigned(cl.rows.rows), 1024, kCacheBytes, stream>>>(cl, p, outer);
  } else if (C <= 1024) launch_rows<L, T, Index, 32, 4>(cl, p, outer, stream);
  else if (C <= 8192) launch_rows<L, T, Index, 256, 1>(cl, p, outer, stream);
  else launch_rows<L, T, Index, 1024, 1>(cl, p, outer, stream);
  if (p.mode != Mode::backward && p.reduction != Reduction::none)
    finalize_kernel<T, is_float_v<Index>><<<1, 1024, 0, stream>>>(cl, p);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace baracuda::loss
