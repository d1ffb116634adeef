// Batch normalization (torch's native_batch_norm and its backward): the
// launch the plans bind, the per-channel math shared by the host reference
// and the CUDA kernels, and the launch tables.
//
// Note [Batch norm layout]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// input is [N, C, *]: channel dim 1, the statistics run over every other dim
// ("the space", count = N * spatial elements per channel). The plan drops the
// channel dim, coalesces the space over the full operands (x, y = out or
// grad_input, g = grad_output) and keeps its innermost dim apart as a row
// (row_len elements, contiguous in NCHW). Per-channel operands are one
// pointer and one stride (null when absent). CUDA takes one of two walks:
//   channels-first (x's channel stride is not 1): a block owns one chunk of
//     one channel's space, rows read with 16-byte vectors when they can be;
//   channels-last (x's channel stride is 1, NHWC): the 32 lanes of a warp
//     read 32 neighbouring channel vectors (16 bytes each when the channel
//     count and strides allow, else one channel a lane) of one space
//     position; the warps of a block take different positions.
// Both reduce in two stages: each block writes its chunk's partial (count,
// mean, M2 forward; sum g, sum g (x - mean) backward) to the workspace, then
// one warp per channel merges the `splits` partials in a fixed order
// (Chan's formula forward), so results are deterministic without atomics.
//
// Note [Batch norm statistics]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Training: mean and the biased variance over the space; invstd =
// 1 / sqrt(var + eps); running_mean_out = (1 - momentum) running_mean +
// momentum mean, running_var_out the same with the unbiased variance
// var * count / (count - 1) (torch). A thread sums x - k and (x - k)^2 with
// k the thread's own first element of the channel (a shift from the
// channel's own data, so no catastrophic cancellation, and an outlier there
// spoils one thread's partial, not every one), turns them into (count,
// mean, M2) and merges by Chan's formula. Eval: mean = running_mean,
// invstd = 1 / sqrt(running_var + eps); save_mean / save_invstd receive
// those (torch returns them empty) and the running outputs receive the
// running stats unchanged. An empty space
// (N = 0) in training: save_mean and save_invstd are NaN, the running stats
// are copied unchanged (torch leaves them alone).
#pragma once

#include <cmath>

#include "core/fp8_traits.hpp"
#include "core/launch_table.hpp"
#include "elementwise/engine.hpp"

struct CUstream_st;

namespace baracuda::norm::bn {

/// Full operands in the space: input, out / grad_input, grad_output.
enum : int { kX = 0, kY = 1, kG = 2, kFull = 3 };

/// A per-channel vector: C elements `stride` apart; data null when absent.
struct ChannelVec {
  char* data = nullptr;
  int64_t stride = 0;
};

struct BatchNormLaunch {
  int64_t channels = 0, count = 0;  ///< C; space elements per channel
  int64_t row_len = 1, rows = 0;    ///< innermost space dim; count / row_len
  ew::OffsetCalc<kFull, int64_t> row_offsets;  ///< row start of each operand (dims above the innermost)
  int64_t row_stride[kFull] = {};
  int64_t channel_stride[kFull] = {};
  char* data[kFull] = {};  ///< g null forward
  ChannelVec weight, bias, running_mean, running_var;  ///< inputs, param dtype
  ChannelVec save_mean, save_invstd;  ///< forward outputs, backward inputs (f32; f64 for f64)
  ChannelVec running_mean_out, running_var_out;  ///< forward outputs, param dtype (may alias the inputs)
  ChannelVec grad_weight, grad_bias;  ///< backward outputs, param dtype
  bool training = true;
  double momentum = 0.1, eps = 1e-5;
  int splits = 1;  ///< chunks of each channel's space (CUDA)
  bool channels_last = false;  ///< x's channel stride is 1 (CUDA walk, Note [Batch norm layout])
  void* workspace = nullptr;
};

/// (launch, stream); registered under "op:input dtype:param dtype".
using BatchNormFn = Status (*)(const BatchNormLaunch&, CUstream_st*);
using BatchNormTable = LaunchTable<BatchNormFn>;
BatchNormTable& host_batch_norm();
BatchNormTable& cuda_batch_norm();

/// Input and parameter dtype pairs: each float with itself, and the halves
/// with f32 parameters (torch's mixed-precision batch norm).
template <class T, class P>
struct TypePair {};
using BatchNormPairs = TypeList<TypePair<float, float>, TypePair<double, double>, TypePair<__half, __half>,
                                TypePair<__half, float>, TypePair<__nv_bfloat16, __nv_bfloat16>,
                                TypePair<__nv_bfloat16, float>, TypePair<__nv_fp8_e4m3, float>,
                                TypePair<__nv_fp8_e5m2, float>>;

/// `Launch<T, P, kBackward>::run` for every pair of `Pairs`.
template <template <class, class, bool> class Launch, class... Pairs>
bool register_batch_norm(BatchNormTable& table, TypeList<Pairs...>) {
  auto one = [&]<class T, class P>(TypePair<T, P>) {
    table.add(launch_key("batch_norm", dtype_of<T>, dtype_of<P>), &Launch<T, P, false>::run);
    if constexpr (has_gradient_v<T>)  // fp8 inputs: the forward only
      table.add(launch_key("batch_norm_backward", dtype_of<T>, dtype_of<P>), &Launch<T, P, true>::run);
  };
  (one(Pairs{}), ...);
  return true;
}

// ---------------------------------------------------------------- shared math

/// Count, mean and sum of squared deviations of a set of values (trivial,
/// for shared memory: value-initialise with {}).
template <class A>
struct Moments {
  A n, mean, m2;
};

/// The moments of the union of two sets (Chan et al.).
template <class A>
BCD_HD Moments<A> merge(const Moments<A>& a, const Moments<A>& b) {
  const A n = a.n + b.n;
  if (b.n == A(0)) return a;
  if (a.n == A(0)) return b;
  const A delta = b.mean - a.mean, wb = b.n / n;
  return {n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.n * wb};
}

/// The moments of n values from sums of (x - shift) and (x - shift)^2.
template <class A>
BCD_HD Moments<A> from_shifted(A n, A shift, A s1, A s2) {
  if (n == A(0)) return {};
  const A d = s1 / n, m2 = s2 - s1 * d;
  return {n, shift + d, m2 > A(0) ? m2 : A(0)};
}

template <class A>
BCD_HD A invstd_of(A var, double eps) {
  return A(1) / sqrt(var + A(eps));
}

/// (1 - momentum) * running + momentum * batch (torch's update).
template <class A>
BCD_HD A running_update(A running, A batch, double momentum) {
  return (A(1) - A(momentum)) * running + A(momentum) * batch;
}

/// Per-channel coefficients of the elementwise passes, each centred on the
/// mean (x * scale + (bias - mean * scale) would cancel when |mean| >> std):
///   forward: out = (x - mean) * invstd * weight + bias
///   backward: grad_input = k_g * (g - mean_g) - k_x * (x - mean)
template <class A>
struct GradCoefficients {
  A k_g, mean_g, k_x, mean;
};

/// Backward, per channel, from sum g and sum g (x - mean) over `count` values.
template <class A>
BCD_HD GradCoefficients<A> grad_coefficients(bool training, A weight, A mean, A invstd, A sum_g, A sum_gxm,
                                              int64_t count) {
  GradCoefficients<A> c{weight * invstd, A(0), A(0), mean};
  if (training && count > 0) {
    c.mean_g = sum_g / A(count);
    c.k_x = c.k_g * invstd * invstd * sum_gxm / A(count);
  }
  return c;
}

}  // namespace baracuda::norm::bn
