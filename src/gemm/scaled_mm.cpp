// scaled_mm: torch._scaled_mm's fp8 matrix product, out = scale_result *
// ((a * scale_a) @ (b * scale_b) + bias), accumulated in f32, with scales per
// tensor, per row/column or per block (Note [scaled_mm scales]) and a
// bf16/f16/f32 or saturated fp8 output. It binds to gemm::Problem like the
// rest of the family; the candidates are cuBLASLt (Hopper fp8, "TN" layout
// only; per-tensor and row-wise scales), CUTLASS (sm_90a, "TN" only; row-wise
// and block-wise scales), the bespoke CUDA kernel (any strides, every form)
// and the host reference.
#include <cmath>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "gemm/engine.hpp"
#include "gemm/scaled_cutlass.hpp"
#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {
namespace gemm {
namespace {

constexpr const char* kName = "scaled_mm";
const std::vector<std::string>& input_names() {
  static const std::vector<std::string> names = {"a", "b", "scale_a", "scale_b", "bias", "scale_result"};
  return names;
}
const std::vector<std::string>& output_names() {
  static const std::vector<std::string> names = {"out"};
  return names;
}

bool is_out(DType t) { return t == DType::bf16 || t == DType::f16 || t == DType::f32 || is_fp8(t); }

enum class ScaleForm { tensor, row, block };
const char* form_name(ScaleForm f) {
  return f == ScaleForm::tensor ? "per-tensor" : f == ScaleForm::row ? "row-wise" : "block-wise";
}

int64_t blocks(int64_t n) { return (n + kScaleBlock - 1) / kScaleBlock; }

/// Whether scale_a's (b_fits: scale_b's) shape has the form for a [M, K] @
/// b [K, N], and what scale_b must be for it (Note [scaled_mm scales]).
bool a_fits(ScaleForm f, const Shape& sa, int64_t m, int64_t k) {
  int64_t numel = 1;
  for (int64_t s : sa) numel *= s;
  switch (f) {
    case ScaleForm::tensor: return sa.size() <= 2 && numel == 1;
    case ScaleForm::row: return sa == Shape{m, 1};
    case ScaleForm::block: return sa == Shape{m, blocks(k)};
  }
  return false;
}
bool b_fits(ScaleForm f, const Shape& sb, int64_t k, int64_t n) {
  if (f == ScaleForm::tensor) return a_fits(f, sb, 1, 1);
  return sb == (f == ScaleForm::row ? Shape{1, n} : Shape{blocks(k), blocks(n)});
}
std::string b_wants(ScaleForm f, int64_t k, int64_t n) {
  if (f == ScaleForm::tensor) return "a scalar ([] or [1])";
  return shape_str(f == ScaleForm::row ? Shape{1, n} : Shape{blocks(k), blocks(n)});
}

/// The form of the scales of a [M, K] @ b [K, N], or an error naming the
/// operand that fits none.
Result<ScaleForm> scale_form(const Shape& sa, const Shape& sb, int64_t m, int64_t k, int64_t n) {
  constexpr ScaleForm kForms[] = {ScaleForm::tensor, ScaleForm::row, ScaleForm::block};
  for (ScaleForm f : kForms)
    if (a_fits(f, sa, m, k) && b_fits(f, sb, k, n)) return f;
  for (ScaleForm f : kForms)
    if (a_fits(f, sa, m, k))
      return invalid(kName, ": 'scale_b' must be ", b_wants(f, k, n), " for ", form_name(f), " 'scale_a' ",
                     shape_str(sa), ", got ", shape_str(sb));
  return invalid(kName, ": 'scale_a' must be [] or [1] (per tensor), ", shape_str(Shape{m, 1}), " (row-wise) or ",
                 shape_str(Shape{m, blocks(k)}), " (block-wise, 1 x 128), got ", shape_str(sa));
}

// Note [scaled_mm's oracle]
// The test driver's reference runs every floating operand in f64, so
// scaled_mm also takes a, b, scales, bias and out all f64 (out_dtype is not
// read then): the same product without the fp8 rounding of the inputs.

Result<OpDesc> infer(const OpDesc& partial) {
  OpDesc d = partial;
  BARACUDA_TRY(check_inputs(kName, d, input_names(), 0));
  const auto& in = d.inputs;
  const DType ta = in[0].dtype, tb = in[1].dtype;
  const bool oracle = ta == DType::f64;
  if (!is_fp8(ta) && !oracle)
    return unsupported(kName, ": 'a' dtype ", dtype_name(ta), " is not supported (fp8_e4m3, fp8_e5m2)");
  if (oracle ? tb != DType::f64 : !is_fp8(tb))
    return invalid(kName, ": 'b' dtype ", dtype_name(tb), ", expected ", oracle ? "f64 (as 'a')" : "fp8_e4m3 or fp8_e5m2");
  const DType scale_t = oracle ? DType::f64 : DType::f32;
  for (size_t i : {2, 3, 5}) {
    if (in[i].dtype != scale_t)
      return invalid(kName, ": '", input_names()[i], "' dtype ", dtype_name(in[i].dtype), ", expected ", dtype_name(scale_t));
  }
  DType out = DType::f64;
  if (!oracle) {
    const double code = d.attrs.get("out_dtype", -1);
    if (code == -1) {
      out = d.outputs.empty() ? DType::bf16 : d.outputs[0].dtype;
    } else {
      if (code != std::trunc(code) || code < 0 || code >= kNumDTypes)
        return invalid(kName, ": 'out_dtype' must be a dtype code or -1, got ", code);
      out = static_cast<DType>(int(code));
    }
    if (!is_out(out))
      return unsupported(kName, ": out dtype ", dtype_name(out), " is not supported (bf16, f16, f32, fp8_e4m3, fp8_e5m2)");
  }
  if (in[0].shape.size() != 2) return invalid(kName, ": 'a' must be a matrix [M, K], got ", shape_str(in[0].shape));
  if (in[1].shape.size() != 2) return invalid(kName, ": 'b' must be a matrix [K, N], got ", shape_str(in[1].shape));
  const int64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  if (in[1].shape[0] != k)
    return invalid(kName, ": 'a' ", shape_str(in[0].shape), " and 'b' ", shape_str(in[1].shape), " cannot be multiplied (",
                   k, " != ", in[1].shape[0], ")");
  if (auto form = scale_form(in[2].shape, in[3].shape, m, k, n); !form) return form.status();
  const TensorSpec& result_scale = in[5];
  if (result_scale.shape.size() > 1 || (result_scale.numel() != 1 && result_scale.shape != Shape{0}))
    return invalid(kName, ": 'scale_result' must be a scalar ([] or [1]) or [0] (none), got ", shape_str(result_scale.shape));
  if (result_scale.numel() == 1 && !oracle && !is_fp8(out))
    return invalid(kName, ": 'scale_result' scales an fp8 output only (cuBLASLt's D scale), but out is ", dtype_name(out));
  const TensorSpec& bias = in[4];
  if (bias.shape != Shape{n} && bias.shape != Shape{0})
    return invalid(kName, ": 'bias' must be [", n, "] or [0] (no bias), got ", shape_str(bias.shape));
  if (oracle ? bias.dtype != DType::f64 : bias.dtype != DType::bf16 && bias.dtype != DType::f16)
    return invalid(kName, ": 'bias' dtype ", dtype_name(bias.dtype), ", expected ", oracle ? "f64" : "bf16 or f16");
  const double fast = d.attrs.get("use_fast_accum", 0);
  if (fast != 0 && fast != 1) return invalid(kName, ": 'use_fast_accum' must be 0 or 1, got ", fast);
  BARACUDA_TRY(set_outputs(kName, d, {{out, {m, n}}}, output_names()));
  return d;
}

/// The problem of one run: a @ b into out, the scales and the bias.
Result<Problem> bind(const OpArgs& args) {
  const auto& in = args.inputs;
  auto p = bind_product(args.outputs[0], in[0], in[1]);
  if (!p) return p.status();
  const TensorView &sa = in[2], &sb = in[3];
  auto form = scale_form(sa.shape_vec(), sb.shape_vec(), p->m, p->k, p->n);
  if (!form) return form.status();
  // A size-1 dim takes stride 0: index 0 is all it is read at.
  auto step = [](const TensorView& v, int d) { return v.rank > d && v.shape[d] > 1 ? v.stride[d] : int64_t(0); };
  p->scale_a.data = sa.data;
  p->scale_b.data = sb.data;
  if (*form != ScaleForm::tensor) {
    p->scale_a.stride = step(sa, 0);
    p->scale_b.stride = step(sb, 1);
  }
  if (*form == ScaleForm::block) {
    p->scale_a.k_stride = step(sa, 1);
    p->scale_b.k_stride = step(sb, 0);
    p->scale_b.block = kScaleBlock;
  }
  if (in[4].numel() > 0) bind_bias(*p, in[4]);
  if (in[5].numel() > 0) p->scale_result = in[5].data;
  return p;
}

class ScaledPlan final : public FamilyPlan {
 public:
  ScaledPlan(const OpInfo& info, OpDesc desc, std::unique_ptr<const Engine> engine, KernelSku sku)
      : FamilyPlan(info, std::move(desc)), engine_(std::move(engine)) {
    sku_ = sku;
    workspace_ = engine_->workspace();
  }

