// The cuDNN engine of the attention family: cuDNN's fused flash attention
// (the frontend's SDPA node), forward and backward, on dense [B, H, S, D]
// views of f16/bf16. One graph per layout, options and device, built on first
// use and kept in a cache every engine shares; `run` only fills the variant
// pack and enqueues. A softcap rides on the frontend's score modifier (Note
// [Softcap as a score modifier]); packed sequences on its ragged layout (Note
// [Packed sequences on cuDNN]).
//
// Note [cuDNN diagonal band]
// cuDNN keeps key j for query i when pos - left < j <= pos + right, where
// pos = i, or i + Lk - Lq with bottom-right alignment. Our rule (key_range in
// problem.hpp) keeps pos - window_left <= j <= pos + window_right, and the
// causal rule caps j at pos; so right = 0 when causal (window_right then
// changes nothing), else window_right, and left = window_left + 1. cuDNN
// takes a left bound only beside a right one, so a lone left bound gets a
// right bound past every key (Lq + Lk). Bottom-right alignment with Lq != Lk
// uses cuDNN's bottom-right band, which refuses an additive mask; with a mask
// the same band moves to top-left alignment (right + Lk - Lq, left - Lk + Lq)
// when both bounds stay in cuDNN's range. Rows that see no key are refused:
// the problem defines them (out = 0, lse = -inf), cuDNN does not.
//
// Note [Dynamic loading]
// The frontend calls the CUDA driver (cuThreadExchangeStreamCaptureMode) and
// NVRTC; linking them would make libbaracuda unloadable on machines without
// a driver. With NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING it resolves cuDNN,
// cudart, the driver and NVRTC with dlopen/dlsym at first use instead
// (throwing on failure, caught here). cuDNN itself is linked (vendor/cudnn.cpp
// calls it), so the dlopen below finds the loaded copy.
//
// Note [Packed sequences on cuDNN]
// varlen_attention's [tokens, heads, dim] operands map to cuDNN's ragged
// layout: [B, H, max_seqlen, D] tensors whose batch b starts at a per-tensor
// element offset (cu_seqlens[b] times the token stride), with a padding mask
// over per-sequence lengths. Both come from cu_seqlens on the device, in the
// workspace after cuDNN's own (ragged.cu: a sequence whose offsets fail
// packing_valid gets length 0, so nothing outside the operands is read or
// written). The lse travels through the workspace in
// cuDNN's token-major [T, Hq] stats layout, since ours is [Hq, T]. Our rules
// where cuDNN's differ are restored around it: a query that sees no key (no
// keys in its sequence, or bottom-right causal with more queries than keys;
// a data-dependent case, so it cannot be refused at plan time) gets out = 0
// and lse = -inf after the forward; the backward reads such an lse as +inf,
// so that every weight exp(score - lse) of the row is 0, not NaN; keys of a
// sequence without queries get zero gradients. Causal and window bands align
// to each sequence's lengths (top-left or bottom-right). The graph is built
// for the bucketed shape (ragged_shape: batch, max_seqlen and token counts
// rounded up to powers of two; sequences past the batch have length 0), so
// that a training loop whose packing changes every step reuses a few graphs.
// Softcaps stay with the bespoke kernels (the score modifier beside a
// padding mask). Decode's padding mask over dense operands (Problem::padded)
// is Note [Decode on cuDNN] in decode.cpp.
#include "attention/engine.hpp"

#if BARACUDA_HAS_CUDNN

#include <dlfcn.h>

#include <bit>
#include <climits>
#include <compare>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#include <cudnn_frontend.h>

#include "attention/ragged.hpp"
#include "core/cuda_check.hpp"
#include "core/sizes.hpp"
#include "vendor/cudnn.hpp"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // see Note [Dynamic loading]
}  // namespace cudnn_frontend

namespace baracuda::attn {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

constexpr int64_t kMaxHeadDim = 256;  // forward and backward on Hopper (cuDNN 9.x)
constexpr int64_t kVector = 8;        // elements in the 16 bytes cuDNN loads at once
constexpr uintptr_t kAlign = 16;

/// Loads the frontend's view of cuDNN once; the reason if it cannot.
Status load_frontend() {
  static const Status loaded = [] {
    const std::string lib = cat("libcudnn.so.", CUDNN_MAJOR);
    fe::cudnn_dlhandle = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!fe::cudnn_dlhandle) return unsupported("cuDNN: cannot load ", lib, ": ", dlerror());
    return Status::ok();
  }();
  return loaded;
}

std::optional<fe::DataType_t> io_type(DType dtype) {
  if (dtype == DType::f16) return fe::DataType_t::HALF;
  if (dtype == DType::bf16) return fe::DataType_t::BFLOAT16;
  return std::nullopt;
}

