// linear_cross_entropy, linear_cross_entropy_backward and linear_cross_entropy_fused:
// registry entries, shape rules, the host reference (f64, row by row) and the
// CUDA plan that composes the GEMM plans with the cross_entropy row kernel.
// Attributes: reduction (0 none, 1 mean, 2 sum), ignore_index, label_smoothing, chunk_rows, f32_weight_grad.
// Optional class weights (class_weight [V], or [0] for none) follow torch's cross_entropy: row r
// counts w[t_r] (lse - z_t) (1 - e) + e / V sum_c w_c (lse - z_c), and mean divides by the sum of
// w[t_r] over the rows not ignored.
//
// Note [Linear CE chunks]
// The CUDA plan never holds the [N, V] logits: it walks chunks of `chunk_rows`
// rows (0: as many as fit kAutoChunkBytes of logits, and at least H rows
// where the weight gradient sums in f32 in the workspace). Per chunk, on the stream:
//   1. logits [c, V] = input_c @ weight^T + bias       (the `linear` plan, into the workspace)
//   2. the cross_entropy row kernel: per-row loss, and in place
//      dlogits = scale * (softmax - smoothed one-hot)   (0 on ignored rows)
//   3. grad_input_c = dlogits @ weight                 (`mm`)
//      grad_weight (+)= dlogits^T @ input_c           (gemm::ProductStep, beta 0 for the first chunk, then 1)
//      grad_bias (+)= dlogits^T @ ones                 (the same with a [c, 1] column of ones)
// The mean's denominator (rows not ignored, or the sum of their class weights) is counted before the loop by a
// one-block kernel, which writes `scale` (1 / rows kept, times grad_output in
// the backward of mean or sum) where the row kernel reads it; the loss is the
// fixed-order sum of the per-row losses (kept in f32, f64 for f64). Chunks run in order on one stream and the GEMMs are cuBLASLt
// (or the bespoke GEMM) without atomics: the result is deterministic.
// f32 and f64 sum grad_weight and grad_bias across chunks in the outputs. f16
// and bf16 (unless f32_weight_grad = 0, which trades accuracy for V * H * 4
// bytes) sum them in f32 in the workspace (V * H + V f32, V * H without
// bias; the product takes half operands to an f32 D) and a cast kernel writes
// them once, in any strides, after the last chunk: one rounding in all, not
// one per chunk (README.md, Losses). The reduction-none backward needs each row's logsumexp: it runs the forward row
// kernel on the chunk first.
//
// Note [fp8 linear CE]
// fp8 storage (e4m3, e5m2) has the forward only. The logits are f32: the
// chunk's product is scaled_mm (fp8 input and weight^T, unit scales, f32
// out; the bias as bf16, which holds every fp8 value), and the cross_entropy
// row kernel is the f32 one (class weights as f32). The prepare kernel writes
// the widened bias and class weights and the two unit scales into the
// workspace; the per-row losses stay f32 until the end, where reduction none
// stores them into the fp8 output and mean/sum round their sum once.
#include <algorithm>
#include <array>
#include <cmath>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/launch_table.hpp"
#include "core/registry_internal.hpp"
#include "core/sizes.hpp"
#include "core/tensor_util.hpp"
#include "gemm/engine.hpp"
#include "loss/linear_ce.hpp"
#include "loss/register.hpp"

