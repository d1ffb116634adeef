// Reductions as reducers shared by the CUDA kernels and the host reference:
// an accumulator with init / step / merge / finish. `step` sees elements in
// increasing index order within one thread; `merge(a, b)` joins the results of
// two index ranges, a before b; both are deterministic and order-exact for
// the arg reducers (ties go to the smaller index).
#pragma once

#include <cmath>
#include <limits>

#include "baracuda/registry.hpp"
#include "core/dtype_traits.hpp"
#include "core/wrapping.hpp"

namespace baracuda::red {

/// Attribute values a reducer reads.
struct RParams {
  double p = 2;           ///< norm order
  double correction = 1;  ///< var/std: divide by n - correction
};

/// Which input dtypes an op takes, and what it outputs.
enum class InSet : uint8_t { floating, real };  // floating: FP incl. fp8; real: FP, ints, bool
enum class OutRule : uint8_t {
  same,         ///< the input dtype
  widen_ints,   ///< the input dtype for floats, i64 for ints and bool (torch's sum/prod)
  index,        ///< i64 (or i32 through the index_dtype attribute)
  boolean,      ///< bool
  count,        ///< i64
};

struct RMeta {
  const char* name;
  InSet inputs;
  OutRule out;
  bool has_identity;  ///< an empty reduction has a value (sum: 0); else it is an error
  double tolerance = 1;
  const char* doc = "";
};

/// The accumulator type of the additive reducers: f32 on the GPU for f32 and
/// smaller floats, f64 for f64 and on the host; i64 for ints and bool.
template <class T, bool Host>
using wide_t = std::conditional_t<is_float_v<T>, math_t<T, Host>, int64_t>;

template <class T>
BCD_HD bool is_nan_value(T x) {
  if constexpr (is_float_v<T>) return x != x;
  else return false;
}

struct Sum {
  static constexpr RMeta meta{"sum", InSet::real, OutRule::widen_ints, true, 1, "sum over dims"};
  template <class T, bool Host> using Acc = wide_t<T, Host>;
  template <class A> static BCD_HD A init(const RParams&) { return A(0); }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t, const RParams&) { return wrapping_add(a, A(x)); }
  template <class A> static BCD_HD A merge(A a, A b, const RParams&) { return wrapping_add(a, b); }
  template <class A> static BCD_HD A finish(A a, int64_t, const RParams&) { return a; }
};

/// Sum's accumulation, divided by the count at the end.
struct Mean : Sum {
  static constexpr RMeta meta{"mean", InSet::floating, OutRule::same, true, 1, "mean over dims (NaN when empty)"};
  template <class A> static BCD_HD A finish(A a, int64_t n, const RParams&) { return a / A(n); }
};

struct Prod {
  static constexpr RMeta meta{"prod", InSet::real, OutRule::widen_ints, true, 4, "product over dims"};
  template <class T, bool Host> using Acc = wide_t<T, Host>;
  template <class A> static BCD_HD A init(const RParams&) { return A(1); }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t, const RParams&) { return wrapping_mul(a, A(x)); }
  template <class A> static BCD_HD A merge(A a, A b, const RParams&) { return wrapping_mul(a, b); }
  template <class A> static BCD_HD A finish(A a, int64_t, const RParams&) { return a; }
};

/// max and min: NaN wins (torch's amax/amin); ints compare in their own type.
template <bool IsMax>
struct Extreme {
  static constexpr RMeta meta{IsMax ? "amax" : "amin", InSet::real, OutRule::same, false, 0,
                              IsMax ? "maximum over dims (NaN propagates)" : "minimum over dims (NaN propagates)"};
  template <class T, bool Host> using Acc = std::conditional_t<is_float_v<T>, math_t<T, Host>, T>;
  template <class A> static BCD_HD A init(const RParams&) {
    if constexpr (std::is_floating_point_v<A>) return IsMax ? -INFINITY : INFINITY;
    else return IsMax ? std::numeric_limits<A>::lowest() : std::numeric_limits<A>::max();
  }
  template <class A> static BCD_HD A pick(A a, A b) {
    if (is_nan_value(a)) return a;
    if (is_nan_value(b)) return b;
    return (IsMax ? b > a : b < a) ? b : a;
  }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t, const RParams&) { return pick(a, A(x)); }
  template <class A> static BCD_HD A merge(A a, A b, const RParams&) { return pick(a, b); }
  template <class A> static BCD_HD A finish(A a, int64_t, const RParams&) { return a; }
};
using Amax = Extreme<true>;
using Amin = Extreme<false>;

