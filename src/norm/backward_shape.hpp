// The shape of the CUDA norm backward with parameters (Note [Fused norm
// backward] in kernels.cuh): the plan sizes its workspace with it and the
// launcher launches with it, so both agree on the number of row splits.
#pragma once

#include <algorithm>
#include <cstdint>

namespace baracuda::norm {

struct FusedBackwardShape {
  int threads = 0;  ///< a block, which works on one row at a time; 0: the two-pass path
  constexpr explicit operator bool() const { return threads > 0; }
};

/// Rows of 1024 elements to 1024 16-byte vectors: a thread owns one vector of
/// each row, so that its parameter-gradient sums stay in registers (two
/// vectors a thread spilled at 1024 threads, whose cap is 64 registers).
constexpr FusedBackwardShape fused_backward_shape(int64_t cols, int elem_bytes) {
  const int64_t v = 16 / elem_bytes;
  if (cols < 1024) return {};
  for (int t = 128; t <= 1024; t *= 2)
    if (cols <= v * t) return {t};
  return {};
}

/// Blocks of the fused path, each one row split: 1024 threads an SM, no more blocks than rows.
inline int fused_backward_blocks(FusedBackwardShape s, int64_t rows, int sm_count) {
  return int(std::clamp<int64_t>(int64_t(sm_count) * (1024 / s.threads), 1, std::max<int64_t>(rows, 1)));
}

}  // namespace baracuda::norm
