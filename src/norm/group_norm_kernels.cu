// CUDA group_norm / instance_norm (group_norm.hpp has the math). A group that
// fits in shared memory is one block: read once, written once, the three
// steps inside (resident_group_kernel). Longer groups take three launches:
// step 1 a row kernel over parts of the (n, c) channel rows (TPR threads per
// part, fixed-order reductions); step 2 one thread per (n, g) (or per channel
// for the parameter gradients) merging parts and channels in order; step 3 an
// elementwise pass with 16-byte vectors where every row allows (a (row,
// chunk) grid for long rows, flat for short ones). No atomics anywhere.
#include <optional>

#include "core/fp8_traits.hpp"
#include "norm/group_norm.hpp"
#include "norm/kernels.cuh"

namespace baracuda::norm {
namespace {

using SpaceCalc = ew::OffsetCalc<kGroupFull, int64_t>;
constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ const T* channel_row(const GroupLaunch& l, int k, int64_t n, int64_t c) {
  return reinterpret_cast<const T*>(l.data[k]) + n * l.stride_n[k] + c * l.stride_c[k];
}

/// Offset of spatial element s in full operand k.
template <bool kUnit>
__device__ __forceinline__ int64_t space_offset(const SpaceCalc& space, int k, int64_t s) {
  if constexpr (kUnit) {
    return s * space.stride[k][0];
  } else {
    int64_t off[kGroupFull];
    space.get(s, off);
    return off[k];
  }
}

/// weight[c] or bias[c] (T, or f32 when `f32`), `fallback` without the parameter.
template <class T, class M>
__device__ __forceinline__ M param(const char* p, int64_t stride, int64_t c, M fallback, bool f32) {
  if (!p) return fallback;
  return f32 ? M(reinterpret_cast<const float*>(p)[c * stride]) : convert<M>(reinterpret_cast<const T*>(p)[c * stride]);
}

template <class T, class M>
__device__ __forceinline__ void store_param(char* p, int64_t stride, int64_t c, M v, bool f32) {
  if (f32) reinterpret_cast<float*>(p)[c * stride] = float(v);
  else reinterpret_cast<T*>(p)[c * stride] = convert<T>(v);
}

template <class T>
__device__ __forceinline__ stat_t<T> load_stat(const char* p, const int64_t* st, int64_t n, int64_t g) {
  return reinterpret_cast<const stat_t<T>*>(p)[n * st[0] + g * st[1]];
}

/// Step 1 works on parts: part r = (n C + c) * splits + split covers spatial
/// [split * chunk, min(S, (split + 1) * chunk)) of channel row (n, c).
struct Part {
  int64_t n = 0, c = 0, begin = 0, count = 0;
  __device__ Part(const GroupLaunch& l, int64_t r) {
    const int64_t nc = r / l.splits;
    n = nc / l.channels, c = nc % l.channels;
    begin = (r % l.splits) * l.chunk;
    count = std::min(l.spatial - begin, l.chunk);
  }
};

/// Step 1, forward: ws[2 r + {0, 1}] = the part's mean and centred square sum.
template <class T, int TPR, int RPB, bool kUnit>
__global__ void __launch_bounds__(TPR * RPB) channel_moments_kernel(GroupLaunch l, SpaceCalc space) {
  using M = math_t<T, false>;
  __shared__ M scratch[RPB * (TPR / 32)];
  const int64_t r = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  const int lane = threadIdx.x % TPR;
  const bool valid = r < l.batch * l.channels * l.splits;
  const Part part(l, valid ? r : 0);
  const int64_t S = valid ? part.count : 0, stride = space.stride[kGnIn][0];
  const T* x = channel_row<T>(l, kGnIn, part.n, part.c) + (kUnit ? part.begin * stride : 0);
  auto at = [&](int64_t s) { return x[space_offset<false>(space, kGnIn, part.begin + s)]; };
  M sum = 0;
  if constexpr (kUnit) rows::for_row<TPR>(x, stride, S, l.vector, lane, [&](int64_t, T v) { sum += convert<M>(v); });
  else for (int64_t s = lane; s < S; s += TPR) sum += convert<M>(at(s));
  sum = rows::row_all_reduce<TPR, RPB>(sum, rows::SumOp{}, scratch);
  const M mean = S > 0 ? sum / M(S) : M(0);
  M sq = 0;
  auto add_sq = [&](int64_t, T v) {
    const M d = convert<M>(v) - mean;
    sq += d * d;
  };
  if constexpr (kUnit) rows::for_row<TPR>(x, stride, S, l.vector, lane, add_sq);
  else for (int64_t s = lane; s < S; s += TPR) add_sq(s, at(s));
  sq = rows::row_all_reduce<TPR, RPB>(sq, rows::SumOp{}, scratch);
  if (valid && lane == 0) {
    M* ws = reinterpret_cast<M*>(l.workspace);
    ws[2 * r] = mean;
    ws[2 * r + 1] = sq;
  }
}

/// Step 1, backward: ws[2 r + {0, 1}] = the part's sum dy * (x - mean) and sum dy.
template <class T, int TPR, int RPB, bool kUnit>
__global__ void __launch_bounds__(TPR * RPB) channel_grad_sums_kernel(GroupLaunch l, SpaceCalc space) {
  using M = math_t<T, false>;
  constexpr int V = rows::kVecOf<T>;
  __shared__ M scratch[RPB * (TPR / 32)];
  const int64_t r = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  const int lane = threadIdx.x % TPR;
  const bool valid = r < l.batch * l.channels * l.splits;
  const Part part(l, valid ? r : 0);
  const int64_t S = valid ? part.count : 0;
  const T* dy = channel_row<T>(l, kGnGradOut, part.n, part.c);
  const T* x = channel_row<T>(l, kGnSavedIn, part.n, part.c);
  const M mean = M(load_stat<T>(l.mean, l.mean_stride, part.n, part.c / l.group_size()));
  M e = 0, d = 0;
  auto add = [&](T gv, T xv) {
    const M g = convert<M>(gv);
    e += g * (convert<M>(xv) - mean);
    d += g;
  };
  if (kUnit && l.vector) {  // parts begin at multiples of 16 elements
    using P = rows::Vec<T, V>;
    const P* a = reinterpret_cast<const P*>(dy + part.begin);
    const P* b = reinterpret_cast<const P*>(x + part.begin);
    for (int64_t i = lane; i < S / V; i += TPR) {
      const P av = a[i], bv = b[i];
#pragma unroll
      for (int k = 0; k < V; ++k) add(av.v[k], bv.v[k]);
    }
  } else {
    for (int64_t s = part.begin + lane; s < part.begin + S; s += TPR)
      add(dy[space_offset<kUnit>(space, kGnGradOut, s)], x[space_offset<kUnit>(space, kGnSavedIn, s)]);
  }
  e = rows::row_all_reduce<TPR, RPB>(e, rows::SumOp{}, scratch);
  d = rows::row_all_reduce<TPR, RPB>(d, rows::SumOp{}, scratch);
  if (valid && lane == 0) {
    M* ws = reinterpret_cast<M*>(l.workspace);
    ws[2 * r] = e;
    ws[2 * r + 1] = d;
  }
}

/// Step 1 sums of channel (n, c), its parts added in order.
template <class M>
__device__ __forceinline__ void channel_sums(const GroupLaunch& l, int64_t n, int64_t c, M& e, M& d) {
  const M* ws = reinterpret_cast<const M*>(l.workspace) + 2 * (n * l.channels + c) * l.splits;
  e = 0, d = 0;
  for (int p = 0; p < l.splits; ++p) e += ws[2 * p], d += ws[2 * p + 1];
}

/// Step 2, forward: per (n, g), the parts' moments merged in channel and part
/// order; the statistics to the outputs and to ws[2 N C splits + 2 (n G + g) + {0, 1}].
template <class T>
__global__ void __launch_bounds__(kThreads) group_stats_kernel(GroupLaunch l) {
  using M = math_t<T, false>;
  const int64_t row = int64_t(blockIdx.x) * kThreads + threadIdx.x, Cg = l.group_size();
  if (row >= l.batch * l.groups) return;
  const int64_t n = row / l.groups, g = row % l.groups, parts = Cg * l.splits;
  M* ws = reinterpret_cast<M*>(l.workspace);
  const M* first = ws + 2 * (n * l.channels + g * Cg) * l.splits;
  M count = 0, mean = 0, m2 = 0;
  for (int64_t k = 0; k < parts; ++k) {
    const int64_t begin = (k % l.splits) * l.chunk;
    merge_moments(count, mean, m2, M(std::min(l.spatial - begin, l.chunk)), first[2 * k], first[2 * k + 1]);
  }
  const M rstd = LayerNorm::rstd(m2, l.row_size(), M(l.eps));
  M* stats = ws + 2 * l.batch * l.channels * l.splits;
  stats[2 * row] = mean;
  stats[2 * row + 1] = rstd;
  reinterpret_cast<stat_t<T>*>(l.mean)[n * l.mean_stride[0] + g * l.mean_stride[1]] = stat_t<T>(mean);
  reinterpret_cast<stat_t<T>*>(l.rstd)[n * l.rstd_stride[0] + g * l.rstd_stride[1]] = stat_t<T>(rstd);
}

/// Step 2, backward: per (n, g), mean(wg) and mean(wg * xhat) to ws[2 N C splits + 2 (n G + g) + {0, 1}].
template <class T>
__global__ void __launch_bounds__(kThreads) group_coefficients_kernel(GroupLaunch l) {
  using M = math_t<T, false>;
  const int64_t row = int64_t(blockIdx.x) * kThreads + threadIdx.x, Cg = l.group_size();
  if (row >= l.batch * l.groups) return;
  const int64_t n = row / l.groups, g = row % l.groups;
  M sum_wg = 0, sum_we = 0;
  for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
    const M w = param<T>(l.weight, l.weight_stride, c, M(1), l.param_f32);
    M e, d;
    channel_sums(l, n, c, e, d);
    sum_we += w * e;
    sum_wg += w * d;
  }
  const M D = M(l.row_size()), rstd = M(load_stat<T>(l.rstd, l.rstd_stride, n, g));
  M* coef = reinterpret_cast<M*>(l.workspace) + 2 * l.batch * l.channels * l.splits;
  coef[2 * row] = sum_wg / D;
  coef[2 * row + 1] = rstd * sum_we / D;
}

/// grad_weight / grad_bias: one thread per channel, summing over n in order.
template <class T>
__global__ void __launch_bounds__(kThreads) grad_params_kernel(GroupLaunch l) {
  using M = math_t<T, false>;
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x, g = c / l.group_size();
  if (c >= l.channels) return;
  M gw = 0, gb = 0;
  for (int64_t n = 0; n < l.batch; ++n) {
    M e, d;
    channel_sums(l, n, c, e, d);
    gw += e * M(load_stat<T>(l.rstd, l.rstd_stride, n, g));
    gb += d;
  }
  store_param<T>(l.grad_weight, l.grad_weight_stride, c, gw, l.param_f32);
  if (l.grad_bias) store_param<T>(l.grad_bias, l.grad_bias_stride, c, gb, l.param_f32);
}

/// Step 3 for one (n, c) row: what every element of the row shares.
template <class T, bool kBackward>
struct RowCoefficients {
  using M = math_t<T, false>;
  M scale, shift, mean, rstd, mean_wg, mean_wg_xhat;
  __device__ RowCoefficients(const GroupLaunch& l, int64_t n, int64_t c) {
    const int64_t g = c / l.group_size();
    const M* stats = reinterpret_cast<const M*>(l.workspace) + 2 * l.batch * l.channels * l.splits + 2 * (n * l.groups + g);
    const M w = param<T>(l.weight, l.weight_stride, c, M(1), l.param_f32);
    if constexpr (!kBackward) {
      mean = stats[0], scale = stats[1] * w, shift = param<T>(l.bias, l.bias_stride, c, M(0), l.param_f32);
    } else {
      mean = M(load_stat<T>(l.mean, l.mean_stride, n, g)), rstd = M(load_stat<T>(l.rstd, l.rstd_stride, n, g));
      scale = w, mean_wg = stats[0], mean_wg_xhat = stats[1];
    }
  }
  /// forward: out from x (a); backward: dx from dy (a) and x (b).
  __device__ __forceinline__ T operator()(T a, T b) const {
    if constexpr (!kBackward) return convert<T>((convert<M>(a) - mean) * scale + shift);
    else return convert<T>(LayerNorm::grad_input(scale * convert<M>(a), (convert<M>(b) - mean) * rstd, mean_wg, mean_wg_xhat, rstd));
  }
};

/// V elements of row (n, c) from spatial index s (V > 1: one 16-byte vector per operand).
template <class T, bool kBackward, bool kUnit, int V>
__device__ __forceinline__ void transform(const GroupLaunch& l, const SpaceCalc& space,
                                          const RowCoefficients<T, kBackward>& f, int64_t n, int64_t c, int64_t s) {
  using P = rows::Vec<T, V>;
  constexpr int kA = kBackward ? kGnGradOut : kGnIn, kB = kBackward ? kGnSavedIn : kGnIn;
  auto at = [&](int k) { return channel_row<T>(l, k, n, c) + (V > 1 ? s : space_offset<kUnit>(space, k, s)); };
  P a, b, out;
  if constexpr (V > 1) a = *reinterpret_cast<const P*>(at(kA)), b = kBackward ? *reinterpret_cast<const P*>(at(kB)) : a;
  else a.v[0] = *at(kA), b.v[0] = kBackward ? *at(kB) : a.v[0];
#pragma unroll
  for (int k = 0; k < V; ++k) out.v[k] = f(a.v[k], b.v[k]);
  T* dst = const_cast<T*>(at(0));
  if constexpr (V > 1) *reinterpret_cast<P*>(dst) = out;
  else *dst = out.v[0];
}

/// Step 3 over long rows: block (row, chunk) owns kChunk elements of one (n, c) row.
constexpr int kChunk = kThreads * 16;

template <class T, bool kBackward, bool kUnit, int V>
__global__ void __launch_bounds__(kThreads) row_elementwise_kernel(GroupLaunch l, SpaceCalc space) {
  const int64_t nc = blockIdx.x, n = nc / l.channels, c = nc % l.channels;
  const RowCoefficients<T, kBackward> f(l, n, c);
  const int64_t end = std::min<int64_t>(l.spatial, int64_t(blockIdx.y + 1) * kChunk);
  for (int64_t s = int64_t(blockIdx.y) * kChunk + threadIdx.x * V; s < end; s += kThreads * V)
    transform<T, kBackward, kUnit, V>(l, space, f, n, c, s);
}

/// Step 3 over short rows: every V-element pack of the whole tensor.
template <class T, bool kBackward, bool kUnit, int V>
__global__ void __launch_bounds__(kThreads) flat_elementwise_kernel(GroupLaunch l, SpaceCalc space) {
  const int64_t S = l.spatial, packs = l.batch * l.channels * S / V;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < packs; i += int64_t(gridDim.x) * kThreads) {
    const int64_t e = i * V, nc = e / S, n = nc / l.channels, c = nc % l.channels;
    transform<T, kBackward, kUnit, V>(l, space, RowCoefficients<T, kBackward>(l, n, c), n, c, e % S);
  }
}

