// decode_attention: flash decoding of one new query token per sequence over
// a paged KV cache (vLLM's block table) or per-sequence contiguous caches,
// with GQA, softcap and a left window. Candidates: the split-K CUDA kernels
// (decode_kernels.cu), cuDNN's fused attention on contiguous caches (Note
// [Decode on cuDNN]), then the host reference (f64), written here.
#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/decode.hpp"
#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "attention/engine.hpp"
#include "core/cuda_check.hpp"
#include "core/sizes.hpp"
#endif

namespace baracuda {
namespace attn {

DecodeTable& host_decode() {
  static DecodeTable table;
  return table;
}
DecodeTable& cuda_decode() {
  static DecodeTable table;
  return table;
}

namespace {

constexpr const char* kOp = "decode_attention";
const std::vector<std::string> kInputs = {"q", "k_cache", "v_cache", "block_table", "seq_lens"};
const std::vector<std::string> kOutputs = {"out", "lse"};
enum Input { kQ, kK, kV, kTable, kSeqLens };

/// lse is f32, f64 for f64 inputs (the reference computes in f64).
/// A rank-2 block table pages the caches; a [0] one means per-sequence caches.
bool is_paged(const OpDesc& d) { return d.inputs[kTable].shape.size() == 2; }
int64_t capacity(const OpDesc& d) {
  const Shape& k = d.inputs[kK].shape;
  return is_paged(d) ? d.inputs[kTable].shape[1] * k[1] : k[1];
}

bool is_whole(double x) { return std::isfinite(x) && x == std::trunc(x); }

Result<OpDesc> infer_desc(const OpDesc& partial) {
  OpDesc d = partial;
  BARACUDA_TRY(check_inputs(kOp, d, kInputs, kQ));
  const TensorSpec &q = d.inputs[kQ], &k = d.inputs[kK], &v = d.inputs[kV];
  const TensorSpec &table = d.inputs[kTable], &lens = d.inputs[kSeqLens];
  const DType t = q.dtype;
  if (t != DType::f32 && t != DType::f16 && t != DType::bf16 && t != DType::f64)
    return unsupported(kOp, ": dtype ", dtype_name(t), " is not supported (f32 f16 bf16 f64)");
  for (int i : {kK, kV})
    if (d.inputs[i].dtype != t)
      return invalid(kOp, ": '", kInputs[i], "' dtype ", dtype_name(d.inputs[i].dtype), ", expected ", dtype_name(t),
                     " (the dtype of 'q')");
  for (int i : {kTable, kSeqLens})
    if (d.inputs[i].dtype != DType::i32)
      return invalid(kOp, ": '", kInputs[i], "' dtype ", dtype_name(d.inputs[i].dtype), ", expected i32");
  if (q.shape.size() != 3) return invalid(kOp, ": 'q' must be [B, Hq, D], got shape ", shape_str(q.shape));
  for (int i : {kK, kV})
    if (d.inputs[i].shape.size() != 4)
      return invalid(kOp, ": '", kInputs[i], "' must be [num_blocks, block_size, Hkv, dim] or [B, S_max, Hkv, dim], got shape ",
                     shape_str(d.inputs[i].shape));
  const bool paged = table.shape.size() == 2;
  if (!paged && table.shape != Shape{0})
    return invalid(kOp, ": 'block_table' must be [B, max_blocks] (paged caches) or [0] (per-sequence caches), got shape ",
                   shape_str(table.shape));
  const int64_t batch = q.shape[0], heads_q = q.shape[1], head_dim = q.shape[2];
  if (paged && table.shape[0] != batch)
    return invalid(kOp, ": 'block_table' has ", table.shape[0], " rows, expected B = ", batch, " (from 'q' ",
                   shape_str(q.shape), ")");
  if (!paged && k.shape[0] != batch)
    return invalid(kOp, ": without a block table 'k_cache' must be [B, S_max, Hkv, D] with B = ", batch,
                   ", got shape ", shape_str(k.shape));
  if (v.shape[0] != k.shape[0] || v.shape[1] != k.shape[1] || v.shape[2] != k.shape[2])
    return invalid(kOp, ": 'v_cache' ", shape_str(v.shape), " and 'k_cache' ", shape_str(k.shape),
                   " must agree in all but the last dim");
  if (k.shape[3] != head_dim)
    return invalid(kOp, ": 'k_cache' head dim ", k.shape[3], " != 'q' head dim ", head_dim);
  if (head_dim < 1) return invalid(kOp, ": the head dim of 'q' must be >= 1, got ", head_dim);
  const int64_t heads_kv = k.shape[2];
  if (heads_kv < 1 || heads_q % heads_kv != 0)
    return invalid(kOp, ": the query heads Hq = ", heads_q, " of 'q' must be a multiple of the kv heads Hkv = ", heads_kv,
                   " of 'k_cache' (GQA)");
  if (lens.shape != Shape{batch})
    return invalid(kOp, ": 'seq_lens' must be [B] = [", batch, "], got shape ", shape_str(lens.shape));
  const double scale = d.attrs.get("scale", 0), softcap = d.attrs.get("softcap", 0);
  const double window = d.attrs.get("window_left", -1), splits = d.attrs.get("num_splits", 0);
  if (!std::isfinite(scale)) return invalid(kOp, ": 'scale' must be finite, got ", scale);
  if (!(softcap >= 0) || !std::isfinite(softcap)) return invalid(kOp, ": 'softcap' must be >= 0, got ", softcap);
  if (!is_whole(window) || window < -1)
    return invalid(kOp, ": 'window_left' must be -1 (unbounded) or a whole number >= 0, got ", window);
  if (!is_whole(splits) || splits < 0 || splits > kDecodeMaxSplits)
    return invalid(kOp, ": 'num_splits' must be 0 (auto) or a whole number up to ", kDecodeMaxSplits, ", got ", splits);
  BARACUDA_TRY(set_outputs(kOp, d, {{t, {batch, heads_q, v.shape[3]}}, {stat_dtype(t), {batch, heads_q}}}, kOutputs));
  return d;
}

// ---------------------------------------------------------------- host reference

/// Every key in f64, scores kept, then the softmax: the oracle. Checks the
/// block-table entries and lengths it uses and names a bad one.
template <class T>
struct HostDecode {
  static Status run(const DecodeProblem& p, CUstream_st*) {
    using LseT = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* q = reinterpret_cast<const T*>(p.q);
    const T* k = reinterpret_cast<const T*>(p.k);
    const T* v = reinterpret_cast<const T*>(p.v);
    const int64_t cap = p.capacity(), group = p.heads_kv > 0 ? p.group() : 1;
    std::vector<int64_t> blocks;  // the physical block of each key
    std::vector<double> scores, acc;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t len = p.seq_lens[b * p.seq_lens_stride];
      if (len < 0 || len > cap)
        return invalid(kOp, ": seq_lens[", b, "] = ", len, " is outside [0, ", cap, "], the cache capacity (",
                       p.table ? "max_blocks * block_size" : "S_max", ")");
      const int64_t lo = decode_first_key(len, p.window_left);
      blocks.assign(size_t(len - lo), b);
      for (int64_t j = lo; p.table && j < len; ++j) {
        const int64_t col = j / p.block_size, entry = p.table[b * p.table_batch + col * p.table_col];
        if (entry < 0 || entry >= p.num_blocks)
          return invalid(kOp, ": block_table[", b, ", ", col, "] = ", entry, " is out of range [0, ", p.num_blocks,
                         ") (sequence ", b, " reads ", len, " cached tokens)");
        blocks[size_t(j - lo)] = entry;
      }
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const T* qh = q + b * p.q_batch + h * p.q_head;
        const int64_t hk = h / group;
        scores.assign(size_t(len - lo), 0.0);
        double top = -std::numeric_limits<double>::infinity();
        for (int64_t j = lo; j < len; ++j) {
          const T* kj = k + blocks[size_t(j - lo)] * p.k_block + (j % p.block_size) * p.k_row + hk * p.k_head;
          double dot = 0;
          for (int64_t d = 0; d < p.head_dim; ++d) dot += convert<double>(qh[d * p.q_dim]) * convert<double>(kj[d * p.k_dim]);
          const double s = decode_score(dot, p.scale, p.softcap);
          scores[size_t(j - lo)] = s;
          top = std::max(top, s);
        }
        acc.assign(size_t(p.value_dim), 0.0);
        double sum = 0;
        for (int64_t j = lo; j < len; ++j) {
          const double w = std::exp(scores[size_t(j - lo)] - top);
          sum += w;
          const T* vj = v + blocks[size_t(j - lo)] * p.v_block + (j % p.block_size) * p.v_row + hk * p.v_head;
          for (int64_t d = 0; d < p.value_dim; ++d) acc[size_t(d)] += w * convert<double>(vj[d * p.v_dim]);
        }
        T* out = reinterpret_cast<T*>(p.out) + b * p.out_batch + h * p.out_head;
        for (int64_t d = 0; d < p.value_dim; ++d) out[d * p.out_dim] = convert<T>(sum > 0 ? acc[size_t(d)] / sum : 0.0);
        reinterpret_cast<LseT*>(p.lse)[b * p.lse_batch + h * p.lse_head] =
            LseT(sum > 0 ? top + std::log(sum) : -std::numeric_limits<double>::infinity());
      }
    }
    return Status::ok();
  }
};

[[maybe_unused]] const bool host_registered = register_launchers<FloatTypes, HostDecode>(host_decode(), kOp);

// ---------------------------------------------------------------- plan

/// How a CUDA plan cuts the key axis: `splits` ranges of `split_len` keys.
struct Splits {
  int count = 1;
  int64_t len = 0;
};

/// Auto: CTAs (B x Hkv x group chunks x splits) in whole waves of the
/// device's resident slots, splits of 64 keys or more (one 16-key step a
/// warp of the tensor-core kernel at D 128), and caches of up to 256 keys
/// unsplit: the combine costs about four steps a warp. H100, B1 Hq 32 Hkv 8
/// D128 bf16, a call replayed in a CUDA graph, us (splits): 256 keys 10.8
/// (1) / 11.8 (2) / 11.3 (4); 512 keys 13.8 (2) / 12.3 (4) / 11.4 (8); 1024
/// keys 13.9 (4) / 12.4 (8) / 11.7 (16); 2048 keys 14.4 (8) / 13.2 (16) /
/// 14.6 (32); 4096 keys 14.9 (16) / 16.4 (32). Decided from the descriptor,
/// so that the workspace is exact.
Splits choose_splits(const OpDesc& d, Backend backend) {
  const int64_t cap = capacity(d);
  Splits s{1, cap};
  if (backend == Backend::host_reference || cap == 0) return s;
  int64_t want = int64_t(d.attrs.get("num_splits", 0));
  if (want == 0) {
    const int64_t batch = d.inputs[kQ].shape[0], heads_kv = d.inputs[kK].shape[2];
    const int64_t group = d.inputs[kQ].shape[1] / heads_kv;
    // The tensor-core kernel (halves, equal head dims 64 or 128) serves 16
    // query heads a CTA, and one CTA an SM streams a contiguous cache at least
    // as fast as two (H100, 32K keys: B1 16 splits, a CTA an SM, 56.4 us
    // against 59.3 for 33 at two an SM and 60.0 for 24; B8 2 splits 362 us
    // against 364 for 4), so its splits fill one slot an SM. A paged cache's
    // scattered blocks stream faster two CTAs an SM once the sequences and
    // heads alone make 16 CTAs (H200, 32K keys, block 16 / 64: B2 81.1 / 78.7
    // us -> 76.9 / 75.5, B4 148.8 / 143.4 -> 139.0 / 137.0, B8 282.9 / 273.4
    // -> 263.3 / 258.9, B16 551.8 / 542.3 -> 513.1 / 506.3; H100 B8 371 /
    // 366.5 -> 369 / 364.5), but not at B1 (H100 58.5 / 57.6 -> 60.3 / 60.5).
    // The others serve a chunk of 1, 4 or 8 heads, four CTAs an SM.
    const DType t = d.inputs[kQ].dtype;
    const int64_t dim = d.inputs[kQ].shape[2], value_dim = d.inputs[kV].shape[3];
    const bool tensor_cores = (t == DType::f16 || t == DType::bf16) && dim == value_dim && (dim == 64 || dim == 128);
    const int64_t per_cta = tensor_cores ? 16 : group == 1 ? 1 : group <= 4 ? 4 : 8;
    const int64_t units = std::max<int64_t>(1, batch * heads_kv * ((group + per_cta - 1) / per_cta));
    int sms = 132;
#ifdef BARACUDA_HAS_CUDA
    if (int n = current_sm_count(); n > 0) sms = n;
#endif
    // Resident slots per SM as above. Pick the split
    // count with the least time per key, waves / splits, so that a last
    // partial wave does not double the run (576 CTAs on 528 slots); a
    // larger count must win by 5% to pay for its extra partials.
    int per_sm = !tensor_cores ? 4 : is_paged(d) && units >= 16 ? 2 : 1;
#ifdef BARACUDA_HAS_CUDA
    // Two 96 KiB CTAs fit a Hopper SM (228 KiB) but not an A100's (164 KiB).
    if (tensor_cores && per_sm > 1)
      if (const int fit = decode_tc_resident_ctas(dim); fit > 0) per_sm = std::min(per_sm, fit);
#endif
    constexpr int64_t kMinSplit = 64, kLongestUnsplit = 256;
    const int64_t slots = per_sm * int64_t(sms);
    const int64_t most = cap <= kLongestUnsplit ? 1 : std::min<int64_t>(kDecodeMaxSplits, (cap + kMinSplit - 1) / kMinSplit);
    double best = 0;
    want = 1;
    for (int64_t w = 1; w <= std::max<int64_t>(1, most); ++w) {
      const double cost = double((units * w + slots - 1) / slots) / double(w);
      if (w == 1 || cost < best * 0.95) best = cost, want = w;
    }
  }
  want = std::clamp<int64_t>(want, 1, kDecodeMaxSplits);
  constexpr int64_t kGrain = 16;
  s.len = ((cap + want - 1) / want + kGrain - 1) / kGrain * kGrain;
  s.count = int((cap + s.len - 1) / s.len);
  return s;
}

/// The raw problem of a call: the descriptor's sizes and attributes, the
/// views' pointers and strides.
DecodeProblem bind(const OpDesc& desc, const OpArgs& args, void* workspace, Splits splits) {
  const TensorView &q = args.inputs[kQ], &k = args.inputs[kK], &v = args.inputs[kV];
  const TensorView &table = args.inputs[kTable], &lens = args.inputs[kSeqLens];
  const TensorView &out = args.outputs[0], &lse = args.outputs[1];
  const bool paged = is_paged(desc);
  DecodeProblem p;
  p.dtype = q.dtype;
  p.batch = q.shape[0], p.heads_q = q.shape[1], p.head_dim = q.shape[2];
  p.heads_kv = k.shape[2], p.value_dim = v.shape[3];
  p.num_blocks = k.shape[0], p.block_size = k.shape[1], p.max_blocks = paged ? table.shape[1] : 1;
  p.q = static_cast<const char*>(q.data), p.q_batch = q.stride[0], p.q_head = q.stride[1], p.q_dim = q.stride[2];
  p.k = static_cast<const char*>(k.data);
  p.k_block = k.stride[0], p.k_row = k.stride[1], p.k_head = k.stride[2], p.k_dim = k.stride[3];
  p.v = static_cast<const char*>(v.data);
  p.v_block = v.stride[0], p.v_row = v.stride[1], p.v_head = v.stride[2], p.v_dim = v.stride[3];
  if (paged) {
    p.table = static_cast<const int32_t*>(table.data);
    p.table_batch = table.stride[0], p.table_col = table.stride[1];
  }
  p.seq_lens = static_cast<const int32_t*>(lens.data), p.seq_lens_stride = lens.stride[0];
  p.out = static_cast<char*>(out.data), p.out_batch = out.stride[0], p.out_head = out.stride[1], p.out_dim = out.stride[2];
  p.lse = static_cast<char*>(lse.data), p.lse_batch = lse.stride[0], p.lse_head = lse.stride[1];
  const double scale = desc.attrs.get("scale", 0);
  p.scale = scale != 0 ? scale : 1.0 / std::sqrt(double(p.head_dim));
  p.softcap = desc.attrs.get("softcap", 0);
  p.window_left = int64_t(desc.attrs.get("window_left", -1));
  p.splits = splits.count, p.split_len = splits.len;
  p.workspace = workspace;
  return p;
}

class DecodePlan final : public FamilyPlan {
 public:
  DecodePlan(const OpInfo& info, OpDesc desc, Backend backend, DecodeFn fn, Splits splits)
      : FamilyPlan(info, std::move(desc)), fn_(fn), splits_(splits) {
    const DType t = desc_.inputs[kQ].dtype;
    sku_ = bespoke_sku(OpCategory::attention, info.name.c_str(), t, backend);
    if (splits_.count > 1) {
      const size_t rows = size_t(desc_.outputs[0].shape[0] * desc_.outputs[0].shape[1]) * size_t(splits_.count);
      workspace_ = rows * size_t(desc_.outputs[0].shape[2] + 1) * (t == DType::f64 ? sizeof(double) : sizeof(float));
    }
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    return fn_(bind(desc_, args, workspace.data, splits_), stream.cuda_stream());
  }

