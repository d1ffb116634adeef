// fp8 storage (e4m3, e5m2): forwards read and write it and compute in f32;
// no op has fp8 gradients (the elementwise, reduction, norm and scan
// families alike). A header of its own so that only its users recompile.
#pragma once

#include <type_traits>

#include "core/dtype_traits.hpp"

namespace baracuda {

template <class T>
inline constexpr bool is_fp8_v = std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;

/// Float storage with gradients: every float but fp8.
template <class T>
inline constexpr bool has_gradient_v = is_float_v<T> && !is_fp8_v<T>;

}  // namespace baracuda