/// Strides of an operand cuDNN reads or writes whole: [batch, head, seq] of
/// extents [b, h, s], the dim stride 1. See Note [cuDNN diagonal band] for
/// the rest of the layout rules.
Status check_operand(const char* name, const Operand& o, int64_t b, int64_t h, int64_t s) {
  if (o.dim != 1) return unsupported("cuDNN needs ", name, "'s dim stride 1, got ", o.dim);
  const int64_t extent[3] = {b, h, s}, stride[3] = {o.batch, o.head, o.seq};
  const char* axis[3] = {"batch", "head", "seq"};
  for (int i = 0; i < 3; ++i) {
    if (extent[i] <= 1) continue;
    if (stride[i] <= 0 || stride[i] % kVector != 0)
      return unsupported("cuDNN needs ", name, "'s ", axis[i], " stride positive and a multiple of ", kVector,
                         " elements (16 bytes), got ", stride[i]);
  }
  if (o.data && reinterpret_cast<uintptr_t>(o.data) % kAlign != 0)
    return unsupported("cuDNN needs ", name, " 16-byte aligned");
  return Status::ok();
}

/// cuDNN's band for the problem, see Note [cuDNN diagonal band].
struct Band {
  int64_t left = -1, right = -1;  // -1: unbounded
  bool bottom_right = false;
  auto operator<=>(const Band&) const = default;
};

Result<Band> band_of(const Problem& p) {
  int64_t right = p.causal ? 0 : (p.window_right >= 0 ? p.window_right : -1);
  const int64_t left = p.window_left >= 0 ? p.window_left + 1 : -1;
  if (right < 0 && left < 0) return Band{};
  if (p.varlen()) {  // cuDNN aligns the band to each sequence's own lengths (its padding mask)
    const RaggedShape graph = ragged_shape(p);
    Band band{left, right < 0 ? graph.seq_q + graph.seq_kv : right, p.bottom_right};
    if (band.left > INT_MAX || band.right > INT_MAX) return unsupported("cuDNN's band bounds are int32");
    return band;
  }
  if (left >= 0 && p.seq_q > p.seq_kv)
    return unsupported("cuDNN serves a sliding window (window_left) only with seq_q <= seq_kv, got ", p.seq_q, " > ",
                       p.seq_kv);
  if (right < 0) right = p.seq_q + p.seq_kv;
  const int64_t shift = p.bottom_right ? p.seq_kv - p.seq_q : 0;
  Band band{left, right, false};
  if (shift != 0 && !p.mask.data && p.seq_q <= p.seq_kv) {
    band.bottom_right = true;
  } else if (shift != 0) {
    band.right = right + shift;
    band.left = left < 0 ? -1 : left - shift;
    if (band.right < 0 || (left >= 0 && band.left < 1))
      return unsupported("cuDNN cannot express this bottom-right causal/window band (seq_q ", p.seq_q, ", seq_kv ",
                         p.seq_kv, ", window ", p.window_left, "/", p.window_right,
                         ") with an additive mask or seq_q > seq_kv");
  }
  if (band.left > INT_MAX || band.right > INT_MAX) return unsupported("cuDNN's band bounds are int32");
  return band;
}

