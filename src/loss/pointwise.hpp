// Pointwise losses: a per-element loss of (input, target, ...) and its
// gradient, shared by the CUDA launcher and the host reference. The plan
// reduces the per-element values (none / mean / sum / batchmean).
//   loss(x..., params) -> M,  grad(x..., params) -> Grads<M, kGrads>
// Gradients are those of the first `kGrads` inputs; params v[0..2] are the
// op's attributes, v[3] the reduction's scale (1, 1/n, ...).
#pragma once

#include "baracuda/registry.hpp"
#include "elementwise/functors.hpp"

namespace baracuda::loss {

using ew::Grads;
using ew::Params;
namespace m = ew::m;

struct LossMeta {
  const char* name;
  int inputs;                    ///< tensor operands
  int grads;                     ///< the first `grads` inputs are differentiable (and shaped like input 0)
  const char* input_names[4];
  Domain domains[4];
  ew::AttrDefault attrs[3] = {};
  bool class_mean = false;       ///< the loss of a row is the mean over the last dim (multilabel)
  const char* doc = "";
};

template <class M>
BCD_HD M sign_of(M x) {
  return x > 0 ? M(1) : x < 0 ? M(-1) : M(0);
}
/// log clamped at -100, as torch's binary_cross_entropy.
template <class M>
BCD_HD M clamped_log(M x) {
  const M l = log(x);
  return l < M(-100) ? M(-100) : l;
}

struct MseLoss {
  static constexpr LossMeta meta{"mse_loss", 2, 2, {"input", "target"}, {{-2, 2}, {-2, 2}}, {}, false,
                                 "(input - target)^2"};
  template <class M> static BCD_HD M loss(M x, M y, const Params&) { return (x - y) * (x - y); }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, const Params&) { return {M(2) * (x - y), M(-2) * (x - y)}; }
};

struct L1Loss {
  static constexpr LossMeta meta{"l1_loss", 2, 2, {"input", "target"}, {{-2, 2}, {-2, 2}}, {}, false, "|input - target|"};
  template <class M> static BCD_HD M loss(M x, M y, const Params&) { return x > y ? x - y : y - x; }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, const Params&) { return {sign_of(x - y), -sign_of(x - y)}; }
};

struct HuberLoss {
  static constexpr LossMeta meta{"huber_loss", 2, 2, {"input", "target"}, {{-2, 2}, {-2, 2}}, {{"delta", 1}}, false,
                                 "0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta); d = input - target"};
  template <class M> static BCD_HD M loss(M x, M y, const Params& p) {
    const M d = x - y, a = d < 0 ? -d : d, delta = p.get<M>(0);
    return a < delta ? M(0.5) * d * d : delta * (a - M(0.5) * delta);
  }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, const Params& p) {
    const M d = x - y, delta = p.get<M>(0);
    const M g = d < -delta ? -delta : d > delta ? delta : d;
    return {g, -g};
  }
};

struct SmoothL1Loss {
  static constexpr LossMeta meta{"smooth_l1_loss", 2, 2, {"input", "target"}, {{-2, 2}, {-2, 2}}, {{"beta", 1}}, false,
                                 "0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta; d = input - target"};
  template <class M> static BCD_HD M loss(M x, M y, const Params& p) {
    const M d = x - y, a = d < 0 ? -d : d, beta = p.get<M>(0);
    return a < beta ? M(0.5) * d * d / beta : a - M(0.5) * beta;
  }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, const Params& p) {
    const M d = x - y, a = d < 0 ? -d : d, beta = p.get<M>(0);
    const M g = a < beta ? d / beta : sign_of(d);
    return {g, -g};
  }
};

/// -w (y log p + (1 - y) log(1 - p)), logs clamped at -100.
struct BceLoss {
  static constexpr LossMeta meta{"binary_cross_entropy", 3, 2, {"input", "target", "weight"},
                                 {{0.02, 0.98}, {0, 1}, {0.5, 2}}, {}, false,
                                 "-weight (t log p + (1 - t) log(1 - p)); weight broadcasts"};
  template <class M> static BCD_HD M loss(M x, M y, M w, const Params&) {
    return -w * (y * clamped_log(x) + (M(1) - y) * clamped_log(M(1) - x));
  }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, M w, const Params&) {
    const M denom = (M(1) - x) * x, eps = M(1e-12);
    return {w * (x - y) / (denom > eps ? denom : eps), w * (clamped_log(M(1) - x) - clamped_log(x))};
  }
};

