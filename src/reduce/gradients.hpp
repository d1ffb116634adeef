// Gradients of the reductions: pointwise over the input, with the forward
// output (and grad_output, and the mean for var/std) broadcast back over the
// reduced axes. Each is an elementwise op run by the elementwise launchers:
//   grad_input = fwd(grad_output, input, output, mean, params)
// params: v[0] = elements per output (n), v[1] = p (norm), v[2] = correction.
// The fourth operand ("aux") is a per-output value the plan reduces first
// when the op declares kUsesAux: var/std's mean, the number of elements tied
// for amax/amin/norm(+-inf), prod's product of the others at a lone zero.
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

/// d|x|_p / dx = sign(x) |x|^(p-1) / |x|_p^(p-1); 0 where the norm is 0
/// (torch's subgradient). p = +-inf: sign(x) split evenly among the elements
/// whose |x| is the extreme (aux: their count; a finite p gets a dummy aux).
struct NormGrad {
  static constexpr const char* name = "norm";
  static constexpr bool kUsesAux = true;
  template <class M> static BCD_HD M fwd(M g, M x, M y, M ties, const ew::Params& prm) {
    const M p = prm.get<M>(1);
    const M sign = x > 0 ? M(1) : x < 0 ? M(-1) : M(0);
    if (p == M(INFINITY) || p == M(-INFINITY)) return x * sign == y ? g * sign / ties : M(0);
    if (p == 1) return g * sign;
    if (p == 0 || y == 0) return M(0);
    if (p == 2) return g * x / y;
    const M ax = x < 0 ? -x : x;
    return g * sign * pow(ax / y, p - M(1));
  }
};

/// amax / amin: grad_output split evenly among the elements equal to the extreme (aux: their count).
template <bool IsMax>
struct ExtremeGrad {
  static constexpr const char* name = IsMax ? "amax" : "amin";
  static constexpr bool kUsesAux = true;
  template <class M> static BCD_HD M fwd(M g, M x, M y, M ties, const ew::Params&) { return x == y ? g / ties : M(0); }
};

/// prod: g * y / x away from zeros; 0 where another element is zero; at a
/// zero, g times the product of the others (aux: that product when the zero
/// is alone, else 0).
struct ProdGrad {
  static constexpr const char* name = "prod";
  static constexpr bool kUsesAux = true;
  template <class M> static BCD_HD M fwd(M g, M x, M y, M others, const ew::Params&) {
    if (x == M(0)) return g * others;
    return y == M(0) ? M(0) : g * (y / x);
  }
};

template <bool Sqrt>
struct VarianceGrad {
  static constexpr const char* name = Sqrt ? "std" : "var";
  static constexpr bool kUsesAux = true;
  template <class M> static BCD_HD M fwd(M g, M x, M y, M mean, const ew::Params& p) {
    const M dof = p.get<M>(0) - p.get<M>(2);
    const M d = dof > 0 ? dof : M(0);
    return Sqrt ? g * (x - mean) / (d * y) : g * M(2) * (x - mean) / d;
  }
};

template <class... Gs>
struct GradList {};
using ReductionGrads = GradList<SumGrad, MeanGrad, LogsumexpGrad, NormGrad, VarianceGrad<false>, VarianceGrad<true>,
                                ExtremeGrad<true>, ExtremeGrad<false>, ProdGrad>;

/// Float storage types with gradients (fp8 has none, as in the elementwise family).
using GradTypes = FloatTypes;

/// The aux operand's type: the backend's math type (f64 on the host) for the
/// ops that read it; T for the others, which are handed grad_output.
template <class Op, bool Host, class T>
using aux_operand_t = std::conditional_t<!requires { Op::kUsesAux; }, T,
                                         std::conditional_t<Host || std::is_same_v<T, double>, double, float>>;

/// grad_input = Op(grad_output, input, output, aux).
template <class Op, bool Host, class T>
using GradFn = ew::Forward<Op, Host, T, T, T, aux_operand_t<Op, Host, T>>;

}  // namespace baracuda::red
