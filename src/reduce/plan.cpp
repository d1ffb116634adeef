// Reduction family: registry entries, shape and dtype rules, and the plan
// that turns (input, output) views into a ReduceLaunch.
#include <algorithm>
#include <bit>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "elementwise/host_launcher.hpp"
#include "elementwise/ops.hpp"
#include "elementwise/prepare.hpp"
#include "reduce/register.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {
namespace red {

ReduceTable& host_reducers() {
  static ReduceTable table;
  return table;
}
ReduceTable& cuda_reducers() {
  static ReduceTable table;
  return table;
}

GradTable& host_gradients() {
  static GradTable table;
  return table;
}
GradTable& cuda_gradients() {
  static GradTable table;
  return table;
}

namespace {

[[maybe_unused]] const bool host_gradients_registered =
    register_gradients<ew::HostLauncher, true, GradTypes>(host_gradients());

template <class R, class T, class Out>
struct HostReduce {
  static Status run(const ReduceLaunch& l, const RParams& r, CUstream_st* s) { return reduce_on_host<R, T, Out>(l, r, s); }
};
[[maybe_unused]] const bool host_registered = register_reducers<HostReduce, RealInputs, true>(host_reducers());

/// How an op picks its reduced dims.
enum class Form : uint8_t {
  dims,    ///< attribute `dims` (bitmask; -1 = all) and `keepdim`
  sum_to,  ///< the output shape given in the descriptor (broadcast rules, reversed)
  trace,   ///< the diagonal of a matrix
};

struct Def {
  std::string name;
  Form form;
  const RMeta* meta;  ///< the reducer (sum for sum_to and trace)
  std::vector<DType> dtypes;
};

std::vector<Def>& defs() {
  static std::vector<Def> all;
  return all;
}

/// Reduced-dim mask of a `dims` descriptor for an input of rank `rank`.
Result<uint32_t> reduced_mask(const Def& def, const Attrs& attrs, int rank) {
  const double dims = attrs.get("dims", -1);
  if (dims == -1) return rank == 0 ? 0u : uint32_t((1u << rank) - 1);
  if (dims < 0 || dims != std::floor(dims) || dims >= 256)
    return invalid(def.name, ": attribute 'dims' must be -1 (all) or a bitmask of axes, got ", dims);
  const auto mask = static_cast<uint32_t>(dims);
  if (mask >> rank)
    return invalid(def.name, ": 'dims' names axis ", std::bit_width(mask) - 1, " but the input has rank ", rank);
  return mask;
}

DType output_dtype(const Def& def, DType in, const Attrs& attrs, Status& error) {
  switch (def.meta->out) {
    case OutRule::same: return in;
    case OutRule::widen_ints: return is_floating(in) ? in : DType::i64;
    case OutRule::boolean: return DType::boolean;
    case OutRule::count: return DType::i64;
    case OutRule::index: {
      const auto code = static_cast<int>(attrs.get("index_dtype", static_cast<int>(DType::i64)));
      if (code == static_cast<int>(DType::i64) || code == static_cast<int>(DType::i32)) return static_cast<DType>(code);
      error = invalid(def.name, ": attribute 'index_dtype' must be i64 or i32, got dtype code ", code);
      return in;
    }
  }
  return in;
}

/// The descriptor's reduced mask (over input axes) and the output shape.
struct Reduction {
  uint32_t mask = 0;
  Shape out_shape;
  int64_t count = 1;
};

Result<Reduction> describe(const Def& def, const OpDesc& d) {
  const Shape& in = d.inputs[0].shape;
  const int rank = static_cast<int>(in.size());
  Reduction r;
  switch (def.form) {
    case Form::dims: {
      auto mask = reduced_mask(def, d.attrs, rank);
      if (!mask) return mask.status();
      r.mask = *mask;
      const bool keep = d.attrs.get("keepdim", 0) != 0;
      for (int a = 0; a < rank; ++a) {
        if (r.mask >> a & 1u) {
          r.count *= in[a];
          if (keep) r.out_shape.push_back(1);
        } else {
          r.out_shape.push_back(in[a]);
        }
      }
      break;
    }
    case Form::sum_to: {
      if (d.outputs.size() != 1)
        return invalid(def.name, ": the descriptor must give the output (its shape is the target shape)");
      const Shape& out = d.outputs[0].shape;
      if (out.size() > in.size())
        return invalid(def.name, ": output rank ", out.size(), " exceeds input rank ", in.size());
      const size_t lead = in.size() - out.size();
      for (int a = 0; a < rank; ++a) {
        const bool leading = static_cast<size_t>(a) < lead;
        const int64_t o = leading ? 1 : out[a - lead];
        if (o != in[a] && o != 1)
          return invalid(def.name, ": output shape ", shape_str(out), " does not broadcast to input shape ",
                         shape_str(in), " (axis ", a, ")");
        if (leading || (o == 1 && in[a] != 1)) {
          r.mask |= 1u << a;
          r.count *= in[a];
        }
      }
      r.out_shape = out;
      break;
    }
    case Form::trace: {
      if (rank != 2) return invalid(def.name, ": input must be a matrix (rank 2), got rank ", rank);
      r.mask = 1;  // over the diagonal view's single axis
      r.count = std::min(in[0], in[1]);
      break;
    }
  }
  return r;
}

Result<OpDesc> infer_desc(const Def& def, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  if (d.inputs.size() != 1) return invalid(op, ": expected 1 input, got ", d.inputs.size());
  const TensorSpec& in = d.inputs[0];
  if (in.shape.size() > static_cast<size_t>(kMaxRank))
    return invalid(op, ": input has rank ", in.shape.size(), ", the maximum is ", kMaxRank);
  BARACUDA_TRY(checked_numel(in.shape, cat(op, ": input")).status());
  if (std::find(def.dtypes.begin(), def.dtypes.end(), in.dtype) == def.dtypes.end())
    return unsupported(op, ": input dtype ", dtype_name(in.dtype), " is not supported");
  auto r = describe(def, d);
  if (!r) return r.status();
  int64_t in_numel = 1;
  for (int64_t s : in.shape) in_numel *= s;
  int64_t out_numel = 1;
  for (int64_t s : r->out_shape) out_numel *= s;
  if (r->count == 0 && out_numel > 0 && !def.meta->has_identity)
    return invalid(op, ": cannot reduce over an empty dimension (input shape ", shape_str(in.shape),
                   "): the operation has no identity");
  Status error = Status::ok();
  TensorSpec expected{output_dtype(def, in.dtype, d.attrs, error), r->out_shape};
  BARACUDA_TRY(error);
  if (d.outputs.empty()) {
    d.outputs.push_back(expected);
  } else {
    if (d.outputs.size() != 1) return invalid(op, ": expected 1 output, got ", d.outputs.size());
    if (d.outputs[0].dtype != expected.dtype)
      return invalid(op, ": output dtype ", dtype_name(d.outputs[0].dtype), " != expected ", dtype_name(expected.dtype));
    if (d.outputs[0].shape != expected.shape)
      return invalid(op, ": output shape ", shape_str(d.outputs[0].shape), " != expected ", shape_str(expected.shape));
  }
  (void)in_numel;
  return d;
}

PrecisionGuarantee precision_of(DType in, const RMeta& meta, Backend backend) {
  // Fixed per-thread runs, fixed trees, splits merged in order.
  const bool exact = !is_floating(in) || meta.out == OutRule::index || meta.out == OutRule::boolean ||
                     meta.out == OutRule::count || std::string_view(meta.name) == "amax" ||
                     std::string_view(meta.name) == "amin";
  return bespoke_precision(in, backend, exact ? std::optional(is_floating(in) ? in : DType::i64) : std::nullopt);
}

/// Bytes of one accumulator of reducer `name` on the GPU for input `in`.
[[maybe_unused]] size_t accumulator_bytes(std::string_view name, DType in) {
  size_t bytes = 0;
  for_each_type<RealInputs>([&]<class T>(TypeTag<T>) {
    if (dtype_of<T> != in) return;
    [&]<class... Rs>(ReducerList<Rs...>) {
      ([&] {
        if constexpr (accepts<Rs, T>)
          if (name == Rs::meta.name) bytes = sizeof(typename Rs::template Acc<T, false>);
      }(), ...);
    }(Reducers{});
  });
  return bytes;
}

/// The output as a broadcast view over the input's shape: its stride along
/// each input axis, 0 on the reduced axes (not for trace).
TensorView broadcast_over_input(Form form, uint32_t mask, const TensorView& in, const TensorView& out) {
  TensorView b = in;
  b.data = out.data;
  b.dtype = out.dtype;
  const int lead = in.rank - out.rank;  // sum_to: leading axes absent from the output
  const bool squeezed = form == Form::dims && out.rank < in.rank;
  for (int a = 0, k = 0; a < in.rank; ++a) {
    const bool reduced = mask >> a & 1u;
    b.stride[a] = 0;
    if (form == Form::sum_to) {
      if (a >= lead && !reduced) b.stride[a] = out.stride[a - lead];
    } else if (squeezed) {
      if (!reduced) b.stride[a] = out.stride[k++];
    } else if (!reduced) {
      b.stride[a] = out.stride[a];
    }
  }
  return b;
}

/// Kept dims: sorted and coalesced (the order of outputs is free). Reduced
/// dims: logical order (innermost first) for the arg reducers, whose index
/// is the row-major position over the reduced dims; sorted by input stride
/// for the others.
ReduceLaunch make_reduce_launch(Form form, const Reduction& reduction, bool index_order, TensorView in,
                              const TensorView& out) {
  const uint32_t mask = reduction.mask;
  if (form == Form::trace) {  // the diagonal as a rank-1 view
    in.shape[0] = reduction.count;
    in.stride[0] = in.stride[0] + in.stride[1];
    in.rank = 1;
  }
  const int in_rank = in.rank;
  int64_t out_stride[kMaxRank] = {};
  if (form != Form::trace) {
    const TensorView b = broadcast_over_input(form, mask, in, out);
    for (int a = 0; a < in_rank; ++a) out_stride[a] = b.stride[a];
  }
  ReduceLaunch l;
  Problem& kept = l.kept;
  Problem& red = l.reduced;
  kept.n_operands = red.n_operands = 2;
  kept.data[0] = red.data[0] = static_cast<char*>(out.data);
  kept.data[1] = red.data[1] = static_cast<char*>(in.data);
  for (int a = in_rank - 1; a >= 0; --a) {  // innermost first
    Problem& p = (mask >> a & 1u) ? red : kept;
    p.shape[p.rank] = in.shape[a];
    p.stride[0][p.rank] = (mask >> a & 1u) ? 0 : out_stride[a];
    p.stride[1][p.rank] = in.stride[a];
    ++p.rank;
  }
  const size_t bytes[2] = {dtype_size(out.dtype), dtype_size(in.dtype)};
  ew::drop_unit_dims(kept);
  ew::flip_negative_dims(kept, bytes);
  ew::sort_dims(kept);
  ew::coalesce(kept);
  ew::drop_unit_dims(red);
  if (!index_order) ew::sort_dims(red);
  ew::coalesce(red);
  l.outputs = kept.numel();
  l.count = red.numel();
  return l;
}


class ReducePlan final : public FamilyPlan {
 public:
  ReducePlan(const Def& def, const OpInfo& info, OpDesc desc, Reduction r, Backend backend, ReduceFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), reduction_(std::move(r)), backend_(backend), fn_(fn) {
    params_.p = desc_.attrs.get("p", 2);
    params_.correction = desc_.attrs.get("correction", 1);
    const DType in = desc_.inputs[0].dtype;
    sku_.category = OpCategory::reduce;
    sku_.op = info.name.c_str();
    sku_.element = in;
    if (desc_.outputs[0].dtype != in) sku_.aux_element = desc_.outputs[0].dtype;
    sku_.layout = Layout::any_strided;
    sku_.backend = backend;
    sku_.precision = precision_of(in, *def.meta, backend);
    int64_t outputs = 1;
    for (int64_t s : desc_.outputs[0].shape) outputs *= s;
    outputs_ = outputs;
#ifdef BARACUDA_HAS_CUDA
    if (backend != Backend::host_reference) {
      sku_.arch = current_sm_version();
      splits_ = choose_splits(outputs, reduction_.count, current_sm_count(), min_split_elements(in));
      if (splits_ > 1) workspace_ = size_t(splits_) * size_t(outputs) * accumulator_bytes(def.meta->name, in);
    }
#endif
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    if (outputs_ == 0) return Status::ok();
    ReduceLaunch l = make_reduce_launch(def_.form, reduction_, def_.meta->out == OutRule::index, args.inputs[0],
                                        args.outputs[0]);
    l.splits = splits_;
    l.chunk = (l.count + splits_ - 1) / splits_;
    l.workspace = workspace.data;
    return fn_(l, params_, stream.cuda_stream()).with_context(def_.name);
  }