/// weight ((1 - y) x + (1 + (pos_weight - 1) y) softplus(-x)).
struct BceWithLogitsLoss {
  static constexpr LossMeta meta{"binary_cross_entropy_with_logits", 4, 2,
                                 {"input", "target", "weight", "pos_weight"},
                                 {{-6, 6}, {0, 1}, {0.5, 2}, {0.5, 2}}, {}, false,
                                 "bce of sigmoid(input), computed stably; weight and pos_weight broadcast"};
  template <class M> static BCD_HD M loss(M x, M y, M w, M pw, const Params&) {
    const M lw = (pw - M(1)) * y + M(1);
    return w * ((M(1) - y) * x + lw * m::softplus(-x));
  }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, M w, M pw, const Params&) {
    const M lw = (pw - M(1)) * y + M(1);
    return {w * ((M(1) - y) + lw * (m::sigmoid(x) - M(1))), w * ((pw - M(1)) * m::softplus(-x) - x)};
  }
};

/// target (log target - input) (0 where target = 0), or exp(t) (t - input) with log_target.
struct KlDivLoss {
  static constexpr LossMeta meta{"kl_div", 2, 2, {"input", "target"}, {{-3, 0}, {0, 1}}, {{"log_target", 0}}, false,
                                 "KL divergence with input given as log-probabilities"};
  template <class M> static BCD_HD M loss(M x, M y, const Params& p) {
    if (p.get<M>(0) != 0) return exp(y) * (y - x);
    return y > 0 ? y * (log(y) - x) : M(0) * x;
  }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, const Params& p) {
    if (p.get<M>(0) != 0) return {-exp(y), exp(y) * (y - x + M(1))};
    return {-y, y > 0 ? log(y) + M(1) - x : M(0)};
  }
};

struct PoissonNllLoss {
  static constexpr LossMeta meta{"poisson_nll_loss", 2, 2, {"input", "target"}, {{0.1, 3}, {0, 4}},
                                 {{"log_input", 1}, {"full", 0}, {"eps", 1e-8}}, false,
                                 "exp(input) - target input (log_input), else input - target log(input + eps); "
                                 "full adds Stirling's term"};
  template <class M> static BCD_HD M stirling(M y) {
    return y > M(1) ? y * log(y) - y + M(0.5) * log(M(2) * m::kPi<M> * y) : M(0);
  }
  template <class M> static BCD_HD M loss(M x, M y, const Params& p) {
    M l = p.get<M>(0) != 0 ? exp(x) - y * x : x - y * log(x + p.get<M>(2));
    if (p.get<M>(1) != 0) l += stirling(y);
    return l;
  }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, const Params& p) {
    const bool log_input = p.get<M>(0) != 0;
    M gy = log_input ? -x : -log(x + p.get<M>(2));
    if (p.get<M>(1) != 0 && y > M(1)) gy += log(y) + M(0.5) / y;
    return {log_input ? exp(x) - y : M(1) - y / (x + p.get<M>(2)), gy};
  }
};

/// 0.5 (log v + (input - target)^2 / v), v = max(var, eps); full adds 0.5 log(2 pi).
struct GaussianNllLoss {
  static constexpr LossMeta meta{"gaussian_nll_loss", 3, 3, {"input", "target", "var"}, {{-2, 2}, {-2, 2}, {0.2, 2}},
                                 {{"full", 0}, {"eps", 1e-6}}, false,
                                 "Gaussian negative log-likelihood; var broadcasts (its gradient is summed)"};
  template <class M> static BCD_HD M loss(M x, M y, M var, const Params& p) {
    const M v = var > p.get<M>(1) ? var : p.get<M>(1);
    M l = M(0.5) * (log(v) + (x - y) * (x - y) / v);
    if (p.get<M>(0) != 0) l += M(0.5) * log(M(2) * m::kPi<M>);
    return l;
  }
  template <class M> static BCD_HD Grads<M, 3> grad(M x, M y, M var, const Params& p) {
    const M v = var > p.get<M>(1) ? var : p.get<M>(1), d = x - y;
    return {d / v, -d / v, M(0.5) * (M(1) / v - d * d / (v * v))};
  }
};