  Status can_implement(const OpArgs& args) const override {
    auto p = check_and_bind(args);
    if (!p) return p.status();
    return engine_->supports(*p).with_context(cat(kName, " on ", backend_name(sku_.backend)));
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    auto p = check_and_bind(args);
    if (!p) return p.status();
    BARACUDA_TRY(check_workspace(kName, workspace, workspace_));
    return engine_->run(*p, workspace, stream.cuda_stream()).with_context(kName);
  }

 private:
  Result<Problem> check_and_bind(const OpArgs& args) const {
    BARACUDA_TRY(FamilyPlan::can_implement(args));
    const TensorView& out = args.outputs[0];
    for (size_t i = 0; i < args.inputs.size(); ++i)
      if (out.numel() > 0 && args.inputs[i].numel() > 0 && memory_overlaps(out, args.inputs[i]))
        return invalid(kName, ": output 'out' overlaps input '", input_names()[i], "'");
    return bind(args);
  }

  std::unique_ptr<const Engine> engine_;
};

/// scaled_mm's CUTLASS kernels: the per-run check of the views, the
/// launcher, and the workspace fixed at plan time.
class CutlassEngine final : public Engine {
 public:
  CutlassEngine(const CutlassScaledKernel* kernel, CutlassScales form, size_t workspace, int sm_count)
      : kernel_(kernel), form_(form), workspace_(workspace), sm_count_(sm_count) {}
  Status supports(const Problem& p) const override { return cutlass_scaled_fits(p, form_); }
  Status run(const Problem& p, const Workspace& workspace, CUstream_st* stream) const override {
    return kernel_->run(p, workspace.data, workspace.bytes, sm_count_, stream);
  }
  size_t workspace() const override { return workspace_; }

