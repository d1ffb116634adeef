// How many lanes of a warp a narrow row takes (Note [Softmax rows in
// registers] in src/softmax/kernels.cuh): shared by the held softmax rows,
// the held norm forward and the narrow norm backward.
#pragma once

#include <cstdint>

namespace baracuda::rows {

/// The fewest lanes, a power of two, whose `per_lane` 16-byte vectors each
/// hold a row of `vectors`, but two from two vectors on (a lane's loads 64
/// bytes apart ran f32 rows of 16 at 1.77 TB/s, two lanes 3.02 on an H100).
constexpr int narrow_row_lanes(int64_t vectors, int per_lane) {
  if (vectors <= 1) return 1;
  int lanes = 2;
  while (int64_t(lanes) * per_lane < vectors) lanes *= 2;
  return lanes;
}

/// Calls `launch.template operator()<lanes>()` with lanes =
/// narrow_row_lanes(vectors, per_lane) as a compile-time constant; false
/// (nothing called) when the row does not fit a warp's lanes.
template <class Launch>
bool launch_on_narrow_row_lanes(int64_t vectors, int per_lane, Launch&& launch) {
  if (vectors > int64_t(32) * per_lane) return false;
  switch (narrow_row_lanes(vectors, per_lane)) {
    case 1: launch.template operator()<1>(); break;
    case 2: launch.template operator()<2>(); break;
    case 4: launch.template operator()<4>(); break;
    case 8: launch.template operator()<8>(); break;
    case 16: launch.template operator()<16>(); break;
    default: launch.template operator()<32>(); break;
  }
  return true;
}

}  // namespace baracuda::rows
