// Elementwise math: one struct per op with `fwd` and its derivative (`deriv`
// for unary ops, `bwd` returning every input's gradient otherwise). Each is
// templated on the math type M, so the CUDA launcher runs it in f32/f64 and
// the host reference runs the same code in f64 as the test oracle.
#pragma once

#include <cmath>
#include <cstring>

#include "baracuda/registry.hpp"
#include "core/dtype_traits.hpp"
#include "core/wrapping.hpp"

namespace baracuda::ew {

/// Up to four attribute values, in the order of the op's `attrs`.
struct Params {
  double v[4] = {0, 0, 0, 0};
  template <class M>
  BCD_HD M get(int i) const {
    return convert<M>(v[i]);
  }
};

struct AttrDefault {
  const char* name = nullptr;
  double value = 0;
};

/// Gradients of every differentiable input.
template <class M, int N>
struct Grads {
  M v[N];
};

enum class Set : uint8_t { floating, float_int, integral, int_bool, real, all };

/// Static description every op struct carries.
struct Meta {
  const char* name;
  Set dtypes = Set::floating;
  Domain domain{-2, 2};
  AttrDefault attrs[3] = {};
  double tolerance = 1;
  bool integer_inputs = false;
  const char* doc = "";
};

namespace m {  // host/device math helpers over M in {float, double}

template <class M>
BCD_HD bool isnan_(M x) {
  return x != x;
}
template <class M>
BCD_HD M rsqrt_(M x) {
#if defined(__CUDA_ARCH__)
  return rsqrt(x);
#else
  return M(1) / std::sqrt(x);
#endif
}
template <class M>
BCD_HD M sigmoid(M x) {
  return M(1) / (M(1) + exp(-x));
}
template <class M>
BCD_HD M softplus(M x) {  // log(1 + e^x), overflow-safe
  return x > M(20) ? x : log1p(exp(x));
}
template <class M>
BCD_HD M clamp_(M x, M lo, M hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}
template <class M>
inline constexpr M kPi = M(3.14159265358979323846);
template <class M>
inline constexpr M kSqrt1_2 = M(0.70710678118654752440);
template <class M>
inline constexpr M kInvSqrt2Pi = M(0.39894228040143267794);
template <class M>
inline constexpr M kSqrt2OverPi = M(0.79788456080286535588);

template <class M>
BCD_HD M gelu_cdf(M x) {
  return M(0.5) * (M(1) + erf(x * kSqrt1_2<M>));
}
template <class M>
BCD_HD M gelu_pdf(M x) {
  return kInvSqrt2Pi<M> * exp(M(-0.5) * x * x);
}

/// Digamma psi(x): reflection below 0, recurrence up to 10, asymptotic series.
template <class M>
BCD_HD M digamma(M x) {
  if (x == floor(x) && x <= M(0)) return x == M(0) ? -INFINITY : NAN;
  M result = 0;
  if (x < M(0)) {
    result = -kPi<M> / tan(kPi<M> * x);
    x = M(1) - x;
  }
  while (x < M(10)) {
    result -= M(1) / x;
    x += M(1);
  }
  M inv2 = M(1) / (x * x);
  M series = inv2 * (M(1) / 12 - inv2 * (M(1) / 120 - inv2 * (M(1) / 252 - inv2 * (M(1) / 240 - inv2 / 132))));
  return result + log(x) - M(0.5) / x - series;
}

/// Trigamma psi'(x), the derivative of digamma.
template <class M>
BCD_HD M trigamma(M x) {
  if (x == floor(x) && x <= M(0)) return INFINITY;
  M result = 0, sign = 1;
  if (x < M(0)) {  // psi1(x) = pi^2 / sin^2(pi x) - psi1(1 - x)
    M s = sin(kPi<M> * x);
    result = kPi<M> * kPi<M> / (s * s);
    sign = -1;
    x = M(1) - x;
  }
  M acc = 0;
  while (x < M(10)) {
    acc += M(1) / (x * x);
    x += M(1);
  }
  M inv = M(1) / x, inv2 = inv * inv;
  M series = inv + inv2 / 2 + inv * inv2 * (M(1) / 6 - inv2 * (M(1) / 30 - inv2 * (M(1) / 42 - inv2 / 30)));
  return result + sign * (acc + series);
}

}  // namespace m

// ================================================================ unary
// fwd(x, p) -> y; deriv(x, p) -> dy/dx. Ops without deriv are not differentiable.

#define BCD_FWD(expr)                                   \
  template <class M>                                    \
  BCD_HD static M fwd([[maybe_unused]] M x, [[maybe_unused]] const Params& p) { \
    return expr;                                        \
  }
#define BCD_DERIV(expr)                                   \
  template <class M>                                      \
  BCD_HD static M deriv([[maybe_unused]] M x, [[maybe_unused]] const Params& p) { \
    return expr;                                          \
  }

// clang-format off
struct Neg { static constexpr Meta meta{"neg", Set::float_int}; BCD_FWD(M(wrapping_neg(x))) BCD_DERIV(M(-1)) };
struct Abs { static constexpr Meta meta{"abs", Set::float_int};
  BCD_FWD(x < M(0) ? M(wrapping_neg(x)) : x) BCD_DERIV(x > M(0) ? M(1) : (x < M(0) ? M(-1) : M(0))) };
struct Sign { static constexpr Meta meta{"sign", Set::float_int};
  BCD_FWD(m::isnan_(x) ? x : M((x > M(0)) - (x < M(0)))) BCD_DERIV(M(0)) };
struct Square { static constexpr Meta meta{"square", Set::float_int}; BCD_FWD(M(wrapping_mul(x, x))) BCD_DERIV(M(2) * x) };
struct Reciprocal { static constexpr Meta meta{"reciprocal", Set::floating, {0.2, 4, true}};
  BCD_FWD(M(1) / x) BCD_DERIV(M(-1) / (x * x)) };
struct Cube { static constexpr Meta meta{"cube", Set::floating}; BCD_FWD(x * x * x) BCD_DERIV(M(3) * x * x) };
struct Sqrt { static constexpr Meta meta{"sqrt", Set::floating, {0.01, 10}};
  BCD_FWD(sqrt(x)) BCD_DERIV(M(0.5) / sqrt(x)) };
struct Rsqrt { static constexpr Meta meta{"rsqrt", Set::floating, {0.01, 10}};
  BCD_FWD(m::rsqrt_(x)) BCD_DERIV(M(-0.5) * m::rsqrt_(x) / x) };
struct Cbrt { static constexpr Meta meta{"cbrt", Set::floating, {0.1, 10, true}};
  BCD_FWD(cbrt(x)) BCD_DERIV(M(1) / (M(3) * cbrt(x) * cbrt(x))) };
struct Exp { static constexpr Meta meta{"exp", Set::floating, {-10, 10}}; BCD_FWD(exp(x)) BCD_DERIV(exp(x)) };
struct Exp2 { static constexpr Meta meta{"exp2", Set::floating, {-10, 10}};
  BCD_FWD(exp2(x)) BCD_DERIV(M(0.69314718055994530942) * exp2(x)) };
struct Expm1 { static constexpr Meta meta{"expm1", Set::floating, {-10, 10}}; BCD_FWD(expm1(x)) BCD_DERIV(exp(x)) };
struct Log { static constexpr Meta meta{"log", Set::floating, {0.01, 10}}; BCD_FWD(log(x)) BCD_DERIV(M(1) / x) };
struct Log2 { static constexpr Meta meta{"log2", Set::floating, {0.01, 10}};
  BCD_FWD(log2(x)) BCD_DERIV(M(1.44269504088896340736) / x) };
struct Log10 { static constexpr Meta meta{"log10", Set::floating, {0.01, 10}};
  BCD_FWD(log10(x)) BCD_DERIV(M(0.43429448190325182765) / x) };
struct Log1p { static constexpr Meta meta{"log1p", Set::floating, {-0.9, 10}};
  BCD_FWD(log1p(x)) BCD_DERIV(M(1) / (M(1) + x)) };
struct Sin { static constexpr Meta meta{"sin", Set::floating, {-6, 6}}; BCD_FWD(sin(x)) BCD_DERIV(cos(x)) };
struct Cos { static constexpr Meta meta{"cos", Set::floating, {-6, 6}}; BCD_FWD(cos(x)) BCD_DERIV(-sin(x)) };
struct Tan { static constexpr Meta meta{"tan", Set::floating, {-1.3, 1.3}};
  BCD_FWD(tan(x)) BCD_DERIV(M(1) + tan(x) * tan(x)) };
struct Asin { static constexpr Meta meta{"asin", Set::floating, {-0.95, 0.95}};
  BCD_FWD(asin(x)) BCD_DERIV(m::rsqrt_(M(1) - x * x)) };
struct Acos { static constexpr Meta meta{"acos", Set::floating, {-0.95, 0.95}};
  BCD_FWD(acos(x)) BCD_DERIV(-m::rsqrt_(M(1) - x * x)) };
struct Atan { static constexpr Meta meta{"atan", Set::floating, {-5, 5}};
  BCD_FWD(atan(x)) BCD_DERIV(M(1) / (M(1) + x * x)) };
struct Sinh { static constexpr Meta meta{"sinh", Set::floating, {-5, 5}}; BCD_FWD(sinh(x)) BCD_DERIV(cosh(x)) };
struct Cosh { static constexpr Meta meta{"cosh", Set::floating, {-5, 5}}; BCD_FWD(cosh(x)) BCD_DERIV(sinh(x)) };
struct Tanh { static constexpr Meta meta{"tanh", Set::floating, {-4, 4}};
  BCD_FWD(tanh(x)) BCD_DERIV(M(1) - tanh(x) * tanh(x)) };
struct Asinh { static constexpr Meta meta{"asinh", Set::floating, {-5, 5}};
  BCD_FWD(asinh(x)) BCD_DERIV(m::rsqrt_(x * x + M(1))) };
struct Acosh { static constexpr Meta meta{"acosh", Set::floating, {1.05, 10}};
  BCD_FWD(acosh(x)) BCD_DERIV(m::rsqrt_(x * x - M(1))) };
struct Atanh { static constexpr Meta meta{"atanh", Set::floating, {-0.95, 0.95}};
  BCD_FWD(atanh(x)) BCD_DERIV(M(1) / (M(1) - x * x)) };
struct Floor { static constexpr Meta meta{"floor", Set::floating, {-10, 10}}; BCD_FWD(floor(x)) BCD_DERIV(M(0)) };
struct Ceil { static constexpr Meta meta{"ceil", Set::floating, {-10, 10}}; BCD_FWD(ceil(x)) BCD_DERIV(M(0)) };
struct Round { static constexpr Meta meta{"round", Set::floating, {-10, 10}, {}, 1, false, "half to even"};
  BCD_FWD(rint(x)) BCD_DERIV(M(0)) };
struct Trunc { static constexpr Meta meta{"trunc", Set::floating, {-10, 10}}; BCD_FWD(trunc(x)) BCD_DERIV(M(0)) };
struct Frac { static constexpr Meta meta{"frac", Set::floating, {-10, 10}}; BCD_FWD(x - trunc(x)) BCD_DERIV(M(1)) };
struct Relu { static constexpr Meta meta{"relu", Set::floating}; BCD_FWD(x > M(0) ? x : M(0)) BCD_DERIV(M(x > M(0))) };
struct Relu6 { static constexpr Meta meta{"relu6", Set::floating, {-3, 9}};
  BCD_FWD(m::clamp_(x, M(0), M(6))) BCD_DERIV(M(x > M(0) && x < M(6))) };
struct Gelu { static constexpr Meta meta{"gelu", Set::floating, {-5, 5}, {}, 1, false, "exact, x * Phi(x)"};
  BCD_FWD(x * m::gelu_cdf(x)) BCD_DERIV(m::gelu_cdf(x) + x * m::gelu_pdf(x)) };
struct GeluTanh { static constexpr Meta meta{"gelu_tanh", Set::floating, {-5, 5}, {}, 1, false, "tanh approximation"};
  BCD_FWD(M(0.5) * x * (M(1) + tanh(m::kSqrt2OverPi<M> * (x + M(0.044715) * x * x * x))))
  template <class M> BCD_HD static M deriv(M x, const Params&) {
    M t = tanh(m::kSqrt2OverPi<M> * (x + M(0.044715) * x * x * x));
    return M(0.5) * (M(1) + t) + M(0.5) * x * (M(1) - t * t) * m::kSqrt2OverPi<M> * (M(1) + M(3 * 0.044715) * x * x);
  } };
struct Silu { static constexpr Meta meta{"silu", Set::floating, {-8, 8}};
  BCD_FWD(x * m::sigmoid(x))
  template <class M> BCD_HD static M deriv(M x, const Params&) {
    M s = m::sigmoid(x);
    return s * (M(1) + x * (M(1) - s));
  } };
struct Mish { static constexpr Meta meta{"mish", Set::floating, {-8, 8}};
  BCD_FWD(x * tanh(m::softplus(x)))
  template <class M> BCD_HD static M deriv(M x, const Params&) {
    M t = tanh(m::softplus(x));
    return t + x * (M(1) - t * t) * m::sigmoid(x);
  } };
struct Sigmoid { static constexpr Meta meta{"sigmoid", Set::floating, {-8, 8}};
  BCD_FWD(m::sigmoid(x))
  template <class M> BCD_HD static M deriv(M x, const Params&) {
    M s = m::sigmoid(x);
    return s * (M(1) - s);
  } };
struct Softplus { static constexpr Meta meta{"softplus", Set::floating, {-8, 8}, {{"beta", 1}, {"threshold", 20}}};
  BCD_FWD(x * p.get<M>(0) > p.get<M>(1) ? x : log1p(exp(x * p.get<M>(0))) / p.get<M>(0))
  BCD_DERIV(x * p.get<M>(0) > p.get<M>(1) ? M(1) : m::sigmoid(x * p.get<M>(0))) };
struct Hardswish { static constexpr Meta meta{"hardswish", Set::floating, {-5, 5}};
  BCD_FWD(x * m::clamp_(x + M(3), M(0), M(6)) / M(6))
  BCD_DERIV(x <= M(-3) ? M(0) : (x < M(3) ? x / M(3) + M(0.5) : M(1))) };  // torch's values at +-3
struct Hardsigmoid { static constexpr Meta meta{"hardsigmoid", Set::floating, {-5, 5}};
  BCD_FWD(m::clamp_(x + M(3), M(0), M(6)) / M(6)) BCD_DERIV(x > M(-3) && x < M(3) ? M(1) / M(6) : M(0)) };
struct Hardtanh { static constexpr Meta meta{"hardtanh", Set::floating, {-3, 3}, {{"min_val", -1}, {"max_val", 1}}};
  BCD_FWD(m::clamp_(x, p.get<M>(0), p.get<M>(1))) BCD_DERIV(M(x > p.get<M>(0) && x < p.get<M>(1))) };
struct Erf { static constexpr Meta meta{"erf", Set::floating, {-3, 3}};
  BCD_FWD(erf(x)) BCD_DERIV(M(1.12837916709551257390) * exp(-x * x)) };
struct Erfc { static constexpr Meta meta{"erfc", Set::floating, {-3, 3}};
  BCD_FWD(erfc(x)) BCD_DERIV(M(-1.12837916709551257390) * exp(-x * x)) };
struct Lgamma { static constexpr Meta meta{"lgamma", Set::floating, {0.1, 10}, {}, 4};
  BCD_FWD(lgamma(x)) BCD_DERIV(m::digamma(x)) };
struct Digamma { static constexpr Meta meta{"digamma", Set::floating, {0.1, 10}, {}, 4};
  BCD_FWD(m::digamma(x)) BCD_DERIV(m::trigamma(x)) };
struct Logit { static constexpr Meta meta{"logit", Set::floating, {0.02, 0.98}, {{"eps", -1}}, 2,  false,
                                          "eps < 0: no clamping"};
  template <class M> BCD_HD static M fwd(M x, const Params& p) {
    M eps = p.get<M>(0);
    if (eps >= M(0)) x = m::clamp_(x, eps, M(1) - eps);
    return log(x / (M(1) - x));
  }
  template <class M> BCD_HD static M deriv(M x, const Params& p) {
    M eps = p.get<M>(0);
    if (eps >= M(0) && (x < eps || x > M(1) - eps)) return M(0);
    return M(1) / (x * (M(1) - x));
  } };
struct Softsign { static constexpr Meta meta{"softsign", Set::floating, {-5, 5}};
  BCD_FWD(x / (M(1) + (x < M(0) ? -x : x)))
  template <class M> BCD_HD static M deriv(M x, const Params&) {
    M d = M(1) + (x < M(0) ? -x : x);
    return M(1) / (d * d);
  } };
struct Tanhshrink { static constexpr Meta meta{"tanhshrink", Set::floating, {-4, 4}, {}, 8};
  BCD_FWD(x - tanh(x)) BCD_DERIV(tanh(x) * tanh(x)) };
struct Selu { static constexpr Meta meta{"selu", Set::floating, {-5, 5}};
  static constexpr double kAlpha = 1.6732632423543772848170429916717, kScale = 1.0507009873554804934193349852946;
  BCD_FWD(M(kScale) * (x > M(0) ? x : M(kAlpha) * expm1(x))) BCD_DERIV(x > M(0) ? M(kScale) : M(kScale * kAlpha) * exp(x)) };
struct LeakyRelu { static constexpr Meta meta{"leaky_relu", Set::floating, {-3, 3}, {{"negative_slope", 0.01}}};
  BCD_FWD(x > M(0) ? x : x * p.get<M>(0)) BCD_DERIV(x > M(0) ? M(1) : p.get<M>(0)) };
struct Elu { static constexpr Meta meta{"elu", Set::floating, {-5, 5}, {{"alpha", 1}}};
  BCD_FWD(x > M(0) ? x : p.get<M>(0) * expm1(x)) BCD_DERIV(x > M(0) ? M(1) : p.get<M>(0) * exp(x)) };
struct Celu { static constexpr Meta meta{"celu", Set::floating, {-5, 5}, {{"alpha", 1}}};
  BCD_FWD(x > M(0) ? x : p.get<M>(0) * expm1(x / p.get<M>(0))) BCD_DERIV(x > M(0) ? M(1) : exp(x / p.get<M>(0))) };
struct Hardshrink { static constexpr Meta meta{"hardshrink", Set::floating, {-2, 2}, {{"lambd", 0.5}}};
  BCD_FWD(x >= -p.get<M>(0) && x <= p.get<M>(0) ? M(0) : x) BCD_DERIV(M(x < -p.get<M>(0) || x > p.get<M>(0))) };
struct Softshrink { static constexpr Meta meta{"softshrink", Set::floating, {-2, 2}, {{"lambd", 0.5}}};
  BCD_FWD(x > p.get<M>(0) ? x - p.get<M>(0) : (x < -p.get<M>(0) ? x + p.get<M>(0) : M(0)))
  BCD_DERIV(M(x < -p.get<M>(0) || x > p.get<M>(0))) };
struct Step { static constexpr Meta meta{"step", Set::floating, {-2, 2}, {}, 1, false, "1 where x > 0, else 0"};
  BCD_FWD(M(x > M(0))) BCD_DERIV(M(0)) };
struct Threshold { static constexpr Meta meta{"threshold", Set::floating, {-2, 2}, {{"threshold", 0}, {"value", 0}}};
  BCD_FWD(x > p.get<M>(0) ? x : p.get<M>(1)) BCD_DERIV(M(x > p.get<M>(0))) };
struct PowScalar { static constexpr Meta meta{"pow_scalar", Set::floating, {0.1, 3}, {{"exponent", 2}}};
  BCD_FWD(pow(x, p.get<M>(0)))
  BCD_DERIV(p.get<M>(0) == M(0) ? M(0) : p.get<M>(0) * pow(x, p.get<M>(0) - M(1))) };
struct Affine { static constexpr Meta meta{"affine", Set::floating, {-2, 2}, {{"scale", 1}, {"shift", 0}}, 1, false,
                                           "scale * x + shift"};
  BCD_FWD(p.get<M>(0) * x + p.get<M>(1)) BCD_DERIV(p.get<M>(0)) };
// Integer/bool unary ops (no gradient).
struct BitwiseNot { static constexpr Meta meta{"bitwise_not", Set::int_bool};
  template <class M> BCD_HD static M fwd(M x, const Params&) {
    if constexpr (std::is_same_v<M, bool>) return !x; else return M(~x);
  } };
// clang-format on

// Predicates: any float (or any real) -> bool.
struct IsNan {
  static constexpr Meta meta{"isnan", Set::floating, {-2, 2, false, true}};
  template <class M> BCD_HD static bool fwd(M x, const Params&) { return m::isnan_(x); }
};
struct IsInf {
  static constexpr Meta meta{"isinf", Set::floating, {-2, 2, false, true}};
  template <class M> BCD_HD static bool fwd(M x, const Params&) { return x == M(INFINITY) || x == M(-INFINITY); }
};
struct IsFinite {
  static constexpr Meta meta{"isfinite", Set::floating, {-2, 2, false, true}};
  template <class M> BCD_HD static bool fwd(M x, const Params&) { return x - x == M(0); }
};
struct LogicalNot {
  static constexpr Meta meta{"logical_not", Set::real};
  template <class M> BCD_HD static bool fwd(M x, const Params&) { return x == M(0); }
};

#undef BCD_FWD
#undef BCD_DERIV

// ================================================================ binary
// fwd(a, b, p) -> y; bwd(dy, a, b, p) -> {da, db}.

template <class M>
BCD_HD M floor_divide(M a, M b) {
  if constexpr (std::is_integral_v<M>) {
    if (b == M(0)) return M(0);  // defined as 0 (torch raises on the CPU)
    // min / -1 overflows (x86 traps): -a wraps to min, as torch's does.
    if constexpr (std::is_signed_v<M>)
      if (b == M(-1)) return wrapping_neg(a);
    M q = M(a / b);
    if constexpr (std::is_signed_v<M>)
      if (M(a % b) != M(0) && ((a < M(0)) != (b < M(0)))) q = M(q - 1);
    return q;
  } else {
    if (b == M(0)) return a / b;
    M mod = fmod(a, b);
    M div = (a - mod) / b;
    if (mod != M(0) && ((b < M(0)) != (mod < M(0)))) div -= M(1);
    M q = floor(div);
    if (div - q > M(0.5)) q += M(1);
    return div == M(0) ? copysign(M(0), a / b) : q;
  }
}

template <class M>
BCD_HD M fmod_(M a, M b) {
  // Integer modulo 0 gives 0; modulo -1 is 0, and min % -1 overflows (x86 traps).
  if constexpr (std::is_integral_v<M>) return b == M(0) || (std::is_signed_v<M> && b == M(-1)) ? M(0) : M(a % b);
  else return fmod(a, b);
}

template <class M>
BCD_HD M python_remainder(M a, M b) {
  M r = fmod_(a, b);
  if constexpr (std::is_signed_v<M> || !std::is_integral_v<M>)
    if (r != M(0) && ((r < M(0)) != (b < M(0)))) r = M(r + b);
  return r;
}

// clang-format off
struct Add { static constexpr Meta meta{"add", Set::float_int, {-2, 2}, {{"alpha", 1}}, 1, false, "input + alpha * other"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params& p) { return M(wrapping_add(a, wrapping_mul(p.get<M>(0), b))); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M, M, const Params& p) { return {{dy, p.get<M>(0) * dy}}; } };
struct Sub { static constexpr Meta meta{"sub", Set::float_int, {-2, 2}, {{"alpha", 1}}, 1, false, "input - alpha * other"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params& p) { return M(wrapping_sub(a, wrapping_mul(p.get<M>(0), b))); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M, M, const Params& p) { return {{dy, -p.get<M>(0) * dy}}; } };
struct Mul { static constexpr Meta meta{"mul", Set::float_int};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return M(wrapping_mul(a, b)); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) { return {{dy * b, dy * a}}; } };
struct Div { static constexpr Meta meta{"div", Set::floating, {0.5, 2, true}};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return a / b; }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) { return {{dy / b, -dy * a / (b * b)}}; } };
struct Pow { static constexpr Meta meta{"pow", Set::floating, {0.2, 3}, {}, 2};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return pow(a, b); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    M da = b == M(0) ? M(0) : dy * b * pow(a, b - M(1));
    M db = (a == M(0) && b >= M(0)) ? M(0) : dy * pow(a, b) * log(a);
    return {{da, db}};
  } };
