// Softmax family: softmax, log_softmax, softmin along `dim`, and their
// backward plans (from grad_output and the forward output).
#include <algorithm>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/rows.hpp"
#include "core/tensor_util.hpp"
#include "softmax/register.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {
namespace smax {

SoftmaxTable& host_softmax() {
  static SoftmaxTable table;
  return table;
}
SoftmaxTable& cuda_softmax() {
  static SoftmaxTable table;
  return table;
}

namespace {

/// The host reference: each row in f64 with the same math as the kernels.
template <class Op, class T, bool kBackward>
Status softmax_on_host(const RowLaunch& l, CUstream_st*) {
  using M = math_t<T, true>;
  const rows::OffsetCalc<3, int64_t> outer(l.outer);
  const int64_t so = l.inner.stride[0][0], sa = l.inner.stride[1][0], sb = kBackward ? l.inner.stride[2][0] : 0;
  std::vector<M> buf(l.cols);
  for (int64_t r = 0; r < l.rows; ++r) {
    int64_t off[3];
    outer.get(r, off);
    T* out = reinterpret_cast<T*>(l.data[0]) + off[0];
    const T* a = reinterpret_cast<const T*>(l.data[1]) + off[1];
    if constexpr (!kBackward) {
      const M sign = Op::template sign<M>();
      M max = -INFINITY, sum = 0;
      for (int64_t c = 0; c < l.cols; ++c) {
        buf[c] = sign * convert<M>(a[c * sa]);
        max = buf[c] > max || buf[c] != buf[c] ? buf[c] : max;
      }
      for (int64_t c = 0; c < l.cols; ++c) sum += std::exp(buf[c] - max);
      for (int64_t c = 0; c < l.cols; ++c) out[c * so] = convert<T>(Op::out(buf[c], max, sum));
    } else {
      const T* b = reinterpret_cast<const T*>(l.data[2]) + off[2];
      M t = 0;
      for (int64_t c = 0; c < l.cols; ++c) t += Op::term(convert<M>(a[c * sa]), convert<M>(b[c * sb]));
      for (int64_t c = 0; c < l.cols; ++c)
        out[c * so] = convert<T>(Op::grad(convert<M>(a[c * sa]), convert<M>(b[c * sb]), t));
    }
  }
  return Status::ok();
}

template <class Op, class T, bool kBackward>
struct HostSoftmax {
  static Status run(const RowLaunch& l, CUstream_st* s) { return softmax_on_host<Op, T, kBackward>(l, s); }
};
[[maybe_unused]] const bool host_registered = register_softmax<HostSoftmax, SoftmaxTypes>(host_softmax());

struct Def {
  std::string name;
  bool backward;
  const char* doc;
};

std::vector<Def>& defs() {
  static std::vector<Def> all;
  return all;
}

int normalize_dim(double dim, int rank) {
  const int d = static_cast<int>(dim);
  return d < 0 ? d + rank : d;
}

Result<OpDesc> infer_desc(const Def& def, const OpInfo& info, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  if (d.inputs.size() != info.input_names.size())
    return invalid(op, ": expected ", info.input_names.size(), " inputs, got ", d.inputs.size());
  const TensorSpec& x = d.inputs[0];
  if (x.shape.size() > static_cast<size_t>(kMaxRank))
    return invalid(op, ": '", info.input_names[0], "' has rank ", x.shape.size(), ", the maximum is ", kMaxRank);
  BARACUDA_TRY(checked_numel(x.shape, cat(op, ": '", info.input_names[0], "'")).status());
  if (std::find(info.dtypes.begin(), info.dtypes.end(), x.dtype) == info.dtypes.end())
    return unsupported(op, ": dtype ", dtype_name(x.dtype), " is not supported");
  for (size_t i = 1; i < d.inputs.size(); ++i) {
    if (d.inputs[i].dtype != x.dtype)
      return invalid(op, ": '", info.input_names[i], "' dtype ", dtype_name(d.inputs[i].dtype), " != '",
                     info.input_names[0], "' dtype ", dtype_name(x.dtype));
    if (d.inputs[i].shape != x.shape)
      return invalid(op, ": '", info.input_names[i], "' shape ", shape_str(d.inputs[i].shape), " != '",
                     info.input_names[0], "' shape ", shape_str(x.shape));
  }
  const int rank = static_cast<int>(x.shape.size());
  const double dim_attr = d.attrs.get("dim", -1);
  const int dim = normalize_dim(dim_attr, std::max(rank, 1));
  if (dim_attr != std::floor(dim_attr) || dim < 0 || dim >= std::max(rank, 1))
    return invalid(op, ": dim ", dim_attr, " is out of range for rank ", rank);
  const TensorSpec expected{x.dtype, x.shape};
  if (d.outputs.empty()) d.outputs.push_back(expected);
  else if (d.outputs.size() != 1 || d.outputs[0].dtype != expected.dtype || d.outputs[0].shape != expected.shape)
    return invalid(op, ": output must be ", dtype_name(expected.dtype), shape_str(expected.shape));
  return d;
}

class SoftmaxPlan final : public FamilyPlan {
 public:
  SoftmaxPlan(const Def& def, const OpInfo& info, OpDesc desc, Backend backend, SoftmaxFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), fn_(fn) {
    sku_ = bespoke_sku(OpCategory::softmax, info.name.c_str(), desc_.inputs[0].dtype, backend);
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const Shape& shape = desc_.inputs[0].shape;
    for (int64_t s : shape)
      if (s == 0) return Status::ok();
    // Move `dim` last in every operand: rows are then the leading dims.
    const int rank = static_cast<int>(shape.size());
    const int dim = rank == 0 ? 0 : normalize_dim(desc_.attrs.get("dim", -1), rank);
    const Shape moved = rows::move_axis_last(shape, dim);
    std::array<TensorView, 3> views;
    std::array<rows::Role, 3> roles;
    size_t n = 0;
    views[n] = rows::move_axis_last(args.outputs[0], dim), roles[n++] = rows::Role::full;
    for (const auto& v : args.inputs) views[n] = rows::move_axis_last(v, dim), roles[n++] = rows::Role::full;
    const RowLaunch l = rows::make_rows(moved, rank == 0 ? 0 : 1, std::span(views.data(), n), std::span(roles.data(), n));
    return fn_(l, stream.cuda_stream()).with_context(def_.name);
  }