 private:
  DecodeFn fn_;
  Splits splits_;
};

#ifdef BARACUDA_HAS_CUDA
// Note [Decode on cuDNN]
// Per-sequence contiguous caches of halves, without softcap or window, may
// run cuDNN's fused SDPA forward, the kernel torch's
// scaled_dot_product_attention runs for one query token on Hopper: q as [B,
// Hq, 1, D], the caches as [B, Hkv, S_max, D] views (any strides cuDNN
// takes), and a padding mask whose lengths a small kernel
// ("decode_padding_lengths", decode.hpp) writes into the workspace each
// call, after cuDNN's own: seq_lens clamped to S_max, so cuDNN never reads
// past a cache, and no query for an empty sequence, whose rows that kernel
// sets to out 0 and lse -inf. It is the candidate after the split kernels,
// asked for by name or as the next candidate: on an H100 (32K keys, GQA
// 32/8, D 128, bf16) it ran 1% faster than they (B1 54.3 against 55.0 us, B8
// 347.3 against 350.8; torch's own call 52.4 and 344.7), and its lse is not
// bitwise reproducible run to run at those lengths (its out was), so the
// precision guarantee says so.

/// The attention problem cuDNN runs for a bound decode problem; lengths null
/// until the workspace is known (can_implement).
Problem cudnn_problem(const DecodeProblem& d, const int32_t* len_q, const int32_t* len_kv) {
  Problem p;
  p.dtype = d.dtype;
  p.batch = d.batch, p.heads_q = d.heads_q, p.heads_kv = d.heads_kv;
  p.seq_q = 1, p.seq_kv = d.block_size, p.head_dim = d.head_dim, p.value_dim = d.value_dim;
  // The one-query axis takes the stride of a packed [B, H, 1, D] tensor, as torch's.
  p.q = {const_cast<char*>(d.q), d.q_batch, d.q_head, d.head_dim, d.q_dim};
  p.k = {const_cast<char*>(d.k), d.k_block, d.k_head, d.k_row, d.k_dim};
  p.v = {const_cast<char*>(d.v), d.v_block, d.v_head, d.v_row, d.v_dim};
  p.out = {d.out, d.out_batch, d.out_head, d.value_dim, d.out_dim};
  p.lse = {d.lse, d.lse_batch, d.lse_head, 1, 0};
  p.scale = d.scale;
  p.padded = true, p.padded_len_q = len_q, p.padded_len_kv = len_kv;
  return p;
}

/// Workspace bytes of the padding lengths: len_q then len_kv, int32 [batch] each.
size_t padding_bytes(int64_t batch) { return workspace_aligned(2 * size_t(batch) * sizeof(int32_t)); }

class CudnnDecodePlan final : public FamilyPlan {
 public:
  CudnnDecodePlan(const OpInfo& info, OpDesc desc, std::unique_ptr<const Engine> engine, size_t cudnn_bytes,
                  DecodeFn lengths)
      : FamilyPlan(info, std::move(desc)),
        engine_(std::move(engine)),
        cudnn_bytes_(workspace_aligned(cudnn_bytes)),
        lengths_(lengths) {
    sku_ = bespoke_sku(OpCategory::attention, info.name.c_str(), desc_.inputs[kQ].dtype, Backend::cudnn);
    sku_.layout = Layout::any_strided;
    sku_.precision.deterministic = sku_.precision.bit_stable_on_same_hardware = false;  // its lse: Note [Decode on cuDNN]
    workspace_ = cudnn_bytes_ + padding_bytes(desc_.inputs[kQ].shape[0]);
  }