namespace baracuda {
namespace loss::lce {

LaunchTable<HelperFn>& cuda_helpers() {
  static LaunchTable<HelperFn> table;
  return table;
}

namespace {

enum class Kind : uint8_t { forward, backward, fused };

/// Logits of one chunk: at most this many bytes (chunk_rows = 0).
constexpr size_t kAutoChunkBytes = size_t(256) << 20;

using Names = std::vector<std::string>;
const Names kOperands{"input", "weight", "target", "bias", "class_weight"};

Names input_names(Kind k) {
  Names n = kOperands;
  if (k == Kind::backward) n.insert(n.begin(), "grad_output");
  return n;
}
Names output_names(Kind k) {
  if (k == Kind::forward) return {"out"};
  if (k == Kind::backward) return {"grad_input", "grad_weight", "grad_bias"};
  return {"out", "grad_input", "grad_weight", "grad_bias"};
}
const char* op_name(Kind k) {
  return k == Kind::forward ? "linear_cross_entropy" : k == Kind::backward ? "linear_cross_entropy_backward"
                                                                             : "linear_cross_entropy_fused";
}

Result<OpDesc> infer_lce(Kind kind, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string op = op_name(kind);
  const Names names = input_names(kind);
  const size_t k = kind == Kind::backward ? 1 : 0;
  BARACUDA_TRY(check_inputs(op, d, names, k));
  const TensorSpec &x = d.inputs[k], &w = d.inputs[k + 1], &t = d.inputs[k + 2], &b = d.inputs[k + 3];
  const TensorSpec& cw = d.inputs[k + 4];
  BARACUDA_TRY(check_float_storage(op, x.dtype, kind != Kind::forward));
  if (x.shape.size() != 2) return invalid(op, ": 'input' must be [N, H], got ", shape_str(x.shape));
  const int64_t N = x.shape[0], H = x.shape[1];
  if (w.dtype != x.dtype || w.shape.size() != 2 || w.shape[1] != H || w.shape[0] < 1)
    return invalid(op, ": 'weight' must be ", dtype_name(x.dtype), "[V, ", H, "] (V >= 1 classes, H of 'input' ",
                   shape_str(x.shape), "), got ", dtype_name(w.dtype), shape_str(w.shape));
  const int64_t V = w.shape[0];
  if (t.dtype != DType::i64 && t.dtype != DType::i32)
    return invalid(op, ": 'target' must hold class indices (i64 or i32), got ", dtype_name(t.dtype));
  if (t.shape != Shape{N}) return invalid(op, ": 'target' shape ", shape_str(t.shape), " != [", N, "] (one per row of 'input')");
  if (b.dtype != x.dtype || b.shape.size() != 1 || (b.shape[0] != V && b.shape[0] != 0))
    return invalid(op, ": 'bias' must be ", dtype_name(x.dtype), "[", V, "] (one per class) or ", dtype_name(x.dtype),
                   "[0] (no bias), got ", dtype_name(b.dtype), shape_str(b.shape));
  if (cw.dtype != x.dtype || cw.shape.size() != 1 || (cw.shape[0] != V && cw.shape[0] != 0))
    return invalid(op, ": 'class_weight' must be ", dtype_name(x.dtype), "[", V, "] (one per class) or ", dtype_name(x.dtype),
                   "[0] (no class weights), got ", dtype_name(cw.dtype), shape_str(cw.shape));
  const double reduction = d.attrs.get("reduction", 1);
  if (reduction != 0 && reduction != 1 && reduction != 2)
    return invalid(op, ": attribute 'reduction' must be 0 (none), 1 (mean) or 2 (sum), got ", reduction);
  const double smoothing = d.attrs.get("label_smoothing", 0);
  if (!(smoothing >= 0 && smoothing <= 1)) return invalid(op, ": 'label_smoothing' must be in [0, 1], got ", smoothing);
  const double ignore = d.attrs.get("ignore_index", -100);
  if (ignore != std::floor(ignore)) return invalid(op, ": 'ignore_index' must be an integer, got ", ignore);
  const double chunk = d.attrs.get("chunk_rows", 0);
  if (!(chunk >= 0 && chunk == std::floor(chunk) && chunk < 9e15))
    return invalid(op, ": 'chunk_rows' must be an integer >= 0 (0: automatic), got ", chunk);
  const TensorSpec loss{x.dtype, reduction == 0 ? Shape{N} : Shape{}};
  if (kind == Kind::backward && (d.inputs[0].dtype != loss.dtype || d.inputs[0].shape != loss.shape))
    return invalid(op, ": 'grad_output' must be ", dtype_name(loss.dtype), shape_str(loss.shape), " (the loss's shape), got ",
                   dtype_name(d.inputs[0].dtype), shape_str(d.inputs[0].shape));
  std::vector<TensorSpec> outs;
  if (kind != Kind::backward) outs.push_back(loss);
  if (kind != Kind::forward) outs.insert(outs.end(), {x, w, b});
  BARACUDA_TRY(set_outputs(op, d, outs, output_names(kind)));
  return d;
}

/// Where fp8's widened operands lie in their workspace region (Note [fp8 linear CE]): two f32
/// unit scales, the bias as bf16 [V], the class weights as f32 [V].
struct WideOperands {
  size_t bias_at = 0, class_weight_at = 0, bytes = 0;
  explicit WideOperands(int64_t classes)
      : bias_at(workspace_aligned(2 * sizeof(float))),
        class_weight_at(bias_at + workspace_aligned(size_t(classes) * 2)),
        bytes(class_weight_at + workspace_aligned(size_t(classes) * sizeof(float))) {}
};

/// Attributes read once at plan time.
struct Params {
  int reduction = 1;
  int64_t ignore_index = -100;
  double smoothing = 0;
};

template <class T>
T* at(const TensorView& v, int64_t i, int64_t j = 0) {
  return static_cast<T*>(v.data) + i * v.stride[0] + (v.rank > 1 ? j * v.stride[1] : 0);
}

/// The host reference: logits of a row in f64, then the loss and its gradients.
template <class T, class Index>
Status host_run(Kind kind, const Params& p, const OpArgs& args) {
  using M = double;
  const size_t k = kind == Kind::backward ? 1 : 0;
  const TensorView &x = args.inputs[k], &w = args.inputs[k + 1], &tg = args.inputs[k + 2], &b = args.inputs[k + 3];
  const TensorView& cw = args.inputs[k + 4];
  const int64_t N = x.shape[0], H = x.shape[1], V = w.shape[0];
  const bool bias = b.shape[0] != 0, grads = kind != Kind::forward;
  const M e = p.smoothing;
  std::vector<M> cls(V, M(1));  // the class weights (all ones without)
  if (cw.shape[0] != 0)
    for (int64_t v = 0; v < V; ++v) cls[v] = convert<M>(*at<const T>(cw, v));
  M cls_total = 0;
  for (M c : cls) cls_total += c;
  std::vector<int64_t> target(N);
  M kept = 0;  // the sum of the class weights of the rows not ignored
  for (int64_t r = 0; r < N; ++r) {
    target[r] = static_cast<int64_t>(*at<const Index>(tg, r));
    if (target[r] == p.ignore_index) continue;
    if (target[r] < 0 || target[r] >= V)
      return invalid(op_name(kind), ": 'target' holds class index ", target[r], " (row ", r, "), outside [0, ", V,
                     ") and not ignore_index ", p.ignore_index);
    kept += cls[target[r]];
  }
  // Gradient scale of every row: grad_output, over the weight kept for mean (0 / 0 gives 0 gradients).
  const M denom = p.reduction == 1 ? kept : M(1);
  auto row_scale = [&](int64_t r) -> M {
    const M go = kind == Kind::backward ? convert<M>(*at<const T>(args.inputs[0], p.reduction == 0 ? r : 0)) : M(1);
    return p.reduction == 1 ? (kept != 0 ? go / denom : M(0)) : go;
  };
  std::vector<M> gw(grads ? size_t(V * H) : 0, 0.0), gb(grads ? size_t(V) : 0, 0.0), z(V), gx(H);
  M total = 0;
  const size_t gi = kind == Kind::fused ? 1 : 0;  // the first gradient output
  for (int64_t r = 0; r < N; ++r) {
    const bool ignored = target[r] == p.ignore_index;
    M mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      M acc = bias ? convert<M>(*at<const T>(b, v)) : M(0);
      for (int64_t h = 0; h < H; ++h) acc += convert<M>(*at<const T>(x, r, h)) * convert<M>(*at<const T>(w, v, h));
      z[v] = acc;
      mx = std::max(mx, acc);
    }
    M s = 0, wz = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - mx), wz += cls[v] * z[v];
    const M lse = mx + std::log(s);
    const M w_t = ignored ? M(0) : cls[target[r]];
    const M loss = ignored ? M(0) : (1 - e) * w_t * (lse - z[target[r]]) + e / M(V) * (cls_total * lse - wz);
    total += loss;
    if (kind != Kind::backward && p.reduction == 0) *at<T>(args.outputs[0], r) = convert<T>(loss);
    if (!grads) continue;
    const M g = ignored ? M(0) : row_scale(r);
    std::fill(gx.begin(), gx.end(), M(0));
    for (int64_t v = 0; v < V; ++v) {
      const M pv = std::exp(z[v] - lse);
      const M dz = g * ((1 - e) * w_t * (pv - (v == target[r] ? M(1) : M(0))) + e / M(V) * (cls_total * pv - cls[v]));
      for (int64_t h = 0; h < H; ++h) {
        gx[h] += dz * convert<M>(*at<const T>(w, v, h));
        gw[v * H + h] += dz * convert<M>(*at<const T>(x, r, h));
      }
      gb[v] += dz;
    }
    for (int64_t h = 0; h < H; ++h) *at<T>(args.outputs[gi], r, h) = convert<T>(gx[h]);
  }
  if (kind != Kind::backward && p.reduction != 0) *static_cast<T*>(args.outputs[0].data) = convert<T>(total / denom);
  if (!grads) return Status::ok();
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t h = 0; h < H; ++h) *at<T>(args.outputs[gi + 1], v, h) = convert<T>(gw[v * H + h]);
    if (bias) *at<T>(args.outputs[gi + 2], v) = convert<T>(gb[v]);
  }
  return Status::ok();
}

