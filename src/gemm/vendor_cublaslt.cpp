// The cuBLASLt engine of the GEMM family. cuBLASLt is column-major: a
// row-major D is computed as D^T = B^T A^T, which also puts linear's bias
// (over N) on cuBLASLt's rows, where its bias epilogue adds it. The
// innermost batch dim becomes cuBLASLt's strided batch; other batch dims and
// the reduction dims of gradients loop on the host (reductions accumulate
// with beta = 1, the epilogue on the last step). Algorithms come from the
// heuristics and are cached per layout and alignment; the plan's workspace
// is what the algorithms of its descriptor's contiguous layout need.
// scaled_mm's fp8 product (Hopper) takes per-tensor or row-wise scales as
// device pointers and only the "TN" layout: A and B with K contiguous.
#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/family.hpp"
#include "elementwise/ops.hpp"
#include "elementwise/prepare.hpp"
#include "gemm/engine.hpp"
#include "vendor/cublaslt.hpp"

namespace baracuda::gemm {
namespace {

using namespace vendor;

struct LtTypes {
  cudaDataType_t a, b, c, d;  // our A's, our B's, C's and D's
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

std::optional<cudaDataType_t> lt_data_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f64: return CUDA_R_64F;
    case DType::fp8_e4m3: return CUDA_R_8F_E4M3;
    case DType::fp8_e5m2: return CUDA_R_8F_E5M2;
    case DType::i8: return CUDA_R_8I;
    case DType::i32: return CUDA_R_32I;
    default: return std::nullopt;
  }
}


std::optional<LtTypes> lt_types(const LtRequest& r) {
  if (r.scaled) {
    if (!is_fp8(r.in) || !is_fp8(r.in_b) ||
        (r.out != DType::bf16 && r.out != DType::f16 && r.out != DType::f32 && !is_fp8(r.out)))
      return std::nullopt;
    // An fp8 D takes C of the bias's type, f16 without one (torch's choice; C is not read).
    const cudaDataType_t d = *lt_data_type(r.out);
    const cudaDataType_t c = !is_fp8(r.out) ? d : r.bias ? *lt_data_type(r.bias_dtype) : CUDA_R_16F;
    return LtTypes{*lt_data_type(r.in), *lt_data_type(r.in_b), c, d, CUBLAS_COMPUTE_32F, CUDA_R_32F};
  }
  if (r.in != r.out && !(r.in == DType::i8 && r.out == DType::i32)) {
    // Half products into f32 (ProductStep), without an epilogue.
    if (r.out != DType::f32 || (r.in != DType::f16 && r.in != DType::bf16) || r.bias || r.bias_grad ||
        r.act != Activation::none)
      return std::nullopt;
    const cudaDataType_t in = r.in == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
    return LtTypes{in, in, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
  }
  switch (r.in) {
    case DType::f32:
      return LtTypes{CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                     r.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f16: return LtTypes{CUDA_R_16F, CUDA_R_16F, CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::bf16: return LtTypes{CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f64: return LtTypes{CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    case DType::i8: return LtTypes{CUDA_R_8I, CUDA_R_8I, CUDA_R_32I, CUDA_R_32I, CUBLAS_COMPUTE_32I, CUDA_R_32I};
    default: return std::nullopt;
  }
}

/// scaled_mm's fp8 product: cuBLASLt takes only A and B with K contiguous
/// ("TN"), leading dims and addresses on 16 bytes.
Status check_fp8_layout(const Problem& p, bool outer_scales) {
  auto operand = [&](const char* name, const Operand& o, int64_t k_stride, int64_t ld, int64_t others, const char* want) {
    if (p.k > 1 && k_stride != 1)
      return unsupported("cuBLASLt's fp8 GEMM needs '", name, "' with K contiguous (", want, "), got strides [",
                         o.row_stride, ", ", o.col_stride, "]");
    if (others > 1 && ld % 16 != 0)
      return unsupported("cuBLASLt's fp8 GEMM needs the leading dim of '", name, "' (", ld,
                         " elements) to be a multiple of 16");
    if (reinterpret_cast<uintptr_t>(o.data) % 16 != 0)
      return unsupported("cuBLASLt's fp8 GEMM needs '", name, "' 16-byte aligned");
    return Status::ok();
  };
  BARACUDA_TRY(operand("a", p.a, p.a.col_stride, p.a.row_stride, p.m, "a row-major [M, K]"));
  BARACUDA_TRY(
      operand("b", p.b, p.b.row_stride, p.b.col_stride, p.n, "a column-major [K, N]: the transpose of a row-major [N, K]"));
  // Row-wise scales are vectors of M and N floats to cuBLASLt (size-1 dims bind with stride 0).
  if (outer_scales && ((p.m > 1 && p.scale_a.stride != 1) || (p.n > 1 && p.scale_b.stride != 1)))
    return unsupported("cuBLASLt's row-wise fp8 scales must be contiguous ('scale_a' stride ", p.scale_a.stride,
                       ", 'scale_b' stride ", p.scale_b.stride, ")");
  return Status::ok();
}

/// A logical r x c operand (element (i, j) at i * rs + j * cs) as cuBLASLt
/// stores it: a column-major matrix, used transposed or not.
struct LtMatrix {
  bool trans = false;
  int64_t rows = 0, cols = 0, ld = 1;  // of the stored matrix
};

std::optional<LtMatrix> lt_matrix(int64_t r, int64_t c, int64_t rs, int64_t cs) {
  if ((rs == 1 || r == 1) && (c == 1 || cs >= std::max<int64_t>(r, 1)))
    return LtMatrix{false, r, c, c == 1 ? std::max<int64_t>(r, 1) : cs};
  if ((cs == 1 || c == 1) && (r == 1 || rs >= std::max<int64_t>(c, 1)))
    return LtMatrix{true, c, r, r == 1 ? std::max<int64_t>(c, 1) : rs};
  return std::nullopt;
}

enum Role { kA, kB, kC, kD, kRoles };

/// A problem in cuBLASLt's terms.
struct Formulation {
  bool swapped = false;  ///< cuBLASLt's A is our B^T, its B our A^T, its D our D^T
  int64_t m = 0, n = 0, k = 0;
  LtMatrix mat[kRoles];
  bool stage_c = false;  ///< C is copied into D first (a broadcast C)
  const Operand* op[kRoles] = {};
  // The innermost batch dim, when cuBLASLt takes it; the rest loops.
  int lt_batch_dims = 0;
  int64_t batch_count = 1;
  int64_t batch_stride[kRoles] = {};
};

Result<Formulation> formulate(const Problem& p) {
  auto attempt = [&](bool swapped) -> std::optional<Formulation> {
    Formulation f;
    f.swapped = swapped;
    f.k = p.k;
    const Operand &a = p.a, &b = p.b;
    std::optional<LtMatrix> la, lb, ld, lc;
    if (swapped) {
      f.m = p.n, f.n = p.m;
      la = lt_matrix(p.n, p.k, b.col_stride, b.row_stride);
      lb = lt_matrix(p.k, p.m, a.col_stride, a.row_stride);
      ld = lt_matrix(p.n, p.m, p.d.col_stride, p.d.row_stride);
      if (p.reads_c()) lc = lt_matrix(p.n, p.m, p.c.col_stride, p.c.row_stride);
      f.op[kA] = &b, f.op[kB] = &a;
    } else {
      f.m = p.m, f.n = p.n;
      la = lt_matrix(p.m, p.k, a.row_stride, a.col_stride);
      lb = lt_matrix(p.k, p.n, b.row_stride, b.col_stride);
      ld = lt_matrix(p.m, p.n, p.d.row_stride, p.d.col_stride);
      if (p.reads_c()) lc = lt_matrix(p.m, p.n, p.c.row_stride, p.c.col_stride);
      f.op[kA] = &a, f.op[kB] = &b;
    }
    if (!la || !lb || !ld || ld->trans) return std::nullopt;
    f.mat[kA] = *la, f.mat[kB] = *lb, f.mat[kD] = *ld;
    // C is read from its own memory only when cuBLASLt can: a broadcast C,
    // or one that reduction steps after the first would replace by D, is
    // copied into D first; without C, D stands in (beta = 0).
    f.stage_c = p.reads_c() && (!lc || lc->trans || p.red_count() > 1);
    const bool own_c = p.reads_c() && !f.stage_c;
    f.op[kC] = own_c ? &p.c : &p.d, f.op[kD] = &p.d;
    f.mat[kC] = own_c ? *lc : *ld;
    return f;
  };
  std::optional<Formulation> f = attempt(true);
  if (!f && !p.bias.data) f = attempt(false);
  if (!f)
    return unsupported("cuBLASLt needs each of A, B and D with a unit stride in one of its last two dims and the other "
                       "stride spanning it, and D's rows contiguous when a bias is added (A strides [",
                       p.a.row_stride, ", ", p.a.col_stride, "], B [", p.b.row_stride, ", ", p.b.col_stride, "], D [",
                       p.d.row_stride, ", ", p.d.col_stride, "])");
  if (p.bias.data && p.bias.col_stride != 1 && p.n > 1)
    return unsupported("cuBLASLt needs a contiguous bias, got stride ", p.bias.col_stride);
  if (p.batch_rank > 0) {
    const int i = p.batch_rank - 1;
    bool fits = p.batch_shape[i] <= INT32_MAX && p.d.batch_stride[i] > 0;
    for (int r = 0; r < kRoles; ++r) fits = fits && f->op[r]->batch_stride[i] >= 0;
    if (fits) {
      f->lt_batch_dims = 1;
      f->batch_count = p.batch_shape[i];
      for (int r = 0; r < kRoles; ++r) f->batch_stride[r] = f->op[r]->batch_stride[i];
    }
  }
  return *f;
}

/// The largest power of two (<= 256) dividing the address and every byte
/// step (elements * `size`) a run takes from it.
template <class Steps>
uint32_t alignment(const void* base, size_t size, const Steps& element_steps) {
  uint64_t bits = reinterpret_cast<uintptr_t>(base) | 256;
  for (int64_t s : element_steps) bits |= static_cast<uint64_t>(s < 0 ? -s : s) * size;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

class LtEngine final : public Engine {
 public:
  LtEngine(const LtRequest& request, LtTypes types, cublasLtHandle_t handle, ew::LaunchFn copy, ew::LaunchFn act,
           GemmFn fallback)
      : request_(request), types_(types), handle_(handle), copy_(copy), act_(act), fallback_(fallback) {}

  /// Formulates the problem and finds (and caches) its algorithms: a layout
  /// or alignment cuBLASLt has no algorithm for is refused here, not in run.
  Status supports(const Problem& p) const override {
    if (p.m == 0 || p.n == 0 || p.k == 0 || p.batch_count() == 0 || p.red_count() == 0) return Status::ok();
    if (request_.scaled) BARACUDA_TRY(check_fp8_layout(p, request_.outer_scales));
    if (p.bias_grad && !lt_can_fuse_bias_grad(p))
      return internal_error("cuBLASLt: a bias gradient over batch or reduction loops cannot be fused");
    auto f = formulate(p);
    if (!f) return f.status();
    std::lock_guard lock(mutex_);
    for (bool last : {true, false}) {
      if (!last && !split_epilogue(p)) break;
      auto call = call_for(p, *f, last);
      if (!call) return call.status();
    }
    return Status::ok();
  }
  /// Picks the probes' algorithms; from then on workspace() is fixed and
  /// the algorithms of other layouts are picked within it.
  Status prepare(std::span<const Problem> probes) {
    for (const Problem& p : probes) BARACUDA_TRY(supports(p));
    sealed_ = true;
    return Status::ok();
  }

  size_t workspace() const override { return workspace_; }

  Status run(const Problem& p, const Workspace& workspace, CUstream_st* stream) const override;

 private:
  /// The descriptors and algorithm of one cuBLASLt call, cached per layout,
  /// alignment and epilogue; the bias pointer is set at each run.
  struct Call {
    MatmulDesc op;
    MatrixLayout layout[kRoles];
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    cublasLtMatmulAlgo_t algo{};
  };

  /// cuBLASLt's f64 GELU is not f64-accurate: f64 runs our activation after.
  bool fused_act() const {
    return request_.act == Activation::relu || (request_.act == Activation::gelu_tanh && request_.out != DType::f64);
  }
  bool epilogue(const Problem& p) const { return p.bias.data || p.bias_grad || fused_act(); }
  /// Several reduction steps with an epilogue: all but the last go without it.
  bool split_epilogue(const Problem& p) const { return p.red_count() > 1 && epilogue(p); }

  Status describe(const Problem& p, const Formulation& f, bool last, Call& call) const;
  /// The call for these layouts (`last`: with the epilogue); mutex_ held.
  Result<Call*> call_for(const Problem& p, const Formulation& f, bool last) const;
  Status stage(const Problem& p, const Operand& src, ew::LaunchFn fn, CUstream_st* stream) const;

  LtRequest request_;
  LtTypes types_;
  cublasLtHandle_t handle_;
  ew::LaunchFn copy_, act_;
  GemmFn fallback_;
  mutable std::mutex mutex_;
  mutable std::map<std::vector<int64_t>, std::unique_ptr<Call>> calls_;
  // Written only while prepare runs (before the engine is shared): the most
  // workspace the picked algorithms need, and whether that is final.
  mutable size_t workspace_ = 0;
  bool sealed_ = false;
};

Status LtEngine::describe(const Problem& p, const Formulation& f, bool last, Call& d) const {
  cublasLtMatmulDesc_t op = nullptr;
  BARACUDA_CUBLAS_TRY(cublasLtMatmulDescCreate(&op, types_.compute, types_.scale));
  d.op.reset(op);
  const cublasOperation_t ta = f.mat[kA].trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = f.mat[kB].trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_TRANSA, ta));
  BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_TRANSB, tb));
  d.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (last) {
    const bool bias = p.bias.data != nullptr;
    if (fused_act() && request_.act == Activation::relu) d.epilogue = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    else if (fused_act()) d.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (bias) d.epilogue = CUBLASLT_EPILOGUE_BIAS;
    // Our M is cuBLASLt's n when swapped: the sum of our A over K is then the
    // sum of cuBLASLt's B over k (BGRADB), else of its A (BGRADA).
    else if (p.bias_grad) d.epilogue = f.swapped ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
    if (bias || p.bias_grad) {  // the heuristics read its alignment from the pointer
      const void* ptr = bias ? static_cast<const void*>(p.bias.data) : p.bias_grad;
      BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ptr));
    }
    if (bias && request_.scaled) {
      const int32_t type = *lt_data_type(p.bias_dtype);
      BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type));
    }
  }
  if (request_.outer_scales) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode));
    BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode));
  }
  if (request_.result_scale)  // the heuristics see the D scale; each run sets its own pointer
    BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, p.scale_result));
  if (request_.fast_accum) {
    const int8_t fast = 1;
    BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast));
  }
  BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_EPILOGUE, d.epilogue));
  for (int r = 0; r < kRoles; ++r) {
    const LtMatrix& m = f.mat[r];
    // cuBLASLt's A is our B when swapped.
    const cudaDataType_t type = r == kC ? types_.c : r == kD ? types_.d : (r == kA) != f.swapped ? types_.a : types_.b;
    cublasLtMatrixLayout_t layout = nullptr;
    BARACUDA_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(m.rows), uint64_t(m.cols), m.ld));
    d.layout[r].reset(layout);
    if (f.lt_batch_dims) {
      const int32_t count = static_cast<int32_t>(f.batch_count);
      const int64_t stride = f.batch_stride[r];
      BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatrixLayoutSetAttribute, layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count));
      BARACUDA_CUBLAS_TRY(
          set_attr(cublasLtMatrixLayoutSetAttribute, layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride));
    }
  }
  return Status::ok();
}