unsigned blocks_for(int64_t work, int64_t per_block) { return unsigned(std::min<int64_t>((work + per_block - 1) / per_block, 1 << 30)); }

template <class T, bool kBackward, bool kUnit, int V>
void launch_elementwise_as(const GroupLaunch& l, const SpaceCalc& space, CUstream_st* stream) {
  const int64_t rows = l.batch * l.channels, chunks = (l.spatial + kChunk - 1) / kChunk;
  if (l.spatial >= int64_t(kThreads) * V && rows < (int64_t(1) << 31) && chunks < 65536)
    row_elementwise_kernel<T, kBackward, kUnit, V><<<dim3(unsigned(rows), unsigned(chunks)), kThreads, 0, stream>>>(l, space);
  else
    flat_elementwise_kernel<T, kBackward, kUnit, V><<<blocks_for(rows * l.spatial / V, kThreads), kThreads, 0, stream>>>(l, space);
}

template <class T, bool kBackward>
Status launch_elementwise(const GroupLaunch& l, const SpaceCalc& space, CUstream_st* stream) {
  if (l.batch * l.channels * l.spatial == 0) return Status::ok();
  if (l.vector) launch_elementwise_as<T, kBackward, true, rows::kVecOf<T>>(l, space, stream);
  else if (l.unit_space) launch_elementwise_as<T, kBackward, true, 1>(l, space, stream);
  else launch_elementwise_as<T, kBackward, false, 1>(l, space, stream);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

/// Step 1 over the N C splits parts, shaped by the part length.
template <class T, bool kBackward>
Status launch_channel_rows(const GroupLaunch& l, const SpaceCalc& space, CUstream_st* stream) {
  const int64_t rows = l.batch * l.channels * l.splits;
  if (rows == 0) return Status::ok();
  return by_row_length(l.chunk, [&]<int TPR, int RPB>() {
    const unsigned blocks = unsigned((rows + RPB - 1) / RPB);
    if constexpr (kBackward) {
      if (l.unit_space) channel_grad_sums_kernel<T, TPR, RPB, true><<<blocks, TPR * RPB, 0, stream>>>(l, space);
      else channel_grad_sums_kernel<T, TPR, RPB, false><<<blocks, TPR * RPB, 0, stream>>>(l, space);
    } else {
      if (l.unit_space) channel_moments_kernel<T, TPR, RPB, true><<<blocks, TPR * RPB, 0, stream>>>(l, space);
      else channel_moments_kernel<T, TPR, RPB, false><<<blocks, TPR * RPB, 0, stream>>>(l, space);
    }
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  });
}

// ---------------------------------------------------------------- whole groups in shared memory

/// Shared memory of the resident kernel: per-channel pairs, then the group's
/// rows (backward: grad_output's, then input's).
template <class T, bool kBackward>
size_t resident_bytes(const GroupLaunch& l) {
  using M = math_t<T, false>;
  const size_t pairs = (size_t(2 * l.group_size()) * sizeof(M) + 15) / 16 * 16;
  return pairs + size_t(kBackward ? 2 : 1) * size_t(l.row_size()) * sizeof(T);
}

/// Block (n, g) keeps its group in shared memory (one HBM read, one write);
/// one warp per channel for the channel sums (lanes and warps in a fixed
/// order), every thread merging the channels in order: the numbers of the
/// three-step path, in one launch.
template <class T, bool kBackward, bool kUnit, int V>
__global__ void __launch_bounds__(kThreads) resident_group_kernel(GroupLaunch l, SpaceCalc space) {
  using M = math_t<T, false>;
  using P = rows::Vec<T, V>;
  constexpr int kA = kBackward ? kGnGradOut : kGnIn, kWarps = kThreads / 32;
  extern __shared__ __align__(16) char smem[];
  const int64_t n = blockIdx.x / l.groups, g = blockIdx.x % l.groups, c0 = g * l.group_size();
  const int Cg = int(l.group_size()), S = int(l.spatial), D = Cg * S;
  M* pair = reinterpret_cast<M*>(smem);  // [Cg][2]
  T* cache = reinterpret_cast<T*>(smem + (size_t(2 * Cg) * sizeof(M) + 15) / 16 * 16);
  auto row = [&](int k, int jc) { return channel_row<T>(l, k, n, c0 + jc); };
#pragma unroll 4
  for (int p = threadIdx.x; p < D / V; p += kThreads) {
    const int j = p * V, jc = j / S, s = j % S;
    if constexpr (V > 1) {
      reinterpret_cast<P*>(cache)[p] = *reinterpret_cast<const P*>(row(kA, jc) + s);
      if constexpr (kBackward) reinterpret_cast<P*>(cache + D)[p] = *reinterpret_cast<const P*>(row(kGnSavedIn, jc) + s);
    } else {
      cache[j] = row(kA, jc)[space_offset<kUnit>(space, kA, s)];
      if constexpr (kBackward) cache[D + j] = row(kGnSavedIn, jc)[space_offset<kUnit>(space, kGnSavedIn, s)];
    }
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const M saved_mean = kBackward ? M(load_stat<T>(l.mean, l.mean_stride, n, g)) : M(0);
  const M saved_rstd = kBackward ? M(load_stat<T>(l.rstd, l.rstd_stride, n, g)) : M(0);
  M* ws = reinterpret_cast<M*>(l.workspace);
  auto warp_sum = [](M v) { return rows::row_all_reduce<32, 1>(v, rows::SumOp{}, static_cast<M*>(nullptr)); };
  auto keep = [&](int jc, M first, M second) {  // one channel's sums: (mean, m2) or (e, d)
    pair[2 * jc] = first, pair[2 * jc + 1] = second;
    if constexpr (kBackward) {
      const int64_t k = n * l.channels + c0 + jc;  // for the parameter gradients (one part per channel)
      ws[2 * k] = first, ws[2 * k + 1] = second;
    }
  };
  // Sums of one channel by the warps of a team (lanes, then members, in a fixed order).
  auto channel_sums = [&](int jc, bool active, int member, int team, M& p0, M& p1) {
    const T* a = cache + (active ? jc : 0) * S;
    p0 = 0, p1 = 0;
    if (active)
      for (int s = member * 32 + lane; s < S; s += 32 * team) {
        if constexpr (!kBackward) {
          p0 += convert<M>(a[s]);
        } else {
          const M gv = convert<M>(a[s]);
          p0 += gv * (convert<M>(a[D + s]) - saved_mean);  // input's row sits D after grad_output's
          p1 += gv;
        }
      }
    p0 = warp_sum(p0), p1 = warp_sum(p1);
  };
  auto centred_squares = [&](int jc, bool active, int member, int team, M mean) {
    const T* a = cache + (active ? jc : 0) * S;
    M sq = 0;
    if (active)
      for (int s = member * 32 + lane; s < S; s += 32 * team) {
        const M d = convert<M>(a[s]) - mean;
        sq += d * d;
      }
    return warp_sum(sq);
  };
  if (Cg >= kWarps) {  // a warp per channel, no block synchronisation
    for (int jc = warp; jc < Cg; jc += kWarps) {
      M p0, p1;
      channel_sums(jc, true, 0, 1, p0, p1);
      if constexpr (!kBackward) p1 = centred_squares(jc, true, 0, 1, p0 / M(S)), p0 /= M(S);
      if (lane == 0) keep(jc, p0, p1);
    }
  } else {  // fewer channels than warps: a team of kWarps / Cg warps per channel
    __shared__ M partial[2][kWarps];
    const int team = kWarps / Cg, jc = warp / team, member = warp % team, lead = jc * team;
    const bool active = jc < Cg;
    M p0, p1;
    channel_sums(jc, active, member, team, p0, p1);
    if (lane == 0) partial[0][warp] = p0, partial[1][warp] = p1;
    __syncthreads();
    M first = 0, second = 0;
    if (active)
      for (int m = 0; m < team; ++m) first += partial[0][lead + m], second += partial[1][lead + m];
    if constexpr (!kBackward) {
      first /= M(S);  // the channel mean
      const M sq = centred_squares(jc, active, member, team, first);
      __syncthreads();  // every warp has read partial[]
      if (lane == 0) partial[1][warp] = sq;
      __syncthreads();
      second = 0;
      if (active)
        for (int m = 0; m < team; ++m) second += partial[1][lead + m];
    }
    if (active && member == 0 && lane == 0) keep(jc, first, second);
  }
  // pair[] was written by lane 0 of one warp per channel (member 0 of a team);
  // every thread reads all of it below, so the whole block waits here (without
  // this barrier a warp scheduled early merges channels not yet written).
  __syncthreads();
  // The group's coefficients, merged in channel order by every thread.
  M mean = saved_mean, rstd = saved_rstd, mean_wg = 0, mean_wg_xhat = 0;
  if constexpr (!kBackward) {
    M count = 0, m2 = 0;
    for (int jc = 0; jc < Cg; ++jc) merge_moments(count, mean, m2, M(S), pair[2 * jc], pair[2 * jc + 1]);
    rstd = LayerNorm::rstd(m2, D, M(l.eps));
    if (threadIdx.x == 0) {
      reinterpret_cast<stat_t<T>*>(l.mean)[n * l.mean_stride[0] + g * l.mean_stride[1]] = stat_t<T>(mean);
      reinterpret_cast<stat_t<T>*>(l.rstd)[n * l.rstd_stride[0] + g * l.rstd_stride[1]] = stat_t<T>(rstd);
    }
  } else {
    M sum_wg = 0, sum_we = 0;
    for (int jc = 0; jc < Cg; ++jc) {
      const M w = param<T>(l.weight, l.weight_stride, c0 + jc, M(1), l.param_f32);
      sum_we += w * pair[2 * jc];
      sum_wg += w * pair[2 * jc + 1];
    }
    mean_wg = sum_wg / M(D), mean_wg_xhat = rstd * sum_we / M(D);
  }
  __syncthreads();  // every thread has read the sums in pair[]: it now takes (scale, shift) per channel
  for (int jc = threadIdx.x; jc < Cg; jc += kThreads) {
    const M w = param<T>(l.weight, l.weight_stride, c0 + jc, M(1), l.param_f32);
    pair[2 * jc] = kBackward ? w : w * rstd;
    pair[2 * jc + 1] = kBackward ? M(0) : param<T>(l.bias, l.bias_stride, c0 + jc, M(0), l.param_f32);
  }
  __syncthreads();
#pragma unroll 4
  for (int p = threadIdx.x; p < D / V; p += kThreads) {
    const int j = p * V, jc = j / S, s = j % S;
    const M scale = pair[2 * jc], shift = pair[2 * jc + 1];
    const P a = reinterpret_cast<const P*>(cache)[p];
    P b = a, out;
    if constexpr (kBackward) b = reinterpret_cast<const P*>(cache + D)[p];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if constexpr (!kBackward) out.v[k] = convert<T>((convert<M>(a.v[k]) - mean) * scale + shift);
      else out.v[k] = convert<T>(LayerNorm::grad_input(scale * convert<M>(a.v[k]), (convert<M>(b.v[k]) - mean) * rstd,
                                                       mean_wg, mean_wg_xhat, rstd));
    }
    T* dst = const_cast<T*>(row(0, jc));
    if constexpr (V > 1) *reinterpret_cast<P*>(dst + s) = out;
    else dst[space_offset<kUnit>(space, 0, s)] = out.v[0];
  }
}

/// The resident kernel when the group fits in shared memory and the groups
/// are many or short; nullopt otherwise.
template <class T, bool kBackward>
std::optional<Status> launch_resident(const GroupLaunch& l, const SpaceCalc& space, CUstream_st* stream) {
  const size_t bytes = resident_bytes<T, kBackward>(l);
  const int64_t blocks = l.batch * l.groups;
  if (l.row_size() == 0 || bytes > rows::kRowCacheBytes || blocks >= (int64_t(1) << 31)) return std::nullopt;
  if (2 * blocks < l.sm_count && l.row_size() > 8192) return std::nullopt;  // few long groups: the split path
  auto go = [&](auto kernel) -> Status {
    if (bytes > 48 * 1024)
      BARACUDA_CUDA_TRY(rows::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), int(rows::kRowCacheBytes)));
    kernel<<<unsigned(blocks), kThreads, bytes, stream>>>(l, space);
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  };
  if (l.vector) return go(resident_group_kernel<T, kBackward, true, rows::kVecOf<T>>);
  if (l.unit_space) return go(resident_group_kernel<T, kBackward, true, 1>);
  return go(resident_group_kernel<T, kBackward, false, 1>);
}