template <class F>
Status visit_index(DType d, F&& f) {
  if (d == DType::i32) return f(TypeTag<int32_t>{});
  return f(TypeTag<int64_t>{});
}

TensorView view(void* data, DType dtype, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride) {
  TensorView v;
  v.data = data, v.dtype = dtype, v.rank = int(shape.size());
  std::copy(shape.begin(), shape.end(), v.shape.begin());
  std::copy(stride.begin(), stride.end(), v.stride.begin());
  return v;
}

/// Rows [r0, r0 + n) of a [N, ...] view.
TensorView rows_of(TensorView v, int64_t r0, int64_t n) {
  if (v.data) v.data = static_cast<char*>(v.data) + r0 * v.stride[0] * int64_t(dtype_size(v.dtype));
  v.shape[0] = n;
  return v;
}

/// A GEMM step: the first choice (cuBLASLt where it accepts the descriptor),
/// and the bespoke GEMM for layouts the first refuses at run time.
struct Step {
  PlanPtr first, fallback;

  Status run(const Stream& stream, Workspace ws, std::initializer_list<TensorView> in, std::initializer_list<TensorView> out) const {
    const OpArgs args{std::span(in.begin(), in.size()), std::span(out.begin(), out.size())};
    const Plan* plan = first.get();
    if (!first->can_implement(args) && fallback) plan = fallback.get();
    return plan->run(stream, ws, args);
  }
  size_t workspace() const { return std::max(first->workspace_size(), fallback ? fallback->workspace_size() : 0); }
};

