// CUDA batch_norm and batch_norm_backward (Note [Batch norm layout] and Note
// [Batch norm statistics] in batch_norm.hpp). Four walks over the space, each
// channels-first or channels-last: statistics and gradient sums (partials per
// chunk into the workspace), normalisation and grad_input (elementwise from
// per-channel coefficients). Small per-channel kernels in between merge the
// partials in a fixed order and update the running stats.
//
// Workspace (A = f32, f64 for f64): coefficients [C][kCoef] (forward: mean,
// scale, bias; backward: k_g, mean_g, k_x, mean), then partials
// [C][splits][kWidth] (forward: count, mean, M2; backward: sum g, sum g (x - mean)).
#include <type_traits>

#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "norm/batch_norm.hpp"

namespace baracuda::norm::bn {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

enum class Pass { stats, grad_sums, normalize, grad_input };
template <Pass kPass>
inline constexpr bool kReduces = kPass == Pass::stats || kPass == Pass::grad_sums;
template <Pass kPass>
inline constexpr bool kReadsG = kPass == Pass::grad_sums || kPass == Pass::grad_input;
template <Pass kPass>
inline constexpr int kCoef = kPass == Pass::stats || kPass == Pass::normalize ? 3 : 4;

template <class T>
using acc_t = math_t<T, false>;

template <class A>
struct Sums {  // trivial, for shared memory: value-initialise with {}
  A g, gxm;
};

template <class A>
__device__ __forceinline__ Moments<A> combine(const Moments<A>& a, const Moments<A>& b) { return merge(a, b); }
template <class A>
__device__ __forceinline__ Sums<A> combine(const Sums<A>& a, const Sums<A>& b) { return {a.g + b.g, a.gxm + b.gxm}; }

template <class A>
__device__ __forceinline__ Moments<A> shfl_down(const Moments<A>& m, int d) {
  return {__shfl_down_sync(0xffffffffu, m.n, d), __shfl_down_sync(0xffffffffu, m.mean, d),
          __shfl_down_sync(0xffffffffu, m.m2, d)};
}
template <class A>
__device__ __forceinline__ Sums<A> shfl_down(const Sums<A>& s, int d) {
  return {__shfl_down_sync(0xffffffffu, s.g, d), __shfl_down_sync(0xffffffffu, s.gxm, d)};
}

/// Lane 0 gets the fixed-order tree combination of the warp's values.
template <class Partial>
__device__ __forceinline__ Partial warp_combine(Partial p) {
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) p = combine(p, shfl_down(p, d));
  return p;
}

template <class A>
__device__ __forceinline__ void store(A* dst, const Moments<A>& m) { dst[0] = m.n, dst[1] = m.mean, dst[2] = m.m2; }
template <class A>
__device__ __forceinline__ void store(A* dst, const Sums<A>& s) { dst[0] = s.g, dst[1] = s.gxm; }
template <class A>
__device__ __forceinline__ Moments<A> load_partial(const A* src, Moments<A>*) { return {src[0], src[1], src[2]}; }
template <class A>
__device__ __forceinline__ Sums<A> load_partial(const A* src, Sums<A>*) { return {src[0], src[1]}; }

/// One thread's share of a chunk: shifted sums (statistics) or plain sums
/// (gradients). The walker counts the elements (the same count for every
/// channel of a thread) and hands it to finish. The shift is the thread's
/// own first element of the channel, set by visit: a sample of the data, so
/// the sums of squares do not cancel, and an outlier there costs only this
/// thread's partial its precision (Note [Batch norm statistics]).
template <class A>
struct StatsAcc {
  using Partial = Moments<A>;
  static constexpr int kWidth = 3;
  A shift = 0, s1 = 0, s2 = 0;
  __device__ __forceinline__ void add(A x, A, bool live) {
    const A d = live ? x - shift : A(0);
    s1 += d;
    s2 += d * d;
  }
  __device__ __forceinline__ Partial finish(int64_t n) const { return from_shifted(A(n), shift, s1, s2); }
};
template <class A>
struct GradAcc {
  using Partial = Sums<A>;
  static constexpr int kWidth = 2;
  A mean = 0;
  Partial sums{};
  __device__ __forceinline__ void add(A x, A g, bool live) {
    g = live ? g : A(0);
    sums.g += g;
    sums.gxm += g * (x - mean);
  }
  __device__ __forceinline__ Partial finish(int64_t) const { return sums; }
};

