// GEMM family: matmul, mm, bmm, mv, dot, addmm, baddbmm, linear (bias and
// activation epilogues) and the gradients matmul_backward and
// linear_backward. Every op binds its tensors to gemm::Problem; the
// candidates are cuBLASLt, the bespoke CUDA kernel (any strides, integer
// dtypes) and the host reference.
#include <algorithm>
#include <cmath>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "gemm/engine.hpp"
#include "reduce/engine.hpp"

namespace baracuda {
namespace gemm {
namespace {

enum class Kind { matmul, mm, bmm, mv, dot, addmm, baddbmm, linear, matmul_backward, linear_backward };

struct Def {
  std::string name;
  Kind kind;
  std::vector<std::string> inputs, outputs;
  std::string doc;
  bool floats_only = false;
};

const std::vector<Def>& defs() {
  static const std::vector<Def> all = {
      {"matmul", Kind::matmul, {"a", "b"}, {"out"}, "torch.matmul: vectors, matrices and broadcast batches of them"},
      {"mm", Kind::mm, {"a", "b"}, {"out"}, "matrix product [M, K] @ [K, N]"},
      {"bmm", Kind::bmm, {"a", "b"}, {"out"}, "batched matrix product [B, M, K] @ [B, K, N]"},
      {"mv", Kind::mv, {"a", "b"}, {"out"}, "matrix-vector product [M, K] @ [K] (GEMV)"},
      {"dot", Kind::dot, {"a", "b"}, {"out"}, "inner product of two vectors"},
      {"addmm", Kind::addmm, {"input", "mat1", "mat2"}, {"out"},
       "beta * input + alpha * mat1 @ mat2; input broadcasts to [M, N] and is not read when beta = 0"},
      {"baddbmm", Kind::baddbmm, {"input", "batch1", "batch2"}, {"out"},
       "beta * input + alpha * batch1 @ batch2; input broadcasts to [B, M, N]"},
      {"linear", Kind::linear, {"input", "weight", "bias"}, {"out"},
       "activation(input @ weight^T + bias): input [..., K], weight [N, K], bias [N] or [0] (none)", true},
      {"matmul_backward", Kind::matmul_backward, {"grad_output", "a", "b"}, {"grad_a", "grad_b"},
       "alpha * grad_output @ b^T and alpha * a^T @ grad_output, summed over the dims a or b broadcast "
       "(mm, bmm, mv, dot, and addmm's matrices with alpha)",
       true},
      {"linear_backward", Kind::linear_backward, {"grad_output", "input", "weight"},
       {"grad_input", "grad_weight", "grad_bias"},
       "gradients of linear without activation (apply the activation's backward first); grad_bias [N], or [0] "
       "when bias = 0",
       true},
  };
  return all;
}

bool is_backward(Kind k) { return k == Kind::matmul_backward || k == Kind::linear_backward; }
bool has_addend(Kind k) { return k == Kind::addmm || k == Kind::baddbmm; }
/// Index of the first product operand (the dtype that names the kernel).
size_t primary_input(Kind k) { return has_addend(k) || is_backward(k) ? 1 : 0; }
DType product_dtype(DType in) { return in == DType::i8 ? DType::i32 : in; }
Activation activation_of(const OpDesc& d) { return static_cast<Activation>(int(d.attrs.get("activation", 0))); }

/// torch.matmul's result shape of a @ b under the rank rules of `kind`.
Result<Shape> product_shape(const Def& def, const TensorSpec& a, const TensorSpec& b, const std::string& an,
                            const std::string& bn) {
  const std::string& op = def.name;
  const size_t ra = a.shape.size(), rb = b.shape.size();
  auto rank_error = [&](const std::string& name, const Shape& s, const char* want) {
    return invalid(op, ": '", name, "' must be ", want, ", got shape ", shape_str(s));
  };
  switch (def.kind) {
    case Kind::mm: case Kind::addmm:
      if (ra != 2) return rank_error(an, a.shape, "a matrix (rank 2)");
      if (rb != 2) return rank_error(bn, b.shape, "a matrix (rank 2)");
      break;
    case Kind::bmm: case Kind::baddbmm:
      if (ra != 3) return rank_error(an, a.shape, "a batch of matrices (rank 3)");
      if (rb != 3) return rank_error(bn, b.shape, "a batch of matrices (rank 3)");
      if (a.shape[0] != b.shape[0])
        return invalid(op, ": batch sizes differ: '", an, "' ", shape_str(a.shape), ", '", bn, "' ", shape_str(b.shape));
      break;
    case Kind::mv:
      if (ra != 2) return rank_error(an, a.shape, "a matrix (rank 2)");
      if (rb != 1) return rank_error(bn, b.shape, "a vector (rank 1)");
      break;
    case Kind::dot:
      if (ra != 1) return rank_error(an, a.shape, "a vector (rank 1)");
      if (rb != 1) return rank_error(bn, b.shape, "a vector (rank 1)");
      break;
    default:
      if (ra == 0) return rank_error(an, a.shape, "at least a vector (rank >= 1)");
      if (rb == 0) return rank_error(bn, b.shape, "at least a vector (rank >= 1)");
  }
  const int64_t ka = a.shape.back(), kb = rb == 1 ? b.shape[0] : b.shape[rb - 2];
  if (ka != kb)
    return invalid(op, ": '", an, "' ", shape_str(a.shape), " and '", bn, "' ", shape_str(b.shape),
                   " cannot be multiplied (", ka, " != ", kb, ")");
  const Shape batches[2] = {ra > 2 ? Shape(a.shape.begin(), a.shape.end() - 2) : Shape{},
                            rb > 2 ? Shape(b.shape.begin(), b.shape.end() - 2) : Shape{}};
  const std::string names[2] = {an, bn};
  auto out = broadcast_shapes(batches, names, op);
  if (!out) return out.status();
  if (ra >= 2) out->push_back(a.shape[ra - 2]);
  if (rb >= 2) out->push_back(b.shape[rb - 1]);
  return out;
}

/// linear's output shape [..., N] for input [..., K], weight [N, K].
Result<Shape> linear_shape(const Def& def, const TensorSpec& x, const TensorSpec& w) {
  if (x.shape.empty()) return invalid(def.name, ": 'input' must have rank >= 1, got a scalar");
  if (w.shape.size() != 2 || w.shape[1] != x.shape.back())
    return invalid(def.name, ": 'weight' must be [N, ", x.shape.back(), "] for input ", shape_str(x.shape), ", got ",
                   shape_str(w.shape));
  Shape out(x.shape.begin(), x.shape.end() - 1);
  out.push_back(w.shape[0]);
  return out;
}

Result<OpDesc> infer_desc(const Def& def, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  const size_t primary = primary_input(def.kind);
  BARACUDA_TRY(check_inputs(op, d, def.inputs, primary));
  for (size_t i = 0; i < d.inputs.size(); ++i)
    if (d.inputs[i].shape.size() > size_t(kMaxRank))
      return invalid(op, ": '", def.inputs[i], "' has rank ", d.inputs[i].shape.size(), ", the maximum is ", kMaxRank);
  const DType t = d.inputs[primary].dtype;
  const bool floats = t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
  const bool ints = t == DType::i8 || t == DType::i32 || t == DType::i64;
  if (!floats && !(ints && !def.floats_only))
    return unsupported(op, ": dtype ", dtype_name(t), " is not supported (",
                       def.floats_only ? "f32 f16 bf16 f64" : "f32 f16 bf16 f64 i8 i32 i64", ")");
  const DType out_t = product_dtype(t);
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    const DType want = (has_addend(def.kind) && i == 0) || (is_backward(def.kind) && i == 0) ? out_t : t;
    if (d.inputs[i].dtype != want)
      return invalid(op, ": '", def.inputs[i], "' dtype ", dtype_name(d.inputs[i].dtype), ", expected ", dtype_name(want),
                     " (the dtype of '", def.inputs[primary], "')");
  }
  const double alpha = d.attrs.get("alpha", 1), beta = d.attrs.get("beta", 1);
  if (ints && (alpha != std::trunc(alpha) || beta != std::trunc(beta)))
    return invalid(op, ": alpha and beta must be integers for integer dtypes, got ", alpha, " and ", beta);
  const double act = d.attrs.get("activation", 0);
  if (act != std::trunc(act) || act < 0 || act >= kActivations)
    return invalid(op, ": 'activation' must be 0 (none), 1 (relu), 2 (gelu), 3 (gelu_tanh) or 4 (silu), got ", act);