template <class M>
struct ValueIndex {
  M value;
  int64_t index;  ///< -1: nothing seen yet
};

/// argmax / argmin: the first index of the extreme value; NaN counts as the
/// extreme (torch).
template <bool IsMax>
struct ArgExtreme {
  static constexpr RMeta meta{IsMax ? "argmax" : "argmin", InSet::real, OutRule::index, false, 0,
                              IsMax ? "index of the first maximum over dims" : "index of the first minimum over dims"};
  template <class T, bool Host>
  using Acc = ValueIndex<std::conditional_t<is_float_v<T>, math_t<T, Host>, T>>;
  template <class A> static BCD_HD A init(const RParams&) { return A{{}, -1}; }
  /// True when b should replace a (b comes from later indices unless tied on index order).
  template <class A> static BCD_HD bool better(const A& a, const A& b) {
    if (b.index < 0) return false;
    if (a.index < 0) return true;
    const bool an = is_nan_value(a.value), bn = is_nan_value(b.value);
    if (an || bn) return bn && (!an || b.index < a.index);
    if (a.value == b.value) return b.index < a.index;
    return IsMax ? b.value > a.value : b.value < a.value;
  }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t i, const RParams&) {
    A b{decltype(a.value)(x), i};
    return better(a, b) ? b : a;
  }
  template <class A> static BCD_HD A merge(A a, A b, const RParams&) { return better(a, b) ? b : a; }
  template <class A> static BCD_HD int64_t finish(A a, int64_t, const RParams&) { return a.index; }
};
using Argmax = ArgExtreme<true>;
using Argmin = ArgExtreme<false>;

template <class M>
struct MaxSum {
  M max, sum;  ///< sum of exp(x - max)
};

struct Logsumexp {
  static constexpr RMeta meta{"logsumexp", InSet::floating, OutRule::same, true, 2,
                              "log(sum(exp(x))) over dims, computed stably"};
  template <class T, bool Host> using Acc = MaxSum<math_t<T, Host>>;
  template <class A> static BCD_HD A init(const RParams&) { return A{-INFINITY, 0}; }
  template <class A> static BCD_HD A merge(A a, A b, const RParams&) {
    using M = decltype(a.max);
    if (a.max != a.max || b.max != b.max) return A{M(NAN), M(NAN)};
    if (b.max == M(-INFINITY)) return a;
    if (a.max == M(-INFINITY)) return b;
    if (a.max == M(INFINITY) || b.max == M(INFINITY)) return A{M(INFINITY), M(1)};
    return a.max >= b.max ? A{a.max, a.sum + b.sum * exp(b.max - a.max)}
                          : A{b.max, b.sum + a.sum * exp(a.max - b.max)};
  }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t, const RParams&) {
    using Acc = decltype(a.max);
    return merge(a, A{Acc(x), Acc(1)}, RParams{});
  }
  template <class A> static BCD_HD auto finish(A a, int64_t, const RParams&) {
    return a.max == decltype(a.max)(-INFINITY) ? a.max : a.max + log(a.sum);
  }
};

