// Softmax family: softmax, log_softmax, softmin, gumbel_softmax and
// sparsemax along `dim`, and their backward plans (from grad_output and the
// forward output; gumbel_softmax's from its soft sample).
#include <algorithm>
#include <cmath>

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
Status softmax_on_host(const RowLaunch& l, const RowParams& p, CUstream_st*) {
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
        out[c * so] = convert<T>(Op::grad(convert<M>(a[c * sa]), convert<M>(b[c * sb]), t) * M(p.grad_scale));
    }
  }
  return Status::ok();
}

template <class Op, class T, bool kBackward>
struct HostSoftmax {
  static Status run(const RowLaunch& l, const RowParams& p, CUstream_st* s) {
    return softmax_on_host<Op, T, kBackward>(l, p, s);
  }
};
[[maybe_unused]] const bool host_registered = register_softmax<HostSoftmax, SoftmaxTypes>(host_softmax());

/// One op of the family: its operands, attributes and launcher.
struct Def {
  std::string name;
  std::string kernel;  ///< the launcher's name (gumbel_softmax_backward runs softmax_backward's)
  bool backward = false;
  bool logical_rows = false;  ///< rows numbered in logical order (counter-based noise)
  bool gumbel = false;        ///< tau (and, forward, hard, seed, offset) attributes
};

std::vector<Def>& defs() {
  static std::vector<Def> all;
  return all;
}

int normalize_dim(double dim, int rank) {
  const int d = static_cast<int>(dim);
  return d < 0 ? d + rank : d;
}

Status check_attrs(const Def& def, const Attrs& attrs) {
  const std::string& op = def.name;
  if (!def.gumbel) return Status::ok();
  const double tau = attrs.get("tau", 1);
  if (!(tau > 0) || !std::isfinite(tau)) return invalid(op, ": 'tau' must be finite and > 0, got ", tau);
  if (def.backward) return Status::ok();
  if (const double hard = attrs.get("hard", 0); hard != 0 && hard != 1)
    return invalid(op, ": 'hard' must be 0 or 1, got ", hard);
  for (const char* n : {"seed", "offset"}) {
    const double v = attrs.get(n, 0);
    if (v != std::trunc(v) || v < 0 || v > 9007199254740992.0)
      return invalid(op, ": '", n, "' must be a whole number in [0, 2^53], got ", v);
  }
  return Status::ok();
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
  BARACUDA_TRY(check_attrs(def, d.attrs));
  BARACUDA_TRY(set_outputs(op, d, std::vector<TensorSpec>(info.output_names.size(), TensorSpec{x.dtype, x.shape}),
                           info.output_names));
  return d;
}

RowParams params_of(const Attrs& attrs) {
  RowParams p;
  p.tau = attrs.get("tau", 1);
  p.grad_scale = 1 / p.tau;
  p.hard = attrs.get("hard", 0) != 0;
  p.seed = uint64_t(attrs.get("seed", 0)), p.offset = uint64_t(attrs.get("offset", 0));
  return p;
}

class SoftmaxPlan final : public FamilyPlan {
 public:
  SoftmaxPlan(const Def& def, const OpInfo& info, OpDesc desc, Backend backend, SoftmaxFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), fn_(fn), params_(params_of(desc_.attrs)) {
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
    const RowLaunch l = rows::rows_along(shape, dim, args.outputs, args.inputs, def_.logical_rows);
    return fn_(l, params_, stream.cuda_stream()).with_context(def_.name);
  }

 private:
  const Def& def_;
  SoftmaxFn fn_;
  RowParams params_;
};

/// What add_ops needs of an op beyond its name.
struct Spec {
  const char* name;
  const char* doc;
  std::vector<std::string> outputs{"out"};  ///< forward outputs
  std::string saved = "output";             ///< the backward's second input
  const char* backward_kernel = nullptr;    ///< default: name_backward
  bool gumbel = false;
  std::vector<Domain> domains{{-6, 6}}, backward_domains{{-1, 1}, {0, 1}};
  std::vector<Attrs> sample_attrs{Attrs{}, Attrs{{"dim", 0}}, Attrs{{"dim", 1}}};
  std::vector<Attrs> backward_sample_attrs = sample_attrs;
  std::vector<DType> dtypes = dtypes_of<FloatTypes>();
};

