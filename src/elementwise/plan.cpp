// Elementwise family: registry entries (one per op and per gradient), shape
// and dtype rules, operand validation and the plan that launches kernels.
#include <algorithm>
#include <map>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "elementwise/ops.hpp"
#include "elementwise/prepare.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {
namespace ew {

KernelTable& host_kernels() {
  static KernelTable table;
  return table;
}
KernelTable& cuda_kernels() {
  static KernelTable table;
  return table;
}

namespace {

/// What the plan needs to know about one registered elementwise op.
struct Def {
  std::string name;
  Kind kind;
  bool backward;
  std::vector<std::string> attr_names;
  std::vector<double> attr_defaults;
  std::vector<DType> dtypes;
};

bool contains(const std::vector<DType>& v, DType d) { return std::find(v.begin(), v.end(), d) != v.end(); }

std::string dtype_list(const std::vector<DType>& v) {
  std::string s;
  for (DType d : v) s += cat(s.empty() ? "" : " ", dtype_name(d));
  return s;
}

int normalize_dim(double dim, size_t rank) {
  int d = static_cast<int>(dim);
  return d < 0 ? d + static_cast<int>(rank) : d;
}

// ---------------------------------------------------------------- shape and dtype rules

/// Checks that inputs [first, last) share one dtype; returns it.
Result<DType> common_dtype(const Def& def, const OpDesc& d, const OpInfo& info, size_t first, size_t last) {
  DType t = d.inputs[first].dtype;
  for (size_t i = first + 1; i < last; ++i)
    if (d.inputs[i].dtype != t)
      return invalid(def.name, ": input '", info.input_names[i], "' has dtype ", dtype_name(d.inputs[i].dtype),
                     ", expected ", dtype_name(t), " like '", info.input_names[first],
                     "' (no implicit promotion: cast first)");
  return t;
}

Result<Shape> broadcast_inputs(const Def& def, const OpDesc& d, const OpInfo& info, size_t first, size_t last) {
  std::vector<Shape> shapes;
  std::vector<std::string> names;
  for (size_t i = first; i < last; ++i) {
    shapes.push_back(d.inputs[i].shape);
    names.push_back(info.input_names[i]);
  }
  return broadcast_shapes(shapes, names, def.name);
}

/// Fills in (or checks) the outputs of a descriptor.
Result<OpDesc> infer_desc(const Def& def, const OpInfo& info, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  if (d.inputs.size() != info.input_names.size())
    return invalid(op, ": expected ", info.input_names.size(), " inputs, got ", d.inputs.size());
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    if (d.inputs[i].shape.size() > static_cast<size_t>(kMaxRank))
      return invalid(op, ": input '", info.input_names[i], "' has rank ", d.inputs[i].shape.size(),
                     ", the maximum is ", kMaxRank);
    auto n = checked_numel(d.inputs[i].shape, cat(op, ": input '", info.input_names[i], "'"));
    if (!n) return n.status();
  }
  for (const auto& o : d.outputs) {
    if (o.shape.size() > static_cast<size_t>(kMaxRank))
      return invalid(op, ": an output has rank ", o.shape.size(), ", the maximum is ", kMaxRank);
    auto n = checked_numel(o.shape, cat(op, ": output"));
    if (!n) return n.status();
  }

  auto check_dtype = [&](DType t, const char* role) -> Status {
    if (!contains(def.dtypes, t))
      return unsupported(op, ": ", role, " dtype ", dtype_name(t), " is not supported (supported: ",
                         dtype_list(def.dtypes), ")");
    return Status::ok();
  };