template <class T, int V, class A>
__device__ __forceinline__ void load(const char* base, int64_t off, A (&v)[V]) {
  const T* p = reinterpret_cast<const T*>(base) + off;
  if constexpr (V > 1) {
    const auto pack = *reinterpret_cast<const rows::Vec<T, V>*>(p);
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = convert<A>(pack.v[e]);
  } else {
    v[0] = convert<A>(*p);
  }
}

template <class T, int V, class A>
__device__ __forceinline__ void store_y(char* base, int64_t off, const A (&v)[V]) {
  T* p = reinterpret_cast<T*>(base) + off;
  if constexpr (V > 1) {
    rows::Vec<T, V> pack;
#pragma unroll
    for (int e = 0; e < V; ++e) pack.v[e] = convert<T>(v[e]);
    *reinterpret_cast<rows::Vec<T, V>*>(p) = pack;
  } else {
    *p = convert<T>(v[0]);
  }
}

/// What one pass does for one channel: the accumulator (reductions) or the
/// coefficients (elementwise), and the step for one element.
template <Pass kPass, class T>
struct Step {
  using A = acc_t<T>;
  using Acc = std::conditional_t<kPass == Pass::stats, StatsAcc<A>, GradAcc<A>>;
  Acc acc;
  A k[4] = {};

  __device__ __forceinline__ void init(const BatchNormLaunch& l, int64_t c) {
    const A* coef = static_cast<const A*>(l.workspace) + c * kCoef<kPass>;
    if constexpr (kPass == Pass::grad_sums) acc.mean = coef[3];
    if constexpr (!kReduces<kPass>)
#pragma unroll
      for (int i = 0; i < kCoef<kPass>; ++i) k[i] = coef[i];
  }

  /// The output element (elementwise passes), or 0 after accumulating
  /// (nothing when not `live`).
  __device__ __forceinline__ A operator()(A x, A g, bool live) {
    if constexpr (kReduces<kPass>) {
      acc.add(x, g, live);
      return A(0);
    } else if constexpr (kPass == Pass::normalize) {
      return (x - k[0]) * k[1] + k[2];
    } else {
      return k[0] * (g - k[1]) - k[2] * (x - k[3]);
    }
  }
};

/// Loads V elements of x (and g) at each of the U offsets in `o`, all in
/// flight at once, runs each element through steps[e * kStepStride] (one
/// channel: stride 0; V neighbouring channels: stride 1) and stores y. Only
/// the first `present` offsets are live. kGuarded: the others are skipped
/// (branches). Else they repeat the first (valid addresses), add nothing to
/// the sums and store the first's values again: no branch, so the compiler
/// cannot sink their loads behind one (the channels-last walks, U up to 4;
/// the channels-first walk keeps its two guarded vectors, fewer registers).
/// `first`: the thread's first visit, whose first elements become the
/// statistics' shifts (one uniform branch a visit, none an element).
/// Stores never precede the loads of their own elements, so y may alias x or g.
template <Pass kPass, class T, int V, int kStepStride, int U, bool kGuarded>
__device__ __forceinline__ void visit(const BatchNormLaunch& l, const int64_t (&o)[U][kFull], int present,
                                      bool first, Step<kPass, T>* steps) {
  using A = acc_t<T>;
  A x[U][V], g[U][V] = {}, y[V];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kGuarded && u > 0 && u >= present) break;
    load<T, V>(l.data[kX], o[u][kX], x[u]);
    if constexpr (kReadsG<kPass>) load<T, V>(l.data[kG], o[u][kG], g[u]);
  }
  if constexpr (kPass == Pass::stats) {
    if (first) {
#pragma unroll
      for (int e = 0; e < (kStepStride ? V : 1); ++e) steps[e * kStepStride].acc.shift = x[0][e];
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kGuarded && u > 0 && u >= present) break;
#pragma unroll
    for (int e = 0; e < V; ++e) y[e] = steps[e * kStepStride](x[u][e], g[u][e], u < present);
    if constexpr (!kReduces<kPass>) store_y<T, V>(l.data[kY], o[u][kY], y);
  }
}

