// The softmax family's math, shared by the CUDA kernels and the host
// reference. Forward over a row x (z = sign * x):
//   m = max z,  s = sum exp(z - m),  out = f(z, m, s).
// Backward from (grad g, forward output y): one row sum t = sum term(g, y),
// then grad_input = grad(g, y, t).
#pragma once

#include <cmath>

#include "core/dtype_traits.hpp"

namespace baracuda::smax {

template <int Kind>  // 0 softmax, 1 log_softmax, 2 softmin
struct Softmax {
  static constexpr const char* name = Kind == 0 ? "softmax" : Kind == 1 ? "log_softmax" : "softmin";
  static constexpr const char* doc = Kind == 0 ? "exp(x) / sum(exp(x)) along dim"
                                     : Kind == 1 ? "x - log(sum(exp(x))) along dim"
                                                 : "softmax(-x) along dim";
  static constexpr bool kLog = Kind == 1;
  template <class M> static BCD_HD M sign() { return Kind == 2 ? M(-1) : M(1); }
  template <class M> static BCD_HD M out(M z, M max, M sum) {
    if constexpr (kLog) return z - max - log(sum);
    else return exp(z - max) / sum;
  }
  /// Backward row sum: sum(g * y), or sum(g) for log_softmax.
  template <class M> static BCD_HD M term(M g, M y) {
    if constexpr (kLog) return g;
    else return g * y;
  }
  template <class M> static BCD_HD M grad(M g, M y, M t) {
    if constexpr (kLog) return g - exp(y) * t;
    else return sign<M>() * y * (g - t);
  }
};

template <class... Ops>
struct OpList {};
using SoftmaxOps = OpList<Softmax<0>, Softmax<1>, Softmax<2>>;

/// Storage types: the four floats and both fp8 formats.
using SoftmaxTypes = Concat<FloatTypes, Fp8Types>::type;

}  // namespace baracuda::smax