 private:
  const Def& def_;
  Reduction reduction_;
  Backend backend_;
  ReduceFn fn_;
  RParams params_;
  int64_t outputs_ = 0;
  int splits_ = 1;
};

std::vector<AttrSpec> attrs_for(const Def& def) {
  std::vector<AttrSpec> a;
  if (def.form == Form::dims) {
    a.push_back({"dims", -1, "bitmask of the axes to reduce (bit a = axis a); -1: all axes"});
    a.push_back({"keepdim", 0, "1: keep reduced axes as size 1"});
  }
  const std::string_view n = def.meta->name;
  if (n == "norm") a.push_back({"p", 2, "order: 2, 1, inf, -inf, 0 (non-zero count) or any real"});
  if (n == "var" || n == "std") a.push_back({"correction", 1, "divide by n - correction (1: Bessel)"});
  if (def.meta->out == OutRule::index)
    a.push_back({"index_dtype", double(static_cast<int>(DType::i64)), "dtype code of the indices: i64 or i32"});
  return a;
}

/// Attribute sets the tests exercise: all axes, the last, the first, a pair.
std::vector<Attrs> samples_for(const Def& def) {
  if (def.form != Form::dims) return {Attrs{}};
  std::vector<Attrs> s{Attrs{}, Attrs{{"dims", 1}}, Attrs{{"dims", 1}, {"keepdim", 1}}, Attrs{{"dims", 2}},
                       Attrs{{"dims", 5}}};
  const std::string_view n = def.meta->name;
  if (n == "norm")
    for (double p : {1.0, double(INFINITY), double(-INFINITY), 0.0, 3.0}) s.push_back(Attrs{{"dims", 1}, {"p", p}});
  if (n == "var" || n == "std") s.push_back(Attrs{{"dims", 1}, {"correction", 0}});
  if (def.meta->out == OutRule::index) s.push_back(Attrs{{"dims", 1}, {"index_dtype", double(static_cast<int>(DType::i32))}});
  return s;
}

/// Test shapes for a forward reduction case (see OpInfo::sample_shapes).
std::optional<SampleShapes> sample_shapes(const Def& def, DType primary, const Shape& shape, const Attrs& attrs) {
  const int rank = static_cast<int>(shape.size());
  if (def.form == Form::trace) {
    if (rank != 2) return std::nullopt;
    return SampleShapes{{shape}, {}};
  }
  if (def.form == Form::sum_to) {  // sum over the first axis and any inner size-1 target
    if (rank == 0) return std::nullopt;
    Shape target(shape.begin() + 1, shape.end());
    if (!target.empty()) target.back() = 1;
    return SampleShapes{{shape}, {TensorSpec{is_floating(primary) ? primary : DType::i64, target}}};
  }
  auto mask = reduced_mask(def, attrs, rank);
  if (!mask) return std::nullopt;
  int64_t count = 1;
  for (int a = 0; a < rank; ++a)
    if (*mask >> a & 1u) count *= shape[a];
  if (count == 0 && !def.meta->has_identity) return std::nullopt;  // an error, tested apart
  return SampleShapes{{shape}, {}};
}

void add_op(std::vector<OpInfo>& ops, Def def_in) {
  defs().push_back(std::move(def_in));
  const Def& def = defs().back();
  OpInfo info;
  info.name = def.name;
  info.category = OpCategory::reduce;
  info.family = def.form == Form::dims ? "reduce" : def.form == Form::sum_to ? "sum_to" : "trace";
  info.direction = Direction::forward;
  info.input_names = {"input"};
  info.output_names = {"out"};
  info.dtypes = def.dtypes;
  info.attrs = attrs_for(def);
  info.backends = {Backend::bespoke_cuda, Backend::host_reference};
  info.doc = def.form == Form::sum_to ? "sum of the input down to the output's (broadcastable) shape"
             : def.form == Form::trace ? "sum of the diagonal of a matrix"
                                       : def.meta->doc;
  info.input_dtypes = [](DType primary) { return std::vector<DType>{primary}; };
  const std::string_view n = def.meta->name;
  info.domains = {n == "prod" ? Domain{0.5, 1.5, true} : n == "logsumexp" ? Domain{-20, 20} : Domain{-2, 2}};
  info.integer_valued_inputs = def.meta->out == OutRule::index;  // ties: the first index must win
  info.tolerance_scale = def.meta->tolerance;
  info.sample_attrs = samples_for(def);
  info.sample_shapes = [&def](DType primary, const Shape& shape, const Attrs& attrs) {
    return sample_shapes(def, primary, shape, attrs);
  };
  const size_t index = ops.size();
  info.infer = [&def](const OpDesc& partial) { return infer_desc(def, partial); };
  info.make_plan = [&def, index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
    auto full = infer_desc(def, desc);
    if (!full) return full.status();
    auto r = describe(def, *full);
    if (!r) return r.status();
    const ReduceTable& table = backend == Backend::host_reference ? host_reducers() : cuda_reducers();
    const DType in = full->inputs[0].dtype, out = full->outputs[0].dtype;
    ReduceFn fn = table.find(launch_key(def.meta->name, in, out));
    if (!fn)
      return unsupported("no ", backend_name(backend), " kernel for ", def.name, " ", dtype_name(in), " -> ",
                         dtype_name(out));
    return PlanPtr(std::make_unique<ReducePlan>(def, registry()[index], std::move(*full), std::move(*r), backend, fn));
  };
  ops.push_back(std::move(info));
}

// ---------------------------------------------------------------- gradients

/// The forward op's descriptor behind a gradient descriptor (sum_to: its
/// output is grad_output's shape).
OpDesc forward_desc(const Def& fwd, const OpDesc& d) {
  OpDesc f{fwd.name, {d.inputs[1]}, {}, d.attrs};
  if (fwd.form == Form::sum_to) f.outputs = {d.inputs[0]};
  return f;
}

/// grad_output (and output) must be what the forward op returns for `input`.
Result<OpDesc> infer_grad(const Def& fwd, const OpInfo& info, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string op = cat(fwd.name, "_backward");
  if (d.inputs.size() != info.input_names.size())
    return invalid(op, ": expected ", info.input_names.size(), " inputs, got ", d.inputs.size());
  if (!is_floating(d.inputs[1].dtype) || dtype_size(d.inputs[1].dtype) == 1)
    return unsupported(op, ": dtype ", dtype_name(d.inputs[1].dtype), " is not supported (f32 f16 bf16 f64)");
  auto f = infer_desc(fwd, forward_desc(fwd, d));
  if (!f) return f.status();
  const TensorSpec& y = f->outputs[0];
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    if (i == 1) continue;
    if (d.inputs[i].dtype != y.dtype || d.inputs[i].shape != y.shape)
      return invalid(op, ": '", info.input_names[i], "' must be ", dtype_name(y.dtype), shape_str(y.shape),
                     " (the forward output), got ", dtype_name(d.inputs[i].dtype), shape_str(d.inputs[i].shape));
  }
  const TensorSpec expected = d.inputs[1];
  if (d.outputs.empty()) d.outputs.push_back(expected);
  else if (d.outputs.size() != 1 || d.outputs[0].dtype != expected.dtype || d.outputs[0].shape != expected.shape)
    return invalid(op, ": output 'grad_input' must be ", dtype_name(expected.dtype), shape_str(expected.shape));
  return d;
}

/// grad_input = G(grad_output, input, output, aux) over the input's shape,
/// every per-output operand broadcast back over the reduced axes. Ops that
/// read aux first reduce it into the workspace (f32, f64 for f64 and on the
/// host): var/std's mean, the ties of amax/amin/norm(+-inf), prod's product
/// at a lone zero; norm with a finite p reads a dummy (one zeroed value).
class ReduceGradPlan final : public FamilyPlan {
 public:
  ReduceGradPlan(const Def& fwd, const OpInfo& info, OpDesc desc, Reduction r, Backend backend, ew::LaunchFn fn,
                 ReduceFn aux_fn, bool reads_aux)
      : FamilyPlan(info, std::move(desc)), fwd_(fwd), reduction_(std::move(r)), fn_(fn), aux_fn_(aux_fn),
        reads_aux_(reads_aux) {
    const DType t = desc_.inputs[1].dtype;
    sku_.category = OpCategory::reduce;
    sku_.op = info.name.c_str();
    sku_.element = t;
    sku_.layout = Layout::any_strided;
    sku_.backend = backend;
    sku_.precision = precision_of(t, *fwd.meta, backend);
#ifdef BARACUDA_HAS_CUDA
    if (backend != Backend::host_reference) sku_.arch = current_sm_version();
#endif
    params_.v[0] = double(reduction_.count);
    params_.v[1] = desc_.attrs.get("p", 2);
    params_.v[2] = desc_.attrs.get("correction", 1);
    aux_dtype_ = math_dtype(t, backend);
    if (reads_aux_)
      workspace_ = size_t(aux_fn_ ? std::max<int64_t>(desc_.inputs[0].numel(), 1) : 1) * dtype_size(aux_dtype_);
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const TensorView& x = args.inputs[1];
    if (x.numel() == 0) return Status::ok();
    const TensorView& g = args.inputs[0];
    const TensorView& y = args.inputs.size() > 2 ? args.inputs[2] : g;
    TensorView aux = g;  // read only by the ops that declare it
    if (reads_aux_) {
      const Shape& out_shape = desc_.inputs[0].shape;
      auto m = TensorView::contiguous(workspace.data, aux_dtype_, out_shape);
      if (!m) return m.status();
      aux = *m;
      if (aux_fn_) {
        ReduceLaunch l = make_reduce_launch(fwd_.form, reduction_, false, x, aux);
        l.splits = 1;
        l.chunk = l.count;
        BARACUDA_TRY(aux_fn_(l, RParams{}, stream.cuda_stream()).with_context(info_.name));
      } else {
        aux.stride.fill(0);  // one dummy value for every output, never used in the math
      }
    }
    const TensorView in[4] = {broadcast_over_input(fwd_.form, reduction_.mask, x, g), x,
                              broadcast_over_input(fwd_.form, reduction_.mask, x, y),
                              broadcast_over_input(fwd_.form, reduction_.mask, x, aux)};
    const ew::LaunchList list = ew::plan_launches(desc_.inputs[1].shape, std::span(&args.outputs[0], 1), in);
    return fn_(list.launches[0], params_, stream.cuda_stream()).with_context(info_.name);
  }