template <class A>
__device__ __forceinline__ A* partials_of(const BatchNormLaunch& l, int64_t c, int width, int coef) {
  return static_cast<A*>(l.workspace) + l.channels * coef + c * int64_t(l.splits) * width;
}

/// Channels-first: block (c, s) walks chunk s of channel c's space, V
/// elements (one 16-byte vector, or 1) at a time: row by row (one offset
/// computation a row) when a row holds a block's worth of vectors, else each
/// thread finds the row of each of its vectors. Elementwise passes run the
/// blocks in reverse, so the data the reduction read last (still in L2) goes first.
template <Pass kPass, class T, int V>
__global__ void __launch_bounds__(kThreads) first_kernel(BatchNormLaunch l) {
  using A = acc_t<T>;
  constexpr bool kReverse = !kReduces<kPass>;
  const int64_t c = kReverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int s = kReverse ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
  const int64_t units = l.count / V;
  const int64_t lo = s * units / l.splits * V, hi = (s + 1) * units / l.splits * V;
  Step<kPass, T> step;
  step.init(l, c);
  int64_t visited = 0;  // elements of the channel this thread saw (the statistics' count)
  if (l.row_len >= kThreads * V) {
    for (int64_t e = lo; e < hi;) {
      const int64_t row = e / l.row_len, start = row * l.row_len;
      const int64_t end = min(hi - start, l.row_len);
      int64_t off[kFull];
      l.row_offsets.get(row, off);
#pragma unroll
      for (int k = 0; k < kFull; ++k) off[k] += c * l.channel_stride[k];
      for (int64_t i = e - start + int64_t(threadIdx.x) * V; i < end; i += 2 * kThreads * V) {
        const int64_t j = i + kThreads * V;  // loaded only when j < end (guarded visit)
        int64_t o[2][kFull];
#pragma unroll
        for (int k = 0; k < kFull; ++k) o[0][k] = off[k] + i * l.row_stride[k], o[1][k] = off[k] + j * l.row_stride[k];
        visit<kPass, T, V, 0, 2, true>(l, o, j < end ? 2 : 1, visited == 0, &step);
        visited += j < end ? 2 * V : V;
      }
      e = start + end;
    }
  } else {  // short rows: every thread finds the row of each of its vectors
    for (int64_t e = lo + int64_t(threadIdx.x) * V; e < hi; e += kThreads * V) {
      const int64_t row = e / l.row_len, col = e - row * l.row_len;
      int64_t o[1][kFull];
      l.row_offsets.get(row, o[0]);
#pragma unroll
      for (int k = 0; k < kFull; ++k) o[0][k] += c * l.channel_stride[k] + col * l.row_stride[k];
      visit<kPass, T, V, 0, 1, true>(l, o, 1, visited == 0, &step);
      visited += V;
    }
  }
  if constexpr (kReduces<kPass>) {
    using Acc = typename Step<kPass, T>::Acc;
    using Partial = typename Acc::Partial;
    __shared__ Partial warps[kWarps];
    const Partial p = warp_combine(step.acc.finish(visited));
    if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = p;
    __syncthreads();
    if (threadIdx.x == 0) {
      Partial r = warps[0];
      for (int w = 1; w < kWarps; ++w) r = combine(r, warps[w]);
      store(partials_of<A>(l, c, Acc::kWidth, kCoef<kPass>) + s * Acc::kWidth, r);
    }
  }
}