Status check_problem(const Problem& p, bool backward) {
  if (p.backward != backward)
    return unsupported("this cuDNN engine runs the ", backward ? "backward" : "forward", " pass");
  if (!io_type(p.dtype)) return unsupported("cuDNN's fused attention serves f16 and bf16, not ", dtype_name(p.dtype));
  if (p.varlen() && p.softcap > 0)
    return unsupported("cuDNN engine: packed sequences (cu_seqlens) with a softcap are not served (the score modifier "
                       "beside a padding mask)");
  if (p.varlen() && p.seq_q == 1 && p.seq_kv == 1)
    return unsupported("cuDNN engine: packed sequences of one token each (max_seqlen 1 and 1) are not served");
  if (p.varlen() && (p.heads_q > 65535 || p.heads_kv > 65535))
    return unsupported("cuDNN engine: packed sequences with more than 65535 heads are not served");
  if (p.padded) {  // decode's padding mask (Note [Decode on cuDNN] in decode.cpp): the plain rule only
    if (p.varlen() || backward || p.mask.data || p.softcap > 0 || p.causal || p.window_left >= 0 ||
        p.window_right >= 0)
      return unsupported("cuDNN engine: a padding mask over sequence lengths is served alone (forward, no mask, "
                         "softcap, causal rule or window)");
  }
  if (p.dropout_p > 0)
    return unsupported("cuDNN's dropout draws its own random stream, not ours (dropout_keep), so it would drop other "
                       "elements");
  if (p.softcap > 0 && (p.window_left >= 0 || p.window_right >= 0))
    return unsupported("cuDNN takes a softcap only as a score modifier, which excludes its window band (a causal "
                       "rule moves into the modifier; Note [Softcap as a score modifier])");
  if (p.softcap > 0 && backward && p.seq_kv % 128 != 0 && vendor::dnn_version() <= 91500)
    return unsupported("cuDNN up to 9.15 runs a backward whose seq_kv (", p.seq_kv,
                       ") is not a multiple of 128 with a padding mask, which excludes the softcap's score modifier");
  if (p.alibi_slopes) return unsupported("cuDNN's ALiBi uses fixed slopes 2^(-8h/H), not the given alibi_slopes");
  if (p.batch <= 0 || p.heads_q <= 0 || p.heads_kv <= 0 || p.seq_q <= 0 || p.seq_kv <= 0)
    return unsupported("cuDNN needs non-empty batch, heads and sequences");
  if (p.heads_q % p.heads_kv != 0)
    return unsupported("cuDNN needs heads_kv (", p.heads_kv, ") to divide heads_q (", p.heads_q, ")");
  for (auto [name, d] : {std::pair{"head_dim", p.head_dim}, std::pair{"value_dim", p.value_dim}})
    if (d <= 0 || d % kVector != 0 || d > kMaxHeadDim)
      return unsupported("cuDNN needs ", name, " a multiple of ", kVector, " up to ", kMaxHeadDim, ", got ", d);

  const int64_t batch = p.varlen() ? 1 : p.batch;  // packed: no batch stride (ragged offsets)
  BARACUDA_TRY(check_operand("q", p.q, batch, p.heads_q, p.seq_q));
  BARACUDA_TRY(check_operand("k", p.k, batch, p.heads_kv, p.seq_kv));
  BARACUDA_TRY(check_operand("v", p.v, batch, p.heads_kv, p.seq_kv));
  BARACUDA_TRY(check_operand("out", p.out, batch, p.heads_q, p.seq_q));
  if (backward) {
    BARACUDA_TRY(check_operand("grad_out", p.grad_out, batch, p.heads_q, p.seq_q));
    BARACUDA_TRY(check_operand("grad_q", p.grad_q, batch, p.heads_q, p.seq_q));
    BARACUDA_TRY(check_operand("grad_k", p.grad_k, batch, p.heads_kv, p.seq_kv));
    BARACUDA_TRY(check_operand("grad_v", p.grad_v, batch, p.heads_kv, p.seq_kv));
  }
  if (p.varlen()) return Status::ok();  // the lse goes through the workspace; empty rows are fixed after
  if (backward) {
    // cuDNN before 9.26 reads the backward's stats as if packed [B, H, S].
    const bool packed = (p.seq_q == 1 || p.lse.seq == 1) && (p.heads_q == 1 || p.lse.head == p.seq_q) &&
                        (p.batch == 1 || p.lse.batch == p.heads_q * p.seq_q);
    if (!packed && vendor::dnn_version() < 92600)
      return unsupported("cuDNN before 9.26 reads the backward's lse only packed [batch, head, seq], got strides [",
                         p.lse.batch, ", ", p.lse.head, ", ", p.lse.seq, "]");
  }
  if (p.lse.data || backward) {
    if ((p.seq_q > 1 && p.lse.seq <= 0) || (p.heads_q > 1 && p.lse.head <= 0) || (p.batch > 1 && p.lse.batch <= 0))
      return unsupported("cuDNN needs positive lse strides");
  }

  if (p.mask.data) {
    if (p.mask_dtype == DType::boolean)
      return unsupported("cuDNN takes no boolean mask (only an additive one, as its bias)");
    if (p.mask_dtype != p.dtype)
      return unsupported("cuDNN adds a mask of the attention's dtype (", dtype_name(p.dtype), "), got ",
                         dtype_name(p.mask_dtype));
    if (p.mask.dim != 1 || p.mask.seq <= 0 || (p.seq_q > 1 && p.mask.seq % kVector != 0))
      return unsupported("cuDNN needs the mask's key stride 1 and its query stride a positive multiple of ", kVector,
                         ", got ", p.mask.dim, " and ", p.mask.seq);
    if (p.mask.batch < 0 || p.mask.batch % kVector != 0 || p.mask.head < 0 || p.mask.head % kVector != 0)
      return unsupported("cuDNN needs the mask's batch and head strides 0 (broadcast) or multiples of ", kVector);
    if (reinterpret_cast<uintptr_t>(p.mask.data) % kAlign != 0) return unsupported("cuDNN needs the mask 16-byte aligned");
  }

  for (int64_t i : {int64_t(0), p.seq_q - 1}) {
    if (p.padded) break;  // the caller gives a padded sequence's empty rows their result
    int64_t lo = 0, hi = 0;
    key_range(p, i, p.seq_q, p.seq_kv, lo, hi);
    if (lo >= hi)
      return unsupported("query ", i, " sees no key (causal/window): cuDNN does not give such rows our out = 0, "
                         "lse = -inf");
  }
  return band_of(p).status();
}