struct Atan2 { static constexpr Meta meta{"atan2", Set::floating, {0.2, 3, true}};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return atan2(a, b); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    M r = dy / (a * a + b * b);
    return {{r * b, -r * a}};
  } };
struct Hypot { static constexpr Meta meta{"hypot", Set::floating, {0.2, 3, true}};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return hypot(a, b); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    M h = hypot(a, b);
    return {{dy * a / h, dy * b / h}};
  } };
struct Copysign { static constexpr Meta meta{"copysign", Set::floating, {0.2, 3, true}};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return copysign(a, b); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    M s = a == M(0) ? M(0) : copysign(M(1), a) * copysign(M(1), b);
    return {{dy * s, M(0)}};
  } };
struct Nextafter { static constexpr Meta meta{"nextafter", Set::floating, {-2, 2}, {}, 1, false,
                                              "the next value of input's dtype toward other"};
  // Steps in the storage format, not in the math type (see Forward).
  static constexpr bool kStorageMath = true;
  template <class T> BCD_HD static T fwd(T a, T b, const Params&) {
    using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    const auto wa = widen(a), wb = widen(b);
    if (wa != wa || wb != wb) return convert<T>(wa + wb);
    if (wa == wb) return b;
    Bits bits;
    if (wa == 0) {  // the smallest subnormal, with the sign of the direction
      bits = Bits(1) | (wb < 0 ? Bits(Bits(1) << (8 * sizeof(T) - 1)) : Bits(0));
    } else {
      memcpy(&bits, static_cast<const void*>(&a), sizeof(T));
      bits = (wa < wb) == (wa > 0) ? Bits(bits + 1) : Bits(bits - 1);
    }
    T out;
    memcpy(static_cast<void*>(&out), &bits, sizeof(T));
    return out;
  } };
