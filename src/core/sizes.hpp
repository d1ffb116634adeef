// Size arithmetic shared by plans and launchers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace baracuda {

/// a / b rounded up (a >= 0, b > 0).
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
/// Bytes rounded up to 256, the alignment of each part a plan carves from its workspace.
constexpr size_t workspace_aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace baracuda