/// Channels-last: lane x owns channels V (32 tile + x) .. + V - 1 (one
/// 16-byte vector, or 1), the warps of the block take every kWarps-th space
/// position of chunk s: forward in the reductions, backward in the
/// elementwise passes, which so start on the positions the reduction read
/// last (still in L2). Partials merge across the warps in warp order.
/// kOneRow: the space is one strided dim (NHWC), so a position's offset is
/// one product; the general offset path would cost its registers here too.
template <Pass kPass, class T, int V, bool kOneRow, int U>
__global__ void __launch_bounds__(kThreads) last_kernel(BatchNormLaunch l) {
  using A = acc_t<T>;
  constexpr bool kReverse = !kReduces<kPass>;
  const int64_t tile = kReverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int s = kReverse ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
  const int64_t c0 = (tile * 32 + threadIdx.x) * V;
  const bool valid = c0 < l.channels;  // V > 1 only when V divides C
  const int64_t lo = s * l.count / l.splits, hi = (s + 1) * l.count / l.splits;
  Step<kPass, T> steps[V];
#pragma unroll
  for (int e = 0; e < V; ++e) steps[e].init(l, valid ? c0 + e : 0);
  auto offsets = [&](int64_t p, int64_t (&o)[kFull]) {
    if constexpr (kOneRow) {
#pragma unroll
      for (int k = 0; k < kFull; ++k) o[k] = p * l.row_stride[k] + c0 * l.channel_stride[k];
    } else {
      const int64_t row = p / l.row_len, col = p - row * l.row_len;
      l.row_offsets.get(row, o);
#pragma unroll
      for (int k = 0; k < kFull; ++k) o[k] += col * l.row_stride[k] + c0 * l.channel_stride[k];
    }
  };
  int64_t visited = 0;  // positions this thread saw (the statistics' count)
  if (valid) {
    for (int64_t i = threadIdx.y; i < hi - lo; i += U * kWarps) {
      const int present = int(min(int64_t(U), (hi - lo - i + kWarps - 1) / kWarps));
      int64_t o[U][kFull];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t iu = u < present ? i + u * kWarps : i;
        offsets(kReverse ? hi - 1 - iu : lo + iu, o[u]);
      }
      visit<kPass, T, V, 1, U, false>(l, o, present, visited == 0, steps);
      visited += present;
    }
  }
  if constexpr (kReduces<kPass>) {
    using Acc = typename Step<kPass, T>::Acc;
    using Partial = typename Acc::Partial;
    __shared__ Partial part[kWarps][32 * V];
#pragma unroll
    for (int e = 0; e < V; ++e) part[threadIdx.y][threadIdx.x * V + e] = steps[e].acc.finish(visited);
    __syncthreads();
    for (int j = threadIdx.y * 32 + threadIdx.x; j < 32 * V; j += kThreads) {
      const int64_t c = tile * 32 * V + j;
      if (c >= l.channels) continue;
      Partial r = part[0][j];
      for (int w = 1; w < kWarps; ++w) r = combine(r, part[w][j]);
      store(partials_of<A>(l, c, Acc::kWidth, kCoef<kPass>) + s * Acc::kWidth, r);
    }
  }
}

template <class U>
__device__ __forceinline__ U& at(const ChannelVec& v, int64_t c) {
  return reinterpret_cast<U*>(v.data)[c * v.stride];
}

/// The partials of channel c merged in a fixed order: lane j takes splits
/// j, j + 32, ... in turn, then the warp's tree; lane 0 holds the result.
/// Loads go kInFlight at a time ahead of the merges (channels-last walks
/// have up to 1024 splits: 32 partials a lane, one L2 round trip each before).
template <class Partial, class A>
__device__ __forceinline__ Partial merge_splits(const BatchNormLaunch& l, int64_t c, int coef) {
  constexpr int kWidth = sizeof(Partial) / sizeof(A), kInFlight = 8;
  const A* src = partials_of<A>(l, c, kWidth, coef);
  Partial p{};
  int s = threadIdx.x % 32;
  for (; s + (kInFlight - 1) * 32 < l.splits; s += kInFlight * 32) {
    Partial v[kInFlight];
#pragma unroll
    for (int e = 0; e < kInFlight; ++e) v[e] = load_partial(src + (s + e * 32) * kWidth, &p);
#pragma unroll
    for (int e = 0; e < kInFlight; ++e) p = combine(p, v[e]);
  }
  for (; s < l.splits; s += 32) p = combine(p, load_partial(src + s * kWidth, &p));
  return warp_combine(p);
}