/// Everything that shapes a graph. Pointers are not in it: every operand is
/// 16-byte aligned (checked) and the pack is filled per run.
struct Key {
  int device = 0;
  bool backward = false, deterministic = false;
  DType dtype = DType::bf16;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_kv = 0, head_dim = 0, value_dim = 0;
  bool varlen = false, padded = false;
  int64_t tokens_q = 0, tokens_kv = 0;  ///< packed only
  using Strides = std::array<int64_t, 3>;
  Strides q{}, k{}, v{}, out{}, lse{}, mask{}, grad_out{}, grad_q{}, grad_k{}, grad_v{};
  bool lse_out = false, masked = false;
  uint32_t scale = 0, softcap = 0;  // f32 bits; softcap 0: none
  std::optional<int64_t> modifier_causal_shift;  ///< a causal mask in the softcap's modifier: keys j <= i + shift
  Band band;
  auto operator<=>(const Key&) const = default;
};

Key::Strides strides(const Operand& o) { return {o.batch, o.head, o.seq}; }

Key key_of(const Problem& p, int device, const Band& band, bool backward, bool deterministic) {
  Key key;
  key.device = device, key.backward = backward, key.deterministic = deterministic;
  key.dtype = p.dtype;
  key.batch = p.batch, key.heads_q = p.heads_q, key.heads_kv = p.heads_kv;
  key.seq_q = p.seq_q, key.seq_kv = p.seq_kv, key.head_dim = p.head_dim, key.value_dim = p.value_dim;
  key.q = strides(p.q), key.k = strides(p.k), key.v = strides(p.v), key.out = strides(p.out);
  key.lse_out = p.backward || p.lse.data;
  if (key.lse_out) key.lse = strides(p.lse);
  key.padded = p.padded;
  key.masked = p.mask.data != nullptr;
  if (key.masked) key.mask = strides(p.mask);
  if (p.backward) {
    key.grad_out = strides(p.grad_out), key.grad_q = strides(p.grad_q);
    key.grad_k = strides(p.grad_k), key.grad_v = strides(p.grad_v);
  }
  if (p.varlen()) {  // the bucketed shape; a batch stride as if padded, the ragged offsets place each sequence
    const RaggedShape graph = ragged_shape(p);
    key.varlen = true, key.batch = graph.batch, key.seq_q = graph.seq_q, key.seq_kv = graph.seq_kv;
    key.tokens_q = graph.tokens_q, key.tokens_kv = graph.tokens_kv;
    for (Key::Strides* s : {&key.q, &key.out, &key.grad_out, &key.grad_q}) (*s)[0] = graph.seq_q * (*s)[2];
    for (Key::Strides* s : {&key.k, &key.v, &key.grad_k, &key.grad_v}) (*s)[0] = graph.seq_kv * (*s)[2];
    if (key.lse_out) key.lse = {};  // not the graph's (cuDNN's stats live in the workspace)
  }
  key.scale = std::bit_cast<uint32_t>(static_cast<float>(p.scale));  // cuDNN scales in f32
  if (p.softcap > 0) key.softcap = std::bit_cast<uint32_t>(static_cast<float>(p.softcap));
  key.band = band;
  if (p.softcap > 0 && p.causal) {  // no band beside a modifier: the mask moves into it
    key.band = Band{};
    key.modifier_causal_shift = p.bottom_right ? p.seq_kv - p.seq_q : 0;
  }
  return key;
}

/// Note [Softcap as a score modifier]
/// cuDNN has no softcap attribute; the frontend's score-modifier hooks add
/// pointwise nodes to the scores right after the scale (before the additive
/// mask, as our rule: mask(softcap(scale q.k))). The forward hook gives
/// cap tanh(s / cap). The backward graph recomputes the scores through the
/// same hook, then hands the backward hook dL/d(capped score) before the
/// scale; it returns dL/ds = g (1 - t^2) = g - (g t) t, t the forward hook's
/// tanh node of that graph (kept here between the two calls). The frontend
/// takes no causal/window band beside a modifier, so a causal softcap puts
/// the causal rule into the forward hook (keys j > i + shift get -inf, from
/// the score's row and column indices; the backward hook needs nothing more,
/// those weights are 0). H100, B4 H32 S4096 D128 bf16, causal softcap 30:
/// forward 471 TFLOP/s against the bespoke kernel's 357, backward 399 against
/// 134 (torch's plain causal: 606 and 459), so the masked tiles cost little.
/// Windows stay with the bespoke kernels (see check_problem).
class SoftcapModifier {
 public:
  SoftcapModifier(float cap, std::optional<int64_t> causal_shift) : cap_(cap), causal_shift_(causal_shift) {}

