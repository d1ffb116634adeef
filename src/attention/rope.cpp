// Rotary position embedding (rope, rope_backward) and the KV-cache append
// (kv_append): descriptor checks, plans and registration. Candidates: the
// bespoke CUDA kernels, then the host reference (rope_host.cpp).
#include <cmath>

#include "attention/rope.hpp"
#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"

namespace baracuda {
namespace rope {

RopeTable& cuda_rope() {
  static RopeTable table;
  return table;
}
KvCopyTable& cuda_kv_copy() {
  static KvCopyTable table;
  return table;
}

namespace {

enum class Kind { rope, rope_backward, kv_append };

struct Def {
  std::string name;
  Kind kind;
  std::vector<std::string> inputs, outputs;
  std::string doc;
};

const std::vector<Def>& defs() {
  static const std::vector<Def> all = {
      {"rope", Kind::rope, {"x", "positions"}, {"out"},
       "rotary position embedding of x [batch, seq, heads, dim] or [seq, heads, dim] at positions (i32/i64) "
       "[batch, seq] or [seq] (shared by the batch); pairs (d, d + rotary_dim/2) (NeoX, rotate_half) or "
       "(2i, 2i+1) (interleaved, GPT-J); dims past rotary_dim pass through; out may be x (in place). "
       "Angles in f64, cos/sin and rotation in f32 (f64 for f64)"},
      {"rope_backward", Kind::rope_backward, {"grad_output", "positions"}, {"grad_input"},
       "gradient of rope: grad_output turned by -theta (same attributes and positions)"},
      {"kv_append", Kind::kv_append, {"k_new", "v_new", "block_table", "cache_seqlens"}, {"k_cache", "v_cache"},
       "write new keys/values into a paged KV cache: token t of sequence b goes to position cache_seqlens[b] + t, "
       "block block_table[b, pos / block_size], slot pos % block_size. k_new [B, T, Hkv, D], v_new [B, T, Hkv, Dv], "
       "block_table i32 [B, max_blocks] or [0] (contiguous caches [B, S_max, Hkv, D]), cache_seqlens i32 [B]; "
       "k_cache [num_blocks, block_size, Hkv, D] and v_cache [.., Dv] are updated in place and must be given "
       "(their shapes cannot be inferred); only the appended slots are written. Caches may be fp8 (plain "
       "conversion). Positions or block ids out of range: the host backend returns an error naming the token, "
       "the CUDA kernel skips the token (it never writes out of bounds)"},
  };
  return all;
}

bool is_float4(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64; }

// ---------------------------------------------------------------- rope descriptors

/// The rotary dims: the attribute, 0 meaning all of `dim`.
int64_t rotary_dim_of(const OpDesc& d, int64_t dim) {
  const double rd = d.attrs.get("rotary_dim", 0);
  return rd == 0 ? dim : int64_t(rd);
}

/// The checked frequency rule of a rope descriptor whose head dim is `dim`.
Result<Frequencies> frequencies(const std::string& op, const OpDesc& d, int64_t dim) {
  const Attrs& a = d.attrs;
  const double rd_attr = a.get("rotary_dim", 0), base = a.get("base", 10000), factor = a.get("factor", 1);
  const double scaling = a.get("scaling", 0), interleaved = a.get("interleaved", 0);
  if (rd_attr != std::trunc(rd_attr) || rd_attr < 0)
    return invalid(op, ": 'rotary_dim' must be a non-negative integer (0: the head dim), got ", rd_attr);
  const int64_t rd = rotary_dim_of(d, dim);
  if (rd > dim) return invalid(op, ": 'rotary_dim' ", rd, " exceeds the head dim ", dim);
  if (rd % 2 != 0)
    return invalid(op, ": 'rotary_dim' must be even, got ", rd, rd_attr == 0 ? " (the head dim; set rotary_dim)" : "");
  if (!(base > 0) || !std::isfinite(base)) return invalid(op, ": 'base' must be positive and finite, got ", base);
  if (interleaved != 0 && interleaved != 1) return invalid(op, ": 'interleaved' must be 0 or 1, got ", interleaved);
  if (scaling != 0 && scaling != 1 && scaling != 2 && scaling != 3)
    return invalid(op, ": 'scaling' must be 0 (none), 1 (linear), 2 (ntk) or 3 (llama3), got ", scaling);
  if (!(factor > 0) || !std::isfinite(factor)) return invalid(op, ": 'factor' must be positive and finite, got ", factor);
  Frequencies f;
  f.base = base;
  f.rotary_dim = int(rd);
  f.scaling = static_cast<Scaling>(int(scaling));
  f.factor = factor;
  if (f.scaling == Scaling::ntk) {
    if (rd <= 2) return invalid(op, ": NTK scaling needs rotary_dim > 2, got ", rd);
    f.base = base * std::pow(factor, double(rd) / double(rd - 2));
  } else if (f.scaling == Scaling::llama3) {
    f.low_freq_factor = a.get("low_freq_factor", 1);
    f.high_freq_factor = a.get("high_freq_factor", 4);
    f.original_max_position = a.get("original_max_position", 8192);
    if (!(f.low_freq_factor > 0) || !(f.high_freq_factor > f.low_freq_factor))
      return invalid(op, ": llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got ", f.low_freq_factor,
                     " and ", f.high_freq_factor);
    if (!(f.original_max_position > 0))
      return invalid(op, ": 'original_max_position' must be positive, got ", f.original_max_position);
  }
  return f;
}

Result<OpDesc> infer_rope(const Def& def, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  BARACUDA_TRY(check_inputs(op, d, def.inputs, 0));
  const TensorSpec& x = d.inputs[0];
  const TensorSpec& pos = d.inputs[1];
  const size_t rank = x.shape.size();
  if (rank != 3 && rank != 4)
    return invalid(op, ": '", def.inputs[0], "' must be [batch, seq, heads, dim] or [seq, heads, dim], got shape ",
                   shape_str(x.shape));
  if (!is_float4(x.dtype))
    return unsupported(op, ": dtype ", dtype_name(x.dtype), " is not supported (f32 f16 bf16 f64)");
  if (pos.dtype != DType::i32 && pos.dtype != DType::i64)
    return invalid(op, ": 'positions' dtype ", dtype_name(pos.dtype), ", expected i32 or i64");
  const int64_t seq = x.shape[rank - 3];
  const bool shared = pos.shape == Shape{seq};
  const bool per_batch = rank == 4 && pos.shape == Shape{x.shape[0], seq};
  if (!shared && !per_batch)
    return invalid(op, ": 'positions' shape ", shape_str(pos.shape), ", expected [", seq, "]",
                   rank == 4 ? cat(" or [", x.shape[0], ", ", seq, "]") : "", " for '", def.inputs[0], "' ",
                   shape_str(x.shape));
  auto f = frequencies(op, d, x.shape.back());
  if (!f) return f.status();
  BARACUDA_TRY(set_outputs(op, d, {x}, def.outputs));
  return d;
}

/// x (or out) as [batch, seq, heads, dim] strides; rank-3 views get batch stride 0.
void strides4(const TensorView& v, int64_t (&stride)[4]) {
  const int lead = 4 - v.rank;
  for (int a = 0; a < 4; ++a) stride[a] = a < lead ? 0 : v.stride[a - lead];
}

class RopePlan final : public FamilyPlan {
 public:
  RopePlan(const Def& def, const OpInfo& info, OpDesc desc, Backend backend, RopeFn fn, Frequencies freq)
      : FamilyPlan(info, std::move(desc)), fn_(fn), freq_(freq), inverse_(def.kind == Kind::rope_backward) {
    sku_ = bespoke_sku(OpCategory::attention, info.name.c_str(), desc_.inputs[0].dtype, backend);
    interleaved_ = desc_.attrs.get("interleaved", 0) != 0;
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const TensorView &x = args.inputs[0], &pos = args.inputs[1], &out = args.outputs[0];
    if (x.numel() == 0) return Status::ok();
    RopeProblem p;
    p.src = static_cast<const char*>(x.data);
    p.dst = static_cast<char*>(out.data);
    p.positions = pos.data;
    p.positions_i64 = pos.dtype == DType::i64;
    const int lead = 4 - x.rank;
    for (int a = 0; a < 4; ++a) p.shape[a] = a < lead ? 1 : x.shape[a - lead];
    strides4(x, p.src_stride);
    strides4(out, p.dst_stride);
    p.pos_stride[0] = pos.rank == 2 ? pos.stride[0] : 0;
    p.pos_stride[1] = pos.stride[pos.rank - 1];
    p.interleaved = interleaved_;
    p.inverse = inverse_;
    p.copy_tail = !same_layout(x, out);
    p.freq = freq_;
    return fn_(p, stream.cuda_stream()).with_context(info_.name);
  }