struct Fmax { static constexpr Meta meta{"fmax", Set::floating, {-2, 2, false, true}, {}, 1, false, "ignores NaN"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return fmax(a, b); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    bool to_a = a >= b || m::isnan_(b);
    return {{to_a ? dy : M(0), to_a ? M(0) : dy}};
  } };
struct Fmin { static constexpr Meta meta{"fmin", Set::floating, {-2, 2, false, true}, {}, 1, false, "ignores NaN"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return fmin(a, b); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    bool to_a = a <= b || m::isnan_(b);
    return {{to_a ? dy : M(0), to_a ? M(0) : dy}};
  } };
struct Maximum { static constexpr Meta meta{"maximum", Set::float_int, {-2, 2, false, true}, {}, 1, false, "propagates NaN"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) {
    if constexpr (!std::is_integral_v<M>) if (m::isnan_(a) || m::isnan_(b)) return a + b;
    return a > b ? a : b;
  }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {  // ties split evenly
    M wa = a > b ? M(1) : (a == b ? M(0.5) : M(0));
    return {{dy * wa, dy * (M(1) - wa)}};
  } };
struct Minimum { static constexpr Meta meta{"minimum", Set::float_int, {-2, 2, false, true}, {}, 1, false, "propagates NaN"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) {
    if constexpr (!std::is_integral_v<M>) if (m::isnan_(a) || m::isnan_(b)) return a + b;
    return a < b ? a : b;
  }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    M wa = a < b ? M(1) : (a == b ? M(0.5) : M(0));
    return {{dy * wa, dy * (M(1) - wa)}};
  } };