  const auto& in = d.inputs;
  std::vector<TensorSpec> outs;
  switch (def.kind) {
    case Kind::matmul: case Kind::mm: case Kind::bmm: case Kind::mv: case Kind::dot: {
      auto s = product_shape(def, in[0], in[1], def.inputs[0], def.inputs[1]);
      if (!s) return s.status();
      outs = {{out_t, *s}};
      break;
    }
    case Kind::addmm: case Kind::baddbmm: {
      auto s = product_shape(def, in[1], in[2], def.inputs[1], def.inputs[2]);
      if (!s) return s.status();
      const Shape both[2] = {in[0].shape, *s};
      const std::string names[2] = {"input", "out"};
      auto b = broadcast_shapes(both, names, op);
      if (!b || *b != *s)
        return invalid(op, ": 'input' ", shape_str(in[0].shape), " does not broadcast to the product's shape ",
                       shape_str(*s));
      outs = {{out_t, *s}};
      break;
    }
    case Kind::linear: {
      auto s = linear_shape(def, in[0], in[1]);
      if (!s) return s.status();
      if (in[2].shape != Shape{s->back()} && in[2].shape != Shape{0})
        return invalid(op, ": 'bias' must be [", s->back(), "] or [0] (no bias), got ", shape_str(in[2].shape));
      outs = {{out_t, *s}};
      break;
    }
    case Kind::matmul_backward: {
      auto s = product_shape(def, in[1], in[2], def.inputs[1], def.inputs[2]);
      if (!s) return s.status();
      if (in[0].shape != *s)
        return invalid(op, ": 'grad_output' shape ", shape_str(in[0].shape), ", expected the product's ", shape_str(*s));
      outs = {in[1], in[2]};
      break;
    }
    case Kind::linear_backward: {
      auto s = linear_shape(def, in[1], in[2]);
      if (!s) return s.status();
      if (in[0].shape != *s)
        return invalid(op, ": 'grad_output' shape ", shape_str(in[0].shape), ", expected linear's output ", shape_str(*s));
      outs = {in[1], in[2], {t, {d.attrs.get("bias", 1) != 0 ? s->back() : 0}}};
      break;
    }
  }
  BARACUDA_TRY(set_outputs(op, d, outs, def.outputs));
  return d;
}

/// The problems one run computes (a gradient: one per operand).
struct Bound {
  Problem problems[2];
  int count = 0;
};

/// `out` with the unit dims matmul squeezes for vector operands put back.
TensorView unsqueezed_product(TensorView out, int rank_a, int rank_b) {
  if (rank_b == 1) out = unsqueezed(out, out.rank);
  if (rank_a == 1) out = unsqueezed(out, out.rank - 1);
  return out;
}

Status bind_op(const Def& def, const OpDesc& desc, const OpArgs& args, Bound& bound) {
  const auto& in = args.inputs;
  const auto& out = args.outputs;
  auto add = [&](Result<Problem> p) -> Status {
    if (!p) return p.status();
    bound.problems[bound.count++] = *p;
    return Status::ok();
  };
  const double alpha = desc.attrs.get("alpha", 1), beta = desc.attrs.get("beta", 1);
  switch (def.kind) {
    case Kind::matmul: case Kind::mm: case Kind::bmm: case Kind::mv: case Kind::dot:
      return add(bind_product(unsqueezed_product(out[0], in[0].rank, in[1].rank), as_matrix(in[0], true),
                              as_matrix(in[1], false)));
    case Kind::addmm: case Kind::baddbmm:
      BARACUDA_TRY(add(bind_product(out[0], in[1], in[2], in[0])));
      bound.problems[0].alpha = alpha, bound.problems[0].beta = beta;
      return Status::ok();
    case Kind::linear: {
      const TensorView x = as_matrix(in[0], true), d = in[0].rank == 1 ? unsqueezed(out[0], 0) : out[0];
      BARACUDA_TRY(add(bind_product(d, x, transposed(in[1]))));
      if (in[2].numel() > 0) bind_bias(bound.problems[0], in[2]);
      bound.problems[0].act = activation_of(desc);
      return Status::ok();
    }
    case Kind::matmul_backward: {
      const TensorView g = unsqueezed_product(in[0], in[1].rank, in[2].rank);
      const TensorView a = as_matrix(in[1], true), b = as_matrix(in[2], false);
      BARACUDA_TRY(add(bind_product(as_matrix(out[0], true), g, transposed(b))));
      BARACUDA_TRY(add(bind_product(as_matrix(out[1], false), transposed(a), g)));
      bound.problems[0].alpha = bound.problems[1].alpha = alpha;
      return Status::ok();
    }
    case Kind::linear_backward: {
      const TensorView g = as_matrix(in[0], true), x = as_matrix(in[1], true);
      BARACUDA_TRY(add(bind_product(as_matrix(out[0], true), g, in[2])));
      return add(bind_product(out[1], transposed(g), x));  // grad_bias: the sum of this A over K
    }
  }
  return internal_error(def.name, ": unknown kind");
}

/// Gives linear_backward's grad_weight problem the grad_bias to fill when
/// cuBLASLt can sum it in the GEMM's epilogue (Note [Fused bias gradient]).
void fuse_bias_grad(Bound& bound, const TensorView& grad_bias) {
  Problem& p = bound.problems[1];
  if (grad_bias.numel() > 0 && (grad_bias.stride[0] == 1 || grad_bias.numel() == 1) && lt_can_fuse_bias_grad(p))
    p.bias_grad = static_cast<char*>(grad_bias.data);
}

// Note [Fused bias gradient]
// linear_backward's grad_bias is the sum of grad_output over its rows: the
// grad_weight GEMM (grad_output^T @ input) sums the same A over K, and
// cuBLASLt's BGRADB/BGRADA epilogue writes that sum as it goes. A cuBLASLt
// plan fuses it when the heuristics offer an algorithm for the descriptor's
// contiguous layout (sku().epilogue = bias_grad); views that split the GEMM
// in several calls (batch or reduction loops), a strided grad_bias, or
// alignments without a fused algorithm take the reduction instead, as every
// plan of the other backends does (sku().epilogue = none).

class GemmPlan final : public FamilyPlan {
 public:
  GemmPlan(const Def& def, const OpInfo& info, OpDesc desc, std::unique_ptr<const Engine> engine,
           red::SumStep bias_sum, bool fused_bias_grad, KernelSku sku)
      : FamilyPlan(info, std::move(desc)), def_(def), engine_(std::move(engine)), bias_sum_(bias_sum),
        fused_bias_grad_(fused_bias_grad) {
    sku_ = sku;
    workspace_ = std::max(engine_->workspace(), bias_sum_.workspace);
  }

