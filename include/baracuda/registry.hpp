// The registry of every op: names, operands, dtypes, attributes, backends,
// forward/backward pairing and sampling hints for tests, the CLI and Python.
#pragma once

#include <functional>

#include "baracuda/core.hpp"

namespace baracuda {

enum class Direction : uint8_t { forward, backward };

struct AttrSpec {
  std::string name;
  double default_value = 0;
  std::string doc;
};

/// Where random test inputs are drawn from: [lo, hi], or |x| in [lo, hi]
/// with a random sign when `symmetric`; `specials` mixes in NaN and +-inf.
/// Integer dtypes draw from [-30, 30] unless `index` (or the op's integer_valued_inputs).
struct Domain {
  double lo = -2, hi = 2;
  bool symmetric = false;
  bool specials = false;
  bool index = false;  ///< integer dtypes also draw from [lo, hi] (class indices)
  bool sorted = false; ///< values non-decreasing in logical order (group offsets)
};

/// Input (and, where the op needs them given, output) shapes of a test case.
struct SampleShapes {
  std::vector<Shape> inputs;
  std::vector<TensorSpec> outputs;  ///< empty: inferred
};

/// Dtypes an op can be asked for. `dtypes` are the primary dtypes (the dtype
/// that names a kernel: input 0 for most ops, the target for fill).
struct OpInfo {
  std::string name;
  OpCategory category = OpCategory::other;
  std::string family;  ///< sub-kind: unary, binary, compare, cast, ...
  Direction direction = Direction::forward;
  std::string gradient;  ///< forward: its backward op; backward: its forward op
  std::vector<std::string> input_names, output_names;
  /// A list op (grouped_gemm): input_names and output_names name the operands
  /// of one group, and a descriptor holds any number G >= 1 of groups,
  /// operand-major: input i * G + g is operand i of group g ("a[g]"); the
  /// outputs likewise. input_dtypes then gives one group's dtypes.
  bool variadic = false;
  std::vector<DType> dtypes;
  std::vector<AttrSpec> attrs;
  std::vector<Backend> backends;
  std::string doc;

  /// Dtypes of each input for a primary dtype (cond of `where` is bool...).
  std::function<std::vector<DType>(DType primary)> input_dtypes;
  /// Shape/dtype inference: inputs (+attrs) -> full descriptor.
  std::function<Result<OpDesc>(const OpDesc& partial)> infer;
  /// Builds a plan for one backend, or says why it cannot.
  using Factory = std::function<Result<PlanPtr>(Backend, const Stream&, const OpDesc&, const PlanPreference&)>;
  Factory make_plan;

  // Test and benchmark hints.
  std::vector<Domain> domains;        ///< per input (the last repeats)
  std::vector<Attrs> sample_attrs;    ///< attribute sets to exercise (>= 1)
  double tolerance_scale = 1.0;       ///< widens the per-dtype tolerance
  bool integer_valued_inputs = false; ///< sample whole numbers (floor_divide...)
  bool in_place = true;               ///< output 0 may alias an input of its layout
  /// Families other than elementwise: the operand shapes of a case whose
  /// primary shape is `shape` (the first input's), or nullopt when `attrs`
  /// do not fit that shape. Unset: elementwise rules.
  std::function<std::optional<SampleShapes>(DType primary, const Shape& shape, const Attrs& attrs)> sample_shapes;

  const AttrSpec* find_attr(std::string_view attr) const;
  Domain domain(size_t input) const;
  /// The names of `count` inputs (or outputs): the registered ones, or for a
  /// variadic op each group's ("a[0]", "a[1]", ..., "b[0]", ...).
  std::vector<std::string> operand_names(bool inputs, size_t count) const;
  /// Which registered operand input (or output) `index` of `count` is: itself,
  /// or for a variadic op index / G.
  size_t operand_of(bool inputs, size_t index, size_t count) const;
};

/// Every registered op, in registration order.
const std::vector<OpInfo>& registry();
/// nullptr when unknown.
const OpInfo* find_op(std::string_view name);

}  // namespace baracuda