 private:
  const CutlassScaledKernel* kernel_;
  CutlassScales form_;
  size_t workspace_;
  int sm_count_;
};

// Note [scaled_mm on cuBLASLt]
// cuBLASLt (12.9 and newer: CUDA 13.0 here) runs Hopper fp8 GEMMs with scales
// per tensor (SCALAR_32F), per row of A and column of B (OUTER_VEC_32F:
// contiguous vectors of M and N floats) and per block (VEC128_32F for A's
// 1 x 128, BLK128x128_32F for B's 128 x 128). Per-tensor and row-wise scales
// are wired in, but cuBLASLt 13.0 answers INVALID_VALUE to row-wise ones on
// the H100 (a named unsupported, so the bespoke kernel runs them there);
// block-wise ones run on the bespoke kernel, which scales each fp8 element as
// it loads it. An fp8 D is scale_result * the product
// (D_SCALE_POINTER), saturated; its C (never read) takes the bias's type, f16
// without a bias, as torch does. cuBLASLt can also write amax(|D|)
// (AMAX_D_POINTER): scaled_mm does not offer it (torch._scaled_mm returns
// none; the bespoke kernel would need a cross-block max).

Result<PlanPtr> make_plan(const OpInfo& info, Backend backend, const OpDesc& desc,
                          [[maybe_unused]] const PlanPreference& pref) {
  auto full = infer(desc);
  if (!full) return full.status();
  const DType a = full->inputs[0].dtype, b = full->inputs[1].dtype, out = full->outputs[0].dtype;
  const bool bias = full->inputs[4].numel() > 0;
  const Shape& a_shape = full->inputs[0].shape;
  const int64_t n_cols = full->inputs[1].shape[1];
  const ScaleForm form = *scale_form(full->inputs[2].shape, full->inputs[3].shape, a_shape[0], a_shape[1], n_cols);
  KernelSku sku = bespoke_sku(OpCategory::gemm, info.name.c_str(), a, backend);
  sku.aux_element = out;
  sku.epilogue = bias ? Epilogue::bias : Epilogue::none;
  if (form != ScaleForm::tensor) sku.kernel = form == ScaleForm::row ? "rowwise_scales" : "blockwise_scales";
  std::unique_ptr<const Engine> engine;
  if (backend == Backend::cublaslt) {
#ifdef BARACUDA_HAS_CUDA
    // Note [scaled_mm on cuBLASLt]
    if (form == ScaleForm::block)
      return unsupported("block-wise scales run on the bespoke kernel (cuBLASLt's VEC128_32F / BLK128x128_32F "
                         "modes are not wired in)");
    LtRequest request;
    request.in = a, request.in_b = b, request.out = out;
    request.scaled = true;
    request.outer_scales = form == ScaleForm::row;
    request.result_scale = full->inputs[5].numel() > 0;
    request.fast_accum = full->attrs.get("use_fast_accum", 0) != 0;
    request.bias = bias;
    request.bias_dtype = full->inputs[4].dtype;
    request.max_workspace = std::min(pref.max_workspace_bytes, kLtWorkspace);
    // The heuristics serve the layout cuBLASLt takes: a row-major, b column-major.
    ProbeViews probe(*full);
    const int64_t k = full->inputs[1].shape[0], n = full->inputs[1].shape[1];
    const std::vector<int64_t> b_shape{k, n}, b_strides{1, std::max<int64_t>(k, 1)};
    probe.inputs[1] = *TensorView::strided(probe.inputs[1].data, b, b_shape, b_strides);
    auto p = bind(OpArgs{probe.inputs, probe.outputs});
    if (!p) return p.status();
    auto lt = make_lt_engine(request, std::span(&*p, 1));
    if (!lt) return lt.status();
    engine = std::move(*lt);
    sku.layout = Layout::row_major;
#else
    return unsupported("built without CUDA");
#endif
  } else if (backend == Backend::cutlass) {
    // Note [scaled_mm on CUTLASS] (scaled_cutlass.cuh)
    if (form == ScaleForm::tensor) return unsupported("per-tensor scales run on cuBLASLt (CUTLASS serves row-wise and block-wise)");
    const CutlassScales cform = form == ScaleForm::row ? CutlassScales::rowwise : CutlassScales::blockwise;
    const CutlassScaledKernel* kernel = cutlass_scaled().find(cutlass_scaled_key(cform, a, b, out));
    if (!kernel)
      return unsupported("no CUTLASS kernel for ", dtype_name(a), " x ", dtype_name(b), " -> ", dtype_name(out), " ",
                         form_name(form), " (built: fp8_e4m3 x fp8_e4m3 -> bf16, f16, f32; none without the CUTLASS "
                         "headers or sm_90a: scripts/carry_cutlass.sh)");
    if (bias && full->inputs[4].dtype != kernel->bias)
      return unsupported("the CUTLASS kernel for ", dtype_name(out), " output reads a ", dtype_name(kernel->bias),
                         " 'bias', got ", dtype_name(full->inputs[4].dtype));
#ifdef BARACUDA_HAS_CUDA
    if (current_sm_version() != 90)
      return unsupported("the CUTLASS fp8 GEMM is built for sm_90a, the device is sm_", current_sm_version());
    const int sms = current_sm_count();
#else
    const int sms = 0;
#endif
    const int64_t k = a_shape[1];
    engine = std::make_unique<CutlassEngine>(kernel, cform, kernel->workspace(a_shape[0], n_cols, k, sms), sms);
    sku.kernel = kernel->name;
    sku.layout = Layout::row_major;
  } else {
    auto e = table_engine(backend, scaled_key(a, b, out), cat(dtype_name(a), " x ", dtype_name(b), " -> ", dtype_name(out)));
    if (!e) return e.status();
    engine = std::move(*e);
  }
  return PlanPtr(std::make_unique<ScaledPlan>(info, std::move(*full), std::move(engine), sku));
}

std::optional<SampleShapes> sample_shapes(const Shape& shape, const Attrs& attrs) {
  if (shape.size() != 2) return std::nullopt;
  const int64_t m = shape[0], n = shape[1];
  int64_t k = 1;  // 1 to 97, at most 5 for large outputs (the sweep's reference stays fast)
  for (int64_t s : shape) k = k * 31 + s;
  k = 1 + k % (m * n > 4096 ? 5 : 97);
  // The scale form cycles with the shape: per tensor, row-wise, block-wise
  // (K up to 97 is one block along K: the sums scale as row-wise ones do).
  const int64_t form = (m + 2 * n) % 3;
  const Shape sa = form == 0 ? Shape{} : form == 1 ? Shape{m, 1} : Shape{m, blocks(k)};
  const Shape sb = form == 0 ? Shape{1} : form == 1 ? Shape{1, n} : Shape{blocks(k), blocks(n)};
  const int out = int(attrs.get("out_dtype", -1));
  const bool fp8_out = out == int(DType::fp8_e4m3) || out == int(DType::fp8_e5m2);
  const Shape result_scale = fp8_out && n % 2 == 1 ? Shape{} : Shape{0};
  return SampleShapes{{{m, k}, {k, n}, sa, sb, n % 4 == 0 ? Shape{0} : Shape{n}, result_scale}, {}};
}

}  // namespace

LaunchTable<const CutlassScaledKernel*>& cutlass_scaled() {
  static LaunchTable<const CutlassScaledKernel*> table;
  return table;
}

std::string cutlass_scaled_key(CutlassScales form, DType a, DType b, DType out) {
  return launch_key(launch_key(form == CutlassScales::rowwise ? "scaled_mm_cutlass_rowwise" : "scaled_mm_cutlass_blockwise", a),
                    b, out);
}

Status cutlass_scaled_fits(const Problem& p, CutlassScales form) {
  if (p.batch_rank != 0 || p.red_rank != 0) return unsupported("CUTLASS's fp8 GEMM takes a single matrix product");
  if (p.m == 0 || p.n == 0) return Status::ok();  // nothing to write: run returns at once
  constexpr int64_t kMaxExtent = 0x7fffffff;
  if (p.m > kMaxExtent || p.n > kMaxExtent || p.k > kMaxExtent) return unsupported("an extent exceeds 2^31 - 1");
  if (p.k == 0) return unsupported("K is 0 (CUTLASS leaves the accumulators unset)");
  if (p.k % kCutlassAlign)
    return unsupported("CUTLASS's fp8 GEMM needs K (", p.k, ") to be a multiple of 16 (TMA moves 16-byte rows)");
  const int64_t out_align = kCutlassAlign / int64_t(dtype_size(p.out_dtype));
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kCutlassAlign == 0; };
  // A [M, K] and B [K, N] with K contiguous, D [M, N] with N contiguous; a
  // single row or column takes any leading dim (cutlass_leading_dim).
  auto matrix = [&](const char* name, const Operand& o, int64_t inner_stride, int64_t outer_stride, int64_t outer,
                    int64_t inner, int64_t align, const char* want) {
    if (inner > 1 && inner_stride != 1)
      return unsupported("CUTLASS's fp8 GEMM needs '", name, "' ", want, ", got strides [", o.row_stride, ", ",
                         o.col_stride, "]");
    if (outer > 1 && (outer_stride % align != 0 || outer_stride < inner))
      return unsupported("CUTLASS's fp8 GEMM needs the leading dim of '", name, "' (", outer_stride,
                         " elements) to be a multiple of ", align, " and at least ", inner);
    if (!aligned(o.data)) return unsupported("CUTLASS's fp8 GEMM needs '", name, "' 16-byte aligned");
    return Status::ok();
  };
  BARACUDA_TRY(matrix("a", p.a, p.a.col_stride, p.a.row_stride, p.m, p.k, kCutlassAlign, "row-major [M, K] (K contiguous)"));
  BARACUDA_TRY(matrix("b", p.b, p.b.row_stride, p.b.col_stride, p.n, p.k, kCutlassAlign,
                      "column-major [K, N] (K contiguous: the transpose of a row-major [N, K])"));
  BARACUDA_TRY(matrix("out", p.d, p.d.col_stride, p.d.row_stride, p.m, p.n, out_align, "row-major [M, N]"));
  if (p.n % out_align != 0)
    return unsupported("CUTLASS's fp8 GEMM needs N (", p.n, ") to be a multiple of ", out_align, " for a ",
                       dtype_name(p.out_dtype), " 'out' (TMA stores 16-byte rows)");
  if (p.bias.data && p.n > 1 && p.bias.col_stride != 1)
    return unsupported("CUTLASS's fp8 GEMM needs a contiguous 'bias', got stride ", p.bias.col_stride);
  if (form == CutlassScales::rowwise && ((p.m > 1 && p.scale_a.stride != 1) || (p.n > 1 && p.scale_b.stride != 1)))
    return unsupported("CUTLASS's row-wise scales must be contiguous vectors ('scale_a' stride ", p.scale_a.stride,
                       ", 'scale_b' stride ", p.scale_b.stride, ")");
  return Status::ok();
}

}  // namespace gemm