 private:
  RopeFn fn_;
  Frequencies freq_;
  bool inverse_, interleaved_ = false;
};

// ---------------------------------------------------------------- kv_append descriptors

Result<OpDesc> infer_kv(const Def& def, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  BARACUDA_TRY(check_inputs(op, d, def.inputs, 0));
  const TensorSpec &k = d.inputs[0], &v = d.inputs[1], &table = d.inputs[2], &seqlens = d.inputs[3];
  if (k.shape.size() != 4)
    return invalid(op, ": 'k_new' must be [batch, tokens, kv_heads, head_dim], got shape ", shape_str(k.shape));
  if (!is_float4(k.dtype)) return unsupported(op, ": dtype ", dtype_name(k.dtype), " is not supported (f32 f16 bf16 f64)");
  const int64_t batch = k.shape[0], tokens = k.shape[1], heads = k.shape[2];
  if (v.dtype != k.dtype)
    return invalid(op, ": 'v_new' dtype ", dtype_name(v.dtype), " != 'k_new' dtype ", dtype_name(k.dtype));
  if (v.shape.size() != 4 || v.shape[0] != batch || v.shape[1] != tokens || v.shape[2] != heads)
    return invalid(op, ": 'v_new' must be [", batch, ", ", tokens, ", ", heads, ", head_dim_v] like 'k_new' ",
                   shape_str(k.shape), ", got shape ", shape_str(v.shape));
  if (table.dtype != DType::i32)
    return invalid(op, ": 'block_table' dtype ", dtype_name(table.dtype), ", expected i32");
  const bool paged = table.shape != Shape{0};
  if (paged && (table.shape.size() != 2 || table.shape[0] != batch))
    return invalid(op, ": 'block_table' must be [", batch, ", max_blocks] or [0] (contiguous caches), got shape ",
                   shape_str(table.shape));
  if (seqlens.dtype != DType::i32)
    return invalid(op, ": 'cache_seqlens' dtype ", dtype_name(seqlens.dtype), ", expected i32");
  if (seqlens.shape != Shape{batch})
    return invalid(op, ": 'cache_seqlens' must be [", batch, "], got shape ", shape_str(seqlens.shape));
  if (d.outputs.size() != 2)
    return invalid(op, ": give both outputs 'k_cache' and 'v_cache' (updated in place; their shapes [num_blocks, "
                   "block_size, kv_heads, head_dim] cannot be inferred from the inputs), got ", d.outputs.size());
  const TensorSpec &kc = d.outputs[0], &vc = d.outputs[1];
  const bool fp8_ok = k.dtype != DType::f64 && is_fp8(kc.dtype);
  if (kc.dtype != k.dtype && !fp8_ok)
    return invalid(op, ": 'k_cache' dtype ", dtype_name(kc.dtype), ", expected ", dtype_name(k.dtype),
                   k.dtype != DType::f64 ? " or fp8_e4m3/fp8_e5m2" : "");
  if (vc.dtype != kc.dtype)
    return invalid(op, ": 'v_cache' dtype ", dtype_name(vc.dtype), " != 'k_cache' dtype ", dtype_name(kc.dtype));
  const char* layout = paged ? "[num_blocks, block_size, " : "[batch, max_seqlen, ";
  if (kc.shape.size() != 4 || kc.shape[2] != heads || kc.shape[3] != k.shape[3] || (!paged && kc.shape[0] != batch))
    return invalid(op, ": 'k_cache' must be ", layout, heads, ", ", k.shape[3], "]", paged ? "" : cat(" with batch ", batch),
                   ", got shape ", shape_str(kc.shape));
  if (vc.shape != Shape{kc.shape[0], kc.shape[1], heads, v.shape[3]})
    return invalid(op, ": 'v_cache' must be ", shape_str(Shape{kc.shape[0], kc.shape[1], heads, v.shape[3]}),
                   " (k_cache's blocks with v_new's head dim), got shape ", shape_str(vc.shape));
  if (paged && kc.shape[1] == 0) return invalid(op, ": 'k_cache' has block_size 0");
  return d;
}

class KvAppendPlan final : public FamilyPlan {
 public:
  KvAppendPlan(const OpInfo& info, OpDesc desc, Backend backend, KvCopyFn fn) : FamilyPlan(info, std::move(desc)), fn_(fn) {
    const DType in = desc_.inputs[0].dtype, cache = desc_.outputs[0].dtype;
    sku_ = bespoke_sku(OpCategory::attention, info.name.c_str(), in, backend);
    if (cache != in) sku_.aux_element = cache;
    else sku_.precision.math = MathPrecision::exact;
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const TensorView &table = args.inputs[2], &seqlens = args.inputs[3];
    for (int which = 0; which < 2; ++which) {
      const TensorView &src = args.inputs[which], &cache = args.outputs[which];
      KvCopy p;
      p.src = static_cast<const char*>(src.data);
      p.dst = static_cast<char*>(cache.data);
      for (int a = 0; a < 4; ++a) {
        p.shape[a] = src.shape[a];
        p.src_stride[a] = src.stride[a];
        p.dst_stride[a] = cache.stride[a];
      }
      if (src.numel() == 0) continue;
      if (table.rank == 2) {  // paged (the descriptor allows [B, max_blocks] or [0])
        p.block_table = static_cast<const int32_t*>(table.data);
        p.table_stride[0] = table.stride[0], p.table_stride[1] = table.stride[1];
        p.max_blocks = table.shape[1];
      }
      p.seqlens = static_cast<const int32_t*>(seqlens.data);
      p.seqlens_stride = seqlens.stride[0];
      p.num_blocks = cache.shape[0];
      p.block_size = cache.shape[1];
      BARACUDA_TRY(fn_(p, stream.cuda_stream()));
    }
    return Status::ok();
  }

