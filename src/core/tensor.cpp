#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/errors.hpp"
#include "core/tensor_util.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {

Result<int64_t> checked_numel(std::span<const int64_t> shape, std::string_view what) {
  int64_t n = 1;
  bool zero = false;
  for (int64_t s : shape) {
    if (s < 0) return invalid(what, ": shape ", shape_str(shape), " has a negative size");
    if (s == 0) zero = true;
  }
  if (zero) return int64_t{0};
  for (int64_t s : shape) {
    if (__builtin_mul_overflow(n, s, &n))
      return invalid(what, ": shape ", shape_str(shape), " has more than 2^63 elements");
  }
  return n;
}

std::string shape_str(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

int64_t TensorSpec::numel() const {
  auto n = checked_numel(shape, "tensor");
  return n ? *n : -1;
}

Result<TensorView> TensorView::strided(void* data, DType dtype, std::span<const int64_t> shape,
                                       std::span<const int64_t> strides) {
  if (shape.size() > static_cast<size_t>(kMaxRank))
    return invalid("tensor view: rank ", shape.size(), " exceeds the maximum rank ", kMaxRank);
  if (strides.size() != shape.size())
    return invalid("tensor view: ", strides.size(), " strides given for rank ", shape.size());
  auto n = checked_numel(shape, "tensor view");
  if (!n) return n.status();
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), v.shape.begin());
  std::copy(strides.begin(), strides.end(), v.stride.begin());
  return v;
}

Result<TensorView> TensorView::contiguous(void* data, DType dtype, std::span<const int64_t> shape) {
  if (shape.size() > static_cast<size_t>(kMaxRank))
    return invalid("tensor view: rank ", shape.size(), " exceeds the maximum rank ", kMaxRank);
  std::array<int64_t, kMaxRank> strides{};
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    // Checked even where a size-0 dim makes the count 0 (strided() checks sizes and the count).
    if (i > 0 && __builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s))
      return invalid("tensor view: the row-major strides of shape ", shape_str(shape), " exceed 2^63");
  }
  return strided(data, dtype, shape, std::span<const int64_t>(strides.data(), shape.size()));
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::pair<int64_t, int64_t> TensorView::span() const {
  if (numel() == 0) return {0, -1};
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < rank; ++i) {
    int64_t reach = stride[i] * (shape[i] - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo, hi};
}

size_t TensorView::span_bytes() const {
  auto [lo, hi] = span();
  return hi < lo ? 0 : static_cast<size_t>(hi - lo + 1) * dtype_size(dtype);
}

Result<Shape> broadcast_shapes(std::span<const Shape> shapes, std::span<const std::string> names,
                               std::string_view op) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (size_t k = 0; k < shapes.size(); ++k) {
    const Shape& s = shapes[k];
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[rank - s.size() + i];
      int64_t d = s[i];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      std::string shapes_text;
      for (size_t j = 0; j < shapes.size(); ++j)
        shapes_text += cat(j ? ", " : "", names[j], " ", shape_str(shapes[j]));
      return invalid(op, ": shapes do not broadcast (", shapes_text, "): operand '", names[k],
                     "' has size ", d, " where the others have ", o);
    }
  }
  return out;
}

bool has_internal_overlap(const TensorView& v) {
  if (v.numel() <= 1) return false;
  std::array<std::pair<int64_t, int64_t>, kMaxRank> dims{};  // |stride|, size
  int n = 0;
  for (int i = 0; i < v.rank; ++i)
    if (v.shape[i] > 1) dims[n++] = {std::llabs(v.stride[i]), v.shape[i]};
  // At most kMaxRank entries: an insertion sort (std::sort's inlined
  // insertion pass drew a GCC 12 -Warray-bounds false positive here).
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  int64_t reach = 0;  // largest offset reachable by the inner dims
  for (int i = 0; i < n; ++i) {
    if (dims[i].first <= reach) return true;
    reach += dims[i].first * (dims[i].second - 1);
  }
  return false;
}

