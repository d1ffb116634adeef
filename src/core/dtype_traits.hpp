// Storage types of each dtype, exact conversions between them, the math
// ("opmath") type kernels compute in, and the one dtype visitor.
// Compiles under nvcc (device + host) and plain C++ (host reference).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "baracuda/core.hpp"
#include "core/errors.hpp"

#if defined(__CUDACC__)
#define BCD_HD __host__ __device__ __forceinline__
#else
#define BCD_HD inline
#endif

namespace baracuda {

template <class T>
struct alignas(2 * sizeof(T)) Complex {
  T re, im;
};

template <class... Ts>
struct TypeList {};
template <class T>
struct TypeTag {
  using type = T;
};

template <class A, class B>
struct Concat;
template <class... A, class... B>
struct Concat<TypeList<A...>, TypeList<B...>> {
  using type = TypeList<A..., B...>;
};

/// True when T is one of the list's types.
template <class T, class List>
struct Contains;
template <class T, class... Ts>
struct Contains<T, TypeList<Ts...>> : std::bool_constant<(std::is_same_v<T, Ts> || ...)> {};

using FloatTypes = TypeList<float, __half, __nv_bfloat16, double>;
using Fp8Types = TypeList<__nv_fp8_e4m3, __nv_fp8_e5m2>;
using IntTypes = TypeList<int8_t, uint8_t, int16_t, int32_t, int64_t, uint32_t>;
using ComplexTypes = TypeList<Complex<float>, Complex<double>>;
using FloatIntTypes = Concat<FloatTypes, IntTypes>::type;
using IntBoolTypes = Concat<IntTypes, TypeList<bool>>::type;
using RealTypes = Concat<Concat<FloatTypes, Fp8Types>::type, IntBoolTypes>::type;
using AllTypes = Concat<RealTypes, ComplexTypes>::type;

template <class T>
struct DTypeOf;
#define BCD_DTYPE_OF(T, D) \
  template <>              \
  struct DTypeOf<T> {      \
    static constexpr DType value = DType::D; \
  };
BCD_DTYPE_OF(float, f32)
BCD_DTYPE_OF(__half, f16)
BCD_DTYPE_OF(__nv_bfloat16, bf16)
BCD_DTYPE_OF(double, f64)
BCD_DTYPE_OF(__nv_fp8_e4m3, fp8_e4m3)
BCD_DTYPE_OF(__nv_fp8_e5m2, fp8_e5m2)
BCD_DTYPE_OF(int8_t, i8)
BCD_DTYPE_OF(uint8_t, u8)
BCD_DTYPE_OF(int16_t, i16)
BCD_DTYPE_OF(int32_t, i32)
BCD_DTYPE_OF(int64_t, i64)
BCD_DTYPE_OF(uint32_t, u32)
BCD_DTYPE_OF(bool, boolean)
BCD_DTYPE_OF(Complex<float>, c64)
BCD_DTYPE_OF(Complex<double>, c128)
#undef BCD_DTYPE_OF
template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

template <class T>
inline constexpr bool is_complex_v = std::is_same_v<T, Complex<float>> || std::is_same_v<T, Complex<double>>;
template <class T>
inline constexpr bool is_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;
/// Reduced-precision floats stored in 8 or 16 bits, computed in f32.
template <class T>
inline constexpr bool is_small_float_v =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __nv_fp8_e4m3> ||
    std::is_same_v<T, __nv_fp8_e5m2>;
template <class T>
inline constexpr bool is_float_v = is_small_float_v<T> || std::is_floating_point_v<T>;

/// The type arithmetic runs in: f32 for f32/f16/bf16/fp8 on the GPU, f64 for
/// f64; the host reference (the test oracle) computes every float in f64.
/// Integers, bool and complex compute in themselves.
template <class T, bool Host>
struct MathType {
  using type = T;
};
template <class T, bool Host>
  requires is_float_v<T>
struct MathType<T, Host> {
  using type = std::conditional_t<Host || std::is_same_v<T, double>, double, float>;
};
template <class T, bool Host>
using math_t = typename MathType<T, Host>::type;

template <class T>
inline constexpr MathPrecision device_math_precision =
    std::is_same_v<T, double> ? MathPrecision::f64 : (is_float_v<T> ? MathPrecision::f32 : MathPrecision::exact);

// ---------------------------------------------------------------- conversion

template <class T>
BCD_HD float small_to_float(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return static_cast<float>(v);  // fp8
}

template <class To>
BCD_HD To small_from_double(double v) {
  if constexpr (std::is_same_v<To, __half>) return __double2half(v);
  else if constexpr (std::is_same_v<To, __nv_bfloat16>) return __double2bfloat16(v);
  else {
    // No saturation: out-of-range e4m3 becomes NaN and e5m2 becomes inf, as in torch.
    constexpr auto kind = std::is_same_v<To, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
    To out;
    out.__x = __nv_cvt_double_to_fp8(v, __NV_NOSAT, kind);
    return out;
  }
}

template <class To>
BCD_HD To small_from_float(float v) {
  if constexpr (std::is_same_v<To, __half>) return __float2half_rn(v);
  else if constexpr (std::is_same_v<To, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else {
    constexpr auto kind = std::is_same_v<To, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
    To out;
    out.__x = __nv_cvt_float_to_fp8(v, __NV_NOSAT, kind);
    return out;
  }
}

/// Float/half/fp8 value as the widest float it converts to exactly.
template <class T>
BCD_HD auto widen(T v) {
  if constexpr (is_small_float_v<T>) return small_to_float(v);
  else return v;
}

/// Float to integer: truncates toward zero, saturates, NaN -> 0 (the same on
/// host and device, where C++ leaves out-of-range conversions undefined).
template <class To, class F>
BCD_HD To float_to_int(F v) {
  if (v != v) return To(0);
  constexpr double lo = static_cast<double>(std::numeric_limits<To>::lowest());
  constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
  double d = static_cast<double>(v);
  if (d <= lo) return std::numeric_limits<To>::lowest();
  if (d >= hi) return std::numeric_limits<To>::max();
  return static_cast<To>(d);
}

/// Converts between any two storage or math types.
template <class To, class From>
BCD_HD To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_complex_v<From>) {
    if constexpr (is_complex_v<To>) return To{convert<decltype(To::re)>(v.re), convert<decltype(To::re)>(v.im)};
    else if constexpr (std::is_same_v<To, bool>) return v.re != 0 || v.im != 0;
    else return convert<To>(v.re);
  } else if constexpr (is_complex_v<To>) {
    using R = decltype(To::re);
    return To{convert<R>(v), R(0)};
  } else if constexpr (std::is_same_v<To, bool>) {
    return widen(v) != 0;
  } else if constexpr (std::is_same_v<From, bool>) {
    return convert<To>(static_cast<int32_t>(v));
  } else if constexpr (is_int_v<To>) {
    if constexpr (is_int_v<From>) return static_cast<To>(v);  // modular, as C++20 defines
    else return float_to_int<To>(widen(v));
  } else if constexpr (is_small_float_v<To>) {
    if constexpr (std::is_same_v<From, double> || is_int_v<From>) return small_from_double<To>(static_cast<double>(v));
    else return small_from_float<To>(widen(v));
  } else {  // To is float or double
    return static_cast<To>(widen(v));
  }
}

// ---------------------------------------------------------------- dispatch

template <class List>
struct ForEachType;
template <class... Ts>
struct ForEachType<TypeList<Ts...>> {
  template <class F>
  static void run(F&& f) {
    (f(TypeTag<Ts>{}), ...);
  }
};
/// Calls f(TypeTag<T>{}) for every T of the list.
template <class List, class F>
void for_each_type(F&& f) {
  ForEachType<List>::run(f);
}

/// Calls f(TypeTag<T>{}) for the T of `dtype` if the list holds it; else an
/// Unsupported status naming `what` and the dtype. f returns a Status.
template <class List, class F>
Status visit_dtype(DType dtype, std::string_view what, F&& f) {
  Status result = unsupported(what, ": dtype ", dtype_name(dtype), " is not supported");
  for_each_type<List>([&]<class T>(TypeTag<T> tag) {
    if (dtype_of<T> == dtype) result = f(tag);
  });
  return result;
}

template <class List>
std::vector<DType> dtypes_of() {
  std::vector<DType> out;
  for_each_type<List>([&]<class T>(TypeTag<T>) { out.push_back(dtype_of<T>); });
  return out;
}

}  // namespace baracuda