struct FloorDivide { static constexpr Meta meta{"floor_divide", Set::float_int, {1, 9, true}, {}, 1, true,
                                                "floor(input / other); integer division by 0 gives 0"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return floor_divide(a, b); } };
struct Fmod { static constexpr Meta meta{"fmod", Set::float_int, {0.5, 5, true}, {}, 1, false,
                                         "C fmod: the sign of input; integer modulo 0 gives 0"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return fmod_(a, b); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) { return {{dy, -dy * trunc(a / b)}}; } };
struct Remainder { static constexpr Meta meta{"remainder", Set::float_int, {0.5, 5, true}, {}, 1, false,
                                              "Python modulo: the sign of other; integer modulo 0 gives 0"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return python_remainder(a, b); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) { return {{dy, -dy * floor(a / b)}}; } };
struct Prelu { static constexpr Meta meta{"prelu", Set::floating, {-2, 2}, {}, 1, false,
                                          "x > 0 ? x : weight * x (weight broadcasts)"};
  template <class M> BCD_HD static M fwd(M x, M w, const Params&) { return x > M(0) ? x : w * x; }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M x, M w, const Params&) {
    return {{x > M(0) ? dy : dy * w, x > M(0) ? M(0) : dy * x}};
  } };
// Integer / bool bit ops.
struct BitwiseAnd { static constexpr Meta meta{"bitwise_and", Set::int_bool};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return M(a & b); } };
struct BitwiseOr { static constexpr Meta meta{"bitwise_or", Set::int_bool};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return M(a | b); } };
struct BitwiseXor { static constexpr Meta meta{"bitwise_xor", Set::int_bool};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return M(a ^ b); } };
struct ShiftLeft { static constexpr Meta meta{"bitwise_left_shift", Set::integral, {0, 9}, {}, 1, true,
                                              "shift counts outside [0, bits) give 0"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) {
    using U = std::make_unsigned_t<M>;
    return (b < M(0) || int64_t(b) >= int64_t(8 * sizeof(M))) ? M(0) : M(U(a) << b);
  } };
