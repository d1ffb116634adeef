// baracuda core: dtypes, tensor views, status, streams, workspaces, kernel
// identity and the plan lifecycle shared by every op family.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

struct CUstream_st;  // cudaStream_t is CUstream_st*; no CUDA header needed here.

namespace baracuda {

/// Largest tensor rank a view can describe.
inline constexpr int kMaxRank = 8;

// ---------------------------------------------------------------- dtypes

/// Element types. The order is part of the C ABI (baracuda.h mirrors it).
enum class DType : uint8_t {
  f32, f16, bf16, f64, fp8_e4m3, fp8_e5m2,
  i8, u8, i16, i32, i64, u32, boolean, c64, c128,
};
inline constexpr int kNumDTypes = 15;

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);
bool is_floating(DType dtype);  ///< f32 f16 bf16 f64 fp8_*
bool is_integral(DType dtype);  ///< i8 u8 i16 i32 i64 u32 (not bool)
bool is_complex(DType dtype);
/// All dtypes, in enum order.
std::span<const DType> all_dtypes();

// ---------------------------------------------------------------- status

enum class ErrorKind : int {
  ok = 0,
  unsupported = 1,          ///< the op/dtype/layout is not offered (by this candidate)
  invalid_problem = 2,      ///< the caller's descriptor or tensors are wrong
  misaligned_operand = 3,   ///< a pointer violates a required alignment
  workspace_too_small = 4,  ///< needed/got are bytes
  buffer_too_small = 5,     ///< needed/got are bytes
  backend_error = 6,        ///< a CUDA library returned an error: library/code
  internal = 7,             ///< a bug in baracuda
};
const char* error_kind_name(ErrorKind kind);

/// Success or an error with a message that names the operand, what was
/// expected and what was given.
class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return {}; }
  static Status error(ErrorKind kind, std::string message);
  static Status too_small(ErrorKind kind, size_t needed, size_t got, std::string message);
  static Status backend(std::string library, long code, std::string message);

  bool is_ok() const { return kind_ == ErrorKind::ok; }
  explicit operator bool() const { return is_ok(); }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  size_t needed() const { return needed_; }
  size_t got() const { return got_; }
  const std::string& library() const { return library_; }
  long code() const { return code_; }
  /// "<kind>: <message>"
  std::string to_string() const;
  /// Prefixes the message with context ("add: " + message) unless it starts so.
  Status& with_context(std::string_view context);

 private:
  ErrorKind kind_ = ErrorKind::ok;
  std::string message_;
  size_t needed_ = 0, got_ = 0;
  std::string library_;
  long code_ = 0;
};

/// A value or the Status explaining why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status status) : v_(std::move(status)) {}
  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  Status status() const { return is_ok() ? Status::ok() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

/// Thrown by the convenience wrappers only (`check`, `*_or_throw`).
class Error : public std::exception {
 public:
  explicit Error(Status status) : status_(std::move(status)), what_(status_.to_string()) {}
  const char* what() const noexcept override { return what_.c_str(); }
  const Status& status() const { return status_; }

 private:
  Status status_;
  std::string what_;
};
inline void check(const Status& s) {
  if (!s.is_ok()) throw Error(s);
}
template <class T>
T check(Result<T> r) {
  if (!r.is_ok()) throw Error(r.status());
  return std::move(r).value();
}

// ---------------------------------------------------------------- tensors

using Shape = std::vector<int64_t>;

/// A strided view of memory: element strides (0 broadcasts, negative allowed),
/// 64-bit shapes. The view does not own its memory.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};

  /// Row-major contiguous view. Fails on rank > kMaxRank or negative sizes.
  static Result<TensorView> contiguous(void* data, DType dtype, std::span<const int64_t> shape);
  static Result<TensorView> strided(void* data, DType dtype, std::span<const int64_t> shape,
                                    std::span<const int64_t> strides);
  int64_t numel() const;
  Shape shape_vec() const { return Shape(shape.begin(), shape.begin() + rank); }
  bool is_contiguous() const;
  /// Element offsets (relative to data) of the lowest and highest element
  /// this view touches; {0, -1} when empty.
  std::pair<int64_t, int64_t> span() const;
  /// Bytes from the lowest to one past the highest touched byte.
  size_t span_bytes() const;
};

/// Dtype and shape: what a descriptor knows about an operand before run().
struct TensorSpec {
  DType dtype = DType::f32;
  Shape shape;
  int64_t numel() const;
};
std::string shape_str(std::span<const int64_t> shape);

// ---------------------------------------------------------------- execution

/// Where a plan runs: a CUDA stream, or the host (CPU) for the host backend.
class Stream {
 public:
  static Stream host() { return Stream(nullptr, true); }
  static Stream cuda(CUstream_st* stream = nullptr) { return Stream(stream, false); }
  bool is_host() const { return host_; }
  CUstream_st* cuda_stream() const { return stream_; }