 private:
  const Def& def_;
  SoftmaxFn fn_;
};

template <class Op>
void add_ops(std::vector<OpInfo>& ops) {
  for (bool backward : {false, true}) {
    defs().push_back(Def{backward ? cat(Op::name, "_backward") : std::string(Op::name), backward, Op::doc});
    const Def& def = defs().back();
    OpInfo info;
    info.name = def.name;
    info.category = OpCategory::softmax;
    info.family = "softmax";
    info.direction = backward ? Direction::backward : Direction::forward;
    info.gradient = backward ? std::string(Op::name) : cat(Op::name, "_backward");
    info.input_names = backward ? std::vector<std::string>{"grad_output", "output"} : std::vector<std::string>{"input"};
    info.output_names = {backward ? "grad_input" : "out"};
    info.dtypes = dtypes_of<SoftmaxTypes>();
    info.attrs = {{"dim", -1, "the axis the softmax runs along (negative: from the end)"}};
    info.backends = {Backend::bespoke_cuda, Backend::host_reference};
    info.doc = backward ? cat("gradient of ", Op::name, " from grad_output and the forward output") : Op::doc;
    info.input_dtypes = [n = info.input_names.size()](DType primary) { return std::vector<DType>(n, primary); };
    info.domains = backward ? std::vector<Domain>{{-1, 1}, {0, 1}} : std::vector<Domain>{{-6, 6}};
    if (backward && Op::kLog) info.domains = {{-1, 1}, {-8, 0}};
    info.tolerance_scale = 2;
    info.sample_attrs = {Attrs{}, Attrs{{"dim", 0}}, Attrs{{"dim", 1}}};
    info.sample_shapes = [n = info.input_names.size()](DType, const Shape& shape,
                                                       const Attrs& attrs) -> std::optional<SampleShapes> {
      const int rank = static_cast<int>(shape.size());
      const int dim = normalize_dim(attrs.get("dim", -1), std::max(rank, 1));
      if (dim < 0 || dim >= std::max(rank, 1)) return std::nullopt;
      return SampleShapes{std::vector<Shape>(n, shape), {}};
    };
    const size_t index = ops.size();
    info.infer = [&def, index](const OpDesc& partial) { return infer_desc(def, registry()[index], partial); };
    info.make_plan = [&def, index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
      const OpInfo& self = registry()[index];
      auto full = infer_desc(def, self, desc);
      if (!full) return full.status();
      const SoftmaxTable& table = backend == Backend::host_reference ? host_softmax() : cuda_softmax();
      SoftmaxFn fn = table.find(launch_key(def.name, full->inputs[0].dtype));
      if (!fn) return unsupported("no ", backend_name(backend), " kernel for ", def.name, " ", dtype_name(full->inputs[0].dtype));
      return PlanPtr(std::make_unique<SoftmaxPlan>(def, self, std::move(*full), backend, fn));
    };
    ops.push_back(std::move(info));
  }
}

}  // namespace
}  // namespace smax

void register_softmax_ops(std::vector<OpInfo>& ops) {
  using namespace smax;
  defs().reserve(8);
  add_ops<Softmax<0>>(ops);
  add_ops<Softmax<1>>(ops);
  add_ops<Softmax<2>>(ops);
}

}  // namespace baracuda
