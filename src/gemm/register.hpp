// The (input, output) dtype pairs the bespoke GEMM launchers serve, and their
// registration under "gemm:in:out".
#pragma once

#include "core/dtype_traits.hpp"
#include "gemm/problem.hpp"

namespace baracuda::gemm {

template <class In, class Out>
struct Pair {
  using in = In;
  using out = Out;
};
/// Floats map to themselves; int8 products accumulate into i32 (torch's _int_mm).
using GemmPairs = TypeList<Pair<float, float>, Pair<__half, __half>, Pair<__nv_bfloat16, __nv_bfloat16>,
                           Pair<double, double>, Pair<int8_t, int32_t>, Pair<int32_t, int32_t>, Pair<int64_t, int64_t>>;

/// `Launch<In, Out>::run` for every pair.
template <template <class, class> class Launch>
bool register_gemms(GemmTable& table) {
  for_each_type<GemmPairs>([&]<class P>(TypeTag<P>) {
    using In = typename P::in;
    using Out = typename P::out;
    table.add(launch_key("gemm", dtype_of<In>, dtype_of<Out>), &Launch<In, Out>::run);
  });
  return true;
}

}  // namespace baracuda::gemm
