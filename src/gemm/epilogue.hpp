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

/// Factor `i` (a row of A, a column of B) of a scale in K block `kb`; 1 without one.
template <class Acc, class Scale>
BCD_HD Acc scale_at(const ScaleOperand& s, int64_t i, int64_t kb) {
  if (!s.data) return Acc(1);
  return convert<Acc>(static_cast<const Scale*>(s.data)[(i / s.block) * s.stride + kb * s.k_stride]);
}

/// What multiplies the sum of element (m, n): alpha times scaled_mm's
/// scales unless the kernel applies them inside the sum (scales_in_k).
template <class Acc, class Scale>
BCD_HD Acc sum_scale(const Problem& p, int64_t m, int64_t n) {
  Acc s = convert<Acc>(p.alpha);
  if (!p.scales_in_k()) s *= scale_at<Acc, Scale>(p.scale_a, m, 0) * scale_at<Acc, Scale>(p.scale_b, n, 0);
  return s;
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

template <class T>
inline constexpr bool is_fp8_v = std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;

/// The stored output: an fp8 output saturates to its largest finite value
/// (+-448 e4m3, +-57344 e5m2; NaN stays NaN), as cuBLASLt and
/// torch._scaled_mm do; other dtypes convert as everywhere.
template <class Out, class Acc>
BCD_HD Out to_output(Acc v) {
  if constexpr (is_fp8_v<Out>) {
    constexpr auto kind = std::is_same_v<Out, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
    Out out;
    if constexpr (std::is_same_v<Acc, double>) out.__x = __nv_cvt_double_to_fp8(v, __NV_SATFINITE, kind);
    else out.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kind);
    return out;
  } else {
    return convert<Out>(v);
  }
}

/// The output value of element (., n) from its accumulated product; `c`
/// points at the element's addend or is null; `scale` is sum_scale. Scale
/// is the type of scale_result.
template <class Out, class Acc, class Scale = float>
BCD_HD Out finish(const Problem& p, Acc scale, Acc acc, const Out* c, int64_t n) {
  Acc v = scale * acc;
  if (c) v += convert<Acc>(p.beta) * convert<Acc>(*c);
  if (p.bias.data) v += bias_at<Acc, Out>(p, n);
  v = activate(p.act, v);
  if (p.scale_result) v *= convert<Acc>(*static_cast<const Scale*>(p.scale_result));
  return to_output<Out>(v);
}

// Note [scaled_mm scales]
// torch._scaled_mm's three scale forms bind to one ScaleOperand per operand:
// per tensor (a scalar each), row-wise (scale_a [M, 1] per row of a,
// scale_b [1, N] per column of b) and block-wise (DeepSeek's: scale_a
// [M, ceil(K/128)] per row and 128 K, scale_b [ceil(K/128), ceil(N/128)] per
// 128 x 128 block of b). Scales constant along K multiply each finished sum
// (sum_scale); block-wise ones change along K, so the kernels multiply each
// operand element by its factor as they load it (scales_in_k), and the sums
// add scaled products. scale_result multiplies last, after the bias (cuBLASLt's
// D = scale_D * (alpha * scale_A * scale_B * A B + bias)).

}  // namespace baracuda::gemm
