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

}  // namespace baracuda::rows