  // Expected outputs: dtype and shape each.
  std::vector<TensorSpec> expected;
  bool outputs_may_reduce = false;  // backward outputs may be summed to a broadcast shape
  switch (def.kind) {
    case Kind::unary:
    case Kind::predicate:
    case Kind::cast:
    case Kind::gated: {
      if (!def.backward) {
        DType t = d.inputs[0].dtype;
        BARACUDA_TRY(check_dtype(t, "input"));
        Shape shape = d.inputs[0].shape;
        DType out = def.kind == Kind::predicate ? DType::boolean : t;
        if (def.kind == Kind::cast) {
          double code = d.attrs.get("dtype", -1);
          if (code < 0 || code >= kNumDTypes || code != static_cast<int>(code))
            return invalid(op, ": attribute 'dtype' must be a dtype code in [0, ", kNumDTypes, "), got ", code);
          out = static_cast<DType>(static_cast<int>(code));
        }
        if (def.kind == Kind::gated) {
          if (shape.empty()) return invalid(op, ": input must have rank >= 1, got a scalar");
          int dim = normalize_dim(d.attrs.get("dim", -1), shape.size());
          if (dim < 0 || dim >= static_cast<int>(shape.size()))
            return invalid(op, ": dim ", d.attrs.get("dim", -1), " is out of range for input rank ", shape.size());
          if (shape[dim] % 2 != 0)
            return invalid(op, ": input size ", shape[dim], " along dim ", dim, " must be even (split in halves)");
          shape[dim] /= 2;
        }
        expected = {{out, shape}};
      } else {  // (grad_output, input) -> grad_input
        auto t = common_dtype(def, d, info, 0, 2);
        if (!t) return t.status();
        BARACUDA_TRY(check_dtype(*t, "input"));
        Shape grad_shape = d.inputs[1].shape;
        if (def.kind == Kind::gated) {
          int dim = normalize_dim(d.attrs.get("dim", -1), grad_shape.size());
          if (dim < 0 || dim >= static_cast<int>(grad_shape.size()) || grad_shape[dim] % 2 != 0)
            return invalid(op, ": input shape ", shape_str(grad_shape), " cannot be split in halves along dim ",
                           d.attrs.get("dim", -1));
          grad_shape[dim] /= 2;
        }
        if (d.inputs[0].shape != grad_shape)
          return invalid(op, ": grad_output shape ", shape_str(d.inputs[0].shape), " != expected ",
                         shape_str(grad_shape));
        expected = {{*t, d.inputs[1].shape}};
      }
      break;
    }
    case Kind::binary:
    case Kind::compare:
    case Kind::ternary: {
      size_t first = def.backward ? 1 : 0;
      auto t = common_dtype(def, d, info, 0, d.inputs.size());
      if (!t) return t.status();
      BARACUDA_TRY(check_dtype(*t, "input"));
      auto shape = broadcast_inputs(def, d, info, first, d.inputs.size());
      if (!shape) return shape.status();
      if (!def.backward) {
        expected = {{def.kind == Kind::compare ? DType::boolean : *t, *shape}};
      } else {
        if (d.inputs[0].shape != *shape)
          return invalid(op, ": grad_output shape ", shape_str(d.inputs[0].shape),
                         " != the broadcast shape of the inputs ", shape_str(*shape));
        for (size_t i = 1; i < d.inputs.size(); ++i) expected.push_back({*t, d.inputs[i].shape});
      }
      break;
    }
    case Kind::where: {
      if (!def.backward) {
        if (d.inputs[0].dtype != DType::boolean)
          return invalid(op, ": input 'condition' must be bool, got ", dtype_name(d.inputs[0].dtype));
        auto t = common_dtype(def, d, info, 1, 3);
        if (!t) return t.status();
        BARACUDA_TRY(check_dtype(*t, "input"));
        auto shape = broadcast_inputs(def, d, info, 0, 3);
        if (!shape) return shape.status();
        expected = {{*t, *shape}};
      } else {  // (grad_output, condition) -> (grad_input, grad_other)
        DType t = d.inputs[0].dtype;
        BARACUDA_TRY(check_dtype(t, "grad_output"));
        if (d.inputs[1].dtype != DType::boolean)
          return invalid(op, ": input 'condition' must be bool, got ", dtype_name(d.inputs[1].dtype));
        auto shape = broadcast_inputs(def, d, info, 0, 2);
        if (!shape) return shape.status();
        if (*shape != d.inputs[0].shape)
          return invalid(op, ": condition shape ", shape_str(d.inputs[1].shape), " does not broadcast to grad_output ",
                         shape_str(d.inputs[0].shape));
        expected = {{t, *shape}, {t, *shape}};
        outputs_may_reduce = true;
      }
      break;
    }
    case Kind::fill: {
      if (d.outputs.size() != 1) return invalid(op, ": give the output spec (dtype and shape) in the descriptor");
      BARACUDA_TRY(check_dtype(d.outputs[0].dtype, "output"));
      expected = d.outputs;
      break;
    }
  }