 private:
  const Def& fwd_;
  Reduction reduction_;
  ew::LaunchFn fn_;
  ReduceFn aux_fn_;
  bool reads_aux_;
  ew::Params params_;
  DType aux_dtype_ = DType::f32;
};

/// trace_backward: grad_output on the diagonal, 0 elsewhere. Two elementwise
/// launches: a fill of grad_input with 0, then grad_output (a scalar,
/// broadcast) copied onto the diagonal view (stride = the sum of the strides).
class TraceGradPlan final : public FamilyPlan {
 public:
  TraceGradPlan(const OpInfo& info, OpDesc desc, Backend backend, ew::LaunchFn fill, ew::LaunchFn copy)
      : FamilyPlan(info, std::move(desc)), fill_(fill), copy_(copy) {
    sku_ = bespoke_sku(OpCategory::reduce, info.name.c_str(), desc_.inputs[1].dtype, backend);
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const TensorView& dx = args.outputs[0];
    if (dx.numel() == 0) return Status::ok();
    const Shape shape = dx.shape_vec();
    const ew::LaunchList zeros = ew::plan_launches(shape, std::span(&dx, 1), {});
    BARACUDA_TRY(fill_(zeros.launches[0], ew::Params{}, stream.cuda_stream()).with_context(info_.name));
    TensorView diagonal = dx;
    diagonal.rank = 1;
    diagonal.shape[0] = std::min(dx.shape[0], dx.shape[1]);
    diagonal.stride[0] = dx.stride[0] + dx.stride[1];
    const int64_t k = diagonal.shape[0];
    const ew::LaunchList onto = ew::plan_launches(std::span(&k, 1), std::span(&diagonal, 1), std::span(&args.inputs[0], 1));
    return copy_(onto.launches[0], ew::Params{}, stream.cuda_stream()).with_context(info_.name);
  }

