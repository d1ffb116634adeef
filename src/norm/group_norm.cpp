// group_norm and instance_norm (with and without affine parameters), their
// backward plans, and instance_norm_running_stats: descriptors, plans,
// registration and the host reference. instance_norm is group_norm with one
// group per channel; both run the same launchers (group_norm.hpp).
//
// Note [Running statistics in place]
// torch.instance_norm updates running_mean/running_var in place. Here that is
// its own op, instance_norm_running_stats: inputs {running_mean, running_var,
// mean, rstd} (the saved statistics of instance_norm), outputs
// {running_mean_out, running_var_out}. Passing the running tensors themselves
// as the outputs updates them in place (an output may alias an input of the
// same layout; each element is read before it is written), as kv_append
// updates its caches; the functional form (fresh outputs) keeps the generic
// test driver's NaN-poisoned outputs meaningful. The instance variance comes
// back from rstd (1 / rstd^2 - eps), unbiased by S / (S - 1) as torch does.
#include <tuple>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/fp8_traits.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "elementwise/prepare.hpp"
#include "norm/group_norm.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {
namespace norm {

GroupNormTables& host_group_norms() {
  static GroupNormTables tables;
  return tables;
}
GroupNormTables& cuda_group_norms() {
  static GroupNormTables tables;
  return tables;
}

namespace {

// ---------------------------------------------------------------- host reference

template <class T>
struct HostGroupNorm {
  using M = double;
  using Stat = std::conditional_t<std::is_same_v<T, double>, double, float>;

  struct Access {
    const GroupLaunch& l;
    ew::OffsetCalc<kGroupFull, int64_t> space;
    explicit Access(const GroupLaunch& launch) : l(launch), space(launch.space) {}
    T& at(int k, int64_t n, int64_t c, int64_t s) const {
      int64_t off[kGroupFull];
      space.get(s, off);
      return reinterpret_cast<T*>(l.data[k])[n * l.stride_n[k] + c * l.stride_c[k] + off[k]];
    }
    Stat& stat(char* p, const int64_t* st, int64_t n, int64_t g) const {
      return reinterpret_cast<Stat*>(p)[n * st[0] + g * st[1]];
    }
    M param(const char* p, int64_t stride, int64_t c, M fallback) const {
      if (!p) return fallback;
      return l.param_f32 ? M(reinterpret_cast<const float*>(p)[c * stride]) : convert<M>(reinterpret_cast<const T*>(p)[c * stride]);
    }
    M weight(int64_t c) const { return param(l.weight, l.weight_stride, c, M(1)); }
    M bias(int64_t c) const { return param(l.bias, l.bias_stride, c, M(0)); }
    void store(char* p, int64_t stride, int64_t c, M v) const {
      if (l.param_f32) reinterpret_cast<float*>(p)[c * stride] = float(v);
      else reinterpret_cast<T*>(p)[c * stride] = convert<T>(v);
    }
  };

  static Status forward(const GroupLaunch& l, CUstream_st*) {
    const Access a(l);
    const int64_t G = l.groups, Cg = l.group_size(), S = l.spatial;
    for (int64_t n = 0; n < l.batch; ++n)
      for (int64_t g = 0; g < G; ++g) {
        M count = 0, mean = 0, m2 = 0;
        for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
          M sum = 0, sq = 0;
          for (int64_t s = 0; s < S; ++s) sum += convert<M>(a.at(kGnIn, n, c, s));
          const M mc = sum / M(S);
          for (int64_t s = 0; s < S; ++s) {
            const M d = convert<M>(a.at(kGnIn, n, c, s)) - mc;
            sq += d * d;
          }
          merge_moments(count, mean, m2, M(S), mc, sq);
        }
        const M rstd = LayerNorm::rstd(m2, l.row_size(), M(l.eps));
        a.stat(l.mean, l.mean_stride, n, g) = Stat(mean);
        a.stat(l.rstd, l.rstd_stride, n, g) = Stat(rstd);
        for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c)
          for (int64_t s = 0; s < S; ++s)
            a.at(kGnOut, n, c, s) = convert<T>((convert<M>(a.at(kGnIn, n, c, s)) - mean) * rstd * a.weight(c) + a.bias(c));
      }
    return Status::ok();
  }