Result<Step> make_step(const Stream& stream, const PlanPreference& pref, OpDesc desc) {
  PlanPreference sub = pref;
  sub.backend.reset(), sub.skip_candidates = 0, sub.max_workspace_bytes = SIZE_MAX, sub.allow_host_fallback = false;
  Step s;
  auto first = select(stream, desc, sub);
  if (!first) return first.status();
  s.first = std::move(*first);
  if (s.first->sku().backend != Backend::bespoke_cuda) {
    sub.backend = Backend::bespoke_cuda;
    if (auto fb = select(stream, desc, sub)) s.fallback = std::move(*fb);
  }
  return s;
}

/// The GEMMs for chunks of `rows` rows.
struct ChunkSteps {
  int64_t rows = 0;
  Step logits, grad_input;
  gemm::ProductStep grad_weight, grad_bias;  ///< beta 0 for the first chunk, then 1
};

class LcePlan final : public FamilyPlan {
 public:
  LcePlan(Kind kind, const OpInfo& info, OpDesc desc, Backend backend)
      : FamilyPlan(info, std::move(desc)), kind_(kind), backend_(backend) {
    k_ = kind == Kind::backward ? 1 : 0;
    const TensorSpec& x = desc_.inputs[k_];
    sku_ = bespoke_sku(OpCategory::loss, info.name.c_str(), x.dtype, backend);
    sku_.aux_element = desc_.inputs[k_ + 2].dtype;
    p_.reduction = static_cast<int>(desc_.attrs.get("reduction", 1));
    p_.ignore_index = static_cast<int64_t>(desc_.attrs.get("ignore_index", -100));
    p_.smoothing = desc_.attrs.get("label_smoothing", 0);
    N_ = x.shape[0], H_ = x.shape[1], V_ = desc_.inputs[k_ + 1].shape[0];
    bias_ = desc_.inputs[k_ + 3].shape[0] != 0;
    weighted_ = desc_.inputs[k_ + 4].shape[0] != 0;
    // Where grad_weight and grad_bias sum across chunks: f32 for f16 and bf16
    // (the workspace) unless f32_weight_grad = 0, else the outputs themselves.
    const bool half = x.dtype == DType::f16 || x.dtype == DType::bf16;
    sum_dtype_ = kind != Kind::forward && half && desc_.attrs.get("f32_weight_grad", 1) != 0 ? DType::f32 : x.dtype;
  }