  Status can_implement(const OpArgs& args) const override {
    BARACUDA_TRY(FamilyPlan::can_implement(args));
    const Problem p = cudnn_problem(bind(desc_, args, nullptr, {}), nullptr, nullptr);
    BARACUDA_TRY(engine_->supports(p).with_context(cat(kOp, " on cudnn")));
    if (const size_t need = workspace_aligned(engine_->workspace(p)); need > cudnn_bytes_)
      return unsupported(kOp, " on cudnn: this layout needs ", need + padding_bytes(p.batch),
                         " workspace bytes, the plan has ", workspace_);
    return Status::ok();
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(FamilyPlan::can_implement(args));  // cuDNN's layout and workspace checks run in engine_->run
    BARACUDA_TRY(check_workspace(kOp, workspace, workspace_));
    const DecodeProblem d = bind(desc_, args, static_cast<char*>(workspace.data) + cudnn_bytes_, {});
    if (d.batch == 0 || d.heads_q == 0) return Status::ok();
    BARACUDA_TRY(lengths_(d, stream.cuda_stream()).with_context(kOp));
    const int32_t* len_q = static_cast<const int32_t*>(d.workspace);
    return engine_->run(cudnn_problem(d, len_q, len_q + d.batch), Workspace{workspace.data, cudnn_bytes_},
                        stream.cuda_stream())
        .with_context(kOp);
  }