 private:
  ew::LaunchFn fill_, copy_;
};

/// Registers `<forward>_backward` for a differentiable reduction.
void add_grad_op(std::vector<OpInfo>& ops, const Def& fwd, size_t fwd_index, const char* grad_name, bool needs_output) {
  OpInfo info;
  info.name = cat(fwd.name, "_backward");
  info.category = OpCategory::reduce;
  info.family = "reduce_backward";
  info.direction = Direction::backward;
  info.gradient = fwd.name;
  info.input_names = needs_output ? std::vector<std::string>{"grad_output", "input", "output"}
                                  : std::vector<std::string>{"grad_output", "input"};
  info.output_names = {"grad_input"};
  info.dtypes = dtypes_of<GradTypes>();
  info.attrs = attrs_for(fwd);
  info.backends = {Backend::bespoke_cuda, Backend::host_reference};
  info.doc = cat("gradient of ", fwd.name, " (grad_output and output shaped like the forward output)");
  info.input_dtypes = [n = info.input_names.size()](DType primary) { return std::vector<DType>(n, primary); };
  info.domains = {Domain{-1, 1}, Domain{-2, 2}, Domain{0.5, 3}};
  info.tolerance_scale = 4;
  info.sample_attrs = samples_for(fwd);
  // amax/amin/norm(+-inf) split among ties and prod has a rule for zeros:
  // whole numbers make both common (output drawn alike, so x == output happens).
  const std::string_view n = fwd.meta->name;
  info.integer_valued_inputs = n == "amax" || n == "amin" || n == "prod" || n == "norm";
  info.sample_shapes = [&fwd, needs_output](DType primary, const Shape& shape,
                                            const Attrs& attrs) -> std::optional<SampleShapes> {
    auto f = sample_shapes(fwd, primary, shape, attrs);
    if (!f) return std::nullopt;
    OpDesc d{fwd.name, {{primary, shape}}, f->outputs, attrs};
    auto full = infer_desc(fwd, d);
    if (!full) return std::nullopt;
    const Shape& y = full->outputs[0].shape;
    SampleShapes s{{y, shape}, {}};
    if (needs_output) s.inputs.push_back(y);
    return s;
  };
  const size_t index = ops.size();
  info.infer = [&fwd, index](const OpDesc& partial) { return infer_grad(fwd, registry()[index], partial); };
  info.make_plan = [&fwd, index, grad_name](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
    const OpInfo& self = registry()[index];
    auto full = infer_grad(fwd, self, desc);
    if (!full) return full.status();
    auto f = infer_desc(fwd, forward_desc(fwd, *full));
    if (!f) return f.status();
    auto r = describe(fwd, *f);
    if (!r) return r.status();
    const DType t = full->inputs[1].dtype;
    const bool host = backend == Backend::host_reference;
    if (fwd.form == Form::trace) {
      const ew::KernelTable& kernels = host ? ew::host_kernels() : ew::cuda_kernels();
      ew::LaunchFn fill = kernels.find(launch_key("fill", t, t)), copy = kernels.find(launch_key("cast", t, t));
      if (!fill || !copy) return unsupported("no ", backend_name(backend), " kernel for ", self.name, " ", dtype_name(t));
      return PlanPtr(std::make_unique<TraceGradPlan>(self, std::move(*full), backend, fill, copy));
    }
    ew::LaunchFn fn = (host ? host_gradients() : cuda_gradients()).find(launch_key(grad_name, t));
    if (!fn) return unsupported("no ", backend_name(backend), " kernel for ", self.name, " ", dtype_name(t));
    const std::string_view n = fwd.meta->name;
    const double p = full->attrs.get("p", 2);
    const char* aux = n == "var" || n == "std" ? "mean"
                      : n == "amax" ? "amax_ties" : n == "amin" ? "amin_ties" : n == "prod" ? "prod_lone_zero"
                      : n == "norm" && p == INFINITY ? "absmax_ties" : n == "norm" && p == -INFINITY ? "absmin_ties"
                                                                                                      : nullptr;
    ReduceFn aux_fn = nullptr;
    if (aux) {
      const DType m = math_dtype(t, backend);
      aux_fn = (host ? host_reducers() : cuda_reducers()).find(launch_key(aux, t, m));
      if (!aux_fn) return unsupported("no ", backend_name(backend), " ", aux, " kernel for ", self.name);
    }
    const bool reads_aux = aux || n == "norm";
    return PlanPtr(std::make_unique<ReduceGradPlan>(fwd, self, std::move(*full), std::move(*r), backend, fn, aux_fn,
                                                    reads_aux));
  };
  ops[fwd_index].gradient = info.name;
  ops.push_back(std::move(info));
}

template <class R>
std::vector<DType> input_dtypes_of() {
  return R::meta.inputs == InSet::real ? dtypes_of<RealInputs>() : dtypes_of<FloatInputs>();
}

}  // namespace