struct ShiftRight { static constexpr Meta meta{"bitwise_right_shift", Set::integral, {0, 9}, {}, 1, true,
                                               "arithmetic for signed types; counts >= bits give 0 or -1"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) {
    if (b < M(0) || int64_t(b) >= int64_t(8 * sizeof(M))) return a < M(0) ? M(-1) : M(0);
    return M(a >> b);
  } };

// Comparisons and logical ops: -> bool.
struct Eq { static constexpr Meta meta{"eq", Set::real, {-2, 2}, {}, 1, true};
  template <class M> BCD_HD static bool fwd(M a, M b, const Params&) { return a == b; } };
struct Ne { static constexpr Meta meta{"ne", Set::real, {-2, 2}, {}, 1, true};
  template <class M> BCD_HD static bool fwd(M a, M b, const Params&) { return a != b; } };
struct Lt { static constexpr Meta meta{"lt", Set::real, {-2, 2}, {}, 1, true};
  template <class M> BCD_HD static bool fwd(M a, M b, const Params&) { return a < b; } };
struct Le { static constexpr Meta meta{"le", Set::real, {-2, 2}, {}, 1, true};
  template <class M> BCD_HD static bool fwd(M a, M b, const Params&) { return a <= b; } };
struct Gt { static constexpr Meta meta{"gt", Set::real, {-2, 2}, {}, 1, true};
  template <class M> BCD_HD static bool fwd(M a, M b, const Params&) { return a > b; } };