  TensorPtr forward(const std::shared_ptr<fe::graph::Graph>& g, const TensorPtr& score) const {
    auto scaled = g->pointwise(score, scalar(1.f / cap_), op("softcap_in", fe::PointwiseMode_t::MUL));
    *tanh_ = g->pointwise(scaled, op("softcap_tanh", fe::PointwiseMode_t::TANH_FWD));
    auto capped = g->pointwise(*tanh_, scalar(cap_), op("softcap_out", fe::PointwiseMode_t::MUL));
    return causal_shift_ ? causal(g, capped, *causal_shift_) : capped;
  }
  TensorPtr backward(const std::shared_ptr<fe::graph::Graph>& g, const TensorPtr& grad) const {
    if (!*tanh_) throw std::logic_error("softcap backward hook ran before its forward hook");
    auto gt = g->pointwise(grad, *tanh_, op("softcap_grad_t", fe::PointwiseMode_t::MUL));
    auto gtt = g->pointwise(gt, *tanh_, op("softcap_grad_tt", fe::PointwiseMode_t::MUL));
    return g->pointwise(grad, gtt, op("softcap_grad", fe::PointwiseMode_t::SUB));
  }

 private:
  static TensorPtr scalar(float value) { return std::make_shared<fe::graph::Tensor_attributes>(value); }
  static fe::graph::Pointwise_attributes op(const char* name, fe::PointwiseMode_t mode) {
    return fe::graph::Pointwise_attributes().set_name(name).set_mode(mode);
  }
  /// score where column j <= row i + shift, else -inf.
  static TensorPtr causal(const std::shared_ptr<fe::graph::Graph>& g, const TensorPtr& score, int64_t shift) {
    auto index = [&](const char* name, int64_t axis) {
      auto t = g->pointwise(score, op(name, fe::PointwiseMode_t::GEN_INDEX).set_axis(axis).set_compute_data_type(
                                       fe::DataType_t::INT32));
      t->set_data_type(fe::DataType_t::INT32);
      return t;
    };
    TensorPtr row = index("causal_row", 2), col = index("causal_col", 3);
    if (shift != 0) {
      row = g->pointwise(row, std::make_shared<fe::graph::Tensor_attributes>(static_cast<int32_t>(shift)),
                         op("causal_shift", fe::PointwiseMode_t::ADD).set_compute_data_type(fe::DataType_t::INT32));
      row->set_data_type(fe::DataType_t::INT32);
    }
    auto keep = g->pointwise(row, col, op("causal_keep", fe::PointwiseMode_t::CMP_GE).set_compute_data_type(
                                           fe::DataType_t::BOOLEAN));
    keep->set_data_type(fe::DataType_t::BOOLEAN);
    return g->pointwise(score, scalar(-std::numeric_limits<float>::infinity()), keep,
                        op("causal_select", fe::PointwiseMode_t::BINARY_SELECT));
  }

  float cap_;
  std::optional<int64_t> causal_shift_;
  std::shared_ptr<TensorPtr> tanh_ = std::make_shared<TensorPtr>();  // shared by the copies std::function makes
};

/// Variant-pack uids of the graph's tensors; packed sequences add the lengths
/// and kOffsets + RaggedOperand.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kBias, kDO, kDQ, kDK, kDV, kLenQ, kLenKV, kOffsets = 32 };

/// Whether a graph reads the ragged offsets of operand i: the forward's are
/// q, k, v, out and (when it keeps the lse) the stats.
bool ragged_used(int i, bool backward, bool stats) {
  return backward || i <= kRaggedOut || (i == kRaggedStats && stats);
}

/// The workspace of a run: cuDNN's graph's, then (packed sequences) the ragged arrays.
size_t total_workspace(const Problem& p, size_t cudnn_bytes) {
  return p.varlen() ? workspace_aligned(cudnn_bytes) + ragged_bytes(p) : cudnn_bytes;
}

/// A built graph, or why it could not be built.
struct Built {
  Status status;
  std::unique_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

class CudnnEngine final : public Engine {
 public:
  CudnnEngine(bool backward, bool deterministic) : backward_(backward), deterministic_(deterministic) {}