template <class T>
struct CudaGroupNorm {
  static Status forward(const GroupLaunch& l, CUstream_st* stream) {
    const SpaceCalc space(l.space);
    if (auto st = launch_resident<T, false>(l, space, stream)) return *st;
    BARACUDA_TRY((launch_channel_rows<T, false>(l, space, stream)));
    if (l.batch * l.groups > 0) {
      group_stats_kernel<T><<<blocks_for(l.batch * l.groups, kThreads), kThreads, 0, stream>>>(l);
      BARACUDA_CUDA_TRY(cudaGetLastError());
    }
    return launch_elementwise<T, false>(l, space, stream);
  }

  static Status backward(const GroupLaunch& l, CUstream_st* stream) {
    const SpaceCalc space(l.space);
    const std::optional<Status> resident = launch_resident<T, true>(l, space, stream);
    if (resident) {
      BARACUDA_TRY(*resident);
    } else {
      BARACUDA_TRY((launch_channel_rows<T, true>(l, space, stream)));
      if (l.batch * l.groups > 0) {
        group_coefficients_kernel<T><<<blocks_for(l.batch * l.groups, kThreads), kThreads, 0, stream>>>(l);
        BARACUDA_CUDA_TRY(cudaGetLastError());
      }
    }
    if (l.grad_weight && l.channels > 0) {
      GroupLaunch sums = l;  // the resident kernel leaves one part per channel
      if (resident) sums.splits = 1, sums.chunk = l.spatial;
      grad_params_kernel<T><<<blocks_for(l.channels, kThreads), kThreads, 0, stream>>>(sums);
      BARACUDA_CUDA_TRY(cudaGetLastError());
    }
    return resident ? Status::ok() : launch_elementwise<T, true>(l, space, stream);
  }