  static Status backward(const GroupLaunch& l, CUstream_st*) {
    const Access a(l);
    const int64_t C = l.channels, G = l.groups, Cg = l.group_size(), S = l.spatial;
    const M D = M(l.row_size());
    std::vector<M> e(size_t(l.batch * C)), d(size_t(l.batch * C));
    for (int64_t n = 0; n < l.batch; ++n)
      for (int64_t g = 0; g < G; ++g) {
        const M mean = a.stat(l.mean, l.mean_stride, n, g), rstd = a.stat(l.rstd, l.rstd_stride, n, g);
        M sum_wg = 0, sum_we = 0;
        for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
          M ec = 0, dc = 0;
          for (int64_t s = 0; s < S; ++s) {
            const M dy = convert<M>(a.at(kGnGradOut, n, c, s));
            ec += dy * (convert<M>(a.at(kGnSavedIn, n, c, s)) - mean);
            dc += dy;
          }
          e[n * C + c] = ec, d[n * C + c] = dc;
          sum_wg += a.weight(c) * dc;
          sum_we += a.weight(c) * ec;
        }
        const M mean_wg = sum_wg / D, mean_wg_xhat = rstd * sum_we / D;
        for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c)
          for (int64_t s = 0; s < S; ++s) {
            const M wg = a.weight(c) * convert<M>(a.at(kGnGradOut, n, c, s));
            const M xhat = (convert<M>(a.at(kGnSavedIn, n, c, s)) - mean) * rstd;
            a.at(kGnGradIn, n, c, s) = convert<T>(LayerNorm::grad_input(wg, xhat, mean_wg, mean_wg_xhat, rstd));
          }
      }
    for (int64_t c = 0; c < C && l.grad_weight; ++c) {
      M gw = 0, gb = 0;
      for (int64_t n = 0; n < l.batch; ++n) {
        gw += e[n * C + c] * M(a.stat(l.rstd, l.rstd_stride, n, c / Cg));
        gb += d[n * C + c];
      }
      a.store(l.grad_weight, l.grad_weight_stride, c, gw);
      if (l.grad_bias) a.store(l.grad_bias, l.grad_bias_stride, c, gb);
    }
    return Status::ok();
  }

  static Status running(const RunningLaunch& r, CUstream_st*) {
    for (int64_t c = 0; c < r.channels; ++c) {
      M mean = 0, var = 0;
      for (int64_t n = 0; n < r.batch; ++n) {
        mean += M(reinterpret_cast<const Stat*>(r.mean)[n * r.mean_stride[0] + c * r.mean_stride[1]]);
        var += unbiased_var(M(reinterpret_cast<const Stat*>(r.rstd)[n * r.rstd_stride[0] + c * r.rstd_stride[1]]),
                            M(r.eps), M(r.spatial));
      }
      const M rm = convert<M>(reinterpret_cast<const T*>(r.running_mean)[c * r.running_mean_stride]);
      const M rv = convert<M>(reinterpret_cast<const T*>(r.running_var)[c * r.running_var_stride]);
      const M m = M(r.momentum);
      reinterpret_cast<T*>(r.mean_out)[c * r.mean_out_stride] = convert<T>((1 - m) * rm + m * (mean / M(r.batch)));
      reinterpret_cast<T*>(r.var_out)[c * r.var_out_stride] = convert<T>((1 - m) * rv + m * (var / M(r.batch)));
    }
    return Status::ok();
  }
};

[[maybe_unused]] const bool host_registered = [] {
  for_each_type<NormTypes>([]<class T>(TypeTag<T>) {
    auto& t = host_group_norms();
    t.forward.add(launch_key("group_norm", dtype_of<T>), &HostGroupNorm<T>::forward);
    if constexpr (has_gradient_v<T>) {  // fp8: forwards only
      t.backward.add(launch_key("group_norm", dtype_of<T>), &HostGroupNorm<T>::backward);
      t.running.add(launch_key("instance_norm_running_stats", dtype_of<T>), &HostGroupNorm<T>::running);
    }
  });
  return true;
}();