  /// The CUDA plan's chunk size, sub-plans and workspace.
  Status prepare(const Stream& stream, const PlanPreference& pref) {
    const DType t = desc_.inputs[k_].dtype, idx = desc_.inputs[k_ + 2].dtype, lt = logits_dtype();
    class_fn_ = cuda_class_losses().find(launch_key("cross_entropy", lt, idx));
    helper_fn_ = cuda_helpers().find(launch_key("linear_cross_entropy", t, idx));
    if (!class_fn_ || !helper_fn_) return unsupported("no CUDA kernels for ", info_.name, " ", dtype_name(t), " with ", dtype_name(idx), " targets");
    const size_t ts = dtype_size(lt), ws_elem = dtype_size(stat_dtype(t));
    int64_t chunk = static_cast<int64_t>(desc_.attrs.get("chunk_rows", 0));
    if (chunk == 0) {
      chunk = std::max<int64_t>(1, int64_t(kAutoChunkBytes / (size_t(V_) * ts)));
      // f32 sums: each chunk re-reads and re-writes the [V, H] f32 sums (8 V H bytes against the 6 c H V
      // FLOPs of its three products); chunks of at least H rows keep that below 4 / (3 H) bytes a FLOP
      // (H100, N 8192, H 4096, V 128256: 1046-row chunks 0.92x torch, 4096-row 1.05x).
      if (sum_dtype_ != t) chunk = std::max(chunk, H_);
    }
    chunk_ = std::max<int64_t>(1, std::min(chunk, N_));
    for (int64_t rows : {chunk_, N_ % chunk_}) {
      if (rows == 0) continue;  // no tail
      ChunkSteps cs;
      cs.rows = rows;
      const TensorSpec xs{t, {rows, H_}}, ws{t, {V_, H_}}, bs{t, {bias_ ? V_ : 0}}, ls{t, {rows, V_}};
      if (is_fp8(t)) {  // Note [fp8 linear CE]
        const TensorSpec one{DType::f32, {}}, wide_bias{DType::bf16, {bias_ ? V_ : 0}}, none{DType::f32, {0}};
        const OpDesc product{"scaled_mm", {xs, {t, {H_, V_}}, one, one, wide_bias, none}, {},
                             Attrs{{"out_dtype", double(int(DType::f32))}}};
        BARACUDA_TRY(assign(cs.logits, make_step(stream, pref, product)));
      } else {
        BARACUDA_TRY(assign(cs.logits, make_step(stream, pref, OpDesc{"linear", {xs, ws, bs}, {}, {}})));
      }
      if (kind_ != Kind::forward) {
        BARACUDA_TRY(assign(cs.grad_input, make_step(stream, pref, OpDesc{"mm", {ls, ws}, {}, {}})));
        const DType acc = sum_dtype_;
        const TensorView lt = view(nullptr, t, {V_, rows}, {1, V_});
        BARACUDA_TRY(assign(cs.grad_weight, gemm::ProductStep::make(view(nullptr, acc, {V_, H_}, {H_, 1}), lt,
                                                                    view(nullptr, t, {rows, H_}, {H_, 1}))));
        if (bias_)
          BARACUDA_TRY(assign(cs.grad_bias, gemm::ProductStep::make(view(nullptr, acc, {V_, 1}, {1, 1}), lt,
                                                                  view(nullptr, t, {rows, 1}, {1, 1}))));
      }
      steps_.push_back(std::move(cs));
    }
    size_t sub = 0;
    for (const ChunkSteps& cs : steps_) {
      for (const Step* s : {&cs.logits, &cs.grad_input})
        if (s->first) sub = std::max(sub, s->workspace());
      sub = std::max({sub, cs.grad_weight.workspace(), cs.grad_bias.workspace()});
    }
    // Workspace: stats | row losses | lse | class scratch | ones | logits | f32 sums | fp8's widened operands | GEMM scratch.
    const bool f32_sums = sum_dtype_ != t;
    off_rows_ = workspace_aligned(2 * ws_elem);
    off_lse_ = off_rows_ + workspace_aligned(size_t(N_) * ws_elem);
    off_scratch_ = off_lse_ + workspace_aligned(size_t(chunk_) * ws_elem);
    off_ones_ = off_scratch_ + workspace_aligned(size_t(scratch_elements(chunk_)) * ws_elem);
    off_logits_ = off_ones_ + workspace_aligned(bias_ && kind_ != Kind::forward ? size_t(chunk_) * ts : 0);
    off_sum_w_ = off_logits_ + workspace_aligned(size_t(chunk_) * size_t(V_) * ts);
    off_sum_b_ = off_sum_w_ + workspace_aligned(f32_sums ? size_t(V_) * size_t(H_) * sizeof(float) : 0);
    off_wide_ = off_sum_b_ + workspace_aligned(f32_sums && bias_ ? size_t(V_) * sizeof(float) : 0);
    off_sub_ = off_wide_ + (is_fp8(t) ? WideOperands(V_).bytes : 0);
    workspace_ = off_sub_ + sub;
    return Status::ok();
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const DType t = desc_.inputs[k_].dtype;
    if (backend_ == Backend::host_reference) {
      return visit_dtype<LossTypes>(t, info_.name, [&]<class T>(TypeTag<T>) {
        return visit_index(args.inputs[k_ + 2].dtype, [&]<class I>(TypeTag<I>) { return host_run<T, I>(kind_, p_, args); });
      });
    }
    return run_cuda(stream, workspace, args).with_context(info_.name);
  }

 private:
  template <class S>
  static Status assign(S& dst, Result<S> src) {
    if (!src) return src.status();
    dst = std::move(*src);
    return Status::ok();
  }

