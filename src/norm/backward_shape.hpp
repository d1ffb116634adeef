// The shape of the CUDA norm backward with parameters (Note [Fused norm
// backward] in kernels.cuh): the plan sizes its workspace with it and the
// launcher launches with it, so both agree on the number of row splits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/row_lanes.hpp"

namespace baracuda::norm {

struct FusedBackwardShape {
  /// A row's threads (below kNarrowBlock, a block of kNarrowBlock works on
  /// kNarrowBlock / threads rows at once); 0: the two-pass path.
  int threads = 0;
  int ranks = 1;    ///< blocks a row: a thread-block cluster when more than 1 (Note [Norm backward over a cluster])
  constexpr explicit operator bool() const { return threads > 0; }
};

/// A clustered block: 512 threads of two vectors a row each (one block an SM,
/// 128 registers: the row's fixed work, its sums and barrier, is shared by
/// twice the elements of a 1024-thread block of one vector a thread).
inline constexpr int kClusterThreads = 512, kClusterVectors = 2, kMaxClusterRanks = 8;
/// The block of narrow rows (Note [Narrow norm backward rows]): 1 to 64 threads a row.
inline constexpr int kNarrowBlock = 128;

/// A thread owns one 16-byte vector of each row (its parameter-gradient sums
/// stay in registers; two vectors a thread spilled at 1024 threads, whose
/// cap is 64 registers): rows of up to 64 vectors take the fewest threads, a
/// power of two, that hold them (but two from two vectors), several rows a
/// block; rows up to 1024 vectors a block of 128 to 1024 threads. Longer
/// rows, up to 8 clustered blocks of 1024 vectors, take clusters where the
/// device has them (`clusters`: sm_90 and later).
constexpr FusedBackwardShape fused_backward_shape(int64_t cols, int elem_bytes, bool clusters) {
  const int64_t v = 16 / elem_bytes, vectors = (cols + v - 1) / v;
  if (cols < 1 || (elem_bytes == 8 && cols < 1024)) return {};  // f64 keeps the two passes there
  if (vectors <= 64) return {rows::narrow_row_lanes(vectors, 1), 1};
  for (int t = 128; t <= 1024; t *= 2)
    if (cols <= v * t) return {t, 1};
  const int64_t per_block = v * kClusterThreads * kClusterVectors;
  const int64_t ranks = (cols + per_block - 1) / per_block;
  if (clusters && ranks <= kMaxClusterRanks) return {kClusterThreads, int(ranks)};
  return {};
}

/// Row splits of the fused path, each one block (or cluster of one block an
/// SM; a narrow block's row groups add up their sums first), no more splits
/// than a block's rows at a time divide the rows into. For clusters this
/// bounds the workspace; the launcher takes no more than the device can hold at once.
inline int fused_backward_splits(FusedBackwardShape s, int64_t rows, int sm_count) {
  const int block = std::max(s.threads, kNarrowBlock), groups = block / s.threads;
  const int64_t resident = s.ranks > 1 ? sm_count / s.ranks : int64_t(sm_count) * (1024 / block);
  return int(std::clamp<int64_t>(resident, 1, std::max<int64_t>((rows + groups - 1) / groups, 1)));
}

}  // namespace baracuda::norm