  if (d.outputs.empty()) {
    d.outputs = expected;
    return d;
  }
  if (d.outputs.size() != expected.size())
    return invalid(op, ": expected ", expected.size(), " outputs, got ", d.outputs.size());
  for (size_t j = 0; j < expected.size(); ++j) {
    const auto& name = info.output_names[j];
    if (d.outputs[j].dtype != expected[j].dtype)
      return invalid(op, ": output '", name, "' dtype ", dtype_name(d.outputs[j].dtype), " != expected ",
                     dtype_name(expected[j].dtype));
    if (d.outputs[j].shape == expected[j].shape) continue;
    if (outputs_may_reduce) {
      std::vector<Shape> pair{d.outputs[j].shape, expected[j].shape};
      std::vector<std::string> names{name, "grad_output"};
      auto b = broadcast_shapes(pair, names, op);
      if (b && *b == expected[j].shape) continue;
    }
    return invalid(op, ": output '", name, "' shape ", shape_str(d.outputs[j].shape), " != expected ",
                   shape_str(expected[j].shape));
  }
  return d;
}

// ---------------------------------------------------------------- plan

PrecisionGuarantee derive_precision(DType element, Backend backend, Kind kind) {
  // No atomics: reductions over broadcast dims run in a fixed order.
  const bool exact = kind == Kind::cast || kind == Kind::fill || kind == Kind::where || !is_floating(element);
  return bespoke_precision(element, backend, exact ? std::optional(element) : std::nullopt);
}

class ElementwisePlan final : public FamilyPlan {
 public:
  ElementwisePlan(const Def& def, const OpInfo& info, OpDesc desc, Backend backend, LaunchFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), backend_(backend), fn_(fn) {
    for (size_t i = 0; i < def.attr_names.size() && i < 4; ++i)
      params_.v[i] = desc_.attrs.get(def.attr_names[i], def.attr_defaults[i]);
    DType element = def.kind == Kind::fill ? desc_.outputs[0].dtype : desc_.inputs[0].dtype;
    if (def.kind == Kind::where && !def.backward) element = desc_.inputs[1].dtype;
    DType out = desc_.outputs[0].dtype;
    sku_.category = OpCategory::elementwise;
    sku_.op = info.name.c_str();
    sku_.element = element;
    if (out != element) sku_.aux_element = out;
    sku_.layout = Layout::any_strided;
    sku_.backend = backend;
#ifdef BARACUDA_HAS_CUDA
    sku_.arch = backend == Backend::host_reference ? 0 : current_sm_version();
#endif
    sku_.precision = derive_precision(element, backend, def.kind);
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const bool gated = def_.kind == Kind::gated;
    const Shape& iteration = def_.backward ? desc_.inputs[0].shape : desc_.outputs[0].shape;
    for (int64_t s : iteration)
      if (s == 0) return Status::ok();
    std::array<TensorView, 3> split_out;
    std::array<TensorView, 4> split_in;
    std::span<const TensorView> outputs = args.outputs, inputs = args.inputs;
    if (gated) {  // kernels see the halves of x (and of dx)
      const TensorView& x = def_.backward ? args.inputs[1] : args.inputs[0];
      int dim = normalize_dim(desc_.attrs.get("dim", -1), x.rank);
      auto halves = [&](const TensorView& v, TensorView* dst) {
        dst[0] = dst[1] = v;
        dst[0].shape[dim] = dst[1].shape[dim] = v.shape[dim] / 2;
        dst[1].data = static_cast<char*>(v.data) + v.stride[dim] * (v.shape[dim] / 2) *
                                                       static_cast<int64_t>(dtype_size(v.dtype));
      };
      if (!def_.backward) {
        halves(x, split_in.data());
        inputs = std::span<const TensorView>(split_in.data(), 2);
      } else {
        split_in[0] = args.inputs[0];
        halves(x, split_in.data() + 1);
        halves(args.outputs[0], split_out.data());
        inputs = std::span<const TensorView>(split_in.data(), 3);
        outputs = std::span<const TensorView>(split_out.data(), 2);
      }
    }
    const LaunchList list = plan_launches(iteration, outputs, inputs);
    for (int i = 0; i < list.count; ++i)
      BARACUDA_TRY(fn_(list.launches[i], params_, stream.cuda_stream()).with_context(def_.name));
    return Status::ok();
  }