 private:
  KvCopyFn fn_;
};

// ---------------------------------------------------------------- plans and samples

Result<PlanPtr> make_plan(const Def& def, const OpInfo& info, Backend backend, const OpDesc& desc) {
  const bool host = backend == Backend::host_reference;
  if (def.kind == Kind::kv_append) {
    auto full = infer_kv(def, desc);
    if (!full) return full.status();
    const DType in = full->inputs[0].dtype, cache = full->outputs[0].dtype;
    KvCopyFn fn = (host ? host_kv_copy() : cuda_kv_copy()).find(launch_key("kv_append", in, cache));
    if (!fn)
      return unsupported("no ", backend_name(backend), " kv_append kernel for ", dtype_name(in), " -> ", dtype_name(cache));
    return PlanPtr(std::make_unique<KvAppendPlan>(info, std::move(*full), backend, fn));
  }
  auto full = infer_rope(def, desc);
  if (!full) return full.status();
  auto freq = frequencies(def.name, *full, full->inputs[0].shape.back());
  const DType t = full->inputs[0].dtype;
  RopeFn fn = (host ? host_rope() : cuda_rope()).find(launch_key("rope", t));
  if (!fn) return unsupported("no ", backend_name(backend), " rope kernel for ", dtype_name(t));
  if (!host && freq->rotary_dim / 2 > kMaxCudaPairs)
    return unsupported("the CUDA rope kernel takes rotary_dim up to ", 2 * kMaxCudaPairs, ", got ", freq->rotary_dim);
  return PlanPtr(std::make_unique<RopePlan>(def, info, std::move(*full), backend, fn, *freq));
}

/// Cached tokens per sequence in kv_append's sweep samples: cache_seqlens is
/// drawn from [0, kSampleCached], the cache holds kSampleCached + T + 1.
constexpr int kSampleCached = 6;

std::optional<SampleShapes> sample_shapes(const Def& def, DType dtype, const Shape& shape, const Attrs& attrs) {
  Shape a, b;  // rope: x and positions; kv_append: k_new and v_new
  switch (shape.size()) {
    case 1: a = {shape[0], 2, 6}, b = {shape[0]}; break;               // rank-3 x
    case 2: a = {2, shape[0], 1, shape[1]}, b = {shape[0]}; break;     // positions shared by the batch
    case 3: a = {shape[0], shape[1], 2, shape[2]}, b = {shape[0], shape[1]}; break;
    default: return std::nullopt;
  }
  if (def.kind != Kind::kv_append) {
    const int64_t dim = a.back(), rd = rotary_dim_of(OpDesc{def.name, {}, {}, attrs}, dim);
    if (rd > dim || rd % 2 != 0 || (attrs.get("scaling", 0) == 2 && rd <= 2)) return std::nullopt;
    return SampleShapes{{a, b}, {}};
  }
  // kv_append: contiguous caches (random block tables would collide); the
  // dedicated tests cover paged caches and untouched slots' prior values.
  Shape k = a.size() == 4 ? a : Shape{1, a[0], 1, 4};
  Shape v = k;
  v[3] += shape.size() == 3 ? 1 : 0;
  const int64_t max_seqlen = k[1] + kSampleCached + 1;
  const Shape kc{k[0], max_seqlen, k[2], k[3]}, vc{k[0], max_seqlen, k[2], v[3]};
  return SampleShapes{{k, v, {0}, {k[0]}}, {{dtype, kc}, {dtype, vc}}};
}

std::vector<Attrs> sample_attrs(Kind kind) {
  if (kind == Kind::kv_append) return {Attrs{}};
  return {
      Attrs{},
      Attrs{{"interleaved", 1}},
      Attrs{{"rotary_dim", 4}, {"base", 500}},
      Attrs{{"rotary_dim", 32}, {"scaling", 1}, {"factor", 4}},
      Attrs{{"rotary_dim", 12}, {"interleaved", 1}, {"scaling", 2}, {"factor", 8}},
      Attrs{{"scaling", 3}, {"factor", 8}, {"original_max_position", 64}},
      Attrs{{"rotary_dim", 32}, {"interleaved", 1}, {"scaling", 3}, {"factor", 4}, {"original_max_position", 256},
            {"low_freq_factor", 2}, {"high_freq_factor", 8}},
  };
}

std::vector<AttrSpec> rope_attrs() {
  return {
      {"base", 10000, "frequency base: inv_freq(i) = base^(-2i / rotary_dim)"},
      {"rotary_dim", 0, "leading dims of each head that rotate (even, <= head dim; 0: all)"},
      {"interleaved", 0, "0: pairs (d, d + rotary_dim/2) (NeoX, Llama rotate_half); 1: pairs (2i, 2i+1) (GPT-J)"},
      {"scaling", 0, "0 none; 1 linear (position / factor); 2 NTK-aware (base * factor^(rd/(rd-2))); 3 llama3"},
      {"factor", 1, "scaling factor"},
      {"low_freq_factor", 1, "llama3: wavelengths above original_max_position / low_freq_factor slow down by factor"},
      {"high_freq_factor", 4, "llama3: wavelengths below original_max_position / high_freq_factor stay"},
      {"original_max_position", 8192, "llama3: the context length the model was trained on"},
  };
}

}  // namespace
}  // namespace rope

void register_rope_ops(std::vector<OpInfo>& ops) {
  using namespace rope;
  for (const Def& def : defs()) {
    const bool kv = def.kind == Kind::kv_append;
    OpInfo info;
    info.name = def.name;
    info.category = OpCategory::attention;
    info.family = kv ? "kv_cache" : "rope";
    info.direction = def.kind == Kind::rope_backward ? Direction::backward : Direction::forward;
    if (!kv) info.gradient = def.kind == Kind::rope ? "rope_backward" : "rope";
    info.input_names = def.inputs;
    info.output_names = def.outputs;
    info.dtypes = {DType::f32, DType::f16, DType::bf16, DType::f64};
    info.attrs = kv ? std::vector<AttrSpec>{} : rope_attrs();
    info.backends = {Backend::bespoke_cuda, Backend::host_reference};
    info.doc = def.doc;
    // Positions: i32 with the halves (as inference engines pass them), i64
    // otherwise (torch's default), so the sweep covers both.
    info.input_dtypes = [kv](DType primary) {
      if (kv) return std::vector<DType>{primary, primary, DType::i32, DType::i32};
      const bool half = primary == DType::f16 || primary == DType::bf16;
      return std::vector<DType>{primary, half ? DType::i32 : DType::i64};
    };
    // Positions in [0, 4095]; kv_append's cache_seqlens in [0, kSampleCached]
    // (its block_table is [0] in the sweep).
    const Domain index{0, kv ? double(kSampleCached) : 4095, false, false, true};
    info.domains = kv ? std::vector<Domain>{Domain{}, Domain{}, index} : std::vector<Domain>{Domain{}, index};
    info.tolerance_scale = 2;
    info.in_place = !kv;
    info.sample_attrs = sample_attrs(def.kind);
    info.sample_shapes = [&def](DType dtype, const Shape& shape, const Attrs& attrs) {
      return sample_shapes(def, dtype, shape, attrs);
    };
    const size_t index_in_registry = ops.size();
    info.infer = [&def](const OpDesc& partial) {
      return def.kind == Kind::kv_append ? infer_kv(def, partial) : infer_rope(def, partial);
    };
    info.make_plan = [&def, index_in_registry](Backend backend, const Stream&, const OpDesc& desc,
                                               const PlanPreference&) -> Result<PlanPtr> {
      return make_plan(def, registry()[index_in_registry], backend, desc);
    };
    ops.push_back(std::move(info));
  }
}

}  // namespace baracuda
