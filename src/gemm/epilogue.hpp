// The GEMM epilogue shared by the bespoke CUDA kernel and the host
// reference: alpha * scales * acc + beta * C + bias, then the activation
// (the elementwise family's functors).
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

/// The type of scaled_mm's per-tensor scales for operands of type T: f32,
/// f64 for f64 operands (the host reference's oracle runs every operand in f64).
template <class T>
using scale_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// alpha times the per-tensor scales the problem carries.
template <class Acc, class Scale>
BCD_HD Acc scaled_alpha(const Problem& p) {
  Acc alpha = convert<Acc>(p.alpha);
  if (p.scale_a) alpha *= convert<Acc>(*static_cast<const Scale*>(p.scale_a));
  if (p.scale_b) alpha *= convert<Acc>(*static_cast<const Scale*>(p.scale_b));
  return alpha;
}

/// The bias of column n: of the output's dtype, or bf16/f16 over a float
/// output (scaled_mm).
template <class Acc, class Out>
BCD_HD Acc bias_at(const Problem& p, int64_t n) {
  const int64_t i = n * p.bias.col_stride;
  if constexpr (std::is_same_v<Out, float> || is_small_float_v<Out>) {
    if (p.bias_dtype == DType::bf16) return convert<Acc>(reinterpret_cast<const __nv_bfloat16*>(p.bias.data)[i]);
    if (p.bias_dtype == DType::f16) return convert<Acc>(reinterpret_cast<const __half*>(p.bias.data)[i]);
  }
  return convert<Acc>(reinterpret_cast<const Out*>(p.bias.data)[i]);
}

/// The output value of element (., n) from its accumulated product; `c`
/// points at the element's addend or is null; `alpha` is scaled_alpha.
template <class Out, class Acc>
BCD_HD Out finish(const Problem& p, Acc alpha, Acc acc, const Out* c, int64_t n) {
  Acc v = alpha * acc;
  if (c) v += convert<Acc>(p.beta) * convert<Acc>(*c);
  if (p.bias.data) v += bias_at<Acc, Out>(p, n);
  return convert<Out>(activate(p.act, v));
}

}  // namespace baracuda::gemm