// ---------------------------------------------------------------- descriptors

enum class Kind { forward, backward, running };

struct Def {
  std::string name, forward_name;
  Kind kind;
  bool instance, affine;
  std::vector<std::string> inputs, outputs;
};

const std::vector<Def>& defs() {
  static const std::vector<Def> all = [] {
    std::vector<Def> v;
    for (bool instance : {false, true})
      for (bool affine : {true, false}) {
        const std::string base = cat(instance ? "instance_norm" : "group_norm", affine ? "" : "_noaffine");
        Def f{base, base, Kind::forward, instance, affine, {"input"}, {"out", "mean", "rstd"}};
        Def b{base + "_backward", base, Kind::backward, instance, affine, {"grad_output", "input", "mean", "rstd"},
              {"grad_input"}};
        if (affine) {
          f.inputs.insert(f.inputs.end(), {"weight", "bias"});
          b.inputs.push_back("weight");
          b.outputs.insert(b.outputs.end(), {"grad_weight", "grad_bias"});
        }
        v.push_back(f);
        v.push_back(b);
      }
    v.push_back({"instance_norm_running_stats", "", Kind::running, true, false,
                 {"running_mean", "running_var", "mean", "rstd"}, {"running_mean_out", "running_var_out"}});
    return v;
  }();
  return all;
}

bool is_float4(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64; }
bool is_stat(const std::string& n) { return n == "mean" || n == "rstd"; }

Result<OpDesc> infer_running(const Def& def, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  BARACUDA_TRY(check_inputs(op, d, def.inputs, 0));
  const TensorSpec& rm = d.inputs[0];
  if (!is_float4(rm.dtype)) return unsupported(op, ": dtype ", dtype_name(rm.dtype), " is not supported (f32 f16 bf16 f64)");
  if (rm.shape.size() != 1) return invalid(op, ": 'running_mean' must be [C], got shape ", shape_str(rm.shape));
  const int64_t C = rm.shape[0];
  const TensorSpec& mean = d.inputs[2];
  if (mean.shape.size() != 2 || mean.shape[1] != C)
    return invalid(op, ": 'mean' shape ", shape_str(mean.shape), ", expected [N, ", C, "] (the saved instance statistics)");
  const std::vector<TensorSpec> want{{rm.dtype, {C}}, {rm.dtype, {C}}, {stat_dtype(rm.dtype), mean.shape}, {stat_dtype(rm.dtype), mean.shape}};
  for (size_t i = 1; i < want.size(); ++i) {
    if (d.inputs[i].dtype != want[i].dtype)
      return invalid(op, ": '", def.inputs[i], "' dtype ", dtype_name(d.inputs[i].dtype), ", expected ", dtype_name(want[i].dtype));
    if (d.inputs[i].shape != want[i].shape)
      return invalid(op, ": '", def.inputs[i], "' shape ", shape_str(d.inputs[i].shape), ", expected ", shape_str(want[i].shape));
  }
  if (d.attrs.get("spatial", 0) < 2)
    return invalid(op, ": attribute 'spatial' (the spatial size S of the instances) must be at least 2 for the unbiased "
                       "variance, got ", d.attrs.get("spatial", 0));
  BARACUDA_TRY(set_outputs(op, d, {want[0], want[1]}, def.outputs));
  return d;
}