 private:
  std::unique_ptr<const Engine> engine_;
  size_t cudnn_bytes_;  ///< cuDNN's part of the workspace; the padding lengths follow
  DecodeFn lengths_;    ///< "decode_padding_lengths:dtype"
};

Result<PlanPtr> make_cudnn_plan(const OpInfo& info, OpDesc desc) {
  const DType t = desc.inputs[kQ].dtype;
  if (t != DType::f16 && t != DType::bf16) return unsupported(kOp, " on cudnn: f16 and bf16 only, got ", dtype_name(t));
  if (is_paged(desc)) return unsupported(kOp, " on cudnn: paged caches are served by the split kernels");
  for (const char* attr : {"softcap", "num_splits"})
    if (desc.attrs.get(attr, 0) != 0) return unsupported(kOp, " on cudnn: '", attr, "' is served by the split kernels");
  if (desc.attrs.get("window_left", -1) >= 0)
    return unsupported(kOp, " on cudnn: 'window_left' is served by the split kernels");
  const DecodeFn lengths = cuda_decode().find(launch_key("decode_padding_lengths", t));
  if (!lengths) return unsupported(kOp, " on cudnn: no padding-length kernel for ", dtype_name(t));
  auto engine = make_cudnn_engine(false, true);
  if (!engine) return engine.status();
  // The probe's views: contiguous operands, as the descriptor gives them.
  ProbeViews probe(desc);
  const Problem p = cudnn_problem(bind(desc, OpArgs{probe.inputs, probe.outputs}, nullptr, {}), nullptr, nullptr);
  BARACUDA_TRY((*engine)->supports(p).with_context(cat(kOp, " on cudnn")));
  BARACUDA_TRY((*engine)->prepare(p).with_context(cat(kOp, " on cudnn")));
  const size_t cudnn_bytes = (*engine)->workspace(p);
  return PlanPtr(std::make_unique<CudnnDecodePlan>(info, std::move(desc), std::move(*engine), cudnn_bytes, lengths));
}
#endif

Result<PlanPtr> make_plan(const OpInfo& info, Backend backend, const OpDesc& desc) {
  auto full = infer_desc(desc);
  if (!full) return full.status();
  const DType t = full->inputs[kQ].dtype;
  if (backend == Backend::cudnn) {
#ifdef BARACUDA_HAS_CUDA
    return make_cudnn_plan(info, std::move(*full));
#else
    return unsupported("built without CUDA");
#endif
  }
  const bool host = backend == Backend::host_reference;
  if (!host && backend != Backend::bespoke_cuda) return unsupported(kOp, ": no ", backend_name(backend), " backend");
  const DecodeFn fn = (host ? host_decode() : cuda_decode()).find(launch_key(kOp, t));
  if (!fn) return unsupported("no ", backend_name(backend), " ", kOp, " kernel for ", dtype_name(t));
  if (!host) {
    const int64_t d = full->inputs[kQ].shape[2], dv = full->outputs[0].shape[2];
    if (d > 256 || dv > 256)
      return unsupported(kOp, " on ", backend_name(backend), ": head dims up to 256, got D = ", d, ", Dv = ", dv);
    if (capacity(*full) > kDecodeMaxCapacity)
      return unsupported(kOp, " on ", backend_name(backend), ": a cache capacity of ", capacity(*full),
                         " tokens exceeds ", kDecodeMaxCapacity);
  }
  const Splits splits = choose_splits(*full, backend);
  return PlanPtr(std::make_unique<DecodePlan>(info, std::move(*full), backend, fn, splits));
}

// ---------------------------------------------------------------- test samples

constexpr int64_t kSampleBlocks = 40;  ///< the sampled block tables index [0, 40)
constexpr int64_t kSampleLen = 77;     ///< the sampled seq_lens lie in [0, 77]

/// [B, Hq, D] (rank 3) or [x, D] (rank 2: B = 1 + x % 4, Hq = 8). Odd D:
/// one kv head per query head, Dv = D + 3; even D: groups of 4 (or one kv
/// head). Paged with block size 1, 3 or 16, or contiguous caches of 80 keys.
std::optional<SampleShapes> sample_shapes(const Shape& shape) {
  int64_t batch, heads_q, dim;
  if (shape.size() == 3) batch = shape[0], heads_q = shape[1], dim = shape[2];
  else if (shape.size() == 2) batch = 1 + shape[0] % 4, heads_q = 8, dim = shape[1];
  else return std::nullopt;
  if (batch < 1 || batch > 16 || heads_q < 1 || heads_q > 64 || dim < 1 || dim > 256) return std::nullopt;
  const bool odd = dim % 2 == 1;
  const int64_t heads_kv = odd ? heads_q : heads_q % 4 == 0 ? heads_q / 4 : 1;
  const int64_t value_dim = odd ? dim + 3 : dim;
  const bool paged = (batch + dim) % 3 != 0;
  const int64_t block_size = !odd ? 16 : dim % 4 == 1 ? 1 : 3;
  const Shape cache = paged ? Shape{kSampleBlocks, block_size, heads_kv, dim} : Shape{batch, 80, heads_kv, dim};
  Shape vcache = cache;
  vcache[3] = value_dim;
  const Shape table = paged ? Shape{batch, (kSampleLen + block_size - 1) / block_size} : Shape{0};
  return SampleShapes{{{batch, heads_q, dim}, cache, vcache, table, {batch}}, {}};
}

}  // namespace
}  // namespace attn