  Status run_cuda(const Stream& stream, Workspace workspace, const OpArgs& args) const {
    CUstream_st* s = stream.cuda_stream();
    const DType t = desc_.inputs[k_].dtype, ws_t = stat_dtype(t), lt = logits_dtype();
    const bool fp8 = is_fp8(t);
    const TensorView &x = args.inputs[k_], &w = args.inputs[k_ + 1], &tg = args.inputs[k_ + 2], &b = args.inputs[k_ + 3];
    const TensorView& cw = args.inputs[k_ + 4];
    const TensorView* go = kind_ == Kind::backward ? &args.inputs[0] : nullptr;
    const size_t gi = kind_ == Kind::fused ? 1 : 0;
    const TensorView* gx = kind_ != Kind::forward ? &args.outputs[gi] : nullptr;
    const TensorView* gw = kind_ != Kind::forward ? &args.outputs[gi + 1] : nullptr;
    const TensorView* gb = kind_ != Kind::forward && bias_ ? &args.outputs[gi + 2] : nullptr;
    const bool none = p_.reduction == 0;
    char* ws = static_cast<char*>(workspace.data);
    void* stats = ws;
    char* row_loss = ws + off_rows_;
    const Workspace sub{ws + off_sub_, workspace.bytes - off_sub_};

    Helper h;
    h.reduction = p_.reduction, h.ignore_index = p_.ignore_index, h.stats = stats;
    h.target = tg.data, h.target_stride = tg.stride[0], h.rows = N_;
    h.classes = V_;
    if (weighted_) h.class_weight = cw.data, h.class_weight_stride = cw.stride[0];
    h.ones = ws + off_ones_, h.ones_count = gb ? chunk_ : 0;
    h.grad_output = go && !none ? go->data : nullptr;
    // fp8: scaled_mm's unit scales, the bias as bf16, the class weights as f32 (Note [fp8 linear CE]).
    char* wide = ws + off_wide_;
    const WideOperands at(V_);
    if (fp8) {
      h.unit_scales = wide;
      if (bias_) h.bias = b.data, h.bias_stride = b.stride[0], h.wide_bias = wide + at.bias_at;
      if (weighted_) h.wide_class_weight = wide + at.class_weight_at;
    }
    BARACUDA_TRY(helper_fn_(h, s));
    const TensorView unit = view(wide, DType::f32, {}, {}), no_scale = view(nullptr, DType::f32, {0}, {1});
    const TensorView wide_bias = view(bias_ ? wide + at.bias_at : nullptr, DType::bf16, {bias_ ? V_ : 0}, {1});
    const TensorView class_weight = fp8 && weighted_ ? view(wide + at.class_weight_at, DType::f32, {V_}, {1}) : cw;
    // The weight and bias gradients: summed in f32 in the workspace, or in the outputs.
    const bool f32_sums = sum_dtype_ != t;
    TensorView sum_w, sum_b;
    if (gw) sum_w = f32_sums ? view(ws + off_sum_w_, DType::f32, {V_, H_}, {H_, 1}) : *gw;
    if (gb) sum_b = f32_sums ? view(ws + off_sum_b_, DType::f32, {V_, 1}, {1, 1}) : view(gb->data, t, {V_, 1}, {gb->stride[0], 1});
    // Writes them into the outputs (src null: zeros, when no chunk ran).
    auto store = [&](const void* src_w, const void* src_b) -> Status {
      Helper z = h;
      z.stage = Helper::Stage::store;
      z.src = src_w, z.dst = gw->data, z.n0 = V_, z.n1 = H_, z.s0 = gw->stride[0], z.s1 = gw->stride[1];
      BARACUDA_TRY(helper_fn_(z, s));
      if (!gb) return Status::ok();
      z.src = src_b, z.dst = gb->data, z.n0 = V_, z.n1 = 1, z.s0 = gb->stride[0], z.s1 = 0;
      return helper_fn_(z, s);
    };
    if (N_ == 0 && gw) BARACUDA_TRY(store(nullptr, nullptr));
    for (int64_t r0 = 0, i = 0; r0 < N_; r0 += chunk_, ++i) {
      const int64_t c = std::min(chunk_, N_ - r0);
      const ChunkSteps& st = steps_[c == chunk_ ? 0 : steps_.size() - 1];
      const TensorView xc = rows_of(x, r0, c), tc = rows_of(tg, r0, c);
      const TensorView logits = view(ws + off_logits_, lt, {c, V_}, {V_, 1});
      if (fp8) {
        const TensorView wt = view(w.data, t, {H_, V_}, {w.stride[1], w.stride[0]});
        BARACUDA_TRY(st.logits.run(stream, sub, {xc, wt, unit, unit, wide_bias, no_scale}, {logits}));
      } else {
        BARACUDA_TRY(st.logits.run(stream, sub, {xc, w, b}, {logits}));
      }
      // The per-row loss: the output itself for reduction none, else the workspace (W).
      const bool to_output = none && kind_ != Kind::backward && !fp8;
      const TensorView out_c = to_output ? rows_of(args.outputs[0], r0, c)
                                         : view(row_loss + r0 * int64_t(dtype_size(ws_t)), ws_t, {c}, {1});
      const TensorView lse = view(ws + off_lse_, ws_t, {c}, {1});
      if (kind_ == Kind::forward || (kind_ == Kind::backward && none)) BARACUDA_TRY(class_step(Mode::forward, logits, tc, class_weight, out_c, lse, nullptr, stats, s));
      if (kind_ == Kind::forward) continue;
      if (kind_ == Kind::backward && none) BARACUDA_TRY(class_step(Mode::backward, logits, tc, cw, out_c, lse, &*go, stats, s, r0));
      else BARACUDA_TRY(class_step(Mode::fused, logits, tc, cw, out_c, lse, nullptr, stats, s));
      // logits now hold dlogits.
      const TensorView lt = view(logits.data, t, {V_, c}, {1, V_});
      BARACUDA_TRY(st.grad_input.run(stream, sub, {logits, w}, {rows_of(*gx, r0, c)}));
      const double beta = i == 0 ? 0 : 1;
      BARACUDA_TRY(st.grad_weight.run(sum_w, lt, xc, beta, sub, s));
      if (gb) BARACUDA_TRY(st.grad_bias.run(sum_b, lt, view(ws + off_ones_, t, {c, 1}, {1, 1}), beta, sub, s));
    }
    if (N_ > 0 && gw && f32_sums) BARACUDA_TRY(store(sum_w.data, gb ? sum_b.data : nullptr));
    if (fp8 && none && N_ > 0) {  // the f32 per-row losses into the fp8 output
      Helper z = h;
      z.stage = Helper::Stage::store;
      const TensorView& out = args.outputs[0];
      z.src = row_loss, z.dst = out.data, z.n0 = N_, z.n1 = 1, z.s0 = out.stride[0], z.s1 = 0;
      BARACUDA_TRY(helper_fn_(z, s));
    }
    if (kind_ != Kind::backward && !none) {
      Helper f = h;
      f.stage = Helper::Stage::finish;
      f.row_loss = row_loss, f.out = args.outputs[0].data;
      BARACUDA_TRY(helper_fn_(f, s));
    }
    return Status::ok();
  }