/// Checks input [N, C, *] (x_index) and every other operand; fills the outputs.
Result<OpDesc> infer_desc(const Def& def, const OpDesc& partial) {
  if (def.kind == Kind::running) return infer_running(def, partial);
  OpDesc d = partial;
  const std::string& op = def.name;
  const bool backward = def.kind == Kind::backward;
  const size_t x_index = backward ? 1 : 0;
  BARACUDA_TRY(check_inputs(op, d, def.inputs, x_index));
  const TensorSpec& x = d.inputs[x_index];
  BARACUDA_TRY(check_float_storage(op, x.dtype, backward));
  const size_t min_rank = def.instance ? 3 : 2;
  if (x.shape.size() < min_rank)
    return invalid(op, ": 'input' must be [N, C", def.instance ? ", spatial..." : ", *", "] (rank >= ", min_rank,
                   def.instance ? "; instance norm needs spatial dims" : "", "), got shape ", shape_str(x.shape));
  const int64_t N = x.shape[0], C = x.shape[1];
  int64_t spatial = 1;
  for (size_t a = 2; a < x.shape.size(); ++a) spatial *= x.shape[a];
  int64_t G = C;
  if (!def.instance) {
    if (backward) {
      const TensorSpec& mean = d.inputs[2];
      if (mean.shape.size() != 2 || mean.shape[0] != N || mean.shape[1] < 1)
        return invalid(op, ": 'mean' shape ", shape_str(mean.shape), ", expected [", N, ", num_groups]");
      G = mean.shape[1];
    } else {
      const double g = d.attrs.get("num_groups", 1);
      if (g < 1 || g != double(int64_t(g)))
        return invalid(op, ": attribute 'num_groups' must be a positive integer, got ", g);
      G = int64_t(g);
    }
    if (C % G != 0)
      return invalid(op, ": num_groups ", G, " must divide the channels C = ", C, " of 'input' ", shape_str(x.shape));
  } else if (!backward && spatial <= 1) {
    return invalid(op, ": expected more than 1 spatial element when training (as torch), got 'input' shape ", shape_str(x.shape));
  }
  // Parameters in the input's dtype, or f32 for half and fp8 inputs (torch's mixed precision).
  const size_t w_index = backward ? 4 : 1;
  const bool narrow = x.dtype == DType::f16 || x.dtype == DType::bf16 || is_fp8(x.dtype);
  const DType param_dtype = def.affine && narrow && d.inputs[w_index].dtype == DType::f32 ? DType::f32 : x.dtype;
  auto expected = [&](const std::string& n) {
    if (is_stat(n)) return TensorSpec{stat_dtype(x.dtype), {N, G}};
    if (n == "weight" || n == "bias" || n == "grad_weight" || n == "grad_bias") return TensorSpec{param_dtype, {C}};
    return TensorSpec{x.dtype, x.shape};
  };
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    const TensorSpec want = expected(def.inputs[i]);
    if (d.inputs[i].dtype != want.dtype)
      return invalid(op, ": '", def.inputs[i], "' dtype ", dtype_name(d.inputs[i].dtype), ", expected ", dtype_name(want.dtype));
    if (d.inputs[i].shape != want.shape)
      return invalid(op, ": '", def.inputs[i], "' shape ", shape_str(d.inputs[i].shape), ", expected ", shape_str(want.shape),
                     want.shape.size() == 1 ? " (one per channel)" : "");
  }
  std::vector<TensorSpec> outs;
  for (const auto& n : def.outputs) outs.push_back(expected(n));
  BARACUDA_TRY(set_outputs(op, d, outs, def.outputs));
  return d;
}

// ---------------------------------------------------------------- plans