  Status supports(const Problem& p) const override { return check_problem(p, backward_); }
  Status prepare(const Problem& p) const override {
    BARACUDA_TRY(supports(p));
    auto built = graph_for(p);
    return built.status();
  }
  size_t workspace(const Problem& p) const override {
    auto built = graph_for(p);
    return built ? total_workspace(p, static_cast<size_t>((*built)->workspace)) : 0;
  }
  Status run(const Problem& p, const Workspace& workspace, CUstream_st* stream) const override;

 private:
  /// The graph of the problem's layout on the current device, built on a miss.
  Result<const Built*> graph_for(const Problem& p) const;

  bool backward_, deterministic_;
};

/// The graphs every engine shares. Never destroyed: graphs must not be torn
/// down after cuDNN and the CUDA context at exit. Entries are never removed.
struct GraphCache {
  std::mutex mutex;
  std::map<Key, std::unique_ptr<Built>> graphs;
};
GraphCache& graph_cache() {
  static GraphCache* cache = new GraphCache;
  return *cache;
}

Status build(const Key& key, cudnnHandle_t handle, std::mutex& handle_mutex, Built& built);

Result<const Built*> CudnnEngine::graph_for(const Problem& p) const {
  auto band = band_of(p);
  if (!band) return band.status();
  int device = 0;
  BARACUDA_CUDA_TRY(cudaGetDevice(&device));
  const Key key = key_of(p, device, *band, backward_, deterministic_);
  GraphCache& cache = graph_cache();
  std::lock_guard lock(cache.mutex);
  std::unique_ptr<Built>& slot = cache.graphs[key];
  if (!slot) {
    slot = std::make_unique<Built>();
    auto handle = vendor::dnn_handle();
    slot->status = handle ? build(key, handle->handle, *handle->mutex, *slot) : handle.status();
    if (!slot->status.is_ok()) slot->graph.reset();
  }
  if (!slot->status.is_ok()) return slot->status;
  return static_cast<const Built*>(slot.get());
}

Status build(const Key& key, cudnnHandle_t handle, std::mutex& handle_mutex, Built& built) {
  const char* pass = key.backward ? "backward" : "forward";
  auto refuse = [&](const std::string& step, const std::string& message) {
    return unsupported("cuDNN cannot build the attention ", pass, " graph (", step, "): ", message);
  };
  try {
    auto g = std::make_unique<fe::graph::Graph>();
    g->set_io_data_type(*io_type(key.dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t b = key.batch, hq = key.heads_q, hk = key.heads_kv, sq = key.seq_q, sk = key.seq_kv;
    const int64_t dqk = key.head_dim, dv = key.value_dim;
    auto make = [&](const char* name, Uid uid, std::vector<int64_t> dim, const Key::Strides& s, fe::DataType_t type) {
      return fe::graph::Tensor_attributes()
          .set_name(name)
          .set_uid(uid)
          .set_dim(std::move(dim))
          .set_stride({s[0], s[1], s[2], 1})
          .set_data_type(type);
    };
    const fe::DataType_t io = *io_type(key.dtype), f32 = fe::DataType_t::FLOAT;
    TensorPtr q = g->tensor(make("q", kQ, {b, hq, sq, dqk}, key.q, io));
    TensorPtr k = g->tensor(make("k", kK, {b, hk, sk, dqk}, key.k, io));
    TensorPtr v = g->tensor(make("v", kV, {b, hk, sk, dv}, key.v, io));
    // Packed sequences: per-tensor offsets and the lengths (Note [Packed sequences on cuDNN]).
    TensorPtr offsets[kRaggedOperands], len_q, len_kv;
    auto index_tensor = [&](const char* name, int64_t uid, int64_t rows, fe::DataType_t type) {
      return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({rows, 1, 1, 1}).set_stride(
          {1, 1, 1, 1}).set_data_type(type));
    };
    if (key.varlen || key.padded) {
      len_q = index_tensor("len_q", kLenQ, b, fe::DataType_t::INT32);
      len_kv = index_tensor("len_kv", kLenKV, b, fe::DataType_t::INT32);
    }
    if (key.varlen) {
      for (int i = 0; i < kRaggedOperands; ++i)
        if (ragged_used(i, key.backward, key.lse_out))
          offsets[i] = index_tensor(cat("offsets_", i).c_str(), kOffsets + i, b + 1, fe::DataType_t::INT64);
      q->set_ragged_offset(offsets[kRaggedQ]);
      k->set_ragged_offset(offsets[kRaggedK]);
      v->set_ragged_offset(offsets[kRaggedV]);
    }
    auto packed = [&](auto& attrs) {
      if (key.varlen || key.padded) attrs.set_padding_mask(true).set_seq_len_q(len_q).set_seq_len_kv(len_kv);
    };
    // The lse: ours, or (packed) cuDNN's token-major [T, Hq] in the workspace.
    const std::vector<int64_t> stats_stride = key.varlen ? std::vector<int64_t>{sq * hq, 1, hq, 1}
                                                         : std::vector<int64_t>{key.lse[0], key.lse[1], key.lse[2], 1};
    TensorPtr bias;
    if (key.masked) {  // stride-0 batch/head dims broadcast as extent 1
      const int64_t mb = key.mask[0] == 0 ? 1 : b, mh = key.mask[1] == 0 ? 1 : hq;
      bias = g->tensor(make("bias", kBias, {mb, mh, sq, sk}, key.mask, io));
    }
    const float scale = std::bit_cast<float>(key.scale);
    auto apply_band = [&](auto& attrs) {
      if (key.band.right < 0) return;
      attrs.set_diagonal_alignment(key.band.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                         : fe::DiagonalAlignment_t::TOP_LEFT);
      attrs.set_diagonal_band_right_bound(static_cast<int>(key.band.right));
      if (key.band.left >= 0) attrs.set_diagonal_band_left_bound(static_cast<int>(key.band.left));
    };

    const SoftcapModifier softcap(std::bit_cast<float>(key.softcap), key.modifier_causal_shift);
    auto softcap_forward = [softcap](std::shared_ptr<fe::graph::Graph> graph, TensorPtr score) {
      return softcap.forward(graph, score);
    };
    if (!key.backward) {
      auto attrs = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(key.lse_out).set_attn_scale(scale);
      apply_band(attrs);
      packed(attrs);
      if (bias) attrs.set_bias(bias);
      if (key.softcap) attrs.set_score_mod(softcap_forward);
      auto [o, stats] = g->sdpa(q, k, v, std::move(attrs));
      o->set_output(true).set_uid(kO).set_dim({b, hq, sq, dv}).set_stride({key.out[0], key.out[1], key.out[2], 1});
      o->set_data_type(io);
      if (key.varlen) o->set_ragged_offset(offsets[kRaggedOut]);
      if (key.lse_out) {
        stats->set_output(true).set_uid(kStats).set_dim({b, hq, sq, 1}).set_stride(stats_stride).set_data_type(f32);
        if (key.varlen) stats->set_ragged_offset(offsets[kRaggedStats]);
      }
    } else {
      TensorPtr o = g->tensor(make("o", kO, {b, hq, sq, dv}, key.out, io));
      TensorPtr d_o = g->tensor(make("grad_out", kDO, {b, hq, sq, dv}, key.grad_out, io));
      TensorPtr stats = g->tensor(make("stats", kStats, {b, hq, sq, 1}, key.lse, f32).set_stride(stats_stride));
      auto attrs = fe::graph::SDPA_backward_attributes()
                       .set_name("sdpa_backward")
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(key.deterministic);
      apply_band(attrs);
      packed(attrs);
      if (key.varlen) {
        o->set_ragged_offset(offsets[kRaggedOut]);
        d_o->set_ragged_offset(offsets[kRaggedGradOut]);
        stats->set_ragged_offset(offsets[kRaggedStats]);
        // Sizes cuDNN's token-major scratch by the tokens, not batch x max_seqlen (rounded as its tests do).
        auto total = [](int64_t tokens) { return std::max<int64_t>(64, ceil_div(tokens, 64) * 64); };
        attrs.set_max_total_seq_len_q(total(key.tokens_q)).set_max_total_seq_len_kv(total(key.tokens_kv));
      }
      if (bias) attrs.set_bias(bias);
      if (key.softcap) {
        attrs.set_score_mod(softcap_forward);
        attrs.set_score_mod_bprop([softcap](std::shared_ptr<fe::graph::Graph> graph, TensorPtr grad) {
          return softcap.backward(graph, grad);
        });
      }
      auto [dq, dk, d_v] = g->sdpa_backward(q, k, v, o, d_o, stats, std::move(attrs));
      dq->set_output(true).set_uid(kDQ).set_dim({b, hq, sq, dqk});
      dq->set_stride({key.grad_q[0], key.grad_q[1], key.grad_q[2], 1}).set_data_type(io);
      dk->set_output(true).set_uid(kDK).set_dim({b, hk, sk, dqk});
      dk->set_stride({key.grad_k[0], key.grad_k[1], key.grad_k[2], 1}).set_data_type(io);
      d_v->set_output(true).set_uid(kDV).set_dim({b, hk, sk, dv});
      d_v->set_stride({key.grad_v[0], key.grad_v[1], key.grad_v[2], 1}).set_data_type(io);
      if (key.varlen) {
        dq->set_ragged_offset(offsets[kRaggedGradQ]);
        dk->set_ragged_offset(offsets[kRaggedGradK]);
        d_v->set_ragged_offset(offsets[kRaggedGradV]);
      }
    }

    if (auto e = g->validate(); e.is_bad()) return refuse("validate", e.err_msg);
    {
      std::lock_guard lock(handle_mutex);
      if (auto e = g->build_operation_graph(handle); e.is_bad()) return refuse("operation graph", e.err_msg);
    }
    if (auto e = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); e.is_bad())
      return refuse("heuristics", e.err_msg);
    if (auto e = g->check_support(); e.is_bad()) return refuse("support", e.err_msg);
    if (auto e = g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad()) return refuse("plans", e.err_msg);
    BARACUDA_CUDNN_FE_TRY(g->get_workspace_size(built.workspace));
    built.graph = std::move(g);
    return Status::ok();
  } catch (const std::exception& e) {  // the frontend throws when a symbol fails to load
    return refuse("exception", e.what());
  }
}

Status CudnnEngine::run(const Problem& p, const Workspace& workspace, CUstream_st* stream) const {
  BARACUDA_TRY(supports(p));  // host checks only: the pointers (alignment) change from run to run
  auto built = graph_for(p);
  if (!built) return built.status();
  const size_t cudnn_bytes = static_cast<size_t>((*built)->workspace);
  const size_t needed = total_workspace(p, cudnn_bytes);
  if (workspace.bytes < needed)
    return Status::too_small(ErrorKind::workspace_too_small, needed, workspace.bytes,
                             "cuDNN attention workspace");
  std::unordered_map<int64_t, void*> pack{{kQ, p.q.data}, {kK, p.k.data}, {kV, p.v.data}, {kO, p.out.data}};
  RaggedArrays ragged;
  if (p.varlen()) {
    ragged = ragged_carve(p, static_cast<char*>(workspace.data) + workspace_aligned(cudnn_bytes));
    BARACUDA_TRY(ragged_prepare(p, ragged, stream));
    pack.emplace(kLenQ, ragged.len_q);
    pack.emplace(kLenKV, ragged.len_kv);
    for (int i = 0; i < kRaggedOperands; ++i)
      if (ragged_used(i, p.backward, p.backward || p.lse.data))
        pack.emplace(kOffsets + i, ragged.offsets + i * (ragged.graph_batch + 1));
    if (p.backward || p.lse.data) pack.emplace(kStats, ragged.stats);
  } else if (p.backward || p.lse.data) {
    pack.emplace(kStats, p.lse.data);
  }
  if (p.padded) {
    if (!p.padded_len_q || !p.padded_len_kv) return internal_error("cuDNN attention: padded without its lengths");
    pack.emplace(kLenQ, const_cast<int32_t*>(p.padded_len_q));
    pack.emplace(kLenKV, const_cast<int32_t*>(p.padded_len_kv));
  }
  if (p.mask.data) pack.emplace(kBias, p.mask.data);
  if (p.backward) {
    pack.emplace(kDO, p.grad_out.data);
    pack.emplace(kDQ, p.grad_q.data);
    pack.emplace(kDK, p.grad_k.data);
    pack.emplace(kDV, p.grad_v.data);
  }
  auto handle = vendor::dnn_handle();
  if (!handle) return handle.status();
  std::lock_guard lock(*handle->mutex);
  BARACUDA_CUDNN_TRY(cudnnSetStream(handle->handle, stream));
  try {
    BARACUDA_CUDNN_FE_TRY((*built)->graph->execute(handle->handle, pack, workspace.data));
  } catch (const std::exception& e) {
    return Status::backend("cudnn_frontend", 0, cat("cuDNN attention execute threw: ", e.what()));
  }
  return p.varlen() ? ragged_finish(p, ragged, stream) : Status::ok();
}

}  // namespace

Result<std::unique_ptr<Engine>> make_cudnn_engine(bool backward, bool deterministic) {
  BARACUDA_TRY(load_frontend());
  return std::unique_ptr<Engine>(std::make_unique<CudnnEngine>(backward, deterministic));
}

size_t cudnn_graphs_built() {
  GraphCache& cache = graph_cache();
  std::lock_guard lock(cache.mutex);
  return cache.graphs.size();
}

}  // namespace baracuda::attn

#else  // !BARACUDA_HAS_CUDNN

namespace baracuda::attn {

Result<std::unique_ptr<Engine>> make_cudnn_engine(bool, bool) {
  return unsupported("built without cuDNN (libcudnn or the cudnn_frontend headers were not found at configure time)");
}
size_t cudnn_graphs_built() { return 0; }

}  // namespace baracuda::attn

#endif