/// Vector p-norm: p = 2, 1, inf, -inf, 0 (count of non-zeros) or any other p.
struct Norm {
  static constexpr RMeta meta{"norm", InSet::floating, OutRule::same, true, 2,
                              "vector p-norm over dims (attribute p: 2, 1, inf, -inf, 0 or any)"};
  template <class T, bool Host> using Acc = math_t<T, Host>;
  template <class A> static BCD_HD A init(const RParams& r) {
    return r.p == -INFINITY ? A(INFINITY) : A(0);
  }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t, const RParams& r) {
    const A v = A(x) < 0 ? -A(x) : A(x);
    if (r.p == 2) return a + v * v;
    if (r.p == 1) return a + v;
    if (r.p == INFINITY) return v != v || a != a ? A(NAN) : (v > a ? v : a);
    if (r.p == -INFINITY) return v != v || a != a ? A(NAN) : (v < a ? v : a);
    if (r.p == 0) return a + A(v != 0);
    return a + pow(v, A(r.p));
  }
  template <class A> static BCD_HD A merge(A a, A b, const RParams& r) {
    if (r.p == INFINITY) return a != a || b != b ? A(NAN) : (a > b ? a : b);
    if (r.p == -INFINITY) return a != a || b != b ? A(NAN) : (a < b ? a : b);
    return a + b;
  }
  template <class A> static BCD_HD A finish(A a, int64_t, const RParams& r) {
    if (r.p == 2) return sqrt(a);
    if (r.p == 1 || r.p == 0 || r.p == INFINITY || r.p == -INFINITY) return a;
    return pow(a, A(1) / A(r.p));
  }
};

template <class M>
struct Moments {
  M mean, m2;
  int64_t n;
};

/// Welford's running mean and squared deviation; Chan's rule merges ranges.
template <bool Sqrt>
struct Variance {
  static constexpr RMeta meta{Sqrt ? "std" : "var", InSet::floating, OutRule::same, true, 4,
                              Sqrt ? "standard deviation over dims (attribute correction, default 1)"
                                   : "variance over dims (attribute correction, default 1)"};
  template <class T, bool Host> using Acc = Moments<math_t<T, Host>>;
  template <class A> static BCD_HD A init(const RParams&) { return A{0, 0, 0}; }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t, const RParams&) {
    using Acc = decltype(a.mean);
    a.n += 1;
    const Acc d = Acc(x) - a.mean;
    a.mean += d / Acc(a.n);
    a.m2 += d * (Acc(x) - a.mean);
    return a;
  }
  template <class A> static BCD_HD A merge(A a, A b, const RParams&) {
    using Acc = decltype(a.mean);
    if (a.n == 0) return b;
    if (b.n == 0) return a;
    const int64_t n = a.n + b.n;
    const Acc d = b.mean - a.mean, fb = Acc(b.n) / Acc(n);
    return A{a.mean + d * fb, a.m2 + b.m2 + d * d * Acc(a.n) * fb, n};
  }
  template <class A> static BCD_HD auto finish(A a, int64_t, const RParams& r) {
    using Acc = decltype(a.mean);
    const Acc dof = Acc(a.n) - Acc(r.correction);
    const Acc v = a.m2 / (dof > 0 ? dof : Acc(0));
    return Sqrt ? sqrt(v) : v;
  }
};
using Var = Variance<false>;
using Std = Variance<true>;

/// any / all / count_nonzero: NaN counts as non-zero.
template <int Kind>  // 0 any, 1 all, 2 count_nonzero
struct Truth {
  static constexpr RMeta meta{Kind == 0 ? "any" : Kind == 1 ? "all" : "count_nonzero", InSet::real,
                              Kind == 2 ? OutRule::count : OutRule::boolean, true, 0,
                              Kind == 0 ? "true when any element is non-zero"
                              : Kind == 1 ? "true when every element is non-zero" : "number of non-zero elements"};
  template <class T, bool Host> using Acc = int64_t;
  template <class A> static BCD_HD A init(const RParams&) { return Kind == 1 ? 1 : 0; }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t, const RParams&) {
    const bool nz = x != M(0);
    return Kind == 0 ? (a | nz) : Kind == 1 ? (a & nz) : a + nz;
  }
  template <class A> static BCD_HD A merge(A a, A b, const RParams&) { return Kind == 0 ? (a | b) : Kind == 1 ? (a & b) : a + b; }
  template <class A> static BCD_HD A finish(A a, int64_t, const RParams&) { return a; }
};
using Any = Truth<0>;
using All = Truth<1>;
using CountNonzero = Truth<2>;

// ---------------------------------------------------------------- gradient auxiliaries
// What a gradient needs besides (grad_output, input, output), reduced over
// the same dims into a float (f64 for f64 and on the host) per output:
// how many elements tie for the extreme (amax, amin and norm with p = +-inf
// share the gradient evenly among them, as torch), and prod's product of
// the other elements at a lone zero.

