// The generic op driver shared by the tests, the CLI and the benchmarks:
// builds a case (op x dtype x shape x layout x attrs) from the registry,
// fills inputs with fresh random data, poisons outputs, runs a plan on the
// chosen backend and checks it against the host reference computed in f64.
#pragma once

#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "baracuda/registry.hpp"

namespace baracuda::harness {

/// contiguous: row-major everywhere. strided: column-major with gaps, inputs
/// walking dim 0 backwards. transposed: inputs column-major, outputs row-major.
/// broadcast: size-1 or stride-0 inputs. inplace: output 0 aliases an input.
/// shifted: row-major, inputs one element and outputs three into their
/// buffers (data pointers off the 16-byte grid, at offsets that differ); not
/// in kAllLayouts, the sweeps' set: tests of vector paths ask for it.
enum class LayoutKind { contiguous, strided, transposed, broadcast, inplace, shifted };
const char* layout_name(LayoutKind layout);
inline constexpr LayoutKind kAllLayouts[] = {LayoutKind::contiguous, LayoutKind::strided, LayoutKind::transposed,
                                             LayoutKind::broadcast, LayoutKind::inplace};
/// The layout of that name (every kind, shifted too), or none.
std::optional<LayoutKind> layout_from_name(std::string_view name);

/// Owns host or device bytes.
class Memory {
 public:
  Memory() = default;
  static Memory host(size_t bytes);
  static Result<Memory> device(size_t bytes);
  Memory(Memory&& o) noexcept { *this = std::move(o); }
  Memory& operator=(Memory&& o) noexcept;
  ~Memory();
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  bool on_device() const { return device_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool device_ = false;
};

struct Tolerance {
  double rtol = 0, atol = 0;
};
/// Per-dtype tolerance for results rounded to `dtype`, widened by `scale`.
Tolerance tolerance_for(DType dtype, double scale);

struct CaseSpec {
  const OpInfo* op = nullptr;
  DType dtype = DType::f32;  ///< primary dtype
  Shape shape;               ///< iteration shape (the forward output's shape)
  Attrs attrs;
  LayoutKind layout = LayoutKind::contiguous;
  std::string to_string() const;
};

struct RunOptions {
  Backend backend = Backend::host_reference;
  bool deterministic_only = false;  ///< plans must give the same bits every run (PlanPreference)
  bool verify = true;
  bool time = false;
  int warmup = 3;
  int iterations = 20;
  uint64_t seed = 0;  ///< 0: BARACUDA_TEST_SEED when set, else a fresh random seed
};

/// BARACUDA_TEST_SEED (decimal), or 0 when unset.
uint64_t seed_from_environment();

struct CaseOutcome {
  bool skipped = false;
  bool passed = false;
  std::string message;  ///< why it failed or was skipped
  std::string sku;
  double max_abs_error = 0;
  bool reference_all_zero = true;  ///< every float reference output was 0
  int64_t elements = 0;            ///< iteration elements
  double bytes = 0;                ///< minimum bytes moved (inputs read once, outputs written once)
  double milliseconds = 0;         ///< median run time when timed
  /// Calling thread's time per run when timed on a device: the best of a few
  /// batches of runs issued back to back (fewer than the launch queue holds,
  /// so the device's pace does not enter): what a small op costs its caller.
  double host_microseconds = 0;
  uint64_t seed = 0;               ///< the inputs' seed (wrong-element messages name it)
};

CaseOutcome run_case(const CaseSpec& spec, const RunOptions& options);

/// The descriptor run_case builds for `spec` (operand shapes from the op's
/// samples or the elementwise rules, outputs inferred), or why there is none.
Result<OpDesc> case_descriptor(const CaseSpec& spec);

/// A typical shape for an op at `elements` elements (gated ops split dim -1).
Shape default_shape(const OpInfo& op, int64_t elements);

/// Device-to-device copy bandwidth (bytes read + written per second), or 0.
double measure_copy_bandwidth(size_t bytes);

/// Value of element `offset` (in elements) of `base` as a double (complex: real part).
double load_double(const void* base, DType dtype, int64_t offset);
void store_double(void* base, DType dtype, int64_t offset, double value);

}  // namespace baracuda::harness
