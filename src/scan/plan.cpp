// Scan family: cumsum, cumprod, logcumsumexp, cummax, cummin along `dim`,
// and their backward plans. CUDA kernels (scan/kernels.cuh) serve every
// op; the backward ops are scans of the views reversed along dim (Note
// [Scan gradients as reversed scans] in scan/ops.hpp).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype_traits.hpp"
#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/fp8_traits.hpp"
#include "core/registry_internal.hpp"
#include "core/rows.hpp"
#include "core/tensor_util.hpp"
#include "core/wrapping.hpp"
#include "scan/register.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {
namespace scan {

ScanTable& cuda_scans() {
  static ScanTable table;
  return table;
}

namespace {

using rows::RowLaunch;
enum class Kind : uint8_t { cumsum, cumprod, logcumsumexp, cummax, cummin };

struct Def {
  std::string name;
  Kind kind;
  bool backward;
  std::vector<std::string> inputs, outputs;
};

std::vector<Def>& defs() {
  static std::vector<Def> all;
  return all;
}

bool integral_or_bool(DType t) { return !is_floating(t) && !is_complex(t); }

/// Output dtype of the forward op (torch: integer cumsum/cumprod accumulate in i64).
DType value_dtype(Kind kind, DType in) {
  if ((kind == Kind::cumsum || kind == Kind::cumprod) && integral_or_bool(in)) return DType::i64;
  return in;
}

/// fp8 (e4m3, e5m2) for the forwards, which compute in f32; no fp8 gradients.
using ScanFloatTypes = Concat<FloatTypes, Fp8Types>::type;

std::vector<DType> dtypes_for(Kind kind, bool backward) {
  if (backward) return dtypes_of<FloatTypes>();
  if (kind == Kind::logcumsumexp) return dtypes_of<ScanFloatTypes>();
  return dtypes_of<Concat<ScanFloatTypes, IntBoolTypes>::type>();
}

int normalize_dim(double dim, int rank) {
  const int d = static_cast<int>(dim);
  return d < 0 ? d + rank : d;
}

// ---------------------------------------------------------------- host reference

/// One row of the forward op; x/y/idx walk with their strides. Math in f64
/// for floats, i64 for integers.
template <class T, class Out>
void forward_row(Kind kind, const T* x, int64_t sx, Out* y, int64_t sy, int64_t* idx, int64_t si, int64_t n) {
  using M = std::conditional_t<is_float_v<T>, double, int64_t>;
  M acc = kind == Kind::cumprod ? M(1) : M(0);
  double lse_max = -INFINITY, lse_sum = 0;
  int64_t best = 0;
  M best_v{};
  for (int64_t i = 0; i < n; ++i) {
    const M v = convert<M>(x[i * sx]);
    switch (kind) {
      case Kind::cumsum: acc = wrapping_add(acc, v); y[i * sy] = convert<Out>(acc); break;
      case Kind::cumprod: acc = wrapping_mul(acc, v); y[i * sy] = convert<Out>(acc); break;
      case Kind::logcumsumexp: {
        const double d = double(v);
        if (d != d || lse_max != lse_max) {
          lse_max = NAN;
        } else if (d > lse_max) {
          lse_sum = lse_sum * std::exp(lse_max - d) + 1;
          lse_max = d;
        } else if (d != -INFINITY) {
          lse_sum += std::exp(d - lse_max);
        }
        y[i * sy] = convert<Out>(lse_max == -INFINITY ? lse_max : lse_max + std::log(lse_sum));
        break;
      }
      case Kind::cummax:
      case Kind::cummin: {
        // torch: NaN wins and stays; ties move to the later index.
        const bool nan_v = v != v, nan_b = best_v != best_v;
        const bool take = i == 0 || nan_v ||
                          (!nan_b && (kind == Kind::cummax ? v >= best_v : v <= best_v));
        if (take && !(nan_b && !nan_v)) best_v = v, best = i;
        y[i * sy] = convert<Out>(best_v);
        idx[i * si] = best;
        break;
      }
    }
  }
}

/// One row of a backward op: dx from the grad g and the saved operand s
/// (the forward output, or the indices of cummax/cummin), in f64, walking
/// the row from its end (Note [Scan gradients as reversed scans]).
template <class T>
Status backward_row(Kind kind, const T* g, int64_t sg, const T* x, int64_t sx, const void* saved, int64_t ss, T* dx,
                  int64_t sd, int64_t n) {
  std::vector<double> out(n, 0.0);
  auto G = [&](int64_t j) { return convert<double>(g[j * sg]); };
  auto X = [&](int64_t j) { return convert<double>(x[j * sx]); };
  auto Y = [&](int64_t j) { return convert<double>(static_cast<const T*>(saved)[j * ss]); };
  switch (kind) {
    case Kind::cumsum: {
      double run = 0;
      for (int64_t i = n; i-- > 0;) out[i] = run += G(i);
      break;
    }
    case Kind::logcumsumexp: {  // dx_i = exp(x_i) sum_{j >= i} g_j exp(-y_j)
      using Op = ScaledSum<double>;
      Op::S run = Op::identity();
      for (int64_t i = n; i-- > 0;) out[i] = Op::scale(run = Op::combine(run, {-Y(i), G(i)}), X(i));
      break;
    }
    case Kind::cumprod: {  // dx_i = out_{i-1} R_i, R_i = g_i + x_{i+1} R_{i+1} (exact with zeros)
      double r = 0;
      for (int64_t i = n; i-- > 0;) {
        r = G(i) + (i + 1 < n ? X(i + 1) * r : 0.0);
        out[i] = (i > 0 ? Y(i - 1) : 1.0) * r;
      }
      break;
    }
    case Kind::cummax:
    case Kind::cummin: {  // the gradient of each output goes to the element it came from
      const int64_t* idx = static_cast<const int64_t*>(saved);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t to = idx[j * ss];
        if (to < 0 || to > j) return invalid("'indices' holds ", to, " at position ", j, " of a row; a running extreme's index lies in [0, ", j, "]");
        if (j > 0 && to < idx[(j - 1) * ss])
          return invalid("'indices' decreases from ", idx[(j - 1) * ss], " to ", to, " at position ", j,
                         " of a row; a running extreme's indices never decrease");
        if (idx[to * ss] != to)
          return invalid("'indices' holds ", to, " at position ", j, " but ", idx[to * ss], " at position ", to,
                         " of a row; a running extreme's index k holds k at position k");
        out[to] += G(j);
      }
      break;
    }
  }
  for (int64_t i = 0; i < n; ++i) dx[i * sd] = convert<T>(out[i]);
  return Status::ok();
}

Status run_on_host(const Def& def, const RowLaunch& l, DType t) {
  const rows::OffsetCalc<4, int64_t> outer(l.outer);
  const auto& st = l.inner.stride;
  return visit_dtype<Concat<ScanFloatTypes, IntBoolTypes>::type>(t, def.name, [&]<class T>(TypeTag<T>) -> Status {
    for (int64_t r = 0; r < l.rows; ++r) {
      int64_t off[4];
      outer.get(r, off);
      if (!def.backward) {
        // Operands: out, [indices], input.
        const bool two = def.outputs.size() == 2;
        const int in = two ? 2 : 1;
        const T* x = reinterpret_cast<const T*>(l.data[in]) + off[in];
        int64_t* idx = two ? reinterpret_cast<int64_t*>(l.data[1]) + off[1] : nullptr;
        if (value_dtype(def.kind, t) == DType::i64 && t != DType::i64) {
          forward_row(def.kind, x, st[in][0], reinterpret_cast<int64_t*>(l.data[0]) + off[0], st[0][0], idx,
                      two ? st[1][0] : 0, l.cols);
        } else {
          forward_row(def.kind, x, st[in][0], reinterpret_cast<T*>(l.data[0]) + off[0], st[0][0], idx,
                      two ? st[1][0] : 0, l.cols);
        }
      } else {
        if constexpr (has_gradient_v<T>) {
          // Operands: grad_input, grad_output, input, [saved].
          const bool saved = def.inputs.size() == 3;
          const size_t es = def.kind == Kind::cummax || def.kind == Kind::cummin ? sizeof(int64_t) : sizeof(T);
          BARACUDA_TRY(backward_row(def.kind, reinterpret_cast<const T*>(l.data[1]) + off[1], st[1][0],
                       reinterpret_cast<const T*>(l.data[2]) + off[2], st[2][0],
                       saved ? static_cast<const void*>(l.data[3] + off[3] * int64_t(es)) : nullptr,
                       saved ? st[3][0] : 0, reinterpret_cast<T*>(l.data[0]) + off[0], st[0][0], l.cols));
        } else {
          return unsupported(def.name, ": dtype ", dtype_name(t), " has no gradient");
        }
      }
    }
    return Status::ok();
  });
}

// ---------------------------------------------------------------- descriptors and plans

Result<OpDesc> infer_desc(const Def& def, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  const size_t xi = def.backward ? 1 : 0;
  BARACUDA_TRY(check_inputs(op, d, def.inputs, xi));
  const TensorSpec& x = d.inputs[xi];
  const int rank = static_cast<int>(x.shape.size());
  const auto dtypes = dtypes_for(def.kind, def.backward);
  if (std::find(dtypes.begin(), dtypes.end(), x.dtype) == dtypes.end())
    return unsupported(op, ": dtype ", dtype_name(x.dtype), " is not supported",
                       def.backward && is_fp8(x.dtype) ? " (fp8 forwards have no gradient)" : "");
  const double dim = d.attrs.get("dim", -1);
  const int axis = normalize_dim(dim, std::max(rank, 1));
  if (dim != std::floor(dim) || axis < 0 || axis >= std::max(rank, 1))
    return invalid(op, ": dim ", dim, " is out of range for rank ", rank);
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    const bool index = def.inputs[i] == "indices";
    const DType want = index ? DType::i64 : x.dtype;
    if (d.inputs[i].dtype != want || d.inputs[i].shape != x.shape)
      return invalid(op, ": '", def.inputs[i], "' must be ", dtype_name(want), shape_str(x.shape), ", got ",
                     dtype_name(d.inputs[i].dtype), shape_str(d.inputs[i].shape));
  }
  std::vector<TensorSpec> outs;
  if (def.backward) outs.push_back({x.dtype, x.shape});
  else outs.push_back({value_dtype(def.kind, x.dtype), x.shape});
  if (def.outputs.size() == 2) outs.push_back({DType::i64, x.shape});
  BARACUDA_TRY(set_outputs(op, d, outs, def.outputs));
  return d;
}