  /// One launch of the cross_entropy row kernel over a chunk's logits (reduction none).
  Status class_step(Mode mode, const TensorView& logits, const TensorView& target, const TensorView& class_weight, const TensorView& out,
                    const TensorView& lse, const TensorView* grad_output, void* stats, CUstream_st* s, int64_t r0 = 0) const {
    std::array<TensorView, kSlots> views;
    std::array<rows::Role, kSlots> roles;
    views.fill(logits);
    roles.fill(rows::Role::full);
    views[kOut] = out, roles[kOut] = rows::Role::per_row;
    views[kLse] = lse, roles[kLse] = rows::Role::per_row;
    views[kTarget] = target, roles[kTarget] = rows::Role::per_row;
    if (weighted_) views[kWeight] = class_weight, roles[kWeight] = rows::Role::per_col;
    if (grad_output) views[kGradOutput] = rows_of(*grad_output, r0, logits.shape[0]), roles[kGradOutput] = rows::Role::per_row;
    ClassParams cp;
    cp.mode = mode;
    cp.reduction = Reduction::none;
    cp.weighted = weighted_;
    cp.ignore_index = p_.ignore_index;
    cp.smoothing = p_.smoothing;
    cp.stat_out = out.dtype != logits.dtype;  // the workspace's per-row losses (f16/bf16)
    ClassLaunch cl;
    const int64_t shape[2] = {logits.shape[0], logits.shape[1]};
    cl.rows = rows::make_rows(shape, 1, std::span(views.data(), kSlots), std::span(roles.data(), kSlots));
    cl.scratch = static_cast<char*>(stats) + off_scratch_;  // stats opens the workspace
    cl.grad_scale = mode == Mode::fused ? stats : nullptr;
    return class_fn_(cl, cp, s);
  }

  /// The logits' dtype: the storage's, f32 for fp8 (Note [fp8 linear CE]).
  DType logits_dtype() const {
    const DType t = desc_.inputs[k_].dtype;
    return is_fp8(t) ? DType::f32 : t;
  }

  Kind kind_;
  Backend backend_;
  size_t k_ = 0;
  Params p_;
  int64_t N_ = 0, H_ = 0, V_ = 0, chunk_ = 1;
  bool bias_ = false, weighted_ = false;
  DType sum_dtype_ = DType::f32;
  ClassFn class_fn_ = nullptr;
  HelperFn helper_fn_ = nullptr;
  std::vector<ChunkSteps> steps_;  ///< [0]: full chunks, [last]: the tail chunk when shorter
  size_t off_rows_ = 0, off_lse_ = 0, off_scratch_ = 0, off_ones_ = 0, off_logits_ = 0, off_sum_w_ = 0, off_sum_b_ = 0,
         off_wide_ = 0, off_sub_ = 0;
};

/// The sweep's cases from its primary shape: [a, b] -> input [a, b] with
/// 2 + (a + b) % 13 classes; [n] -> [n, 8] with 3 classes; [a, b, c] ->
/// [a * b, 16] with 80 c classes (a long row: [3, 4, 128] has 10240). Class
/// weights where the attributes ask for reduction none or set chunk_rows.
/// f16 takes at most 16384 rows: grad_weight sums N products of f16-rounded
/// dlogits, an error of ~sqrt(N) ulps that cancelling sums leave beside
/// small results (65537 rows went past the sweep's tolerance once on an H100).
std::optional<SampleShapes> lce_samples(Kind kind, DType dtype, const Shape& shape, const Attrs& attrs) {
  int64_t N, H, V;
  if (shape.size() == 2) N = shape[0], H = shape[1], V = 2 + (shape[0] + shape[1]) % 13;
  else if (shape.size() == 1 && shape[0] > 0) N = dtype == DType::f16 ? std::min<int64_t>(shape[0], 16384) : shape[0], H = 8, V = 3;
  else if (shape.size() == 3) N = shape[0] * shape[1], H = 16, V = 80 * shape[2];
  else return std::nullopt;
  V = std::max<int64_t>(V, 3);  // targets are drawn from {-1, 0, 1}
  if (attrs.get("chunk_rows", 0) != 0 && N > 4096) return std::nullopt;  // tens of thousands of chunks: launches only
  const bool biased = attrs.get("reduction", 1) != 2;
  const bool weighted = attrs.get("reduction", 1) == 0 || attrs.get("chunk_rows", 0) != 0;
  SampleShapes s;
  if (kind == Kind::backward) s.inputs.push_back(attrs.get("reduction", 1) == 0 ? Shape{N} : Shape{});
  s.inputs.insert(s.inputs.end(), {Shape{N, H}, Shape{V, H}, Shape{N}, Shape{biased ? V : 0}, Shape{weighted ? V : 0}});
  return s;
}