class GroupNormPlan final : public FamilyPlan {
 public:
  GroupNormPlan(const Def& def, const OpInfo& info, OpDesc desc, Backend backend, GroupNormFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), fn_(fn) {
    const bool backward = def.kind == Kind::backward;
    const TensorSpec& x = desc_.inputs[backward ? 1 : 0];
    sku_ = bespoke_sku(OpCategory::norm, info.name.c_str(), x.dtype, backend);
    sku_.aux_element = stat_dtype(x.dtype);
    eps_ = desc_.attrs.get("eps", 1e-5);
    const TensorSpec& stats = backward ? desc_.inputs[2] : desc_.outputs[1];
    groups_ = stats.shape[1];
    for (size_t a = 2; a < x.shape.size(); ++a) spatial_ *= x.shape[a];
    chunk_ = spatial_;
#ifdef BARACUDA_HAS_CUDA
    if (backend != Backend::host_reference) {
      sm_count_ = current_sm_count();
      std::tie(splits_, chunk_) = group_norm_splits(x.shape[0] * x.shape[1], spatial_, sm_count_);
      workspace_ = group_norm_workspace(x.shape[0], x.shape[1], groups_, splits_, x.dtype == DType::f64);
    }
#endif
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    if (groups_ == 0) return Status::ok();  // instance norm of no channels: every operand is empty
    const bool backward = def_.kind == Kind::backward;
    GroupLaunch l;
    const TensorView& x = args.inputs[backward ? 1 : 0];
    l.batch = x.shape[0];
    l.channels = x.shape[1];
    l.groups = groups_;
    l.splits = splits_;
    l.chunk = chunk_;
    l.sm_count = sm_count_;
    l.eps = eps_;
    l.workspace = workspace.data;
    const int n_full = backward ? 3 : 2;
    const TensorView* full[kGroupFull] = {&args.outputs[0], backward ? &args.inputs[0] : &x, backward ? &args.inputs[1] : nullptr};
    ew::Problem& p = l.space;
    p.n_operands = n_full;
    for (int a = x.rank - 1; a >= 2; --a, ++p.rank) {
      p.shape[p.rank] = x.shape[a];
      l.spatial *= x.shape[a];
      for (int k = 0; k < n_full; ++k) p.stride[k][p.rank] = full[k]->stride[a];
    }
    ew::drop_unit_dims(p);
    ew::sort_dims(p);
    ew::coalesce(p);
    if (p.rank == 0) p.rank = 1, p.shape[0] = 1;  // strides stay 0
    const int elem = int(dtype_size(x.dtype)), vec = 16 / elem;
    l.unit_space = p.rank == 1;
    l.vector = l.spatial % vec == 0;
    for (int k = 0; k < n_full; ++k) {
      l.data[k] = static_cast<char*>(full[k]->data);
      l.stride_n[k] = full[k]->stride[0];
      l.stride_c[k] = full[k]->stride[1];
      l.unit_space = l.unit_space && (p.stride[k][0] == 1 || p.shape[0] == 1);
      l.vector = l.vector && reinterpret_cast<uintptr_t>(l.data[k]) % 16 == 0 && l.stride_n[k] % vec == 0 &&
                 l.stride_c[k] % vec == 0;
    }
    l.vector = l.vector && l.unit_space && p.shape[0] > 1;
    auto stat = [](const TensorView& v, char*& ptr, int64_t* st) {
      ptr = static_cast<char*>(v.data);
      st[0] = v.stride[0], st[1] = v.stride[1];
    };
    stat(backward ? args.inputs[2] : args.outputs[1], l.mean, l.mean_stride);
    stat(backward ? args.inputs[3] : args.outputs[2], l.rstd, l.rstd_stride);
    if (def_.affine) {
      const TensorView& w = args.inputs[backward ? 4 : 1];
      l.weight = static_cast<char*>(w.data), l.weight_stride = w.stride[0];
      l.param_f32 = w.dtype != x.dtype;
      if (backward) {
        l.grad_weight = static_cast<char*>(args.outputs[1].data), l.grad_weight_stride = args.outputs[1].stride[0];
        l.grad_bias = static_cast<char*>(args.outputs[2].data), l.grad_bias_stride = args.outputs[2].stride[0];
      } else {
        l.bias = static_cast<char*>(args.inputs[2].data), l.bias_stride = args.inputs[2].stride[0];
      }
    }
    if (l.batch == 0 && !l.grad_weight) return Status::ok();
    return fn_(l, stream.cuda_stream()).with_context(def_.name);
  }

 private:
  const Def& def_;
  GroupNormFn fn_;
  double eps_ = 1e-5;
  int64_t groups_ = 1, spatial_ = 1, chunk_ = 1;
  int splits_ = 1, sm_count_ = 0;
};