Result<SumStep> make_sum_step(Backend backend, DType in, DType out, const Shape& in_shape, uint32_t mask) {
  SumStep step;
  step.fn = (backend == Backend::host_reference ? host_reducers() : cuda_reducers()).find(launch_key("sum", in, out));
  if (!step.fn)
    return unsupported("no ", backend_name(backend), " sum from ", dtype_name(in), " to ", dtype_name(out));
  int64_t outputs = 1, count = 1;
  for (size_t a = 0; a < in_shape.size(); ++a) (mask >> a & 1u ? count : outputs) *= in_shape[a];
#ifdef BARACUDA_HAS_CUDA
  if (backend != Backend::host_reference) {
    step.splits = choose_splits(outputs, count, current_sm_count(), min_split_elements(in));
    if (step.splits > 1) step.workspace = size_t(step.splits) * size_t(outputs) * accumulator_bytes("sum", in);
  }
#endif
  return step;
}

Status run_sum_step(const SumStep& step, const TensorView& in, const TensorView& out, uint32_t mask, void* workspace,
                    CUstream_st* stream) {
  Reduction r;
  r.mask = mask;
  ReduceLaunch l = make_reduce_launch(Form::dims, r, false, in, out);
  l.splits = step.splits;
  l.chunk = (l.count + step.splits - 1) / step.splits;
  l.workspace = workspace;
  return step.fn(l, RParams{}, stream);
}

}  // namespace red