void add_lce_op(std::vector<OpInfo>& ops, Kind kind) {
  OpInfo info;
  info.name = op_name(kind);
  info.category = OpCategory::loss;
  info.family = "linear_cross_entropy";
  info.direction = kind == Kind::backward ? Direction::backward : Direction::forward;
  info.gradient = kind == Kind::forward ? "linear_cross_entropy_backward" : kind == Kind::backward ? "linear_cross_entropy" : "";
  info.input_names = input_names(kind);
  info.output_names = output_names(kind);
  info.dtypes = kind == Kind::forward ? dtypes_of<LossTypes>() : dtypes_of<FloatTypes>();
  info.attrs = {{"reduction", 1, "0 none, 1 mean (over the class weights of the rows not ignored: their count without), 2 sum"},
                {"ignore_index", -100, "rows whose target is this index count for nothing"},
                {"label_smoothing", 0, "mix the target with the uniform distribution"},
                {"chunk_rows", 0, "rows of logits the CUDA plan holds at once (0: as many as fit 256 MiB, at least H with f32 weight-gradient sums)"},
                {"f32_weight_grad", 1,
                 "f16/bf16: 1 sums grad_weight and grad_bias across chunks in f32 (V * H * 4 more workspace bytes, one "
                 "rounding); 0 sums them in the outputs (one rounding per chunk)"}};
  info.backends = {Backend::bespoke_cuda, Backend::host_reference};
  info.doc = kind == Kind::forward
                 ? "cross_entropy(input @ weight^T + bias, target, class_weight) without materialising the [N, V] logits: "
                   "input [N, H], weight [V, H], class-index target [N], bias [V] or [0], class_weight [V] or [0] (none)"
             : kind == Kind::backward ? "gradients of linear_cross_entropy (input, weight, bias; grad_bias [0] without bias), "
                                        "recomputing the logits chunk by chunk"
                                      : "linear_cross_entropy and its gradients for grad_output = 1 in one pass over the "
                                        "chunks of logits (scale the gradients by grad_output afterwards)";
  info.input_dtypes = [kind](DType primary) {
    std::vector<DType> d{primary, primary, DType::i64, primary, primary};
    if (kind == Kind::backward) d.insert(d.begin(), primary);
    return d;
  };
  info.domains = {Domain{-1, 1}, Domain{-0.5, 0.5}, Domain{-1, 1, false, false, true}, Domain{-1, 1}, Domain{0.5, 2}};
  if (kind == Kind::backward) info.domains.insert(info.domains.begin(), Domain{-1, 1});
  info.tolerance_scale = 8;
  info.in_place = false;
  // Targets are drawn from {-1, 0, 1}: -1 is the ignored index. Small chunks walk several (and a tail).
  for (double r : {0.0, 1.0, 2.0}) info.sample_attrs.push_back(Attrs{{"reduction", r}, {"ignore_index", -1}});
  info.sample_attrs.push_back(Attrs{{"reduction", 1}, {"ignore_index", -1}, {"label_smoothing", 0.2}, {"chunk_rows", 4}});
  info.sample_attrs.push_back(Attrs{{"reduction", 0}, {"ignore_index", -1}, {"label_smoothing", 0.1}, {"chunk_rows", 5}});
  info.sample_attrs.push_back(Attrs{{"reduction", 2}, {"ignore_index", -1}, {"chunk_rows", 3}});
  // Sums in the outputs' dtype: one chunk (a rounding per chunk is the documented cost of more).
  info.sample_attrs.push_back(Attrs{{"reduction", 1}, {"ignore_index", -1}, {"f32_weight_grad", 0}});
  info.sample_shapes = [kind](DType dtype, const Shape& shape, const Attrs& attrs) {
    return lce_samples(kind, dtype, shape, attrs);
  };
  info.infer = [kind](const OpDesc& partial) { return infer_lce(kind, partial); };
  const size_t index = ops.size();
  info.make_plan = [kind, index](Backend backend, const Stream& stream, const OpDesc& desc,
                                 const PlanPreference& pref) -> Result<PlanPtr> {
    auto full = infer_lce(kind, desc);
    if (!full) return full.status();
    auto plan = std::make_unique<LcePlan>(kind, registry()[index], std::move(*full), backend);
    if (backend != Backend::host_reference) BARACUDA_TRY(plan->prepare(stream, pref));
    return PlanPtr(std::move(plan));
  };
  ops.push_back(std::move(info));
}

}  // namespace
}  // namespace loss::lce

void register_linear_ce_ops(std::vector<OpInfo>& ops) {
  for (auto kind : {loss::lce::Kind::forward, loss::lce::Kind::backward, loss::lce::Kind::fused})
    loss::lce::add_lce_op(ops, kind);
}

}  // namespace baracuda
