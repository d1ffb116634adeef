// CTC loss (torch.nn.functional.ctc_loss): the problem as raw pointers and
// strides, and the log-space recursions shared by the host reference and the
// CUDA kernels. For one sample with input length I, target length S, the
// extended labels l'(s), s < L = 2S + 1, are the blank at even s and
// target[(s - 1) / 2] at odd s; with lp = log_probs of the sample:
//   alpha_0(s) = lp(0, l'(s)) for s < 2, -inf elsewhere;
//   alpha_t(s) = lse(alpha_{t-1}(s), alpha_{t-1}(s-1), [alpha_{t-1}(s-2)]) + lp(t, l'(s)),
//                the last term when l'(s) is a label other than l'(s-2);
//   nll = -lse(alpha_{I-1}(L-1), alpha_{I-1}(L-2));  (I = 0: 0 if S = 0, else inf)
//   beta mirrors alpha from t = I-1 (also counting lp(t, l'(s))), and
//   d nll / d lp(t, c) = exp(lp(t, c)) - exp(lse_{s: l'(s)=c}(alpha_t(s) + beta_t(s)) + nll - lp(t, c)),
// torch's ctc_loss_backward (the gradient as if lp were unnormalised logits
// of a softmax); zero for t >= I, and for an infinite nll with zero_infinity.
// Reductions: none, sum, mean = mean over samples of nll / max(S, 1).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype_traits.hpp"

struct CUstream_st;

