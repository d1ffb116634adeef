// The scans as associative, commutative combines over a state S, for the
// CUDA kernels: lift(x, i) makes the state of element i; combine(a, b) with
// a before b; value(s) is the output. Commutativity lets partial results be
// formed in any fixed order (deterministic, not sequential).
#pragma once

#include <cmath>

#include "core/dtype_traits.hpp"

namespace baracuda::scan {

/// Math type: f32 for halves, f64 for f64, i64 for integers and bool.
template <class T>
using scan_math_t = std::conditional_t<is_float_v<T>, math_t<T, false>, int64_t>;

template <class M>
struct CumSum {
  static constexpr const char* name = "cumsum";
  using S = M;
  static BCD_HD S identity() { return S(0); }
  static BCD_HD S lift(M x, int64_t) { return x; }
  static BCD_HD S combine(S a, S b) { return a + b; }
};

template <class M>
struct CumProd {
  static constexpr const char* name = "cumprod";
  using S = M;
  static BCD_HD S identity() { return S(1); }
  static BCD_HD S lift(M x, int64_t) { return x; }
  static BCD_HD S combine(S a, S b) { return a * b; }
};

/// log(exp(a) + exp(b)); -inf is the identity, NaN propagates.
template <class M>
struct LogCumSumExp {
  static constexpr const char* name = "logcumsumexp";
  using S = M;
  static BCD_HD S identity() { return S(-INFINITY); }
  static BCD_HD S lift(M x, int64_t) { return x; }
  static BCD_HD S combine(S a, S b) {
    if (a != a || b != b) return a + b;
    const S hi = a > b ? a : b, lo = a > b ? b : a;
    if (lo == -INFINITY) return hi;
    if (hi == INFINITY) return hi;
    return hi + log1p(exp(lo - hi));
  }
};

template <class M>
struct Extreme {
  M v;
  int64_t i;
};

/// torch's running max/min: NaN ranks above every number, ties go to the
/// later index; a max over the total order (rank, index), hence associative
/// and commutative.
template <class M, bool kMax>
struct CumExtreme {
  static constexpr const char* name = kMax ? "cummax" : "cummin";
  using S = Extreme<M>;
  static BCD_HD S identity() { return S{M(0), -1}; }
  static BCD_HD S lift(M x, int64_t i) { return S{x, i}; }
  static BCD_HD bool above(M a, M b) {  // a ranks strictly above b
    if (a != a) return b == b;
    if (b != b) return false;
    return kMax ? a > b : a < b;
  }
  static BCD_HD S combine(S a, S b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (above(a.v, b.v)) return a;
    if (above(b.v, a.v)) return b;
    return a.i > b.i ? a : b;
  }
};

}  // namespace baracuda::scan