 private:
  const Def& def_;
  Backend backend_;
  LaunchFn fn_;
  Params params_;
};

// ---------------------------------------------------------------- registration

std::vector<std::string> input_names(Kind kind, const std::string& name) {
  static const std::map<std::string, std::vector<std::string>> special{
      {"prelu", {"input", "weight"}},        {"clamp", {"input", "min", "max"}},
      {"fma", {"input", "tensor1", "tensor2"}}, {"addcmul", {"input", "tensor1", "tensor2"}},
      {"addcdiv", {"input", "tensor1", "tensor2"}}, {"lerp", {"input", "end", "weight"}},
  };
  if (auto it = special.find(name); it != special.end()) return it->second;
  switch (kind) {
    case Kind::binary: case Kind::compare: return {"input", "other"};
    case Kind::ternary: return {"input", "tensor1", "tensor2"};
    case Kind::where: return {"condition", "input", "other"};
    case Kind::fill: return {};
    default: return {"input"};
  }
}

/// Non-default attribute sets the tests also exercise.
std::vector<Attrs> extra_samples(const std::string& name) {
  static const std::map<std::string, std::vector<Attrs>> extra{
      {"add", {{{"alpha", 2.5}}}},        {"sub", {{{"alpha", -0.5}}}},
      {"leaky_relu", {{{"negative_slope", 0.2}}}}, {"elu", {{{"alpha", 0.5}}}},
      {"celu", {{{"alpha", 0.7}}}},        {"softplus", {{{"beta", 2}, {"threshold", 3}}}},
      {"hardtanh", {{{"min_val", -0.5}, {"max_val", 0.7}}}}, {"logit", {{{"eps", 0.1}}}},
      {"threshold", {{{"threshold", 0.3}, {"value", -1}}}}, {"pow_scalar", {{{"exponent", 3}}, {{"exponent", -0.5}}}},
      {"affine", {{{"scale", 2.5}, {"shift", -1}}}}, {"addcmul", {{{"value", -0.5}}}},
      {"addcdiv", {{{"value", 2}}}},       {"hardshrink", {{{"lambd", 1}}}},
      {"softshrink", {{{"lambd", 1}}}},    {"glu", {{{"dim", 0}}}},
      {"swiglu", {{{"dim", 0}}}},         {"fill", {{{"value", 1.5}}}},
  };
  auto it = extra.find(name);
  return it == extra.end() ? std::vector<Attrs>{} : it->second;
}

std::vector<Def>& defs() {
  static std::vector<Def> all;  // stable addresses: reserved before use
  return all;
}

template <class Op>
void add_op(std::vector<OpInfo>& ops, Kind kind) {
  constexpr const Meta& meta = Op::meta;
  std::vector<AttrSpec> attrs;
  for (const auto& a : meta.attrs)
    if (a.name) attrs.push_back({a.name, a.value, ""});
  const std::vector<DType> dtypes = dtypes_of<typename SetTypes<meta.dtypes>::type>();

  auto make_info = [&](bool backward) {
    Def def;
    def.name = backward ? cat(meta.name, "_backward") : meta.name;
    def.kind = kind;
    def.backward = backward;
    for (const auto& a : attrs) {
      def.attr_names.push_back(a.name);
      def.attr_defaults.push_back(a.default_value);
    }
    def.dtypes = dtypes;
    if (backward) std::erase_if(def.dtypes, [](DType d) { return !is_floating(d) || dtype_size(d) == 1; });
    defs().push_back(def);
    const Def& stored = defs().back();

    OpInfo info;
    info.name = stored.name;
    info.category = OpCategory::elementwise;
    info.family = std::string(kind == Kind::unary ? "unary" : kind == Kind::predicate ? "predicate"
                              : kind == Kind::binary ? "binary" : kind == Kind::compare ? "compare"
                              : kind == Kind::ternary ? "ternary" : kind == Kind::where ? "where"
                              : kind == Kind::cast ? "cast" : kind == Kind::fill ? "fill" : "gated");
    info.direction = backward ? Direction::backward : Direction::forward;
    info.doc = meta.doc;
    info.attrs = attrs;
    info.dtypes = stored.dtypes;
    info.backends = {Backend::bespoke_cuda, Backend::host_reference};
    auto fwd_inputs = input_names(kind, meta.name);
    if (!backward) {
      info.input_names = fwd_inputs;
      info.output_names = {"out"};
      if (differentiable<Op>) info.gradient = cat(meta.name, "_backward");
    } else {
      info.gradient = meta.name;
      if (kind == Kind::where) {
        info.input_names = {"grad_output", "condition"};
        info.output_names = {"grad_input", "grad_other"};
      } else {
        info.input_names = {"grad_output"};
        for (const auto& n : fwd_inputs) {
          info.input_names.push_back(n);
          info.output_names.push_back("grad_" + n);
        }
      }
    }
    info.input_dtypes = [kind, backward, n = info.input_names.size()](DType primary) {
      std::vector<DType> v(n, primary);
      if (kind == Kind::where) v[backward ? 1 : 0] = DType::boolean;
      return v;
    };
    Domain dom = meta.domain;
    info.domains = {dom};
    if (backward) info.domains = {Domain{-1, 1}, dom};
    if (kind == Kind::where && !backward) info.domains = {Domain{0, 1}, dom};
    if (kind == Kind::binary && (std::string_view(meta.name) == "pow"))
      info.domains = backward ? std::vector<Domain>{{-1, 1}, {0.2, 3}, {-2, 2}} : std::vector<Domain>{{0.2, 3}, {-2, 2}};
    info.tolerance_scale = meta.tolerance;
    info.integer_valued_inputs = meta.integer_inputs;
    info.sample_attrs = {Attrs{}};
    if (kind == Kind::cast) {
      info.sample_attrs.clear();
      for (DType to : all_dtypes()) info.sample_attrs.push_back(Attrs{{"dtype", double(static_cast<int>(to))}});
    }
    for (auto& extra : extra_samples(meta.name)) info.sample_attrs.push_back(extra);

    info.infer = [&stored, index = ops.size()](const OpDesc& partial) {
      return infer_desc(stored, registry()[index], partial);
    };
    info.make_plan = [&stored, index = ops.size()](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
      const OpInfo& self = registry()[index];
      auto full = infer_desc(stored, self, desc);
      if (!full) return full.status();
      DType primary = stored.kind == Kind::fill ? full->outputs[0].dtype
                      : (stored.kind == Kind::where && !stored.backward) ? full->inputs[1].dtype
                                                                         : full->inputs[0].dtype;
      DType secondary = stored.kind == Kind::cast ? full->outputs[0].dtype : primary;
      const KernelTable& table = backend == Backend::host_reference ? host_kernels() : cuda_kernels();
      LaunchFn fn = table.find(launch_key(stored.name, primary, secondary));
      if (!fn)
        return unsupported("no ", backend_name(backend), " kernel for ", stored.name, " with dtype ", dtype_name(primary),
                           secondary != primary ? cat(" -> ", dtype_name(secondary)) : std::string());
      return PlanPtr(std::make_unique<ElementwisePlan>(stored, self, std::move(*full), backend, fn));
    };
    ops.push_back(std::move(info));
  };
  make_info(false);
  if (differentiable<Op>) make_info(true);
}

}  // namespace
}  // namespace ew

void register_elementwise_ops(std::vector<OpInfo>& ops) {
  using namespace ew;
  defs().reserve(256);
  for_each_type<UnaryOps>([&]<class Op>(TypeTag<Op>) { add_op<Op>(ops, Kind::unary); });
  for_each_type<PredicateOps>([&]<class Op>(TypeTag<Op>) { add_op<Op>(ops, Kind::predicate); });
  for_each_type<BinaryOps>([&]<class Op>(TypeTag<Op>) { add_op<Op>(ops, Kind::binary); });
  for_each_type<CompareOps>([&]<class Op>(TypeTag<Op>) { add_op<Op>(ops, Kind::compare); });
  for_each_type<TernaryOps>([&]<class Op>(TypeTag<Op>) { add_op<Op>(ops, Kind::ternary); });
  for_each_type<GatedOps>([&]<class Op>(TypeTag<Op>) { add_op<Op>(ops, Kind::gated); });
  add_op<Where>(ops, Kind::where);
  add_op<Cast>(ops, Kind::cast);
  add_op<Fill>(ops, Kind::fill);
}

}  // namespace baracuda