Result<LtEngine::Call*> LtEngine::call_for(const Problem& p, const Formulation& f, bool last) const {
  const size_t in_size = dtype_size(p.in_dtype), out_size = dtype_size(p.out_dtype);
  // Alignment of each operand: its address and every step a run takes from
  // it (cuBLASLt's batch, the host loops over batch and reduction dims).
  auto align_of = [&](const Operand& o, size_t size, int64_t lt_stride) {
    int64_t steps[1 + 2 * kMaxRank];
    int n = 0;
    steps[n++] = lt_stride;
    for (int i = 0; i < p.batch_rank - f.lt_batch_dims; ++i) steps[n++] = o.batch_stride[i];
    for (int i = 0; i < p.red_rank; ++i) steps[n++] = o.red_stride[i];
    return alignment(o.data, size, std::span<const int64_t>(steps, n));
  };
  const uint32_t align[kRoles] = {align_of(*f.op[kA], in_size, f.batch_stride[kA]),
                                  align_of(*f.op[kB], in_size, f.batch_stride[kB]),
                                  align_of(*f.op[kC], out_size, f.batch_stride[kC]),
                                  align_of(*f.op[kD], out_size, f.batch_stride[kD])};
  const void* bias_ptr = p.bias.data ? static_cast<const void*>(p.bias.data) : p.bias_grad;
  const uint32_t bias_align = last && bias_ptr ? alignment(bias_ptr, 1, std::span<const int64_t>()) : 0;
  std::vector<int64_t> key{f.swapped, f.lt_batch_dims, f.batch_count, bias_align, last, last && p.bias_grad};
  for (int r = 0; r < kRoles; ++r)
    key.insert(key.end(), {f.mat[r].trans, f.mat[r].rows, f.mat[r].cols, f.mat[r].ld, f.batch_stride[r], align[r]});
  if (auto it = calls_.find(key); it != calls_.end()) return it->second.get();

  auto call = std::make_unique<Call>();
  BARACUDA_TRY(describe(p, f, last, *call));
  cublasLtMatmulPreference_t raw = nullptr;
  BARACUDA_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&raw));
  MatmulPreference pref(raw);
  const uint64_t max_ws = sealed_ ? workspace_ : request_.max_workspace;
  BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulPreferenceSetAttribute, raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_ws));
  const cublasLtMatmulPreferenceAttributes_t align_attr[kRoles] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int r = 0; r < kRoles; ++r)
    BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulPreferenceSetAttribute, raw, align_attr[r], align[r]));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, call->op.get(), call->layout[kA].get(), call->layout[kB].get(),
                                     call->layout[kC].get(), call->layout[kD].get(), raw, 1, &result, &found);
  // Measured on H100 (cuBLASLt 13.0): outer-vector (row-wise) fp8 scales give INVALID_VALUE here.
  if (request_.outer_scales && status == CUBLAS_STATUS_INVALID_VALUE)
    return unsupported("cuBLASLt refuses row-wise (outer-vector) fp8 scales on sm_", current_sm_version(),
                       " (CUBLAS_STATUS_INVALID_VALUE from its heuristics)");
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && (found == 0 || result.state)))
    return unsupported("cuBLASLt has no algorithm for ", dtype_name(p.in_dtype), " ", f.m, "x", f.n, "x", f.k,
                       " with these layouts and alignments (A ", f.mat[kA].trans ? "T" : "N", " ld ", f.mat[kA].ld,
                       ", B ", f.mat[kB].trans ? "T" : "N", " ld ", f.mat[kB].ld, ", D ld ", f.mat[kD].ld,
                       last && p.bias_grad ? ", bias-gradient epilogue" : "", ") within ", max_ws, " workspace bytes");
  BARACUDA_CUBLAS_TRY(status);
  call->algo = result.algo;
  if (!sealed_) workspace_ = std::max<size_t>(workspace_, result.workspaceSize);
  return calls_.emplace(std::move(key), std::move(call)).first->second.get();
}