namespace {

/// The bytes [lo, hi) a view touches; lo == hi when it touches none (empty or null).
struct ByteRange {
  intptr_t lo = 0, hi = 0;
  bool empty() const { return lo == hi; }
  bool meets(const ByteRange& o) const { return !empty() && !o.empty() && lo < o.hi && o.lo < hi; }
};

ByteRange byte_range(const TensorView& v) {
  if (v.numel() == 0 || !v.data) return {};
  auto [lo, hi] = v.span();
  const intptr_t base = reinterpret_cast<intptr_t>(v.data), es = static_cast<intptr_t>(dtype_size(v.dtype));
  return {base + lo * es, base + (hi + 1) * es};
}

// Note [Overlaps among many operands]
// can_implement checks every output against every other operand. A list op
// (grouped_gemm) has hundreds of operands, and the pairwise loops cost a
// millisecond a call at 64 groups. Past kPairwiseChecks pairs, the outputs'
// byte ranges are sorted by start: two outputs overlap only if one starts
// before the furthest end seen so far; once they are disjoint, each input's
// range is looked up by binary search. The same pairs are found either way
// (memory_overlaps is the byte-range test); only the order of the search
// differs, so the first pair is taken in index order in both.
constexpr size_t kPairwiseChecks = 64;

/// Output indices with a non-empty range, sorted by range start.
std::vector<std::pair<ByteRange, size_t>> sorted_ranges(std::span<const TensorView> views) {
  std::vector<std::pair<ByteRange, size_t>> r;
  r.reserve(views.size());
  for (size_t j = 0; j < views.size(); ++j)
    if (ByteRange b = byte_range(views[j]); !b.empty()) r.push_back({b, j});
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.first.lo < b.first.lo; });
  return r;
}

}  // namespace

bool memory_overlaps(const TensorView& a, const TensorView& b) { return byte_range(a).meets(byte_range(b)); }

std::optional<std::pair<size_t, size_t>> overlapping_outputs(std::span<const TensorView> outputs) {
  const size_t n = outputs.size();
  if (n * n <= kPairwiseChecks) {
    for (size_t j = 0; j < n; ++j)
      for (size_t k = 0; k < j; ++k)
        if (memory_overlaps(outputs[k], outputs[j])) return std::pair{k, j};
    return std::nullopt;
  }
  // Any overlap shows as a range starting before the furthest end of those
  // before it; then the pairwise search names the first pair in index order.
  const auto sorted = sorted_ranges(outputs);
  intptr_t furthest = std::numeric_limits<intptr_t>::min();
  bool any = false;
  for (const auto& [range, j] : sorted) {
    if (range.lo < furthest) {
      any = true;
      break;
    }
    furthest = std::max(furthest, range.hi);
  }
  if (!any) return std::nullopt;
  for (size_t j = 0; j < n; ++j)
    for (size_t k = 0; k < j; ++k)
      if (memory_overlaps(outputs[k], outputs[j])) return std::pair{k, j};
  return std::nullopt;
}

Status for_each_overlap(std::span<const TensorView> outputs, std::span<const TensorView> inputs,
                        const std::function<Status(size_t, size_t)>& visit) {
  if (outputs.size() * inputs.size() <= kPairwiseChecks) {
    for (size_t j = 0; j < outputs.size(); ++j)
      for (size_t i = 0; i < inputs.size(); ++i)
        if (memory_overlaps(outputs[j], inputs[i])) BARACUDA_TRY(visit(j, i));
    return Status::ok();
  }
  // Disjoint outputs sorted by start are sorted by end too: an input's first
  // candidate is the first output ending past the input's start.
  const auto sorted = sorted_ranges(outputs);
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ByteRange in = byte_range(inputs[i]);
    if (in.empty()) continue;
    auto at = std::partition_point(sorted.begin(), sorted.end(), [&](const auto& o) { return o.first.hi <= in.lo; });
    for (; at != sorted.end() && at->first.lo < in.hi; ++at) pairs.push_back({at->second, i});
  }
  std::sort(pairs.begin(), pairs.end());  // outputs in order, each output's inputs in order
  for (const auto& [j, i] : pairs) BARACUDA_TRY(visit(j, i));
  return Status::ok();
}

bool same_layout(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || dtype_size(a.dtype) != dtype_size(b.dtype) || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i]) return false;
    if (a.shape[i] > 1 && a.stride[i] != b.stride[i]) return false;
  }
  return true;
}

Status fill_bytes(const TensorView& v, uint8_t byte, const Stream& stream) {
  const int64_t n = v.numel();
  if (n == 0) return Status::ok();
  const int64_t es = int64_t(dtype_size(v.dtype));
  const int last = v.rank - 1;
  const int64_t len = last < 0 ? 1 : v.shape[last], step = last < 0 ? 0 : v.stride[last], lines = n / len;
  for (int64_t line = 0; line < lines; ++line) {
    int64_t off = 0;  // element offset of the line's first element
    for (int64_t d = last - 1, rest = line; d >= 0; --d) off += (rest % v.shape[d]) * v.stride[d], rest /= v.shape[d];
    char* first = static_cast<char*>(v.data) + off * es;
    if (stream.is_host()) {
      for (int64_t i = 0; i < len; ++i) std::memset(first + i * step * es, byte, size_t(es));
      continue;
    }
#ifdef BARACUDA_HAS_CUDA
    // The line from its lowest address: a negative stride walks down from `first`.
    char* low = step < 0 ? first + (len - 1) * step * es : first;
    const size_t pitch = size_t(step == 0 ? es : std::abs(step) * es);
    BARACUDA_CUDA_TRY(cudaMemset2DAsync(low, pitch, byte, size_t(es), size_t(step == 0 ? 1 : len), stream.cuda_stream()));
#else
    return unsupported("fill_bytes: a CUDA stream in a build without CUDA");
#endif
  }
  return Status::ok();
}