void register_reduce_ops(std::vector<OpInfo>& ops) {
  using namespace red;
  defs().reserve(32);
  [&]<class... Rs>(ReducerList<Rs...>) {
    (add_op(ops, Def{Rs::meta.name, Form::dims, &Rs::meta, input_dtypes_of<Rs>()}), ...);
  }(Reducers{});
  add_op(ops, Def{"sum_to", Form::sum_to, &Sum::meta, input_dtypes_of<Sum>()});
  add_op(ops, Def{"trace", Form::trace, &Sum::meta, input_dtypes_of<Sum>()});
  // Gradients: (forward, gradient functor, whether it reads the forward output).
  const std::tuple<const char*, const char*, bool> differentiable[] = {
      {"sum", "sum", false},        {"mean", "mean", false}, {"logsumexp", "logsumexp", true},
      {"norm", "norm", true},       {"var", "var", false},   {"std", "std", true},
      {"sum_to", "sum", false},     {"trace", "trace", false},       {"prod", "prod", true},
      {"amax", "amax", true},       {"amin", "amin", true}};
  for (const auto& [name, grad, needs_output] : differentiable) {
    size_t index = 0;
    while (ops[index].name != name) ++index;
    const Def* fwd = nullptr;
    for (const Def& d : defs())
      if (d.name == name) fwd = &d;
    add_grad_op(ops, *fwd, index, grad, needs_output);
  }
}

}  // namespace baracuda