/// True when the CUDA kernels cut rows across blocks (single pass): rows
/// longer than a tile, too few of them for 16 blocks an SM (a function of
/// the shape only).
[[maybe_unused]] bool split_rows(int64_t rows, int64_t cols, int sm_count) {
  return rows > 0 && cols > kTile && rows < int64_t(sm_count) * 16;
}

/// The view reversed along `dim` (negative stride from the last element).
TensorView reversed(TensorView v, int dim) {
  if (v.rank == 0 || v.shape[dim] == 0) return v;
  v.data = static_cast<char*>(v.data) + (v.shape[dim] - 1) * v.stride[dim] * int64_t(dtype_size(v.dtype));
  v.stride[dim] = -v.stride[dim];
  return v;
}

class ScanPlan final : public FamilyPlan {
 public:
  ScanPlan(const Def& def, const OpInfo& info, OpDesc desc, Backend backend, ScanFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), fn_(fn) {
    const DType t = desc_.inputs[def.backward ? 1 : 0].dtype;
    sku_ = bespoke_sku(OpCategory::scan, def.name.c_str(), t, backend);  // tile totals merged in order
    if (!is_floating(t)) sku_.precision.math = MathPrecision::exact, sku_.precision.accumulator = DType::i64;
#ifdef BARACUDA_HAS_CUDA
    if (backend != Backend::host_reference) {
      const Shape& shape = desc_.inputs[def.backward ? 1 : 0].shape;
      const int rank = static_cast<int>(shape.size());
      const int dim = rank == 0 ? 0 : normalize_dim(desc_.attrs.get("dim", -1), rank);
      int64_t rows = 1, cols = rank == 0 ? 1 : shape[dim];
      for (int a = 0; a < rank; ++a)
        if (a != dim) rows *= shape[a];
      split_ = split_rows(rows, cols, current_sm_count());
      if (split_) workspace_ = single_pass_workspace(rows, cols);
    }
#endif
  }