struct Ge { static constexpr Meta meta{"ge", Set::real, {-2, 2}, {}, 1, true};
  template <class M> BCD_HD static bool fwd(M a, M b, const Params&) { return a >= b; } };
struct LogicalAnd { static constexpr Meta meta{"logical_and", Set::real, {-1, 1}, {}, 1, true};
  template <class M> BCD_HD static bool fwd(M a, M b, const Params&) { return a != M(0) && b != M(0); } };
struct LogicalOr { static constexpr Meta meta{"logical_or", Set::real, {-1, 1}, {}, 1, true};
  template <class M> BCD_HD static bool fwd(M a, M b, const Params&) { return a != M(0) || b != M(0); } };
struct LogicalXor { static constexpr Meta meta{"logical_xor", Set::real, {-1, 1}, {}, 1, true};
  template <class M> BCD_HD static bool fwd(M a, M b, const Params&) { return (a != M(0)) != (b != M(0)); } };

// ================================================================ gated (x split in halves a | b)
struct Glu { static constexpr Meta meta{"glu", Set::floating, {-4, 4}, {{"dim", -1}}, 1, false, "a * sigmoid(b)"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return a * m::sigmoid(b); }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    M s = m::sigmoid(b);
    return {{dy * s, dy * a * s * (M(1) - s)}};
  } };