class RunningPlan final : public FamilyPlan {
 public:
  RunningPlan(const OpInfo& info, OpDesc desc, Backend backend, RunningFn fn) : FamilyPlan(info, std::move(desc)), fn_(fn) {
    sku_ = bespoke_sku(OpCategory::norm, info.name.c_str(), desc_.inputs[0].dtype, backend);
    sku_.aux_element = stat_dtype(desc_.inputs[0].dtype);
    momentum_ = desc_.attrs.get("momentum", 0.1);
    eps_ = desc_.attrs.get("eps", 1e-5);
    spatial_ = desc_.attrs.get("spatial", 0);
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    RunningLaunch r;
    const TensorView &rm = args.inputs[0], &rv = args.inputs[1], &mean = args.inputs[2], &rstd = args.inputs[3];
    r.batch = mean.shape[0];
    r.channels = rm.shape[0];
    if (r.channels == 0) return Status::ok();
    r.running_mean = static_cast<const char*>(rm.data), r.running_mean_stride = rm.stride[0];
    r.running_var = static_cast<const char*>(rv.data), r.running_var_stride = rv.stride[0];
    r.mean = static_cast<const char*>(mean.data), r.mean_stride[0] = mean.stride[0], r.mean_stride[1] = mean.stride[1];
    r.rstd = static_cast<const char*>(rstd.data), r.rstd_stride[0] = rstd.stride[0], r.rstd_stride[1] = rstd.stride[1];
    r.mean_out = static_cast<char*>(args.outputs[0].data), r.mean_out_stride = args.outputs[0].stride[0];
    r.var_out = static_cast<char*>(args.outputs[1].data), r.var_out_stride = args.outputs[1].stride[0];
    r.momentum = momentum_, r.eps = eps_, r.spatial = spatial_;
    return fn_(r, stream.cuda_stream()).with_context(info_.name);
  }

 private:
  RunningFn fn_;
  double momentum_ = 0.1, eps_ = 1e-5, spatial_ = 0;  ///< attributes, read once at plan time
};

std::string doc_of(const Def& def) {
  if (def.kind == Kind::running)
    return "torch.instance_norm's running-stat update from instance_norm's saved mean/rstd [N, C]: running_mean_out = "
           "(1 - momentum) * running_mean + momentum * mean over n of mean; running_var_out likewise with the unbiased "
           "instance variance (1 / rstd^2 - eps) * S / (S - 1). Pass running_mean/running_var as the outputs to update "
           "them in place";
  const std::string what = def.instance ? "instance normalization of input [N, C, spatial...] (statistics per (n, c))"
                                        : "group normalization of input [N, C, *] (statistics per (n, group) over C / "
                                          "num_groups channels and the spatial dims)";
  if (def.kind == Kind::backward)
    return cat("gradients of ", def.forward_name, " (as torch.native_group_norm_backward)");
  return cat(what, def.affine ? ", then weight[C] and bias[C] per channel (the input's dtype, or f32 for f16/bf16 input)" : "",
             "; mean and rstd [N, groups] are f32 (f64 for f64), as torch.native_group_norm");
}

Domain domain_of(const std::string& n) {
  if (n == "rstd") return {0.5, 2};
  if (n == "mean") return {-0.5, 0.5};
  if (n == "running_var") return {0.1, 2};
  return {-2, 2};
}

}  // namespace
}  // namespace norm