 private:
  Stream(CUstream_st* s, bool host) : stream_(s), host_(host) {}
  CUstream_st* stream_;
  bool host_;
};

/// Caller-owned scratch bytes; `run` never allocates.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// ---------------------------------------------------------------- identity

enum class Backend : uint8_t {
  host_reference, bespoke_cuda, cublaslt, cudnn, cufft, cusolver, curand, cusparse, nccl, cccl, cutlass,
};
const char* backend_name(Backend backend);
std::optional<Backend> backend_from_name(std::string_view name);

enum class OpCategory : uint8_t {
  elementwise, reduce, scan, softmax, norm, loss, gemm, attention, shape, index, random, other,
};
const char* category_name(OpCategory category);

enum class MathPrecision : uint8_t { exact, f16, bf16, tf32, f32, f64 };
const char* math_precision_name(MathPrecision precision);

/// Numerical promises of a kernel, derived from its dtypes and algorithm.
struct PrecisionGuarantee {
  MathPrecision math = MathPrecision::f32;
  DType accumulator = DType::f32;
  bool bit_stable_on_same_hardware = true;
  bool deterministic = true;
};

enum class Layout : uint8_t { any_strided, contiguous, row_major, col_major };
enum class Epilogue : uint8_t { none, bias, bias_relu, bias_gelu, bias_silu, bias_grad };

/// Which kernel a plan picked.
struct KernelSku {
  OpCategory category = OpCategory::other;
  const char* op = "";  ///< registry name, static storage
  DType element = DType::f32;
  std::optional<DType> aux_element;  ///< second dtype (cast target, predicate output, ...)
  Layout layout = Layout::any_strided;
  Epilogue epilogue = Epilogue::none;
  int arch = 0;  ///< SM version the kernel was built for (90 = sm_90a); 0 = host
  Backend backend = Backend::host_reference;
  PrecisionGuarantee precision;
  /// The bespoke kernel where a family has several for one op and dtype
  /// ("tensor_cores"); empty otherwise. Static storage.
  const char* kernel = "";
  std::string to_string() const;
};

/// How `select` should choose among candidates.
struct PlanPreference {
  size_t max_workspace_bytes = SIZE_MAX;
  bool deterministic_only = false;
  bool allow_tf32 = false;  ///< f32 GEMMs may multiply in TF32 (10-bit mantissa), as torch's allow_tf32
  std::optional<Backend> backend;  ///< only this backend
  bool allow_host_fallback = true;  ///< allow the host backend on a host stream
  int skip_candidates = 0;  ///< skip this many accepting candidates ("next candidate")
};

// ---------------------------------------------------------------- plans

/// Named scalar attributes of an op (alpha, negative_slope, dtype code...).
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, double>> init) : values_(init) {}
  Attrs& set(const std::string& name, double value) { values_[name] = value; return *this; }
  double get(const std::string& name, double fallback) const;
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  const std::map<std::string, double>& values() const { return values_; }

 private:
  std::map<std::string, double> values_;
};

/// What an op is asked to do: its name, operand dtypes/shapes and attributes.
struct OpDesc {
  std::string op;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  Attrs attrs;
  std::string to_string() const;
};

/// The concrete tensors of one run. Outputs may alias inputs only with equal
/// layout (in-place).
struct OpArgs {
  std::span<const TensorView> inputs;
  std::span<const TensorView> outputs;
};

/// A selected kernel for one descriptor. Immutable and thread-safe.
class Plan {
 public:
  virtual ~Plan() = default;
  virtual const OpDesc& desc() const = 0;
  /// Validates the tensors against the descriptor; makes no CUDA call.
  virtual Status can_implement(const OpArgs& args) const = 0;
  /// Exact scratch bytes `run` needs.
  virtual size_t workspace_size() const = 0;
  virtual KernelSku sku() const = 0;
  PrecisionGuarantee precision_guarantee() const { return sku().precision; }
  /// Enqueues the op. Never allocates or synchronises; graph-capturable.
  virtual Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const = 0;
};
using PlanPtr = std::unique_ptr<const Plan>;

/// Walks the op's ordered candidate list and returns the first that accepts.
/// Set BARACUDA_VERBOSE_SELECT=1 to print every rejection with its reason.
Result<PlanPtr> select(const Stream& stream, const OpDesc& desc, const PlanPreference& pref = {});

/// Fills in a descriptor's outputs (dtypes/shapes) from its inputs and attrs,
/// as the op's shape rules say. Outputs already given are checked.
Result<OpDesc> infer(const std::string& op, std::vector<TensorSpec> inputs, const Attrs& attrs = {});

/// select + can_implement + run for ops needing no workspace (convenience).
Status run_op(const Stream& stream, const std::string& op, std::span<const TensorView> inputs,
              std::span<const TensorView> outputs, const Attrs& attrs = {});

/// True when a CUDA device is usable in this process.
bool cuda_available();

}  // namespace baracuda