struct Reglu { static constexpr Meta meta{"reglu", Set::floating, {-4, 4}, {{"dim", -1}}, 1, false, "relu(a) * b"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return (a > M(0) ? a : M(0)) * b; }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    return {{a > M(0) ? dy * b : M(0), a > M(0) ? dy * a : M(0)}};
  } };
struct Swiglu { static constexpr Meta meta{"swiglu", Set::floating, {-4, 4}, {{"dim", -1}}, 1, false, "silu(a) * b"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return Silu::fwd(a, Params{}) * b; }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    return {{dy * b * Silu::deriv(a, Params{}), dy * Silu::fwd(a, Params{})}};
  } };
struct Geglu { static constexpr Meta meta{"geglu", Set::floating, {-4, 4}, {{"dim", -1}}, 1, false, "gelu(a) * b"};
  template <class M> BCD_HD static M fwd(M a, M b, const Params&) { return Gelu::fwd(a, Params{}) * b; }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, M a, M b, const Params&) {
    return {{dy * b * Gelu::deriv(a, Params{}), dy * Gelu::fwd(a, Params{})}};
  } };

// ================================================================ ternary
struct Clamp { static constexpr Meta meta{"clamp", Set::float_int, {-2, 2}, {}, 1, false,
                                          "min(max(input, min), max)"};
  template <class M> BCD_HD static M fwd(M x, M lo, M hi, const Params&) {
    if constexpr (!std::is_integral_v<M>) if (m::isnan_(x)) return x;
    M y = x < lo ? lo : x;
    return y > hi ? hi : y;
  }
  template <class M> BCD_HD static Grads<M, 3> bwd(M dy, M x, M lo, M hi, const Params&) {
    bool to_hi = (x < lo ? lo : x) > hi;
    bool to_lo = !to_hi && x < lo;
    bool to_x = !to_hi && !to_lo;
    return {{to_x ? dy : M(0), to_lo ? dy : M(0), to_hi ? dy : M(0)}};
  } };