/// One warp per channel: the statistics, save_mean / save_invstd, the
/// running stats and the normalisation coefficients.
template <class T, class P>
__global__ void __launch_bounds__(kThreads) finalize_forward(BatchNormLaunch l) {
  using A = acc_t<T>;
  const int64_t c = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (c >= l.channels) return;
  const bool have_stats = l.training && l.count > 0;
  Moments<A> m{};
  if (have_stats) m = merge_splits<Moments<A>, A>(l, c, 3);
  if (threadIdx.x % 32 != 0) return;
  A mean, invstd, var = 0;
  if (l.training) {
    mean = have_stats ? m.mean : A(NAN);
    var = have_stats ? m.m2 / m.n : A(NAN);
    invstd = invstd_of(var, l.eps);
  } else {
    mean = convert<A>(at<P>(l.running_mean, c));
    invstd = invstd_of(convert<A>(at<P>(l.running_var, c)), l.eps);
  }
  at<A>(l.save_mean, c) = mean;
  at<A>(l.save_invstd, c) = invstd;
  if (l.running_mean.data) {
    A rm = convert<A>(at<P>(l.running_mean, c)), rv = convert<A>(at<P>(l.running_var, c));
    if (have_stats) {
      rm = running_update(rm, mean, l.momentum);
      rv = running_update(rv, var * m.n / (m.n - A(1)), l.momentum);
    }
    at<P>(l.running_mean_out, c) = convert<P>(rm);
    at<P>(l.running_var_out, c) = convert<P>(rv);
  }
  if (l.count == 0) return;  // no workspace
  A* coef = static_cast<A*>(l.workspace) + c * 3;
  coef[0] = mean;
  coef[1] = invstd * (l.weight.data ? convert<A>(at<P>(l.weight, c)) : A(1));
  coef[2] = l.bias.data ? convert<A>(at<P>(l.bias, c)) : A(0);
}

/// Thread per channel: the mean and invstd the backward uses (coef[3], coef[2]).
template <class T, class P>
__global__ void __launch_bounds__(kThreads) prepare_backward(BatchNormLaunch l) {
  using A = acc_t<T>;
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= l.channels) return;
  A* coef = static_cast<A*>(l.workspace) + c * 4;
  if (l.training) {
    coef[3] = at<A>(l.save_mean, c);
    coef[2] = at<A>(l.save_invstd, c);
  } else {
    coef[3] = convert<A>(at<P>(l.running_mean, c));
    coef[2] = invstd_of(convert<A>(at<P>(l.running_var, c)), l.eps);
  }
}

/// One warp per channel: grad_weight, grad_bias and the grad_input coefficients.
template <class T, class P>
__global__ void __launch_bounds__(kThreads) finalize_backward(BatchNormLaunch l) {
  using A = acc_t<T>;
  const int64_t c = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (c >= l.channels) return;
  Sums<A> sums{};
  if (l.count > 0) sums = merge_splits<Sums<A>, A>(l, c, 4);
  if (threadIdx.x % 32 != 0) return;
  if (l.count == 0) {
    at<P>(l.grad_weight, c) = convert<P>(A(0));
    at<P>(l.grad_bias, c) = convert<P>(A(0));
    return;
  }
  A* coef = static_cast<A*>(l.workspace) + c * 4;
  const A mean = coef[3], invstd = coef[2];
  at<P>(l.grad_weight, c) = convert<P>(sums.gxm * invstd);
  at<P>(l.grad_bias, c) = convert<P>(sums.g);
  const A w = l.weight.data ? convert<A>(at<P>(l.weight, c)) : A(1);
  const auto k = grad_coefficients<A>(l.training, w, mean, invstd, sums.g, sums.gxm, l.count);
  coef[0] = k.k_g, coef[1] = k.mean_g, coef[2] = k.k_x, coef[3] = k.mean;
}

