// The host reference of ctc_loss: the recursions of ctc.hpp in f64, sample by
// sample, with every length and label checked (an error names the operand).
#include <vector>

#include "core/errors.hpp"
#include "core/launch_table.hpp"
#include "loss/ctc.hpp"
#include "loss/register.hpp"

namespace baracuda::loss::ctc {

LaunchTable<Fn>& host_ctc();

namespace {

/// Each sample's offset into concatenated targets; an error for bad lengths or labels.
Result<std::vector<int64_t>> validate(const Problem& p, std::string_view op) {
  std::vector<int64_t> offset(p.N + 1, 0);
  for (int64_t b = 0; b < p.N; ++b) {
    const int64_t tl = load_index(p.target_lengths, p.tl64, b * p.tl_stride);
    offset[b + 1] = offset[b] + (tl > 0 ? tl : 0);
  }
  if (p.concatenated && offset[p.N] != p.S)
    return invalid(op, ": 'target_lengths' sum to ", offset[p.N], " but the concatenated 'targets' hold ", p.S, " labels");
  for (int64_t b = 0; b < p.N; ++b) {
    const Sample sm = sample_of(p, b, offset[b]);
    if (sm.bad == Bad::input_length)
      return invalid(op, ": 'input_lengths'[", b, "] = ", load_index(p.input_lengths, p.il64, b * p.il_stride),
                     " is outside [0, ", p.T, "] (T, dim 0 of 'log_probs')");
    if (sm.bad == Bad::target_length)
      return invalid(op, ": 'target_lengths'[", b, "] = ", load_index(p.target_lengths, p.tl64, b * p.tl_stride),
                     p.concatenated ? cat(" is negative") : cat(" is outside [0, ", p.S, "] (dim 1 of 'targets')"));
    for (int64_t k = 0; k < sm.S; ++k) {
      const int64_t lab = label_at(p, sm, k);
      if (lab < 0 || lab >= p.C || lab == p.blank)
        return invalid(op, ": 'targets' holds label ", lab, " (sample ", b, ", position ", k, "), outside [0, ", p.C,
                       ") or equal to blank ", p.blank);
    }
  }
  return offset;
}

template <class T>
Status ctc_on_host(const Problem& p, bool backward, CUstream_st*) {
  using M = double;
  const std::string_view op = backward ? "ctc_loss_backward" : "ctc_loss";
  auto offsets = validate(p, op);
  if (!offsets) return offsets.status();
  const M ninf = neg_inf<M>();
  M total = 0;
  std::vector<M> alpha, beta, lcab(p.C);
  for (int64_t b = 0; b < p.N; ++b) {
    const Sample sm = sample_of(p, b, (*offsets)[b]);
    const int64_t I = sm.I, L = sm.L;
    auto lp = [&](int64_t t, int64_t c) { return lp_at<T, M>(p, b, t, c); };
    alpha.assign(size_t(I * L), ninf);
    for (int64_t s = 0; s < L && I > 0; ++s) alpha[s] = s < 2 ? lp(0, extended(p, sm, s)) : ninf;
    for (int64_t t = 1; t < I; ++t) {
      const M* prev = &alpha[(t - 1) * L];
      for (int64_t s = 0; s < L; ++s)
        alpha[t * L + s] = log_add(prev[s], s >= 1 ? prev[s - 1] : ninf, skips_from(p, sm, s) ? prev[s - 2] : ninf) +
                           lp(t, extended(p, sm, s));
    }
    const M nll = I == 0 ? (sm.S == 0 ? M(0) : M(INFINITY))
                         : -log_add(alpha[(I - 1) * L + L - 1], L >= 2 ? alpha[(I - 1) * L + L - 2] : ninf);
    if (!backward) {
      const M loss = finish_nll(p, nll);
      if (p.reduction == 0) static_cast<T*>(p.dst)[b * p.dst_n] = convert<T>(loss);
      else total += loss * reduction_scale<M>(p, sm.S);
      continue;
    }
    T* grad = static_cast<T*>(p.dst) + b * p.dst_n;
    auto store = [&](int64_t t, int64_t c, M v) { grad[t * p.dst_t + c * p.dst_c] = convert<T>(v); };
    const bool zero = I == 0 || (p.zero_infinity && nll == M(INFINITY));
    for (int64_t t = zero ? 0 : I; t < p.T; ++t)
      for (int64_t c = 0; c < p.C; ++c) store(t, c, 0);
    if (zero) continue;
    const M scale = convert<M>(static_cast<const T*>(p.grad_output)[b * p.go_stride]) * reduction_scale<M>(p, sm.S);
    std::vector<M> next_row(L, ninf);
    beta.assign(L, ninf);
    for (int64_t t = I - 1; t >= 0; --t) {
      for (int64_t s = 0; s < L; ++s) {
        if (t == I - 1) beta[s] = s >= L - 2 ? lp(t, extended(p, sm, s)) : ninf;
        else
          beta[s] = log_add(next_row[s], s + 1 < L ? next_row[s + 1] : ninf,
                            s + 2 < L && skips_from(p, sm, s + 2) ? next_row[s + 2] : ninf) + lp(t, extended(p, sm, s));
      }
      std::fill(lcab.begin(), lcab.end(), ninf);
      for (int64_t s = 0; s < L; ++s) {
        M& acc = lcab[extended(p, sm, s)];
        acc = log_add(acc, alpha[t * L + s] + beta[s]);
      }
      for (int64_t c = 0; c < p.C; ++c) store(t, c, grad_at(lp(t, c), lcab[c], nll, scale));
      next_row.swap(beta);
    }
  }
  if (!backward && p.reduction != 0)
    *static_cast<T*>(p.dst) = convert<T>(p.reduction == 1 && p.N == 0 ? M(NAN) : total);
  return Status::ok();
}

template <class T>
struct HostCtc {
  static Status run(const Problem& p, bool backward, CUstream_st* s) { return ctc_on_host<T>(p, backward, s); }
};

[[maybe_unused]] const bool registered = register_launchers<LossTypes, HostCtc>(host_ctc(), "ctc_loss");

}  // namespace
}  // namespace baracuda::loss::ctc