  /// The CUDA gradients read the input and the saved operand at neighbouring
  /// positions while other threads write grad_input: it may share only
  /// grad_output's memory (in place).
  Status can_implement(const OpArgs& args) const override {
    BARACUDA_TRY(FamilyPlan::can_implement(args));
    if (fn_ && def_.backward && def_.kind != Kind::cumsum)
      for (size_t i = 1; i < args.inputs.size(); ++i)
        if (memory_overlaps(args.outputs[0], args.inputs[i]))
          return unsupported(def_.name, ": 'grad_input' overlaps '", def_.inputs[i],
                             "' (on CUDA it may share only grad_output's memory)");
    return Status::ok();
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const size_t xi = def_.backward ? 1 : 0;
    const Shape& shape = desc_.inputs[xi].shape;
    for (int64_t s : shape)
      if (s == 0) return Status::ok();
    // Move `dim` last in every operand: rows are then the leading dims.
    const int rank = static_cast<int>(shape.size());
    const int dim = rank == 0 ? 0 : normalize_dim(desc_.attrs.get("dim", -1), rank);
    RowLaunch l;
    if (fn_ && def_.backward) {  // scans from the end of the row
      const TensorView out = reversed(args.outputs[0], dim);
      std::array<TensorView, 4> in;
      for (size_t i = 0; i < args.inputs.size(); ++i) in[i] = reversed(args.inputs[i], dim);
      l = rows::rows_along(shape, dim, std::span(&out, 1), std::span(in.data(), args.inputs.size()));
    } else {
      l = rows::rows_along(shape, dim, args.outputs, args.inputs);
    }
    if (!fn_) return run_on_host(def_, l, desc_.inputs[xi].dtype).with_context(def_.name);
#ifdef BARACUDA_HAS_CUDA
    ScanLaunch launch;
    launch.rows = l;
    launch.indices = !def_.backward && def_.outputs.size() == 2;
    launch.split = split_;
    launch.workspace = workspace.data;
    launch.workspace_bytes = workspace.bytes;
    return fn_(launch, stream.cuda_stream()).with_context(def_.name);
#else
    (void)stream;
    return internal_error(def_.name, ": CUDA plan in a build without CUDA");
#endif
  }