  Status can_implement(const OpArgs& args) const override {
    Bound bound;
    BARACUDA_TRY(check_and_bind(args, bound));
    for (int i = 0; i < bound.count; ++i)
      BARACUDA_TRY(engine_->supports(bound.problems[i]).with_context(cat(def_.name, " on ", backend_name(sku_.backend))));
    return Status::ok();
  }

  /// The engine's layout check is left to engine->run, which formulates the
  /// problem anyway and fails with the same message: not done twice per call.
  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    Bound bound;
    BARACUDA_TRY(check_and_bind(args, bound));
    BARACUDA_TRY(check_workspace(def_.name, workspace, workspace_));
    for (int i = 0; i < bound.count; ++i)
      BARACUDA_TRY(engine_->run(bound.problems[i], workspace, stream.cuda_stream()).with_context(def_.name));
    if (def_.kind == Kind::linear_backward && args.outputs[2].numel() > 0 && !bound.problems[1].bias_grad) {
      const TensorView& g = args.inputs[0];
      const uint32_t mask = (1u << (g.rank - 1)) - 1;  // every dim but the last
      BARACUDA_TRY(red::run_sum_step(bias_sum_, g, args.outputs[2], mask, workspace.data, stream.cuda_stream())
                       .with_context(def_.name));
    }
    return Status::ok();
  }

