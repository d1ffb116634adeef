// Group normalization (and instance normalization, its groups == channels
// case): the problem the host reference and the CUDA kernels see, and the
// math they share.
//
// Input [N, C, spatial...], G groups of C / G channels. Row (n, g) holds
// D = (C / G) * S elements (S = the spatial size):
//   mean = sum x / D, rstd = 1 / sqrt(sum (x - mean)^2 / D + eps)
//   out[n, c, s] = (x - mean) * rstd * weight[c] + bias[c]
// Both backends reduce in three steps, each in a fixed order (CUDA: in one
// block per group when the group fits in shared memory, else in three
// launches, step 1 over parts of the channel rows):
//   1. per (n, c): forward, the channel's mean and centred square sum over S;
//      backward, e = sum dy * (x - mean[n, g]) and d = sum dy over S;
//   2. per (n, g): forward, the channels' moments merged in channel order
//      (Chan et al.); backward, mean(wg) = sum_c w[c] * d / D and
//      mean(wg * xhat) = rstd * sum_c w[c] * e / D;
//   3. per element: the normalised output, or the layer-norm grad_input
//      formula (LayerNorm::grad_input) with those two row means.
// grad_weight[c] = sum_n e[n, c] * rstd[n, g], grad_bias[c] = sum_n d[n, c],
// summed over n in order (no atomics; the workspace holds the step-1 sums).
#pragma once

#include <algorithm>
#include <utility>

#include "core/launch_table.hpp"
#include "elementwise/engine.hpp"
#include "norm/ops.hpp"

struct CUstream_st;

namespace baracuda::norm {

/// Full-shape operands: forward {out, input}, backward {grad_input, grad_output, input}.
inline constexpr int kGroupFull = 3;

struct GroupLaunch {
  int64_t batch = 0, channels = 0, groups = 1, spatial = 1;
  /// CUDA step 1 splits each channel row into `splits` parts of `chunk` elements
  /// (a multiple of 16; the last part may be shorter, none is empty).
  int splits = 1;
  int64_t chunk = 1;
  int sm_count = 0;  ///< of the plan's device: few long groups skip the one-block-per-group kernel
  char* data[kGroupFull] = {};
  int64_t stride_n[kGroupFull] = {}, stride_c[kGroupFull] = {};
  ew::Problem space;        ///< the spatial dims of the full operands, coalesced (rank >= 1)
  bool unit_space = false;  ///< space is one run of stride 1 (or 0 for one element) in every full operand
  bool vector = false;      ///< also 16-byte aligned rows whose length divides into vectors
  /// Statistics [N, G] (f32; f64 for f64): outputs forward, inputs backward.
  char* mean = nullptr;
  char* rstd = nullptr;
  int64_t mean_stride[2] = {}, rstd_stride[2] = {};
  /// [C] parameters (null: weight 1, bias 0) and their gradients (null: not
  /// wanted), in the input's dtype or, with param_f32, f32 (half inputs).
  bool param_f32 = false;
  char* weight = nullptr;
  char* bias = nullptr;
  char* grad_weight = nullptr;
  char* grad_bias = nullptr;
  int64_t weight_stride = 0, bias_stride = 0, grad_weight_stride = 0, grad_bias_stride = 0;
  double eps = 1e-5;
  void* workspace = nullptr;  ///< (2 N C splits + 2 N G) math values (CUDA)

  BCD_HD int64_t group_size() const { return channels / groups; }
  BCD_HD int64_t row_size() const { return group_size() * spatial; }  ///< D
};

/// Operand indices in GroupLaunch::data.
inline constexpr int kGnOut = 0, kGnIn = 1;                       // forward
inline constexpr int kGnGradIn = 0, kGnGradOut = 1, kGnSavedIn = 2;  // backward

using GroupNormFn = Status (*)(const GroupLaunch&, CUstream_st*);

/// instance_norm_running_stats: running_{mean,var}_out[c] from the running
/// stats and the saved per-instance mean/rstd [N, C].
struct RunningLaunch {
  int64_t batch = 0, channels = 0;
  const char* mean = nullptr;  ///< [N, C] statistics dtype
  const char* rstd = nullptr;
  int64_t mean_stride[2] = {}, rstd_stride[2] = {};
  const char* running_mean = nullptr;  ///< [C] input dtype
  const char* running_var = nullptr;
  char* mean_out = nullptr;
  char* var_out = nullptr;
  int64_t running_mean_stride = 0, running_var_stride = 0, mean_out_stride = 0, var_out_stride = 0;
  double momentum = 0.1, eps = 1e-5, spatial = 2;
};
using RunningFn = Status (*)(const RunningLaunch&, CUstream_st*);

/// Launchers by "group_norm:dtype", "group_norm_backward:dtype" (GroupNormFn)
/// and "instance_norm_running_stats:dtype" (RunningFn).
struct GroupNormTables {
  LaunchTable<GroupNormFn> forward, backward;
  LaunchTable<RunningFn> running;
};
GroupNormTables& host_group_norms();
GroupNormTables& cuda_group_norms();

/// CUDA step 1's parts of a channel row of `spatial` elements: enough parts
/// over the N C rows to give every SM a few blocks, each at least 4096 long.
/// {splits, chunk}; a function of the shapes only (the workspace is sized by it).
inline std::pair<int, int64_t> group_norm_splits(int64_t rows, int64_t spatial, int sm_count) {
  const int64_t want = rows > 0 ? (int64_t(4) * sm_count + rows - 1) / rows : 1;
  const int64_t most = std::max<int64_t>(1, spatial / 4096);
  const int64_t splits = std::clamp<int64_t>(std::min(want, most), 1, 1024);
  const int64_t per_split = (spatial + splits - 1) / splits;
  const int64_t chunk = std::max<int64_t>(1, (per_split + 15) / 16) * 16;
  return {int(std::max<int64_t>(1, (spatial + chunk - 1) / chunk)), chunk};
}

/// Workspace bytes of the CUDA plans (math type f32, f64 for f64).
inline size_t group_norm_workspace(int64_t batch, int64_t channels, int64_t groups, int splits, bool f64) {
  return size_t(2 * batch * channels * splits + 2 * batch * groups) * (f64 ? 8 : 4);
}

/// Merges channel moments (mean, centred square sum over `n` elements each)
/// into a running (count, mean, m2), in the order called (Chan et al.).
template <class M>
BCD_HD void merge_moments(M& count, M& mean, M& m2, M n, M mean_b, M m2_b) {
  if (n == M(0)) return;
  const M total = count + n;
  const M delta = mean_b - mean;
  mean += delta * (n / total);
  m2 += m2_b + delta * delta * (count * n / total);
  count = total;
}

/// torch.instance_norm's running-stat update for one channel from the
/// per-instance (mean, rstd) of the N instances: running = (1 - momentum) *
/// running + momentum * mean over n of the instance mean / unbiased variance
/// (var = 1 / rstd^2 - eps, times S / (S - 1)).
template <class M>
BCD_HD M unbiased_var(M rstd, M eps, M spatial) {
  return (M(1) / (rstd * rstd) - eps) * (spatial / (spatial - M(1)));
}

}  // namespace baracuda::norm