 private:
  const Def& def_;
  ScanFn fn_;  ///< null: the host reference
  bool split_ = false;
};

void add_ops(std::vector<OpInfo>& ops, const char* name, Kind kind, const char* doc) {
  const bool extreme = kind == Kind::cummax || kind == Kind::cummin;
  for (bool backward : {false, true}) {
    Def def{backward ? cat(name, "_backward") : std::string(name), kind, backward, {}, {}};
    if (!backward) {
      def.inputs = {"input"};
      def.outputs = extreme ? std::vector<std::string>{"values", "indices"} : std::vector<std::string>{"out"};
    } else {
      def.inputs = {"grad_output", "input"};
      if (kind == Kind::logcumsumexp || kind == Kind::cumprod) def.inputs.push_back("output");
      if (extreme) def.inputs.push_back("indices");
      def.outputs = {"grad_input"};
    }
    defs().push_back(std::move(def));
    const Def& stored = defs().back();
    OpInfo info;
    info.name = stored.name;
    info.category = OpCategory::scan;
    info.family = "scan";
    info.direction = backward ? Direction::backward : Direction::forward;
    info.gradient = backward ? std::string(name) : cat(name, "_backward");
    info.input_names = stored.inputs;
    info.output_names = stored.outputs;
    info.dtypes = dtypes_for(kind, backward);
    info.attrs = {{"dim", -1, "the axis scanned (negative: from the end)"}};
    info.backends = {Backend::bespoke_cuda, Backend::host_reference};
    info.doc = backward ? cat("gradient of ", name) : doc;
    info.input_dtypes = [&stored](DType primary) {
      std::vector<DType> v;
      for (const auto& n : stored.inputs) v.push_back(n == "indices" ? DType::i64 : primary);
      return v;
    };
    info.domains = {kind == Kind::cumprod ? Domain{0.5, 1.5, true} : Domain{-2, 2}};
    // Saved operands are drawn at random: an output in [0.5, 2] (the
    // gradients are functions of it as given), indices all 0 (valid: one
    // segment per row; real ones are tested apart).
    // cumprod's gradient holds suffix products of the input: |x| <= 1 keeps
    // them finite over 65K-element (and broadcast, constant) rows. Where they
    // overflow, the parallel composition of affine maps may meet inf - inf
    // (NaN) where a serial loop would stay at +-inf.
    const Domain grad_x = kind == Kind::cumprod ? Domain{0.5, 1, true} : info.domains[0];
    if (backward) info.domains = {Domain{-1, 1}, grad_x, extreme ? Domain{0, 0, false, false, true} : Domain{0.5, 2}};
    // f32 running sums over 65K elements drift well past 4 ulps of their (cancelling) values.
    info.tolerance_scale = backward || kind == Kind::cumsum || kind == Kind::logcumsumexp ? 32 : 4;
    info.sample_attrs = {Attrs{}, Attrs{{"dim", 0}}};
    info.integer_valued_inputs = extreme && !backward;  // ties
    info.sample_shapes = [n = stored.inputs.size()](DType, const Shape& shape, const Attrs& attrs) -> std::optional<SampleShapes> {
        const int rank = static_cast<int>(shape.size());
        const int dim = normalize_dim(attrs.get("dim", -1), std::max(rank, 1));
        if (dim < 0 || dim >= std::max(rank, 1)) return std::nullopt;
        return SampleShapes{std::vector<Shape>(n, shape), {}};
      };
    const size_t index = ops.size();
    info.infer = [&stored](const OpDesc& partial) { return infer_desc(stored, partial); };
    info.make_plan = [&stored, index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
      auto full = infer_desc(stored, desc);
      if (!full) return full.status();
      ScanFn fn = nullptr;
      if (backend != Backend::host_reference) {
        const DType t = full->inputs[stored.backward ? 1 : 0].dtype;
        fn = cuda_scans().find(launch_key(stored.name, t));
        if (!fn)
          return unsupported(stored.name, ": no ", backend_name(backend), " kernel for ", dtype_name(t));
      }
      return PlanPtr(std::make_unique<ScanPlan>(stored, registry()[index], std::move(*full), backend, fn));
    };
    ops.push_back(std::move(info));
  }
}

}  // namespace
}  // namespace scan

void register_scan_ops(std::vector<OpInfo>& ops) {
  using scan::Kind;
  scan::defs().reserve(16);
  scan::add_ops(ops, "cumsum", Kind::cumsum, "running sum along dim (ints and bool sum in i64)");
  scan::add_ops(ops, "cumprod", Kind::cumprod, "running product along dim (ints and bool multiply in i64)");
  scan::add_ops(ops, "logcumsumexp", Kind::logcumsumexp, "running log(sum(exp(x))) along dim, computed stably");
  scan::add_ops(ops, "cummax", Kind::cummax, "running maximum and its index along dim (NaN propagates)");
  scan::add_ops(ops, "cummin", Kind::cummin, "running minimum and its index along dim (NaN propagates)");
}

}  // namespace baracuda