 private:
  /// The shared argument checks, no output over a product operand (addmm's
  /// input may be its output, in place), then the bound problems.
  Status check_and_bind(const OpArgs& args, Bound& bound) const {
    BARACUDA_TRY(FamilyPlan::can_implement(args));
    for (size_t j = 0; j < args.outputs.size(); ++j)
      for (size_t i = has_addend(def_.kind) ? 1 : 0; i < args.inputs.size(); ++i)
        if (args.outputs[j].numel() > 0 && args.inputs[i].numel() > 0 && memory_overlaps(args.outputs[j], args.inputs[i]))
          return invalid(def_.name, ": output '", def_.outputs[j], "' overlaps input '", def_.inputs[i],
                         "'; a product cannot be written over its operands");
    BARACUDA_TRY(bind_op(def_, desc_, args, bound).with_context(def_.name));
    if (fused_bias_grad_) {
      fuse_bias_grad(bound, args.outputs[2]);
      // Alignments the heuristics offer no fused algorithm for take the reduction.
      Problem& p = bound.problems[1];
      if (p.bias_grad && !engine_->supports(p)) p.bias_grad = nullptr;
    }
    return Status::ok();
  }

  const Def& def_;
  std::unique_ptr<const Engine> engine_;
  red::SumStep bias_sum_;
  bool fused_bias_grad_;
};

Epilogue sku_epilogue(const Def& def, const OpDesc& d, bool fused_bias_grad) {
  if (def.kind == Kind::linear_backward) return fused_bias_grad ? Epilogue::bias_grad : Epilogue::none;
  if (def.kind != Kind::linear || d.inputs[2].numel() == 0) return Epilogue::none;
  switch (activation_of(d)) {
    case Activation::relu: return Epilogue::bias_relu;
    case Activation::gelu: case Activation::gelu_tanh: return Epilogue::bias_gelu;
    case Activation::silu: return Epilogue::bias_silu;
    case Activation::none: break;
  }
  return Epilogue::bias;
}

Result<PlanPtr> make_plan(const Def& def, const OpInfo& info, Backend backend, const OpDesc& desc,
                          [[maybe_unused]] const PlanPreference& pref) {
  auto full = infer_desc(def, desc);
  if (!full) return full.status();
  const DType in = full->inputs[primary_input(def.kind)].dtype, out = product_dtype(in);
  KernelSku sku = product_sku(info.name.c_str(), in, out, backend);
  std::unique_ptr<const Engine> engine;
  bool fused_bias_grad = false;
  if (backend == Backend::cublaslt) {
#ifdef BARACUDA_HAS_CUDA
    LtRequest request;
    request.in = in, request.out = out;
    request.tf32 = pref.allow_tf32 && in == DType::f32;
    request.act = def.kind == Kind::linear ? activation_of(*full) : Activation::none;
    request.bias = def.kind == Kind::linear && full->inputs[2].numel() > 0;
    request.max_workspace = std::min(pref.max_workspace_bytes, kLtWorkspace);
    // The heuristics must serve the contiguous layout of this descriptor.
    ProbeViews probe(*full);
    Bound bound;
    BARACUDA_TRY(bind_op(def, *full, OpArgs{probe.inputs, probe.outputs}, bound));
    if (def.kind == Kind::linear_backward) {
      Bound fused = bound;
      fuse_bias_grad(fused, probe.outputs[2]);
      if (fused.problems[1].bias_grad) {
        LtRequest with_grad = request;
        with_grad.bias_grad = true;
        if (auto lt = make_lt_engine(with_grad, std::span(fused.problems, fused.count))) {
          engine = std::move(*lt);
          fused_bias_grad = true;
        }
      }
    }
    if (!engine) {
      auto lt = make_lt_engine(request, std::span(bound.problems, bound.count));
      if (!lt) return lt.status();
      engine = std::move(*lt);
    }
    if (request.tf32) sku.precision.math = MathPrecision::tf32;
    sku.layout = Layout::row_major;
#else
    return unsupported("built without CUDA");
#endif
  } else {
    auto e = table_engine(backend, in, out);
    if (!e) return e.status();
    engine = std::move(*e);
  }
  sku.epilogue = sku_epilogue(def, *full, fused_bias_grad);
  red::SumStep bias_sum;
  if (def.kind == Kind::linear_backward && full->outputs[2].numel() > 0) {  // also when fused: views that cannot fuse
    const Shape& g = full->inputs[0].shape;
    const Backend sum_backend = backend == Backend::host_reference ? backend : Backend::bespoke_cuda;
    auto step = red::make_sum_step(sum_backend, in, in, g, (1u << (g.size() - 1)) - 1);
    if (!step) return step.status();
    bias_sum = *step;
  }
  return PlanPtr(
      std::make_unique<GemmPlan>(def, info, std::move(*full), std::move(engine), bias_sum, fused_bias_grad, sku));
}

// ---------------------------------------------------------------- test samples

/// A contraction length that varies with the output's shape: 1 to 97, at
/// most 5 for large outputs (the sweep's host reference stays fast).
int64_t sample_k(const Shape& out) {
  int64_t h = int64_t(out.size()), n = 1;
  for (int64_t s : out) h = h * 31 + s, n *= s;
  const int64_t range = n > 4096 ? 5 : 97;
  return 1 + (h % range + range) % range;
}

std::optional<SampleShapes> sample_shapes(const Def& def, const Shape& shape, const Attrs& attrs) {
  const size_t r = shape.size();
  const int64_t k = sample_k(shape);
  auto matmul_operands = [&]() -> std::pair<Shape, Shape> {
    if (r == 0) return {{k}, {k}};
    if (r == 1) return {{shape[0], k}, {k}};
    Shape a(shape.begin(), shape.end() - 1), b(shape.begin(), shape.end() - 2);
    a.push_back(k);
    if (r % 2 == 1) b.clear();  // odd ranks: b broadcasts over every batch dim
    else if (r > 2) b[0] = 1;   // even ranks: over the first
    b.push_back(k), b.push_back(shape.back());
    return {a, b};
  };
  const int64_t n = r ? shape.back() : 1;
  switch (def.kind) {
    case Kind::matmul: {
      auto [a, b] = matmul_operands();
      return SampleShapes{{a, b}, {}};
    }
    case Kind::mm: case Kind::bmm: case Kind::mv: case Kind::dot: {
      const size_t want = def.kind == Kind::mm ? 2 : def.kind == Kind::bmm ? 3 : def.kind == Kind::mv ? 1 : 0;
      if (r != want) return std::nullopt;
      Shape a = r >= 2 ? Shape(shape.begin(), shape.end() - 1) : shape, b = r == 3 ? Shape{shape[0]} : Shape{};
      a.push_back(k);
      b.push_back(k);
      if (r >= 2) b.push_back(n);
      return SampleShapes{{a, b}, {}};
    }
    case Kind::addmm: case Kind::baddbmm: {
      if (r != (def.kind == Kind::addmm ? 2u : 3u)) return std::nullopt;
      Shape a(shape.begin(), shape.end() - 1), b(shape.begin(), shape.end() - 2);
      a.push_back(k), b.push_back(k), b.push_back(n);
      const int64_t m = shape[r - 2];
      const int form = int((m + n) % 3);
      const Shape c = form == 0 ? shape : form == 1 ? Shape{n} : Shape{m, 1};
      return SampleShapes{{c, a, b}, {}};
    }
    case Kind::linear: case Kind::linear_backward: {
      if (r == 0) return std::nullopt;
      Shape x(shape.begin(), shape.end() - 1);
      x.push_back(k);
      const Shape w{n, k};
      if (def.kind == Kind::linear_backward) return SampleShapes{{shape, x, w}, {}};
      return SampleShapes{{x, w, n % 4 == 0 ? Shape{0} : Shape{n}}, {}};
    }
    case Kind::matmul_backward: {
      auto [a, b] = matmul_operands();
      return SampleShapes{{shape, a, b}, {}};
    }
  }
  (void)attrs;
  return std::nullopt;
}

std::vector<Attrs> sample_attrs(Kind kind) {
  switch (kind) {
    case Kind::addmm: case Kind::baddbmm: return {Attrs{}, Attrs{{"alpha", -2}, {"beta", 3}}, Attrs{{"beta", 0}}};
    case Kind::linear: {
      std::vector<Attrs> all;
      for (int a = 0; a < kActivations; ++a) all.push_back(Attrs{{"activation", double(a)}});
      return all;
    }
    case Kind::matmul_backward: return {Attrs{}, Attrs{{"alpha", 0.5}}};
    case Kind::linear_backward: return {Attrs{}, Attrs{{"bias", 0}}};
    default: return {Attrs{}};
  }
}

std::vector<AttrSpec> attr_specs(Kind kind) {
  switch (kind) {
    case Kind::addmm: case Kind::baddbmm:
      return {{"beta", 1, "scales input (0: input is not read)"}, {"alpha", 1, "scales the product"}};
    case Kind::linear:
      return {{"activation", 0, "0 none, 1 relu, 2 gelu (exact), 3 gelu_tanh, 4 silu"}};
    case Kind::matmul_backward: return {{"alpha", 1, "scales both gradients (addmm's alpha)"}};
    case Kind::linear_backward: return {{"bias", 1, "1: grad_bias is [N]; 0: [0] (linear had no bias)"}};
    default: return {};
  }
}

}  // namespace
}  // namespace gemm