/// 16-byte vectors of V elements along the rows (unit row strides, rows and
/// channel starts on vector boundaries) or, `across_channels` (channels-last),
/// across the channels (unit channel strides, V dividing C, row and space
/// strides on vector boundaries), for every operand the pass touches.
template <Pass kPass, int V>
bool vectors_fit(const BatchNormLaunch& l, size_t elem, bool across_channels) {
  if (V == 1 || (across_channels ? l.channels : l.row_len) % V != 0) return false;
  for (int k = 0; k < kFull; ++k) {
    if ((k == kY && kReduces<kPass>) || (k == kG && !kReadsG<kPass>)) continue;
    const int64_t unit = across_channels ? l.channel_stride[k] : l.row_stride[k];
    const int64_t step = across_channels ? l.row_stride[k] : l.channel_stride[k];
    if (unit != 1 || step % V != 0 || reinterpret_cast<uintptr_t>(l.data[k]) % (V * elem) != 0) return false;
    for (int d = 0; d < l.row_offsets.rank; ++d)
      if (l.row_offsets.stride[k][d] % V != 0) return false;
  }
  return true;
}

/// Space positions a warp has in flight in the channels-last walks (U):
/// 64 bytes of loads a thread in every pass with 16-byte vectors (H100: 2,
/// 4 or 8 ran the statistics pass within noise of each other).
template <Pass kPass>
inline constexpr int kPositionsInFlight = kReadsG<kPass> ? 2 : 4;

template <Pass kPass, class T>
void launch_pass(const BatchNormLaunch& l, cudaStream_t stream) {
  constexpr int V = rows::kVecOf<T>;
  if (l.channels_last) {
    const dim3 block(32, kWarps);
    auto launch = [&]<int kV>(std::integral_constant<int, kV>) {
      const dim3 grid(unsigned((l.channels + 32 * kV - 1) / (32 * kV)), l.splits);
      if (l.rows == 1)
        last_kernel<kPass, T, kV, true, kPositionsInFlight<kPass>><<<grid, block, 0, stream>>>(l);
      else
        last_kernel<kPass, T, kV, false, kPositionsInFlight<kPass>><<<grid, block, 0, stream>>>(l);
    };
    if (vectors_fit<kPass, V>(l, sizeof(T), /*across_channels=*/true))
      launch(std::integral_constant<int, V>{});
    else
      launch(std::integral_constant<int, 1>{});
    return;
  }
  const dim3 grid(unsigned(l.channels), l.splits);
  if (vectors_fit<kPass, V>(l, sizeof(T), /*across_channels=*/false))
    first_kernel<kPass, T, V><<<grid, kThreads, 0, stream>>>(l);
  else
    first_kernel<kPass, T, 1><<<grid, kThreads, 0, stream>>>(l);
}

template <class T, class P, bool kBackward>
struct CudaBatchNorm {
  static Status run(const BatchNormLaunch& l, CUstream_st* stream) {
    if (l.channels == 0) return Status::ok();
    const unsigned warp_blocks = unsigned((l.channels + kWarps - 1) / kWarps);
    if constexpr (!kBackward) {
      if (l.training && l.count > 0) launch_pass<Pass::stats, T>(l, stream);
      finalize_forward<T, P><<<warp_blocks, kThreads, 0, stream>>>(l);
      if (l.count > 0) launch_pass<Pass::normalize, T>(l, stream);
    } else {
      if (l.count > 0) {
        prepare_backward<T, P><<<unsigned((l.channels + kThreads - 1) / kThreads), kThreads, 0, stream>>>(l);
        launch_pass<Pass::grad_sums, T>(l, stream);
      }
      finalize_backward<T, P><<<warp_blocks, kThreads, 0, stream>>>(l);
      if (l.count > 0) launch_pass<Pass::grad_input, T>(l, stream);
    }
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_batch_norm<CudaBatchNorm>(cuda_batch_norm(), BatchNormPairs{});

}  // namespace
}  // namespace baracuda::norm::bn
