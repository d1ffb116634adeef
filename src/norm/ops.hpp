// Normalization math shared by the CUDA kernels and the host reference.
// A row of N elements h (the input, or input + residual in the math type;
// residual_out receives h rounded to the storage type) is normalised:
//   layer: mean = sum h / N, rstd = 1 / sqrt(sum (h - mean)^2 / N + eps)
//   rms:   mean = 0,         rstd = 1 / sqrt(sum h^2 / N + eps)
//   out = (h - mean) * rstd * weight + bias
// Backward with xhat = (h - mean) * rstd and wg = weight * grad:
//   grad_input = rstd * (wg - [layer] mean(wg) - xhat * mean(wg * xhat))
//   grad_weight = sum over rows of grad * xhat, grad_bias = sum over rows of grad.
#pragma once

#include <cmath>
#include <type_traits>

#include "core/dtype_traits.hpp"
#include "core/fp8_traits.hpp"

namespace baracuda::norm {

/// One member of the family: which statistics, parameters and fusions.
template <bool Rms, bool Weight, bool Bias, bool Residual>
struct NormSpec {
  static constexpr bool kRms = Rms, kWeight = Weight, kBias = Bias, kResidual = Residual;
  static constexpr const char* name = Residual ? (Rms ? "add_rms_norm" : "add_layer_norm")
                                      : Rms ? (Weight ? "rms_norm" : "rms_norm_noaffine")
                                            : (Weight ? "layer_norm" : "layer_norm_noaffine");
  // Forward operands: outputs {out, [residual_out], [mean], rstd}, then inputs
  // {input, [residual], [weight], [bias]}.
  static constexpr int kOut = 0;
  static constexpr int kResidualOut = Residual ? 1 : -1;
  static constexpr int kMean = Rms ? -1 : 1 + Residual;
  static constexpr int kRstd = 1 + Residual + !Rms;
  static constexpr int kInput = kRstd + 1;
  static constexpr int kResidualIn = Residual ? kInput + 1 : -1;
  static constexpr int kWeightIn = Weight ? kInput + 1 + Residual : -1;
  static constexpr int kBiasIn = Bias ? kWeightIn + 1 : -1;
  static constexpr int kOperands = kInput + 1 + Residual + Weight + Bias;
  // Backward operands: outputs {grad_input, [grad_weight], [grad_bias]}, then
  // inputs {grad_output, input, [mean], rstd, [weight]}.
  static constexpr int kGradInput = 0;
  static constexpr int kGradWeight = Weight ? 1 : -1;
  static constexpr int kGradBias = Bias ? 2 : -1;
  static constexpr int kGradOutput = 1 + Weight + Bias;
  static constexpr int kSavedInput = kGradOutput + 1;
  static constexpr int kSavedMean = Rms ? -1 : kSavedInput + 1;
  static constexpr int kSavedRstd = kSavedInput + 2 - Rms;
  static constexpr int kSavedWeight = Weight ? kSavedRstd + 1 : -1;
  static constexpr int kBackwardOperands = kSavedRstd + 1 + Weight;
  // The fused forms differentiate as the plain norm over residual_out (Note [Residual norm backward] in plan.cpp).
  static constexpr bool kHasBackward = !Residual;

  template <class M> static BCD_HD M rstd(M centred_sq_sum, int64_t n, M eps) {
    return M(1) / sqrt(centred_sq_sum / M(n) + eps);
  }
  template <class M> static BCD_HD M grad_input(M wg, M xhat, M mean_wg, M mean_wg_xhat, M rstd) {
    return rstd * (wg - (Rms ? M(0) : mean_wg) - xhat * mean_wg_xhat);
  }
  /// grad_input regrouped for a row's elements: (grad rstd) weight + (h - mean) slope + offset, two
  /// fused multiply-adds an element on the per-row terms, with grad rstd shared with grad_weight's
  /// term (grad rstd) (h - mean) (grad_input and xhat take five operations; the fused backward is
  /// bound by the instructions it issues).
  template <class M>
  struct GradTerms {
    M slope, offset;
  };
  template <class M> static BCD_HD GradTerms<M> grad_input_terms(M mean_wg, M mean_wg_xhat, M rstd) {
    return {-(rstd * rstd) * mean_wg_xhat, Rms ? M(0) : -rstd * mean_wg};
  }
  template <class M> static BCD_HD M grad_input_from(M grad_rstd, M weight, M centred, GradTerms<M> t) {
    if constexpr (Rms) return fma(grad_rstd, weight, centred * t.slope);
    else return fma(grad_rstd, weight, fma(centred, t.slope, t.offset));
  }
};

using LayerNorm = NormSpec<false, true, true, false>;
using LayerNormNoAffine = NormSpec<false, false, false, false>;
using RmsNorm = NormSpec<true, true, false, false>;
using RmsNormNoAffine = NormSpec<true, false, false, false>;
using AddLayerNorm = NormSpec<false, true, true, true>;
using AddRmsNorm = NormSpec<true, true, false, true>;

template <class... Ss>
struct SpecList {};
using NormSpecs = SpecList<LayerNorm, LayerNormNoAffine, RmsNorm, RmsNormNoAffine, AddLayerNorm, AddRmsNorm>;

/// Storage types of input/output/weight: the four floats, and fp8 (e4m3,
/// e5m2) for the forwards, which compute in f32 (fp8 has no gradients, as in
/// the elementwise and reduction families).
using NormTypes = Concat<FloatTypes, Fp8Types>::type;
using NormGradientTypes = FloatTypes;

/// The saved statistics' type (mean, rstd) of storage type T: f64 for f64, else f32.
template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Attribute values the kernels read.
struct NormParams {
  double eps = 1e-5;
};

}  // namespace baracuda::norm