void register_gemm_ops(std::vector<OpInfo>& ops) {
  using namespace gemm;
  for (const Def& def : defs()) {
    OpInfo info;
    info.name = def.name;
    info.category = OpCategory::gemm;
    info.family = "gemm";
    info.direction = is_backward(def.kind) ? Direction::backward : Direction::forward;
    if (def.kind == Kind::linear) info.gradient = "linear_backward";
    else if (def.kind == Kind::linear_backward) info.gradient = "linear";
    else if (def.kind == Kind::matmul_backward) info.gradient = "matmul";
    else if (!has_addend(def.kind)) info.gradient = "matmul_backward";
    info.input_names = def.inputs;
    info.output_names = def.outputs;
    info.dtypes = def.floats_only ? std::vector<DType>{DType::f32, DType::f16, DType::bf16, DType::f64}
                                  : std::vector<DType>{DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8,
                                                       DType::i32, DType::i64};
    info.attrs = attr_specs(def.kind);
    info.backends = {Backend::cublaslt, Backend::bespoke_cuda, Backend::host_reference};
    info.doc = def.doc;
    info.input_dtypes = [&def](DType primary) {
      std::vector<DType> v(def.inputs.size(), primary);
      if (has_addend(def.kind) || is_backward(def.kind)) v[0] = product_dtype(primary);
      return v;
    };
    info.tolerance_scale = 8;
    info.in_place = has_addend(def.kind);
    info.sample_attrs = sample_attrs(def.kind);
    info.sample_shapes = [&def](DType, const Shape& shape, const Attrs& attrs) { return sample_shapes(def, shape, attrs); };
    const size_t index = ops.size();
    info.infer = [&def](const OpDesc& partial) { return infer_desc(def, partial); };
    info.make_plan = [&def, index](Backend backend, const Stream&, const OpDesc& desc,
                                   const PlanPreference& pref) -> Result<PlanPtr> {
      return make_plan(def, registry()[index], backend, desc, pref);
    };
    ops.push_back(std::move(info));
  }
}

}  // namespace baracuda