namespace baracuda::loss::ctc {

/// Operands: log_probs [T, N, C] (unbatched: n stride 0), targets padded
/// [N, S] or concatenated [S] (the sum of target lengths), lengths [N].
struct Problem {
  const void* log_probs = nullptr;
  int64_t lp_t = 0, lp_n = 0, lp_c = 0;
  const void* targets = nullptr;
  int64_t tg_n = 0, tg_s = 0;  ///< concatenated: tg_n unused, tg_s the element stride
  const void* input_lengths = nullptr;
  const void* target_lengths = nullptr;
  int64_t il_stride = 0, tl_stride = 0;
  const void* grad_output = nullptr;  ///< backward: per sample (none) or a scalar
  int64_t go_stride = 0;
  void* dst = nullptr;  ///< forward: the loss (none: per sample); backward: grad [T, N, C]
  int64_t dst_t = 0, dst_n = 0, dst_c = 0;
  int64_t T = 0, N = 0, C = 0, S = 0;  ///< S: padded dim 1, or the concatenated length
  int64_t blank = 0;
  bool concatenated = false, targets64 = true, il64 = true, tl64 = true;
  int reduction = 1;  ///< 0 none, 1 mean, 2 sum
  bool zero_infinity = false;
  // CUDA workspace (see Workspace); the host reference allocates its own.
  void* ws_loss = nullptr;   ///< M[N]: each sample's reduced term
  void* ws_alpha = nullptr;  ///< M: alpha of every t (backward)
  void* ws_rows = nullptr;   ///< M: kRollingRows rows per sample (when not in shared memory)
  int32_t* ws_next = nullptr;  ///< the next target position with the same label (backward)
  bool rows_in_smem = true;
};

/// What makes a sample invalid (the host names it; the GPU writes NaN).
enum class Bad : int { none = 0, input_length, target_length, target_sum, label };

/// Longest extended label sequence a descriptor allows.
inline int64_t max_positions(const Problem& p) { return 2 * p.S + 1; }

/// Rows of 2S + 1 values a CUDA block keeps per sample (shared memory or ws_rows):
/// three rolling rows of alpha or beta, and alpha + beta of the current step.
inline constexpr int kRollingRows = 4;

/// Where sample b's rows start in a buffer of rows: padded b * (2S + 1);
/// concatenated 2 * (target lengths before b) + b (each sample's own 2 S_b + 1).
BCD_HD int64_t row_base(const Problem& p, int64_t b, int64_t offset) {
  return p.concatenated ? 2 * offset + b : b * (2 * p.S + 1);
}

BCD_HD int64_t load_index(const void* base, bool wide, int64_t off) {
  return wide ? static_cast<const int64_t*>(base)[off] : int64_t(static_cast<const int32_t*>(base)[off]);
}

/// One sample: lengths, where its target starts, and whether they are valid.
struct Sample {
  int64_t I = 0, S = 0, L = 1;
  int64_t tg_base = 0;  ///< element offset of its first label
  int64_t rows = 0;     ///< row_base
  Bad bad = Bad::none;
};

/// `offset`: the target lengths before b (concatenated targets).
BCD_HD Sample sample_of(const Problem& p, int64_t b, int64_t offset) {
  Sample s;
  s.I = load_index(p.input_lengths, p.il64, b * p.il_stride);
  s.S = load_index(p.target_lengths, p.tl64, b * p.tl_stride);
  if (s.I < 0 || s.I > p.T) s.bad = Bad::input_length;
  else if (s.S < 0 || (!p.concatenated && s.S > p.S)) s.bad = Bad::target_length;
  if (s.bad != Bad::none) s.S = 0;
  s.L = 2 * s.S + 1;
  s.tg_base = p.concatenated ? offset * p.tg_s : b * p.tg_n;
  s.rows = row_base(p, b, offset);
  return s;
}

/// The label at target position k of a sample.
BCD_HD int64_t label_at(const Problem& p, const Sample& s, int64_t k) {
  return load_index(p.targets, p.targets64, s.tg_base + k * p.tg_s);
}

/// l'(s): the blank at even positions.
BCD_HD int64_t extended(const Problem& p, const Sample& sm, int64_t s) {
  return s % 2 == 0 ? p.blank : label_at(p, sm, (s - 1) / 2);
}

/// Whether the path may come to s from s - 2 (a label other than the one at s - 2).
BCD_HD bool skips_from(const Problem& p, const Sample& sm, int64_t s) {
  return s % 2 == 1 && s >= 3 && label_at(p, sm, (s - 1) / 2) != label_at(p, sm, (s - 3) / 2);
}

template <class M>
BCD_HD M neg_inf() {
  return -std::numeric_limits<M>::infinity();
}

/// log(e^a + e^b + e^c) around the largest term m: m + log1p(e^(o1 - m) + e^(o2 - m))
/// over the other two (two exponentials, not three); -inf when all are -inf, NaN propagates
/// (a NaN is never taken for m, so it is one of the others).
template <class M>
BCD_HD M log_add(M a, M b, M c = neg_inf<M>()) {
  using std::exp;
  using std::log1p;
  M m = a, o1 = b;
  if (!(a > b)) m = b, o1 = a;
  M o2 = c;
  if (!(m > c)) o2 = m, m = c;
  if (m == neg_inf<M>()) return a + b + c;  // -inf, or NaN when one is NaN
  return m + log1p(exp(o1 - m) + exp(o2 - m));
}

/// The log-probability of a sample at (t, c).
template <class T, class M>
BCD_HD M lp_at(const Problem& p, int64_t b, int64_t t, int64_t c) {
  return convert<M>(static_cast<const T*>(p.log_probs)[t * p.lp_t + b * p.lp_n + c * p.lp_c]);
}

/// Factor of a sample's nll in the reduced loss (and of grad_output in its gradient).
template <class M>
BCD_HD M reduction_scale(const Problem& p, int64_t target_length) {
  if (p.reduction != 1) return M(1);
  const int64_t d = target_length > 1 ? target_length : 1;
  return M(1) / (M(d) * M(p.N));
}

/// A sample's loss from its nll (zero_infinity turns +inf into 0).
template <class M>
BCD_HD M finish_nll(const Problem& p, M nll) {
  return p.zero_infinity && nll == std::numeric_limits<M>::infinity() ? M(0) : nll;
}

/// The gradient at (t, c) from lcab = lse of alpha + beta over the positions labelled c.
template <class M>
BCD_HD M grad_at(M lp, M lcab, M nll, M scale) {
  using std::exp;
  return scale * (exp(lp) - exp(lcab + nll - lp));
}

using Fn = Status (*)(const Problem&, bool backward, CUstream_st*);

}  // namespace baracuda::loss::ctc