template <class M>
struct ExtremeCount {
  M value, count;  ///< count 0: nothing seen
};

/// Kind: 0 max, 1 min, 2 max |x|, 3 min |x|. A NaN extreme has no ties (no
/// element compares equal to it): its count is 0 and nothing is used.
template <int Kind>
struct TieCount {
  static constexpr bool kMax = Kind % 2 == 0, kAbs = Kind >= 2;
  static constexpr RMeta meta{Kind == 0 ? "amax_ties" : Kind == 1 ? "amin_ties" : Kind == 2 ? "absmax_ties" : "absmin_ties",
                              InSet::floating, OutRule::same, false, 0, "elements equal to the extreme"};
  template <class T, bool Host> using Acc = ExtremeCount<math_t<T, Host>>;
  template <class A> static BCD_HD A init(const RParams&) { return A{0, 0}; }
  template <class A> static BCD_HD A merge(A a, A b, const RParams&) {
    if (a.count == 0 && a.value == 0) return b;  // empty (a NaN extreme keeps value NaN)
    if (b.count == 0 && b.value == 0) return a;
    if (a.value != a.value || b.value != b.value) return A{a.value + b.value, 0};  // NaN
    if (a.value == b.value) return A{a.value, a.count + b.count};
    return (kMax ? b.value > a.value : b.value < a.value) ? b : a;
  }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t, const RParams& r) {
    using V = decltype(a.value);
    const V v = kAbs && V(x) < 0 ? -V(x) : V(x);
    return merge(a, v != v ? A{v, 0} : A{v, 1}, r);
  }
  template <class A> static BCD_HD auto finish(A a, int64_t, const RParams&) { return a.count; }
};

template <class M>
struct ZerosProduct {
  M product;      ///< of the non-zero elements
  int64_t zeros;
};

/// prod's gradient at a zero: the product of the others when it is the only
/// zero, else 0.
struct LoneZeroProduct {
  static constexpr RMeta meta{"prod_lone_zero", InSet::floating, OutRule::same, true, 0,
                              "product of the non-zero elements when exactly one is zero, else 0"};
  template <class T, bool Host> using Acc = ZerosProduct<math_t<T, Host>>;
  template <class A> static BCD_HD A init(const RParams&) { return A{1, 0}; }
  template <class A, class M> static BCD_HD A step(A a, M x, int64_t, const RParams&) {
    using V = decltype(a.product);
    return V(x) == V(0) ? A{a.product, a.zeros + 1} : A{a.product * V(x), a.zeros};
  }
  template <class A> static BCD_HD A merge(A a, A b, const RParams&) { return A{a.product * b.product, a.zeros + b.zeros}; }
  template <class A> static BCD_HD auto finish(A a, int64_t, const RParams&) {
    return a.zeros == 1 ? a.product : decltype(a.product)(0);
  }
};

/// The value step() sees: floats in the accumulator's math type, others as is.
template <class T, bool Host>
BCD_HD auto load_value(T x) {
  if constexpr (is_float_v<T>) return convert<math_t<T, Host>>(x);
  else if constexpr (std::is_same_v<T, bool>) return int32_t(x);
  else return x;
}

template <class... Rs>
struct ReducerList {};
using Reducers = ReducerList<Sum, Mean, Prod, Amax, Amin, Argmax, Argmin, Logsumexp, Norm, Var, Std, Any, All,
                             CountNonzero>;
using AuxReducers = ReducerList<TieCount<0>, TieCount<1>, TieCount<2>, TieCount<3>, LoneZeroProduct>;

/// Input dtypes per set (fp8 only where the op is floating).
using FloatInputs = Concat<FloatTypes, Fp8Types>::type;
using RealInputs = Concat<FloatInputs, IntBoolTypes>::type;

template <class R, class T>
inline constexpr bool accepts = R::meta.inputs == InSet::real ? Contains<T, RealInputs>::value
                                                              : Contains<T, FloatInputs>::value;

}  // namespace baracuda::red