/// Terms by torch's formula: (t != 1) max(0, margin - x) + (t != -1) x.
struct HingeEmbeddingLoss {
  static constexpr LossMeta meta{"hinge_embedding_loss", 2, 1, {"input", "target"}, {{-2, 2}, {-1, 1}},
                                 {{"margin", 1}}, false, "input where target = 1, max(0, margin - input) where -1"};
  template <class M> static BCD_HD M loss(M x, M y, const Params& p) {
    const M h = p.get<M>(0) - x;
    return (y != M(1) ? (h > 0 ? h : M(0)) : M(0)) + (y != M(-1) ? x : M(0));
  }
  template <class M> static BCD_HD Grads<M, 1> grad(M x, M y, const Params& p) {
    // At margin - x = 0 the clamp passes the gradient, as torch's clamp_min.
    return {(y != M(1) && p.get<M>(0) - x >= 0 ? M(-1) : M(0)) + (y != M(-1) ? M(1) : M(0))};
  }
};

/// max(0, -target (input1 - input2) + margin).
struct MarginRankingLoss {
  static constexpr LossMeta meta{"margin_ranking_loss", 3, 2, {"input1", "input2", "target"},
                                 {{-2, 2}, {-2, 2}, {-1, 1}}, {{"margin", 0}}, false,
                                 "max(0, -target (input1 - input2) + margin)"};
  template <class M> static BCD_HD M loss(M a, M b, M y, const Params& p) {
    const M h = -y * (a - b) + p.get<M>(0);
    return h > 0 ? h : M(0);
  }
  template <class M> static BCD_HD Grads<M, 2> grad(M a, M b, M y, const Params& p) {
    const bool active = -y * (a - b) + p.get<M>(0) > 0;
    return {active ? -y : M(0), active ? y : M(0)};
  }
};

/// log(1 + exp(-target input)).
struct SoftMarginLoss {
  static constexpr LossMeta meta{"soft_margin_loss", 2, 2, {"input", "target"}, {{-3, 3}, {-1, 1}}, {}, false,
                                 "log(1 + exp(-target input))"};
  template <class M> static BCD_HD M loss(M x, M y, const Params&) { return m::softplus(-y * x); }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, const Params&) {
    const M s = m::sigmoid(-y * x);
    return {-y * s, -x * s};
  }
};

/// -weight (t log sigmoid(x) + (1 - t) log sigmoid(-x)), averaged over the classes (last dim).
struct MultilabelSoftMarginLoss {
  static constexpr LossMeta meta{"multilabel_soft_margin_loss", 3, 2, {"input", "target", "weight"},
                                 {{-4, 4}, {0, 1}, {0.5, 2}}, {}, true,
                                 "mean over classes (last dim) of the per-class logistic loss; weight broadcasts"};
  template <class M> static BCD_HD M loss(M x, M y, M w, const Params&) {
    return w * (y * m::softplus(-x) + (M(1) - y) * m::softplus(x));
  }
  template <class M> static BCD_HD Grads<M, 2> grad(M x, M y, M w, const Params&) {
    return {w * (m::sigmoid(x) - y), w * (m::softplus(-x) - m::softplus(x))};
  }
};

template <class... Ls>
struct LossList {};
using PointwiseLosses = LossList<MseLoss, L1Loss, HuberLoss, SmoothL1Loss, BceLoss, BceWithLogitsLoss, KlDivLoss,
                                 PoissonNllLoss, GaussianNllLoss, HingeEmbeddingLoss, MarginRankingLoss, SoftMarginLoss,
                                 MultilabelSoftMarginLoss>;

/// Per-element loss times the scale params.v[3], in the math type of T.
template <class L, bool Host, class T, class... Ins>
struct LossForward {
  Params p;
  BCD_HD auto operator()(Ins... x) const {
    using M = math_t<T, Host>;
    return L::template loss<M>(convert<M>(x)..., p) * p.get<M>(3);
  }
};

/// (grad_output, inputs...) -> the gradients of the first kGrads inputs,
/// times grad_output and the scale.
template <class L, bool Host, class T, class... Ins>
struct LossBackward {
  Params p;
  static constexpr bool kSumsOverBroadcast = true;
  BCD_HD auto operator()(T g, Ins... x) const {
    using M = math_t<T, Host>;
    auto r = L::template grad<M>(convert<M>(x)..., p);
    const M s = convert<M>(g) * p.get<M>(3);
#pragma unroll
    for (int k = 0; k < L::meta.grads; ++k) r.v[k] *= s;
    if constexpr (L::meta.grads == 1) return r.v[0];
    else return r;
  }
};

}  // namespace baracuda::loss