void register_scaled_mm_ops(std::vector<OpInfo>& ops) {
  using namespace gemm;
  OpInfo info;
  info.name = kName;
  info.category = OpCategory::gemm;
  info.family = "gemm";
  info.input_names = input_names();
  info.output_names = output_names();
  info.dtypes = {DType::fp8_e4m3, DType::fp8_e5m2};
  info.attrs = {{"out_dtype", -1,
                 "dtype code of out: bf16, f16, f32, fp8_e4m3 or fp8_e5m2 (saturated); -1: the given out's dtype, "
                 "else bf16"},
                {"use_fast_accum", 0, "1: cuBLASLt's fp8 fast accumulation (fewer f32 promotions; other backends ignore it)"}};
  info.backends = {Backend::cublaslt, Backend::cutlass, Backend::bespoke_cuda, Backend::host_reference};
  info.doc =
      "torch._scaled_mm: scale_result * ((a * scale_a) @ (b * scale_b) + bias) with fp8 a [M, K] and b [K, N] "
      "(e4m3/e5m2; cuBLASLt takes no e5m2 x e5m2 and needs a row-major, b column-major, leading dims multiple of "
      "16; CUTLASS (sm_90a) runs row-wise and block-wise e4m3 x e4m3 in that layout), f32 scales per tensor ([] or [1] each), row-wise (scale_a [M, 1], scale_b [1, N]) or block-wise "
      "(scale_a [M, ceil(K/128)] per 1 x 128, scale_b [ceil(K/128), ceil(N/128)] per 128 x 128), bias [N] "
      "bf16/f16 or [0] (none), scale_result an f32 scalar (fp8 out only) or [0] (none), f32 accumulation; fp8 "
      "outputs saturate to the largest finite value";
  // b: e4m3 (cuBLASLt's e5m2 x e4m3 pair) for e5m2 a.
  info.input_dtypes = [](DType a) {
    return std::vector<DType>{a, DType::fp8_e4m3, DType::f32, DType::f32, DType::bf16, DType::f32};
  };
  // scale_result at most 1: an fp8 out of the sweep's sums stays far from saturation.
  info.domains = {Domain{}, Domain{}, Domain{0.25, 2, true}, Domain{0.25, 2, true}, Domain{}, Domain{0.25, 1, true}};
  info.tolerance_scale = 8;
  info.in_place = false;
  info.sample_attrs = {Attrs{}, Attrs{{"out_dtype", double(int(DType::f16))}},
                       Attrs{{"out_dtype", double(int(DType::f32))}, {"use_fast_accum", 1}},
                       Attrs{{"out_dtype", double(int(DType::fp8_e4m3))}}, Attrs{{"out_dtype", double(int(DType::fp8_e5m2))}}};
  info.sample_shapes = [](DType, const Shape& shape, const Attrs& attrs) { return sample_shapes(shape, attrs); };
  info.infer = [](const OpDesc& partial) { return infer(partial); };
  const size_t index = ops.size();
  info.make_plan = [index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference& pref) {
    return make_plan(registry()[index], backend, desc, pref);
  };
  ops.push_back(std::move(info));
}

}  // namespace baracuda