void register_decode_ops(std::vector<OpInfo>& ops) {
  using namespace attn;
  OpInfo info;
  info.name = kOp;
  info.category = OpCategory::attention;
  info.family = "decode";
  info.input_names = kInputs;
  info.output_names = kOutputs;
  info.dtypes = {DType::bf16, DType::f16, DType::f32, DType::f64};
  info.attrs = {{"scale", 0, "score scale (0: 1 / sqrt(D))"},
                {"softcap", 0, "0: none; else score = softcap * tanh(score / softcap)"},
                {"window_left", -1, "-1: unbounded; else only keys j >= seq_len - 1 - window_left"},
                {"num_splits", 0, "key splits of the CUDA kernel (0: auto)"}};
  info.backends = {Backend::bespoke_cuda, Backend::cudnn, Backend::host_reference};
  info.doc =
      "flash decoding: q [B, Hq, D] (one new token per sequence) over a paged KV cache k_cache [num_blocks, "
      "block_size, Hkv, D], v_cache [num_blocks, block_size, Hkv, Dv] with block_table i32 [B, max_blocks], or "
      "per-sequence caches [B, S_max, Hkv, D] with block_table [0]; seq_lens i32 [B] counts the cached tokens "
      "(the new one included) -> out [B, Hq, Dv] and lse [B, Hq] (natural log, f32; -inf and out 0 when empty)";
  info.input_dtypes = [](DType t) { return std::vector<DType>{t, t, t, DType::i32, DType::i32}; };
  info.infer = infer_desc;
  info.domains = {Domain{-2, 2}, Domain{-2, 2}, Domain{-2, 2}, Domain{0, double(kSampleBlocks - 1), false, false, true},
                  Domain{0, double(kSampleLen), false, false, true}};
  info.sample_attrs = {Attrs{}, Attrs{{"softcap", 2.5}, {"scale", 0.3}}, Attrs{{"window_left", 6}},
                       Attrs{{"num_splits", 3}}, Attrs{{"num_splits", 7}, {"window_left", 20}, {"softcap", 10}}};
  info.tolerance_scale = 2;
  info.in_place = false;
  info.sample_shapes = [](DType, const Shape& shape, const Attrs&) { return sample_shapes(shape); };
  const size_t index = ops.size();
  info.make_plan = [index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) {
    return make_plan(registry()[index], backend, desc);
  };
  ops.push_back(std::move(info));
}

}  // namespace baracuda