Status check_inputs(std::string_view op, const OpDesc& d, std::span<const std::string> input_names, size_t primary) {
  if (d.inputs.size() != input_names.size())
    return invalid(op, ": expected ", input_names.size(), " inputs, got ", d.inputs.size());
  const TensorSpec& x = d.inputs[primary];
  if (x.shape.size() > static_cast<size_t>(kMaxRank))
    return invalid(op, ": '", input_names[primary], "' has rank ", x.shape.size(), ", the maximum is ", kMaxRank);
  return checked_numel(x.shape, cat(op, ": '", input_names[primary], "'")).status();
}

Status set_outputs(std::string_view op, OpDesc& d, const std::vector<TensorSpec>& expected,
                   std::span<const std::string> output_names) {
  if (d.outputs.empty()) {
    d.outputs = expected;
    return Status::ok();
  }
  if (d.outputs.size() != expected.size())
    return invalid(op, ": expected ", expected.size(), " outputs, got ", d.outputs.size());
  for (size_t j = 0; j < expected.size(); ++j)
    if (d.outputs[j].dtype != expected[j].dtype || d.outputs[j].shape != expected[j].shape)
      return invalid(op, ": output '", output_names[j], "' must be ", dtype_name(expected[j].dtype),
                     shape_str(expected[j].shape), ", got ", dtype_name(d.outputs[j].dtype), shape_str(d.outputs[j].shape));
  return Status::ok();
}

Status check_args(std::string_view op, const OpArgs& args, const OpDesc& desc, std::span<const std::string> input_names,
                  std::span<const std::string> output_names) {
  if (args.inputs.size() != desc.inputs.size() || args.outputs.size() != desc.outputs.size())
    return invalid(op, ": expected ", desc.inputs.size(), " inputs and ", desc.outputs.size(), " outputs, got ",
                   args.inputs.size(), " and ", args.outputs.size());
  auto check = [&](const TensorView& v, const TensorSpec& spec, const std::string& name) -> Status {
    if (v.rank < 0 || v.rank > kMaxRank)
      return invalid(op, ": '", name, "' has rank ", v.rank, ", the maximum is ", kMaxRank);
    if (v.dtype != spec.dtype)
      return invalid(op, ": '", name, "' dtype ", dtype_name(v.dtype), " != descriptor dtype ", dtype_name(spec.dtype));
    if (!std::equal(v.shape.begin(), v.shape.begin() + v.rank, spec.shape.begin(), spec.shape.end()))
      return invalid(op, ": '", name, "' shape ", shape_str(v.shape_vec()), " != descriptor shape ",
                     shape_str(spec.shape));
    if (!v.data && v.numel() > 0) return invalid(op, ": '", name, "' has null data and ", v.numel(), " elements");
    return Status::ok();
  };
  for (size_t i = 0; i < args.inputs.size(); ++i) BARACUDA_TRY(check(args.inputs[i], desc.inputs[i], input_names[i]));
  for (size_t j = 0; j < args.outputs.size(); ++j) {
    const TensorView& out = args.outputs[j];
    const std::string& name = output_names[j];
    BARACUDA_TRY(check(out, desc.outputs[j], name));
    if (has_internal_overlap(out))
      return invalid(op, ": output '", name, "' has overlapping elements (strides ",
                     shape_str(std::span<const int64_t>(out.stride.data(), out.rank)), " for shape ",
                     shape_str(out.shape_vec()), ")");
  }
  if (auto pair = overlapping_outputs(args.outputs))
    return invalid(op, ": outputs '", output_names[pair->first], "' and '", output_names[pair->second],
                   "' overlap in memory");
  return for_each_overlap(args.outputs, args.inputs, [&](size_t j, size_t i) -> Status {
    if (same_layout(args.outputs[j], args.inputs[i])) return Status::ok();  // in place
    return invalid(op, ": output '", output_names[j], "' overlaps input '", input_names[i],
                   "' with a different layout (in-place needs equal shape, strides and element size)");
  });
}

}  // namespace baracuda