  static Status running(const RunningLaunch& r, CUstream_st* stream);
};

template <class T>
__global__ void __launch_bounds__(kThreads) running_stats_kernel(RunningLaunch r) {
  using M = math_t<T, false>;
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= r.channels) return;
  M mean = 0, var = 0;
  for (int64_t n = 0; n < r.batch; ++n) {
    mean += M(load_stat<T>(r.mean, r.mean_stride, n, c));
    var += unbiased_var(M(load_stat<T>(r.rstd, r.rstd_stride, n, c)), M(r.eps), M(r.spatial));
  }
  const M rm = convert<M>(reinterpret_cast<const T*>(r.running_mean)[c * r.running_mean_stride]);
  const M rv = convert<M>(reinterpret_cast<const T*>(r.running_var)[c * r.running_var_stride]);
  const M m = M(r.momentum);
  reinterpret_cast<T*>(r.mean_out)[c * r.mean_out_stride] = convert<T>((1 - m) * rm + m * (mean / M(r.batch)));
  reinterpret_cast<T*>(r.var_out)[c * r.var_out_stride] = convert<T>((1 - m) * rv + m * (var / M(r.batch)));
}

template <class T>
Status CudaGroupNorm<T>::running(const RunningLaunch& r, CUstream_st* stream) {
  running_stats_kernel<T><<<blocks_for(r.channels, kThreads), kThreads, 0, stream>>>(r);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

[[maybe_unused]] const bool registered = [] {
  for_each_type<Concat<FloatTypes, Fp8Types>::type>([]<class T>(TypeTag<T>) {
    auto& t = cuda_group_norms();
    t.forward.add(launch_key("group_norm", dtype_of<T>), &CudaGroupNorm<T>::forward);
    if constexpr (has_gradient_v<T>) {  // fp8: forwards only
      t.backward.add(launch_key("group_norm", dtype_of<T>), &CudaGroupNorm<T>::backward);
      t.running.add(launch_key("instance_norm_running_stats", dtype_of<T>), &CudaGroupNorm<T>::running);
    }
  });
  return true;
}();

}  // namespace
}  // namespace baracuda::norm