/// Writes `src` (a broadcast addend, fn = copy) or D itself (fn = the
/// activation, in place) into D over the problem's batch dims and M x N.
Status LtEngine::stage(const Problem& p, const Operand& src, ew::LaunchFn fn, CUstream_st* stream) const {
  Shape shape(p.batch_shape, p.batch_shape + p.batch_rank);
  shape.push_back(p.m);
  shape.push_back(p.n);
  auto view = [&](const Operand& o) {
    std::vector<int64_t> strides(o.batch_stride, o.batch_stride + p.batch_rank);
    strides.push_back(o.row_stride);
    strides.push_back(o.col_stride);
    return *TensorView::strided(o.data, p.out_dtype, shape, strides);
  };
  const TensorView dst = view(p.d), from = view(src);
  const ew::LaunchList list = ew::plan_launches(shape, std::span(&dst, 1), std::span(&from, 1));
  return fn(list.launches[0], ew::Params{}, stream);
}

Status LtEngine::run(const Problem& p, const Workspace& workspace, CUstream_st* stream) const {
  if (p.m == 0 || p.n == 0 || p.batch_count() == 0) return Status::ok();
  if (p.k == 0 || p.red_count() == 0) return fallback_(p, stream);
  auto formulated = formulate(p);
  if (!formulated) return formulated.status();
  const Formulation& f = *formulated;
  if (f.stage_c) BARACUDA_TRY(stage(p, p.c, copy_, stream));
  const int64_t reds = p.red_count();
  const int loop_batch_rank = p.batch_rank - f.lt_batch_dims;
  int64_t loop_batches = 1;
  for (int i = 0; i < loop_batch_rank; ++i) loop_batches *= p.batch_shape[i];
  // alpha and beta in the scale type.
  union Scalar {
    float f32;
    double f64;
    int32_t i32;
  };
  auto scalar = [&](double v) {
    Scalar s{};
    if (types_.scale == CUDA_R_64F) s.f64 = v;
    else if (types_.scale == CUDA_R_32I) s.i32 = static_cast<int32_t>(v);
    else s.f32 = static_cast<float>(v);
    return s;
  };
  const Scalar alpha = scalar(p.alpha), beta_first = scalar(p.reads_c() ? p.beta : 0.0), one = scalar(1.0);
  const size_t in_size = dtype_size(p.in_dtype), out_size = dtype_size(p.out_dtype);
  {
    // One run at a time per engine: the cached descriptors carry the bias pointer.
    std::lock_guard lock(mutex_);
    auto last = call_for(p, f, true);
    if (!last) return last.status();
    Call* plain = *last;
    if (split_epilogue(p)) {
      auto c = call_for(p, f, false);
      if (!c) return c.status();
      plain = *c;
    }
    cublasLtMatmulDesc_t op = (*last)->op.get();
    if (p.bias.data || p.bias_grad) {
      const void* ptr = p.bias.data ? static_cast<const void*>(p.bias.data) : p.bias_grad;
      BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ptr));
    }
    if (request_.scaled) {  // cuBLASLt's A is our B when swapped
      const void* scale_a = f.swapped ? p.scale_b.data : p.scale_a.data;
      const void* scale_b = f.swapped ? p.scale_a.data : p.scale_b.data;
      BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_a));
      BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_b));
      if (request_.result_scale)
        BARACUDA_CUBLAS_TRY(set_attr(cublasLtMatmulDescSetAttribute, op, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, p.scale_result));
    }
    for (int64_t bi = 0; bi < loop_batches; ++bi) {
      auto at = [&](const Operand& o, size_t size) {
        return o.data + offset_of(bi, loop_batch_rank, p.batch_shape, o.batch_stride) * int64_t(size);
      };
      for (int64_t r = 0; r < reds; ++r) {
        auto red_at = [&](const Operand& o, size_t size) {
          return at(o, size) + offset_of(r, p.red_rank, p.red_shape, o.red_stride) * int64_t(size);
        };
        // Reduction steps accumulate into D (beta = 1); only the last carries the epilogue.
        const Call& call = r < reds - 1 ? *plain : **last;
        const Scalar& beta = r == 0 ? beta_first : one;
        // A C of another type than D (fp8 D: C is 16-bit) cannot share D's memory: with beta = 0 it is
        // not read, and cuBLASLt takes no pointer for it.
        const bool c_unread = f.op[kC] == &p.d && types_.c != types_.d;
        if (c_unread && reds > 1) return internal_error("cuBLASLt: an fp8 output cannot accumulate reduction steps");
        BARACUDA_CUBLAS_TRY(cublasLtMatmul(handle_, call.op.get(), &alpha, red_at(*f.op[kA], in_size),
                                           call.layout[kA].get(), red_at(*f.op[kB], in_size), call.layout[kB].get(),
                                           &beta, c_unread ? nullptr : at(*f.op[kC], out_size), call.layout[kC].get(),
                                           at(p.d, out_size),
                                           call.layout[kD].get(), &call.algo, workspace.data, workspace.bytes, stream));
      }
    }
  }
  if (request_.act != Activation::none && !fused_act()) BARACUDA_TRY(stage(p, p.d, act_, stream));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Engine>> make_lt_engine(const LtRequest& request, std::span<const Problem> probes) {
  auto types = lt_types(request);
  if (!types && request.scaled)
    return unsupported("cuBLASLt's fp8 GEMM takes fp8_e4m3/fp8_e5m2 operands to bf16, f16, f32 or fp8, not ",
                       dtype_name(request.in), " x ", dtype_name(request.in_b), " -> ", dtype_name(request.out));
  if (!types)
    return unsupported("cuBLASLt serves f32 f16 bf16 f64, f16/bf16 -> f32 (no epilogue) and i8 -> i32, not ", dtype_name(request.in), " -> ",
                       dtype_name(request.out));
  if (request.scaled && request.in == DType::fp8_e5m2 && request.in_b == DType::fp8_e5m2)
    return unsupported("cuBLASLt has no fp8_e5m2 x fp8_e5m2 GEMM: 'a' or 'b' must be fp8_e4m3");
  // fp8 outputs take either (C is of the bias's type then).
  if (request.scaled && request.bias && !is_fp8(request.out) &&
      request.bias_dtype != (request.out == DType::f16 ? DType::f16 : DType::bf16))
    return unsupported("cuBLASLt's fp8 GEMM needs 'bias' ", request.out == DType::f16 ? "f16" : "bf16", " for ",
                       dtype_name(request.out), " output, got ", dtype_name(request.bias_dtype));
  if (request.in == DType::i8 && (request.bias || request.act != Activation::none))
    return unsupported("cuBLASLt's int8 GEMM takes no epilogue");
  auto handle = lt_handle();
  if (!handle) return handle.status();
  const ew::KernelTable& kernels = ew::cuda_kernels();
  ew::LaunchFn copy = kernels.find(launch_key("cast", request.out, request.out));
  ew::LaunchFn act = nullptr;
  if (request.act != Activation::none) {  // unfused activations (all of them in f64) run in place after
    act = kernels.find(launch_key(activation_name(request.act), request.out, request.out));
    if (!act) return unsupported("no CUDA ", activation_name(request.act), " kernel for ", dtype_name(request.out));
  }
  GemmFn fallback = cuda_gemms().find(request.scaled ? scaled_key(request.in, request.in_b, request.out)
                                                      : launch_key("gemm", request.in, request.out));
  if (!copy || !fallback) return unsupported("no CUDA copy or bespoke GEMM kernel for ", dtype_name(request.out));
  auto engine = std::make_unique<LtEngine>(request, *types, *handle, copy, act, fallback);
  BARACUDA_TRY(engine->prepare(probes));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace baracuda::gemm