void add_ops(std::vector<OpInfo>& ops, const Spec& spec) {
  for (bool backward : {false, true}) {
    const std::string name = backward ? cat(spec.name, "_backward") : std::string(spec.name);
    defs().push_back(Def{name, backward && spec.backward_kernel ? spec.backward_kernel : name, backward,
                         spec.gumbel && !backward, spec.gumbel});
    const Def& def = defs().back();
    OpInfo info;
    info.name = def.name;
    info.category = OpCategory::softmax;
    info.family = "softmax";
    info.direction = backward ? Direction::backward : Direction::forward;
    info.gradient = backward ? std::string(spec.name) : cat(spec.name, "_backward");
    info.input_names = backward ? std::vector<std::string>{"grad_output", spec.saved} : std::vector<std::string>{"input"};
    info.output_names = backward ? std::vector<std::string>{"grad_input"} : spec.outputs;
    info.dtypes = spec.dtypes;
    info.attrs = {{"dim", -1, "the axis the op runs along (negative: from the end)"}};
    if (spec.gumbel) {
      info.attrs.push_back({"tau", 1, "temperature: softmax((logits + gumbel noise) / tau), tau > 0"});
      if (!backward) {
        info.attrs.push_back({"hard", 0, "1: out is the one-hot of the argmax (first on ties); soft is always the softmax"});
        info.attrs.push_back({"seed", 0, "noise seed (Philox key), a whole number below 2^53"});
        info.attrs.push_back({"offset", 0, "noise counter offset: rows draw from offset + row (advance it between calls)"});
      }
    }
    info.backends = {Backend::bespoke_cuda, Backend::host_reference};
    info.doc = backward ? cat("gradient of ", spec.name, " from grad_output and the forward ", spec.saved) : spec.doc;
    info.input_dtypes = [n = info.input_names.size()](DType primary) { return std::vector<DType>(n, primary); };
    info.domains = backward ? spec.backward_domains : spec.domains;
    info.tolerance_scale = 2;
    info.sample_attrs = backward ? spec.backward_sample_attrs : spec.sample_attrs;
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
      SoftmaxFn fn = table.find(launch_key(def.kernel, full->inputs[0].dtype));
      if (!fn) return unsupported("no ", backend_name(backend), " kernel for ", def.name, " ", dtype_name(full->inputs[0].dtype));
      return PlanPtr(std::make_unique<SoftmaxPlan>(def, self, std::move(*full), backend, fn));
    };
    ops.push_back(std::move(info));
  }
}

template <class Op>
Spec softmax_spec() {
  Spec s{Op::name, Op::doc};
  s.dtypes = dtypes_of<SoftmaxTypes>();
  if (Op::kLog) s.backward_domains = {{-1, 1}, {-8, 0}};
  return s;
}

}  // namespace
}  // namespace smax

void register_softmax_ops(std::vector<OpInfo>& ops) {
  using namespace smax;
  defs().reserve(16);
  for (const Spec& spec : {softmax_spec<Softmax<0>>(), softmax_spec<Softmax<1>>(), softmax_spec<Softmax<2>>()})
    add_ops(ops, spec);
  Spec gumbel{GumbelSoftmax::name, "softmax((logits + g) / tau) along dim, g = -log(-log(u)) Gumbel noise drawn from "
              "(seed, offset, row, col) (Philox); out: the one-hot of its argmax when hard, else the same as soft"};
  gumbel.outputs = {"out", "soft"};
  gumbel.saved = "soft";
  gumbel.backward_kernel = "softmax_backward";
  gumbel.gumbel = true;
  gumbel.dtypes = dtypes_of<SoftmaxTypes>();
  gumbel.domains = {{-3, 3}};
  gumbel.sample_attrs = {Attrs{{"seed", 7}, {"offset", 3}}, Attrs{{"dim", 0}, {"tau", 0.5}, {"hard", 1}, {"seed", 1}},
                         Attrs{{"dim", 1}, {"tau", 2}, {"seed", 5}, {"offset", 100}}};
  gumbel.backward_sample_attrs = {Attrs{{"tau", 0.5}}, Attrs{{"dim", 0}, {"tau", 2}}};
  add_ops(ops, gumbel);
  Spec sparse{Sparsemax::name, "Euclidean projection of the input onto the probability simplex along dim "
              "(Martins & Astudillo 2016): max(x - tau, 0) with tau such that the row sums to 1"};
  sparse.domains = {{-2, 2}};
  sparse.dtypes = dtypes_of<SoftmaxTypes>();
  sparse.backward_domains = {{-1, 1}, {-0.5, 1}};  // output <= 0: off the support
  add_ops(ops, sparse);
}

}  // namespace baracuda
