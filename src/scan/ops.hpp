// The scans as associative combines over a state S, for the CUDA kernels:
// lift(x, i) makes the state of element i; combine(a, b) with a before b;
// value(s) is the output. The forward combines also commute, the gradients'
// (affine maps, segmented sums) do not: the kernels combine every partial
// result in element order (deterministic, not sequential).
#pragma once

#include <cmath>
#include <type_traits>

#include "core/dtype_traits.hpp"
#include "core/wrapping.hpp"

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
  static BCD_HD S combine(S a, S b) { return wrapping_add(a, b); }
};

template <class M>
struct CumProd {
  static constexpr const char* name = "cumprod";
  using S = M;
  static BCD_HD S identity() { return S(1); }
  static BCD_HD S lift(M x, int64_t) { return x; }
  static BCD_HD S combine(S a, S b) { return wrapping_mul(a, b); }
};

/// Combines of one arithmetic instruction (the single-pass kernel's choice of tile path).
template <class Op>
struct cheap_combine : std::false_type {};
template <class M>
struct cheap_combine<CumSum<M>> : std::true_type {};
template <class M>
struct cheap_combine<CumProd<M>> : std::true_type {};

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

// ---------------------------------------------------------------- gradients
// Note [Scan gradients as reversed scans]
// Each backward op is an inclusive scan run from the end of the row (the
// views are reversed along dim; e below counts from the end):
//  - cumprod: dx_i = out_{i-1} * R_i with R_i = g_i + x_{i+1} R_{i+1}, a
//    linear recurrence, i.e. a scan of affine maps r -> a r + b. Exact with
//    any number of zeros and no division (torch divides by x where it has no
//    zero and treats the first zero apart; the values agree).
//  - logcumsumexp: dx_i = exp(x_i) * sum_{j >= i} g_j exp(-y_j), the sum kept
//    as s * exp(m) with m the largest exponent so far, so neither overflows
//    (torch splits g into positive and negative parts, each in log space).
//  - cummax/cummin: indices are non-decreasing along the row with idx_j <= j,
//    so the j with idx_j = k form one run starting at k: dx_k is the sum of
//    that run (a segmented sum, heads where the index changes) when
//    idx_k == k, else 0. No scatter, no atomics. Indices no running extreme
//    has: the host reference rejects them (run cannot check on the GPU); the
//    CUDA kernel still writes each position once, never out of bounds, with
//    values that are then unspecified.
// The kernels read the input and the saved operand one position away from
// the one they write: grad_input may share grad_output's memory only.

/// Composition of affine maps r -> a r + b (the right operand applied last).
template <class M>
struct Affine {
  M a, b;
};
template <class M>
struct AffineScan {
  static constexpr const char* name = "cumprod_backward";
  using S = Affine<M>;
  static BCD_HD S identity() { return S{M(1), M(0)}; }
  static BCD_HD S combine(S p, S q) { return S{q.a * p.a, q.a * p.b + q.b}; }
};

/// s * exp(m); m = -inf is zero.
template <class M>
struct Scaled {
  M m, s;
};
template <class M>
struct ScaledSum {
  static constexpr const char* name = "logcumsumexp_backward";
  using S = Scaled<M>;
  static BCD_HD S identity() { return S{M(-INFINITY), M(0)}; }
  static BCD_HD S combine(S p, S q) {
    if (p.m == M(-INFINITY)) return q;
    if (q.m == M(-INFINITY)) return p;
    if (p.m >= q.m) return S{p.m, p.s + q.s * exp(q.m - p.m)};
    return S{q.m, p.s * exp(p.m - q.m) + q.s};  // and NaN propagates
  }
  /// exp(x) times the sum, exactly 0 for an empty one.
  static BCD_HD M scale(S t, M x) { return t.s == M(0) ? M(0) : exp(x + t.m) * t.s; }
};

/// A sum that restarts at every head (head: the first element of a segment).
template <class M>
struct Segment {
  M sum;
  int32_t head;
};
template <class M>
struct SegmentedSum {
  static constexpr const char* name = "cumextreme_backward";
  using S = Segment<M>;
  static BCD_HD S identity() { return S{M(0), 0}; }
  static BCD_HD S combine(S p, S q) { return S{q.head ? q.sum : p.sum + q.sum, p.head | q.head}; }
};

}  // namespace baracuda::scan
