// The GEMM epilogue shared by the bespoke CUDA kernel and the host
// reference: alpha * acc + beta * C + bias, then the activation (the
// elementwise family's functors).
#pragma once

#include "core/dtype_traits.hpp"
#include "elementwise/functors.hpp"
#include "gemm/problem.hpp"

namespace baracuda::gemm {

/// Accumulator of a product of T: f64 on the host and for f64, f32 for the
/// other floats on the GPU, i64 for integers (wraps as the output's type does).
template <class T, bool Host>
using acc_t = std::conditional_t<is_float_v<T>, math_t<T, Host>, int64_t>;

template <class Acc>
BCD_HD Acc activate(Activation act, Acc x) {
  if constexpr (is_float_v<Acc>) {
    const ew::Params none;
    switch (act) {
      case Activation::relu: return ew::Relu::fwd(x, none);
      case Activation::gelu: return ew::Gelu::fwd(x, none);
      case Activation::gelu_tanh: return ew::GeluTanh::fwd(x, none);
      case Activation::silu: return ew::Silu::fwd(x, none);
      case Activation::none: break;
    }
  } else if (act == Activation::relu) {
    return x > 0 ? x : Acc(0);
  }
  return x;
}

/// The output value of one element from its accumulated product; `c` and
/// `bias` point at the element's addend and bias, or are null.
template <class Out, class Acc>
BCD_HD Out finish(const Problem& p, Acc acc, const Out* c, const Out* bias) {
  Acc v = convert<Acc>(p.alpha) * acc;
  if (c) v += convert<Acc>(p.beta) * convert<Acc>(*c);
  if (bias) v += convert<Acc>(*bias);
  return convert<Out>(activate(p.act, v));
}

}  // namespace baracuda::gemm
