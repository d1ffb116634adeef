// Class losses over rows of C class scores (the class dim moved last):
// cross_entropy (logits; class-index or class-probability targets, label
// smoothing, ignore_index, class weights) and nll_loss (log-probabilities).
// Per row r with target t, weight w (all ones without class weights),
// lse = logsumexp(z), smoothing e:
//   nll_r    = w_t (lse - z_t)            (nll_loss: -w_t z_t)
//   smooth_r = sum_c w_c (lse - z_c)
//   d_r      = w_t (0 where t = ignore_index)
// none: (1 - e) nll_r + e / C smooth_r; sum: the sum of that; mean: that sum
// over sum d (torch's rule; without class weights, the rows not ignored).
// Probability targets p: loss_r = sum_c w_c p'_c (lse - z_c), p' = (1 - e) p + e / C,
// and mean divides by the rows.
#pragma once

#include <cmath>
#include <type_traits>

#include "core/dtype_traits.hpp"
#include "core/rows.hpp"

struct CUstream_st;

namespace baracuda::loss {

enum class Mode : uint8_t { forward, backward, fused };
enum class Reduction : uint8_t { none = 0, mean = 1, sum = 2 };

/// Operand slots of a ClassLaunch (unused slots hold a harmless view).
enum Slot : int {
  kOut = 0,         ///< per-row loss (reduction none)
  kLse = 1,         ///< per-row logsumexp, saved by the forward (f32; f64 for f64)
  kGradInput = 2,   ///< full
  kGradOutput = 3,  ///< per row (none) or broadcast (a scalar)
  kInput = 4,       ///< full: logits, or log-probabilities for nll
  kTarget = 5,      ///< per row (indices) or full (probabilities)
  kWeight = 6,      ///< per column
  kSlots = 7,
};

struct ClassParams {
  Mode mode = Mode::forward;
  Reduction reduction = Reduction::mean;
  bool weighted = false;
  int64_t ignore_index = -100;
  double smoothing = 0;
  bool stat_out = false;  ///< reduction none: kOut holds W (f32; f64 for f64), not T (linear_cross_entropy's row losses)
};

/// rows.data by Slot; `scalar_out` receives a mean/sum; `scratch` (W-typed):
/// [0] = sum d, [1] = sum of the class weights, then nll[rows], smooth[rows], d[rows].
struct ClassLaunch {
  rows::RowLaunch rows;
  void* scalar_out = nullptr;
  void* scratch = nullptr;
  /// Fused mode: the gradient's scale, one W-typed value in device memory
  /// (linear_cross_entropy's 1 / rows kept); nullptr: 1.
  const void* grad_scale = nullptr;
};

/// Scratch elements a launch needs for `rows` rows.
inline int64_t scratch_elements(int64_t rows) { return 2 + 3 * rows; }

using ClassFn = Status (*)(const ClassLaunch&, const ClassParams&, CUstream_st*);

struct CrossEntropy {
  static constexpr const char* name = "cross_entropy";
  static constexpr bool kLogits = true;
};
struct NllLoss {
  static constexpr const char* name = "nll_loss";
  static constexpr bool kLogits = false;
};

template <class... Ls>
struct ClassLossList {};
using ClassLosses = ClassLossList<CrossEntropy, NllLoss>;

/// Coefficients of a row's terms in its loss and gradient.
template <class M>
struct RowScale {
  M nll, smooth;
};

/// The weights of nll_r and smooth_r in the reduced (or per-row) loss; grads scale the same way.
template <class M>
BCD_HD RowScale<M> row_scale(const ClassParams& p, int64_t classes, int64_t rows, M sum_d) {
  const M e = M(p.smoothing), c = M(classes > 0 ? classes : 1);
  RowScale<M> s{M(1) - e, e / c};
  if (p.reduction == Reduction::mean) {  // torch 2.11 divides both terms by the (weighted) count kept
    s.nll /= sum_d;
    s.smooth /= sum_d;
  }
  (void)rows;
  return s;
}

/// Probability targets fold the smoothing into each row's term, which a mean divides by the rows.
template <bool kProbs>
BCD_HD ClassParams effective(ClassParams p) {
  if (kProbs) p.smoothing = 0;
  return p;
}

/// The target index of a row as int64 (probability targets: unused).
template <class Index>
BCD_HD int64_t index_of(Index t) {
  if constexpr (is_float_v<Index>) return 0;
  else return static_cast<int64_t>(t);
}

}  // namespace baracuda::loss
