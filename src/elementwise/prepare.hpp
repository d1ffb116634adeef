// Turns operand views over an iteration shape into kernel launches:
// broadcasting, dimension reordering and coalescing, reduction split.
#pragma once

#include <array>

#include "elementwise/engine.hpp"

namespace baracuda::ew {

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