void register_group_norm_ops(std::vector<OpInfo>& ops) {
  using namespace norm;
  for (const Def& def : defs()) {
    OpInfo info;
    info.name = def.name;
    info.category = OpCategory::norm;
    info.family = "norm";
    info.direction = def.kind == Kind::backward ? Direction::backward : Direction::forward;
    if (def.kind == Kind::forward) info.gradient = def.name + "_backward";
    if (def.kind == Kind::backward) info.gradient = def.forward_name;
    info.input_names = def.inputs;
    info.output_names = def.outputs;
    info.dtypes = def.kind == Kind::forward ? dtypes_of<NormTypes>() : dtypes_of<NormGradientTypes>();
    if (def.kind == Kind::running)
      info.attrs = {{"momentum", 0.1, "weight of the new statistics"},
                    {"eps", 1e-5, "the eps instance_norm ran with (recovers the variance from rstd)"},
                    {"spatial", 0, "S, the spatial size of the instances (>= 2)"}};
    else if (def.kind == Kind::forward)
      info.attrs = {{"eps", 1e-5, "added to the variance"}};
    if (def.kind == Kind::forward && !def.instance)
      info.attrs.insert(info.attrs.begin(), {"num_groups", 1, "G: channels split into G groups of C / G"});
    info.backends = {Backend::bespoke_cuda, Backend::host_reference};
    info.doc = doc_of(def);
    info.input_dtypes = [&def](DType primary) {
      std::vector<DType> v;
      for (const auto& n : def.inputs) v.push_back(is_stat(n) ? stat_dtype(primary) : primary);
      return v;
    };
    for (const auto& n : def.inputs) info.domains.push_back(domain_of(n));
    info.tolerance_scale = def.kind == Kind::backward ? 8 : 4;
    if (def.kind == Kind::running) info.sample_attrs = {Attrs{{"spatial", 5}}, Attrs{{"spatial", 2}, {"momentum", 1}}};
    else if (def.kind == Kind::forward && !def.instance) info.sample_attrs = {Attrs{{"num_groups", 1}}, Attrs{{"num_groups", 2}}};
    else info.sample_attrs = {Attrs{}};
    info.sample_shapes = [&def](DType, const Shape& primary, const Attrs& attrs) -> std::optional<SampleShapes> {
      SampleShapes s;
      if (def.kind == Kind::running) {  // [C], or [N, C] (the CLI suite's matrices)
        if (primary.empty() || primary.size() > 2) return std::nullopt;
        const Shape c{primary.back()}, stats{primary.size() == 2 ? primary[0] : 3, primary.back()};
        s.inputs = {c, c, stats, stats};
        return s;
      }
      // A matrix [R, K] (the CLI suite's shape) becomes [R, 16 or 32, K / that]
      // for instance norm (which needs spatial dims) and for long group-norm rows.
      Shape shape = primary;
      const int64_t split = def.instance ? 16 : 32;
      if (shape.size() == 2 && shape[1] % split == 0 && shape[1] / split >= 2 && (def.instance || shape[1] >= 1024))
        shape = {shape[0], split, shape[1] / split};
      if (shape.size() < (def.instance ? 3u : 2u)) return std::nullopt;
      int64_t spatial = 1;
      for (size_t a = 2; a < shape.size(); ++a) spatial *= shape[a];
      if (def.instance && spatial <= 1) return std::nullopt;
      const int64_t C = shape[1];
      // Backward ops take num_groups from the statistics' shape: 2 groups when C is even.
      const int64_t G = def.instance ? C : def.kind == Kind::forward ? int64_t(attrs.get("num_groups", 1)) : (C % 2 ? 1 : 2);
      if (G < 1 || C % G) return std::nullopt;
      for (const auto& n : def.inputs)
        s.inputs.push_back(is_stat(n) ? Shape{shape[0], G} : n == "weight" || n == "bias" ? Shape{C} : shape);
      return s;
    };
    const size_t index = ops.size();
    info.infer = [&def](const OpDesc& partial) { return infer_desc(def, partial); };
    info.make_plan = [&def, index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
      auto full = infer_desc(def, desc);
      if (!full) return full.status();
      const GroupNormTables& t = backend == Backend::host_reference ? host_group_norms() : cuda_group_norms();
      const DType dt = full->inputs[def.kind == Kind::backward ? 1 : 0].dtype;
      if (def.kind == Kind::running) {
        RunningFn fn = t.running.find(launch_key(def.name, dt));
        if (!fn) return unsupported("no ", backend_name(backend), " kernel for ", def.name, " ", dtype_name(dt));
        return PlanPtr(std::make_unique<RunningPlan>(registry()[index], std::move(*full), backend, fn));
      }
      GroupNormFn fn = (def.kind == Kind::backward ? t.backward : t.forward).find(launch_key("group_norm", dt));
      if (!fn) return unsupported("no ", backend_name(backend), " kernel for ", def.name, " ", dtype_name(dt));
      return PlanPtr(std::make_unique<GroupNormPlan>(def, registry()[index], std::move(*full), backend, fn));
    };
    ops.push_back(std::move(info));
  }
}

}  // namespace baracuda
