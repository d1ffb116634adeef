// Shape, broadcast and memory-overlap rules shared by every family.
#pragma once

#include <functional>
#include <optional>

#include "baracuda/core.hpp"

namespace baracuda {

/// Product of the sizes; an error names `what` on negative sizes or overflow.
Result<int64_t> checked_numel(std::span<const int64_t> shape, std::string_view what);

/// Numpy broadcasting of several shapes; `names` label the operands in errors.
Result<Shape> broadcast_shapes(std::span<const Shape> shapes, std::span<const std::string> names,
                               std::string_view op);

/// True when two distinct indices of the view address the same element
/// (a conservative test: may report overlap for exotic interleaved layouts).
bool has_internal_overlap(const TensorView& view);

/// True when the byte ranges touched by two views intersect.
bool memory_overlaps(const TensorView& a, const TensorView& b);

/// Same data pointer, dtype, shape and strides.
bool same_layout(const TensorView& a, const TensorView& b);

/// The first two outputs k < j (by j, then k) whose memory overlaps, if any.
std::optional<std::pair<size_t, size_t>> overlapping_outputs(std::span<const TensorView> outputs);

/// Calls visit(j, i) for each output j and input i whose memory overlaps,
/// outputs in order and each output's inputs in order, until a visit fails;
/// returns that status. The outputs must not overlap one another
/// (overlapping_outputs). Both take O(n log n) for many operands (list ops:
/// Note [Overlaps among many operands] in tensor.cpp).
Status for_each_overlap(std::span<const TensorView> outputs, std::span<const TensorView> inputs,
                        const std::function<Status(size_t output, size_t input)>& visit);

/// Sets every byte of each element of `v` to `byte`, ordered on `stream`:
/// element by element on the host, on CUDA a strided memset of each last-dim
/// line (capturable). 0x00 writes zeros, 0xFF a NaN in every float dtype.
/// For results with no input to compute from (sums or means over nothing).
Status fill_bytes(const TensorView& v, uint8_t byte, const Stream& stream);

/// The checks every family's shape inference starts with: the input count,
/// then the rank and element count of input `primary`.
Status check_inputs(std::string_view op, const OpDesc& desc, std::span<const std::string> input_names, size_t primary);

/// Fills in the descriptor's outputs with `expected`, or checks the ones given.
Status set_outputs(std::string_view op, OpDesc& desc, const std::vector<TensorSpec>& expected,
                   std::span<const std::string> output_names);

/// The checks every plan's can_implement makes, with messages naming the op
/// and operand: argument counts; each view's rank, dtype and shape against
/// the descriptor; null data; outputs that overlap themselves or each other;
/// outputs that overlap an input other than in place (an equal layout).
Status check_args(std::string_view op, const OpArgs& args, const OpDesc& desc, std::span<const std::string> input_names,
                  std::span<const std::string> output_names);

}  // namespace baracuda
