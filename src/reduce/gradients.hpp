// Gradients of the reductions: pointwise over the input, with the forward
// output (and grad_output, and the mean for var/std) broadcast back over the
// reduced axes. Each is an elementwise op run by the elementwise launchers:
//   grad_input = fwd(grad_output, input, output, mean, params)
// params: v[0] = elements per output (n), v[1] = p (norm), v[2] = correction.
#pragma once

#include "elementwise/engine.hpp"

namespace baracuda::red {

struct SumGrad {
  static constexpr const char* name = "sum";
  template <class M> static BCD_HD M fwd(M g, M, M, M, const ew::Params&) { return g; }
};

struct MeanGrad {
  static constexpr const char* name = "mean";
  template <class M> static BCD_HD M fwd(M g, M, M, M, const ew::Params& p) { return g / p.get<M>(0); }
};

struct LogsumexpGrad {
  static constexpr const char* name = "logsumexp";
  template <class M> static BCD_HD M fwd(M g, M x, M y, M, const ew::Params&) { return g * exp(x - y); }
};

/// d|x|_p / dx = sign(x) |x|^(p-1) / |x|_p^(p-1); 0 where the norm is 0 (torch's subgradient).
struct NormGrad {
  static constexpr const char* name = "norm";
  template <class M> static BCD_HD M fwd(M g, M x, M y, M, const ew::Params& prm) {
    const M p = prm.get<M>(1);
    const M sign = x > 0 ? M(1) : x < 0 ? M(-1) : M(0);
    if (p == 1) return g * sign;
    if (p == 0 || y == 0) return M(0);
    if (p == 2) return g * x / y;
    const M ax = x < 0 ? -x : x;
    return g * sign * pow(ax / y, p - M(1));
  }
};

template <bool Sqrt>
struct VarianceGrad {
  static constexpr const char* name = Sqrt ? "std" : "var";
  static constexpr bool kUsesMean = true;
  template <class M> static BCD_HD M fwd(M g, M x, M y, M mean, const ew::Params& p) {
    const M dof = p.get<M>(0) - p.get<M>(2);
    const M d = dof > 0 ? dof : M(0);
    return Sqrt ? g * (x - mean) / (d * y) : g * M(2) * (x - mean) / d;
  }
};

template <class... Gs>
struct GradList {};
using ReductionGrads = GradList<SumGrad, MeanGrad, LogsumexpGrad, NormGrad, VarianceGrad<false>, VarianceGrad<true>>;

/// Float storage types with gradients (fp8 has none, as in the elementwise family).
using GradTypes = FloatTypes;

/// The mean operand's type: the backend's math type (f64 on the host) for
/// var/std, which read it; T for the others, which are handed grad_output.
template <class Op, bool Host, class T>
using mean_operand_t = std::conditional_t<!requires { Op::kUsesMean; }, T,
                                          std::conditional_t<Host || std::is_same_v<T, double>, double, float>>;

/// grad_input = Op(grad_output, input, output, mean).
template <class Op, bool Host, class T>
using GradFn = ew::Forward<Op, Host, T, T, T, mean_operand_t<Op, Host, T>>;

}  // namespace baracuda::red
