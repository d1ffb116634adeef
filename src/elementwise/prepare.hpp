// Turns operand views over an iteration shape into kernel launches:
// broadcasting, dimension reordering and coalescing, reduction split.
#pragma once

#include <array>

#include "elementwise/engine.hpp"

namespace baracuda::ew {

// Problem transforms, also used by other families (reductions).
/// Removes size-1 dims.
void drop_unit_dims(Problem& p);
/// Walks dims where operand 0 has a negative stride backwards in every operand.
void flip_negative_dims(Problem& p, std::span<const size_t> elem_bytes);
/// Orders dims innermost-first by stride, operand 0 deciding first.
void sort_dims(Problem& p);
/// Merges adjacent dims that every operand walks as one.
void coalesce(Problem& p);

/// At most one launch per output (3 outputs at most).
struct LaunchList {
  std::array<Launch, 3> launches;
  int count = 0;
};

/// `outputs` and `inputs` are views whose shapes broadcast to `iteration`.
/// An output whose shape is smaller than `iteration` receives the sum over
/// the broadcast dims; then every output gets a launch of its own.
LaunchList plan_launches(std::span<const int64_t> iteration, std::span<const TensorView> outputs,
                         std::span<const TensorView> inputs);

}  // namespace baracuda::ew
