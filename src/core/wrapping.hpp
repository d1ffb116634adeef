// Integer sums and products that wrap around modulo 2^bits, as torch's do:
// signed overflow is undefined behaviour in C++ (and the host reference
// would then answer anything), so integers add and multiply as unsigned.
// Floats are untouched: the same functors serve both.
#pragma once

#include <type_traits>

#include "core/dtype_traits.hpp"

namespace baracuda {

/// The unsigned type integer A computes in: never narrower than unsigned
/// int, so that promotion cannot bring back a signed multiply.
template <class A>
using wrapping_unsigned_t = std::make_unsigned_t<std::conditional_t<(sizeof(A) < sizeof(int)), int, A>>;

template <class A>
inline constexpr bool kWraps = std::is_integral_v<A> && !std::is_same_v<A, bool>;

template <class A>
BCD_HD A wrapping_add(A a, A b) {
  if constexpr (kWraps<A>) return static_cast<A>(wrapping_unsigned_t<A>(a) + wrapping_unsigned_t<A>(b));
  else return a + b;
}

template <class A>
BCD_HD A wrapping_sub(A a, A b) {
  if constexpr (kWraps<A>) return static_cast<A>(wrapping_unsigned_t<A>(a) - wrapping_unsigned_t<A>(b));
  else return a - b;
}

/// -a (for floats the sign flip itself: -(+0) is -0, which 0 - a is not).
template <class A>
BCD_HD A wrapping_neg(A a) {
  if constexpr (kWraps<A>) return static_cast<A>(wrapping_unsigned_t<A>(0) - wrapping_unsigned_t<A>(a));
  else return -a;
}

template <class A>
BCD_HD A wrapping_mul(A a, A b) {
  if constexpr (kWraps<A>) return static_cast<A>(wrapping_unsigned_t<A>(a) * wrapping_unsigned_t<A>(b));
  else return a * b;
}

}  // namespace baracuda
