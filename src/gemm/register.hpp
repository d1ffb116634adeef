// The dtype combinations the bespoke GEMM launchers serve, and their
// registration: "gemm:in:out" (A and B of one dtype) and scaled_key
// (scaled_mm's fp8 pairs).
#pragma once

#include "core/dtype_traits.hpp"
#include "gemm/problem.hpp"

namespace baracuda::gemm {

template <class In, class Out>
struct Pair {
  using in = In;
  using out = Out;
};
/// Floats map to themselves; int8 products accumulate into i32 (torch's _int_mm);
/// f16 and bf16 also into f32 (ProductStep: other families' sums across calls).
using GemmPairs = TypeList<Pair<float, float>, Pair<__half, __half>, Pair<__nv_bfloat16, __nv_bfloat16>,
                           Pair<double, double>, Pair<int8_t, int32_t>, Pair<int32_t, int32_t>, Pair<int64_t, int64_t>,
                           Pair<__half, float>, Pair<__nv_bfloat16, float>>;
/// scaled_mm's output dtypes (its oracle, f64 x f64 -> f64, is registered apart).
using ScaledOutTypes = TypeList<__nv_bfloat16, __half, float, __nv_fp8_e4m3, __nv_fp8_e5m2>;

/// `Launch<In, In, Out>::run` for every pair.
template <template <class, class, class> class Launch>
bool register_gemms(GemmTable& table) {
  for_each_type<GemmPairs>([&]<class P>(TypeTag<P>) {
    using In = typename P::in;
    using Out = typename P::out;
    table.add(launch_key("gemm", dtype_of<In>, dtype_of<Out>), &Launch<In, In, Out>::run);
  });
  return true;
}

/// `Launch<A, B, Out>::run` for every fp8 pair (A, B) and output of scaled_mm, and f64.
template <template <class, class, class> class Launch>
bool register_scaled_gemms(GemmTable& table) {
  for_each_type<Fp8Types>([&]<class A>(TypeTag<A>) {
    for_each_type<Fp8Types>([&]<class B>(TypeTag<B>) {
      for_each_type<ScaledOutTypes>([&]<class Out>(TypeTag<Out>) {
        table.add(scaled_key(dtype_of<A>, dtype_of<B>, dtype_of<Out>), &Launch<A, B, Out>::run);
      });
    });
  });
  table.add(scaled_key(DType::f64, DType::f64, DType::f64), &Launch<double, double, double>::run);
  return true;
}

}  // namespace baracuda::gemm