struct Fma { static constexpr Meta meta{"fma", Set::floating, {-2, 2}, {}, 1, false, "a * b + c"};
  template <class M> BCD_HD static M fwd(M a, M b, M c, const Params&) { return fma(a, b, c); }
  template <class M> BCD_HD static Grads<M, 3> bwd(M dy, M a, M b, M, const Params&) { return {{dy * b, dy * a, dy}}; } };
struct Addcmul { static constexpr Meta meta{"addcmul", Set::floating, {-2, 2}, {{"value", 1}}, 1, false,
                                            "input + value * tensor1 * tensor2"};
  template <class M> BCD_HD static M fwd(M x, M t1, M t2, const Params& p) { return x + p.get<M>(0) * t1 * t2; }
  template <class M> BCD_HD static Grads<M, 3> bwd(M dy, M, M t1, M t2, const Params& p) {
    M v = p.get<M>(0) * dy;
    return {{dy, v * t2, v * t1}};
  } };
struct Addcdiv { static constexpr Meta meta{"addcdiv", Set::floating, {0.5, 2, true}, {{"value", 1}}, 1, false,
                                            "input + value * tensor1 / tensor2"};
  template <class M> BCD_HD static M fwd(M x, M t1, M t2, const Params& p) { return x + p.get<M>(0) * t1 / t2; }
  template <class M> BCD_HD static Grads<M, 3> bwd(M dy, M, M t1, M t2, const Params& p) {
    M v = p.get<M>(0) * dy;
    return {{dy, v / t2, -v * t1 / (t2 * t2)}};
  } };
struct Lerp { static constexpr Meta meta{"lerp", Set::floating, {-2, 2}, {}, 1, false, "input + weight * (end - input)"};
  template <class M> BCD_HD static M fwd(M a, M b, M w, const Params&) {
    return (w < M(0.5) && w > M(-0.5)) ? a + w * (b - a) : b - (b - a) * (M(1) - w);
  }
  template <class M> BCD_HD static Grads<M, 3> bwd(M dy, M a, M b, M w, const Params&) {
    return {{dy * (M(1) - w), dy * w, dy * (b - a)}};
  } };

// ================================================================ selection, cast, fill
struct Where { static constexpr Meta meta{"where", Set::all, {-2, 2}, {}, 1, false, "condition ? input : other"};
  template <class M> BCD_HD static M fwd(bool c, M a, M b, const Params&) { return c ? a : b; }
  template <class M> BCD_HD static Grads<M, 2> bwd(M dy, bool c, const Params&) { return {{c ? dy : M(0), c ? M(0) : dy}}; } };
struct Cast { static constexpr Meta meta{"cast", Set::all, {-100, 100}, {{"dtype", 0}}, 1, false,
                                         "converts to the dtype given by its code; float->int truncates "
                                         "and saturates, NaN->0"};
  template <class M> BCD_HD static M fwd(M x, const Params&) { return x; } };
struct Fill { static constexpr Meta meta{"fill", Set::all, {-2, 2}, {{"value", 0}}};
  template <class M> BCD_HD static M fwd(const Params& p) { return convert<M>(p.v[0]); } };
// clang-format on

}  // namespace baracuda::ew
