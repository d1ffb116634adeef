// The cuDNN attention engine: every refusal names its reason (host only, no
// GPU needed), and forward and backward match the host reference on a GPU
// (GQA, causal in both alignments, Sq != Skv, sliding windows, broadcast
// additive masks, softcaps, head dims 64 and 128, [B, S, H, D] memory, lse,
// packed sequences with empty ones and queries that see no key), with every
// output poisoned with NaN before the run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention/engine.hpp"
#include "core/dtype_traits.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>

using namespace baracuda;
using namespace baracuda::attn;

namespace {

/// Contiguous [B, H, S, D] strides, or [B, S, H, D] memory seen as [B, H, S, D].
Operand dense(char* data, int64_t b, int64_t h, int64_t s, int64_t d, bool bshd = false) {
  (void)b;
  Operand o;
  o.data = data;
  o.dim = 1;
  if (bshd) o.seq = h * d, o.head = d, o.batch = s * h * d;
  else o.seq = d, o.head = s * d, o.batch = h * s * d;
  return o;
}

/// A forward problem with contiguous operands and no data (supports() never reads it).
Problem layout(DType dtype, int64_t b, int64_t hq, int64_t hk, int64_t sq, int64_t sk, int64_t d) {
  Problem p;
  p.dtype = dtype;
  p.batch = b, p.heads_q = hq, p.heads_kv = hk, p.seq_q = sq, p.seq_kv = sk, p.head_dim = d, p.value_dim = d;
  p.q = dense(nullptr, b, hq, sq, d);
  p.k = dense(nullptr, b, hk, sk, d);
  p.v = dense(nullptr, b, hk, sk, d);
  p.out = dense(nullptr, b, hq, sq, d);
  p.lse.seq = 1, p.lse.head = sq, p.lse.batch = hq * sq;
  p.scale = 1.0f / std::sqrt(float(d));
  return p;
}

/// Packed sequences ([tokens, heads, dim]) of at most sq / sk tokens, B of them.
Problem packed_layout(DType dtype, int64_t b, int64_t hq, int64_t hk, int64_t sq, int64_t sk, int64_t d) {
  static const int32_t offsets[3] = {0, 1, 2};  // never read by supports()
  Problem p = layout(dtype, b, hq, hk, sq, sk, d);
  p.cu_seqlens_q = p.cu_seqlens_kv = offsets;
  p.tokens_q = b * sq, p.tokens_kv = b * sk;
  for (Operand* o : {&p.q, &p.out}) o->batch = 0, o->seq = hq * d, o->head = d;
  for (Operand* o : {&p.k, &p.v}) o->batch = 0, o->seq = hk * d, o->head = d;
  p.lse.batch = 0, p.lse.head = p.tokens_q, p.lse.seq = 1;
  return p;
}

/// The engine as `var` (an Engine*), or skip the test when it cannot be made (built without cuDNN).
#define CUDNN_ENGINE_OR_SKIP(var, backward, deterministic)                                                  \
  auto var##_made = make_cudnn_engine(backward, deterministic);                                          \
  if (!var##_made) GTEST_SKIP() << "no cuDNN engine: " << var##_made.status().message();                  \
  const Engine* var = var##_made->get()

void expect_refused(const Engine& engine, const Problem& p, const std::string& reason) {
  const Status s = engine.supports(p);
  EXPECT_EQ(s.kind(), ErrorKind::unsupported) << "accepted; expected a refusal naming '" << reason << "'";
  EXPECT_NE(s.message().find(reason), std::string::npos) << "reason '" << s.message() << "' lacks '" << reason << "'";
}

TEST(AttentionCudnn, RefusesWithReasons) {
  CUDNN_ENGINE_OR_SKIP(fwd, false, false);
  const Problem base = layout(DType::bf16, 2, 8, 2, 64, 128, 64);
  ASSERT_TRUE(fwd->supports(base).is_ok()) << fwd->supports(base).message();

  Problem p = base;
  p.dtype = DType::f32;
  expect_refused(*fwd, p, "f16 and bf16");
  p = layout(DType::bf16, 2, 8, 2, 64, 128, 12);
  expect_refused(*fwd, p, "multiple of 8");
  p = layout(DType::bf16, 2, 8, 2, 64, 128, 264);
  expect_refused(*fwd, p, "up to 256");
  p = base;
  p.value_dim = 36;
  expect_refused(*fwd, p, "value_dim");
  p = base;
  p.q.dim = 2;
  expect_refused(*fwd, p, "dim stride 1");
  p = base;
  p.k.seq = 68;
  expect_refused(*fwd, p, "multiple of 8");
  p = base;
  p.v.data = reinterpret_cast<char*>(uintptr_t(0x1008));
  expect_refused(*fwd, p, "16-byte aligned");
  p = base;
  p.dropout_p = 0.1f;
  expect_refused(*fwd, p, "dropout");
  p = base;
  p.softcap = 30;
  p.causal = true;  // the causal rule moves into the score modifier
  EXPECT_TRUE(fwd->supports(p).is_ok()) << fwd->supports(p).message();
  p.causal = false, p.window_left = 4;
  expect_refused(*fwd, p, "softcap");
  p = base;
  const float slopes[8] = {};
  p.alibi_slopes = slopes;
  expect_refused(*fwd, p, "ALiBi");
  p = base;
  p.mask = dense(reinterpret_cast<char*>(uintptr_t(0x1000)), 2, 8, 64, 128);
  p.mask_dtype = DType::boolean;
  expect_refused(*fwd, p, "boolean mask");
  p.mask_dtype = DType::f32;
  expect_refused(*fwd, p, "dtype");
  p = packed_layout(DType::bf16, 2, 8, 2, 64, 128, 64);
  ASSERT_TRUE(fwd->supports(p).is_ok()) << fwd->supports(p).message();
  p.window_left = 16;
  EXPECT_TRUE(fwd->supports(p).is_ok()) << fwd->supports(p).message();
  p.window_left = -1, p.softcap = 30;
  expect_refused(*fwd, p, "cu_seqlens");
  p = packed_layout(DType::bf16, 2, 8, 2, 1, 1, 64);
  expect_refused(*fwd, p, "one token");
  p = layout(DType::bf16, 2, 8, 3, 64, 128, 64);
  expect_refused(*fwd, p, "divide");
  p = layout(DType::bf16, 2, 8, 2, 128, 64, 64);  // the first 64 queries sit before every key
  p.causal = p.bottom_right = true;
  expect_refused(*fwd, p, "sees no key");
  p = layout(DType::bf16, 2, 8, 2, 128, 64, 64);
  p.causal = true, p.window_left = 100;
  expect_refused(*fwd, p, "seq_q <= seq_kv");
  p = base;
  p.backward = true;
  expect_refused(*fwd, p, "forward pass");
  p = layout(DType::bf16, 0, 8, 2, 64, 128, 64);
  expect_refused(*fwd, p, "non-empty");

  CUDNN_ENGINE_OR_SKIP(bwd, true, true);
  p = base;
  expect_refused(*bwd, p, "backward pass");
  // A softcap backward: cuDNN up to 9.15 pads seq_kv % 128 != 0 with a
  // padding mask, which excludes the score modifier; later ones may take it.
  p = layout(DType::bf16, 2, 8, 2, 64, 136, 64);
  p.backward = true, p.softcap = 30;
  p.grad_out = p.grad_q = p.out, p.grad_k = p.k, p.grad_v = p.v;
  if (const Status s = bwd->supports(p); !s.is_ok()) expect_refused(*bwd, p, "multiple of 128");
  p = layout(DType::bf16, 2, 8, 2, 64, 256, 64);
  p.backward = true, p.softcap = 30;
  p.grad_out = p.grad_q = p.out, p.grad_k = p.k, p.grad_v = p.v;
  EXPECT_TRUE(bwd->supports(p).is_ok()) << bwd->supports(p).message();
  p.causal = true;  // the backward masks inside the modifier
  EXPECT_TRUE(bwd->supports(p).is_ok()) << bwd->supports(p).message();
  p.window_left = 16;
  expect_refused(*bwd, p, "softcap");
}

TEST(AttentionCudnn, AcceptsWhatItMaps) {
  CUDNN_ENGINE_OR_SKIP(fwd, false, false);
  Problem p = layout(DType::bf16, 2, 8, 2, 64, 128, 128);
  for (bool br : {false, true}) {
    p.causal = true, p.bottom_right = br;
    EXPECT_TRUE(fwd->supports(p).is_ok()) << fwd->supports(p).message();
    p.window_left = 16;
    EXPECT_TRUE(fwd->supports(p).is_ok()) << fwd->supports(p).message();
    p.window_left = -1;
  }
  p = layout(DType::f16, 1, 4, 4, 96, 96, 64);
  p.window_left = 8, p.window_right = 4;
  EXPECT_TRUE(fwd->supports(p).is_ok()) << fwd->supports(p).message();
  p.q = dense(nullptr, 1, 4, 96, 64, /*bshd=*/true);
  p.mask = dense(reinterpret_cast<char*>(uintptr_t(0x1000)), 1, 4, 96, 96);
  p.mask.batch = p.mask.head = 0;
  p.mask_dtype = DType::f16;
  EXPECT_TRUE(fwd->supports(p).is_ok()) << fwd->supports(p).message();
  p.window_left = p.window_right = -1;
  p.softcap = 30;  // a score modifier: no band beside it
  EXPECT_TRUE(fwd->supports(p).is_ok()) << fwd->supports(p).message();
}

// ---------------------------------------------------------------- GPU

struct Case {
  const char* name;
  DType dtype = DType::bf16;
  int64_t batch = 2, heads_q = 4, heads_kv = 4, seq_q = 64, seq_kv = 64, head_dim = 64;
  bool causal = false, bottom_right = false;
  int64_t window_left = -1, window_right = -1;
  bool mask = false;  ///< additive [1, 1, Sq, Skv] broadcast over batch and heads
  bool bshd = false;  ///< [B, S, H, D] memory for q, k, v, out and the gradients
  double softcap = 0;  ///< cuDNN's score modifier; scores here reach about +-1, so caps near 1 bend them
  /// Packed sequences when set: their query and key lengths (seq_q / seq_kv
  /// are then max_seqlen, at least the longest), and a token-row pad of
  /// `pad` elements a head ([T, H, D + pad] memory).
  std::vector<int64_t> lens_q = {}, lens_kv = {};
  int64_t pad = 0;
  int64_t unused_tokens = 0;  ///< packed: tokens past the last sequence, q and k alike (never written)
};

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({.name = "gqa_8_2", .heads_q = 8, .heads_kv = 2, .seq_q = 128, .seq_kv = 128});
  c.push_back({.name = "mqa_causal", .heads_q = 4, .heads_kv = 1, .seq_q = 96, .seq_kv = 96, .causal = true});
  c.push_back({.name = "causal_top_left", .seq_q = 64, .seq_kv = 136, .causal = true});
  c.push_back({.name = "causal_bottom_right", .seq_q = 64, .seq_kv = 136, .causal = true, .bottom_right = true});
  c.push_back({.name = "cross_no_mask", .seq_q = 40, .seq_kv = 200});
  c.push_back({.name = "sliding_window", .seq_q = 128, .seq_kv = 128, .causal = true, .window_left = 32});
  c.push_back({.name = "window_two_sided", .seq_q = 96, .seq_kv = 96, .window_left = 16, .window_right = 8});
  c.push_back({.name = "window_left_only", .seq_q = 80, .seq_kv = 80, .window_left = 20});
  c.push_back({.name = "window_bottom_right",
               .seq_q = 32, .seq_kv = 96, .causal = true, .bottom_right = true, .window_left = 24});
  c.push_back({.name = "mask_broadcast", .heads_q = 8, .heads_kv = 2, .seq_q = 64, .seq_kv = 128, .mask = true});
  c.push_back({.name = "mask_causal_bottom_right",
               .seq_q = 64, .seq_kv = 128, .causal = true, .bottom_right = true, .mask = true});
  c.push_back({.name = "head_dim_128", .seq_q = 128, .seq_kv = 128, .head_dim = 128, .causal = true});
  c.push_back({.name = "bshd_gqa", .heads_q = 8, .heads_kv = 2, .seq_q = 72, .seq_kv = 120, .bshd = true});
  c.push_back({.name = "f16_bshd_causal", .dtype = DType::f16, .seq_q = 64, .seq_kv = 64, .causal = true, .bshd = true});
  c.push_back({.name = "softcap_gqa", .heads_q = 8, .heads_kv = 2, .seq_q = 128, .seq_kv = 128, .softcap = 0.5});
  // seq_kv a multiple of 128: see the refusal in RefusesWithReasons.
  c.push_back({.name = "softcap_mask_d128",
               .seq_q = 40, .seq_kv = 256, .head_dim = 128, .mask = true, .softcap = 0.7});
  c.push_back({.name = "softcap_f16_bshd", .dtype = DType::f16, .seq_q = 72, .seq_kv = 128, .bshd = true, .softcap = 2});
  c.push_back({.name = "varlen_causal_gqa", .heads_q = 8, .heads_kv = 2, .seq_q = 200, .seq_kv = 200, .causal = true,
               .lens_q = {37, 128, 5, 200}, .lens_kv = {37, 128, 5, 200}});
  // Sequence 1 has keys and no queries (zero key gradients); sequence 4's
  // first 24 queries sit before every key (out 0, lse -inf).
  c.push_back({.name = "varlen_bottom_right_d128", .seq_q = 70, .seq_kv = 70, .head_dim = 128, .causal = true,
               .bottom_right = true, .lens_q = {3, 0, 70, 1, 40}, .lens_kv = {5, 4, 70, 9, 16}});
  // Sequence 1 has queries and no keys; max_seqlen above the longest; padded token rows.
  c.push_back({.name = "varlen_f16_cross_padded", .dtype = DType::f16, .seq_q = 40, .seq_kv = 48,
               .lens_q = {12, 9, 33}, .lens_kv = {40, 0, 17}, .pad = 8});
  // Windows aligned to each sequence: bottom-right causal (queries 0-9 of
  // sequence 2 see no key), and a two-sided top-left window.
  // A causal softcap: the causal rule inside the score modifier.
  c.push_back({.name = "softcap_causal_gqa", .heads_q = 8, .heads_kv = 2, .seq_q = 128, .seq_kv = 128,
               .causal = true, .softcap = 0.5});
  c.push_back({.name = "softcap_causal_bottom_right_mask_d128", .seq_q = 72, .seq_kv = 256, .head_dim = 128,
               .causal = true, .bottom_right = true, .mask = true, .softcap = 0.7});
  c.push_back({.name = "varlen_window_bottom_right", .heads_q = 8, .heads_kv = 2, .seq_q = 96, .seq_kv = 130,
               .causal = true, .bottom_right = true, .window_left = 24, .lens_q = {96, 17, 40, 1},
               .lens_kv = {130, 17, 30, 64}});
  c.push_back({.name = "varlen_window_two_sided", .seq_q = 150, .seq_kv = 150, .window_left = 20, .window_right = 7,
               .lens_q = {150, 33, 0, 64}, .lens_kv = {150, 33, 12, 90}});
  return c;
}

uint16_t to_bits(DType dtype, float v) {
  if (dtype == DType::f16) return __half_as_ushort(small_from_float<__half>(v));
  return __bfloat16_as_ushort(small_from_float<__nv_bfloat16>(v));
}
float from_bits(DType dtype, uint16_t bits) {
  if (dtype == DType::f16) return small_to_float(__ushort_as_half(bits));
  return small_to_float(__ushort_as_bfloat16(bits));
}

/// A host vector of E and its device copy.
template <class E>
struct PlainBuffer {
  std::vector<E> host;
  E* dev = nullptr;
  PlainBuffer() = default;
  PlainBuffer(const PlainBuffer&) = delete;
  ~PlainBuffer() { if (dev) cudaFree(dev); }
  void upload() {
    if (dev) cudaFree(std::exchange(dev, nullptr));
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), host.size() * sizeof(E)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size() * sizeof(E), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<E> download() const {
    std::vector<E> out(host.size());
    EXPECT_EQ(cudaMemcpy(out.data(), dev, out.size() * sizeof(E), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};
using FloatBuffer = PlainBuffer<float>;
using IntBuffer = PlainBuffer<int32_t>;

/// One [B, H, S, D]-sized half buffer (f16 or bf16 bits) on the host and its device copy.
struct Buffer : PlainBuffer<uint16_t> {
  void random(size_t n, DType dtype, std::mt19937& rng, float lo = -1, float hi = 1) {
    std::uniform_real_distribution<float> dist(lo, hi);
    host.resize(n);
    for (auto& x : host) x = to_bits(dtype, dist(rng));
  }
  void poison(size_t n) { host.assign(n, 0x7FFF); }  // NaN in f16 and bf16
  std::vector<float> download(DType dtype) const { return as_float(dtype, PlainBuffer::download()); }
  std::vector<float> values(DType dtype) const { return as_float(dtype, host); }
  static std::vector<float> as_float(DType dtype, const std::vector<uint16_t>& bits) {
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = from_bits(dtype, bits[i]);
    return out;
  }
};

/// Every element the reference wrote is written: finite where it is finite,
/// equal where it is infinite (lse -inf: a query that sees no key); NaN in
/// the reference marks memory it leaves alone (row pads), skipped. The
/// reference is not all zero, and |got - want| <= tol * (|want| + max|want|).
void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double max_ref = 0;
  for (float w : want)
    if (std::isfinite(w)) max_ref = std::max(max_ref, double(std::fabs(w)));
  EXPECT_GT(max_ref, 0) << what << ": the reference is all zero";
  size_t unwritten = 0, bad = 0, first_bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) continue;
    if (std::isinf(want[i])) {
      if (got[i] != want[i] && bad++ == 0) first_bad = i;
      continue;
    }
    if (!std::isfinite(got[i])) {
      ++unwritten;
      continue;
    }
    const double err = std::fabs(double(got[i]) - want[i]);
    worst = std::max(worst, err);
    if (err > tol * (std::fabs(want[i]) + max_ref) && bad++ == 0) first_bad = i;
  }
  EXPECT_EQ(unwritten, 0u) << what << ": elements left NaN (poisoned) or non-finite";
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements off, first at " << first_bad << " (got " << got[first_bad]
                     << ", want " << want[first_bad] << "); worst error " << worst << ", max |ref| " << max_ref;
}

class AttentionCudnnGpu : public testing::TestWithParam<Case> {};

/// The operands of one case, on the host (reference) and the device (cuDNN).
struct Operands {
  Case c;
  int64_t numel_q = 0, numel_kv = 0, numel_lse = 0;
  int64_t tokens_q = 0, tokens_kv = 0;  ///< packed sequences
  Buffer q, k, v, out, mask, grad_out, grad_q, grad_k, grad_v;
  FloatBuffer lse;
  IntBuffer cu_q, cu_kv;

  explicit Operands(const Case& cs) : c(cs) {
    if (packed()) {
      c.batch = int64_t(c.lens_q.size());
      cu_q.host = {0}, cu_kv.host = {0};
      for (int64_t b = 0; b < c.batch; ++b) {
        cu_q.host.push_back(cu_q.host.back() + int32_t(c.lens_q[b]));
        cu_kv.host.push_back(cu_kv.host.back() + int32_t(c.lens_kv[b]));
      }
      tokens_q = cu_q.host.back() + c.unused_tokens, tokens_kv = cu_kv.host.back() + c.unused_tokens;
      numel_q = tokens_q * c.heads_q * (c.head_dim + c.pad);
      numel_kv = tokens_kv * c.heads_kv * (c.head_dim + c.pad);
      numel_lse = c.heads_q * tokens_q;
      return;
    }
    numel_q = c.batch * c.heads_q * c.seq_q * c.head_dim;
    numel_kv = c.batch * c.heads_kv * c.seq_kv * c.head_dim;
    numel_lse = c.batch * c.heads_q * c.seq_q;
  }
  bool packed() const { return !c.lens_q.empty(); }

  /// An operand's view: dense, or packed [T, H, D + pad] tokens.
  Operand view(char* data, int64_t heads, int64_t seq) const {
    if (!packed()) return dense(data, c.batch, heads, seq, c.head_dim, c.bshd);
    Operand o;
    o.data = data;
    o.dim = 1, o.head = c.head_dim + c.pad, o.seq = heads * (c.head_dim + c.pad);
    return o;
  }

  /// The problem over host (`device` false) or device memory.
  Problem problem(bool device, bool backward) {
    auto at = [&](Buffer& b) { return static_cast<char*>(device ? b.dev : static_cast<void*>(b.host.data())); };
    Problem p;
    p.dtype = c.dtype;
    p.batch = c.batch, p.heads_q = c.heads_q, p.heads_kv = c.heads_kv, p.seq_q = c.seq_q, p.seq_kv = c.seq_kv;
    p.head_dim = p.value_dim = c.head_dim;
    p.q = view(at(q), c.heads_q, c.seq_q);
    p.k = view(at(k), c.heads_kv, c.seq_kv);
    p.v = view(at(v), c.heads_kv, c.seq_kv);
    p.out = view(at(out), c.heads_q, c.seq_q);
    p.lse.data = reinterpret_cast<char*>(device ? lse.dev : lse.host.data());
    p.lse.seq = 1, p.lse.head = c.seq_q, p.lse.batch = c.heads_q * c.seq_q;
    if (packed()) {
      p.cu_seqlens_q = device ? cu_q.dev : cu_q.host.data();
      p.cu_seqlens_kv = device ? cu_kv.dev : cu_kv.host.data();
      p.tokens_q = tokens_q, p.tokens_kv = tokens_kv;
      p.lse.batch = 0, p.lse.head = tokens_q;
    }
    if (c.mask) {
      p.mask.data = at(mask);
      p.mask.dim = 1, p.mask.seq = c.seq_kv, p.mask.head = 0, p.mask.batch = 0;
      p.mask_dtype = c.dtype;
    }
    p.scale = 1.0f / std::sqrt(float(c.head_dim));
    p.causal = c.causal, p.bottom_right = c.bottom_right;
    p.window_left = c.window_left, p.window_right = c.window_right;
    p.softcap = c.softcap;
    p.backward = backward;
    if (backward) {
      p.grad_out = view(at(grad_out), c.heads_q, c.seq_q);
      p.grad_q = view(at(grad_q), c.heads_q, c.seq_q);
      p.grad_k = view(at(grad_k), c.heads_kv, c.seq_kv);
      p.grad_v = view(at(grad_v), c.heads_kv, c.seq_kv);
    }
    return p;
  }

  /// Random inputs and the host forward's out and lse.
  void host_forward(std::mt19937& rng) {
    q.random(numel_q, c.dtype, rng);
    k.random(numel_kv, c.dtype, rng);
    v.random(numel_kv, c.dtype, rng);
    if (c.mask) mask.random(c.seq_q * c.seq_kv, c.dtype, rng, -2, 2);
    out.poison(numel_q);
    lse.host.assign(numel_lse, NAN);
    AttentionFn ref = host_attention().find(launch_key("attention", c.dtype));
    ASSERT_NE(ref, nullptr) << "no host reference attention:" << dtype_name(c.dtype);
    const Status s = ref(problem(false, false), Workspace{}, nullptr);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }

  /// Random grad_out and the host backward's gradients (q, k, v) of the host
  /// forward (out and lse as it left them) into `want`; the gradients are
  /// poisoned again after, ready for upload.
  void host_backward(std::mt19937& rng, std::vector<float> (&want)[3]) {
    grad_out.random(numel_q, c.dtype, rng);
    grad_q.poison(numel_q), grad_k.poison(numel_kv), grad_v.poison(numel_kv);
    AttentionFn ref = host_attention().find(launch_key("attention_backward", c.dtype));
    ASSERT_NE(ref, nullptr) << "no host reference attention_backward:" << dtype_name(c.dtype);
    const Status r = ref(problem(false, true), Workspace{}, nullptr);
    ASSERT_TRUE(r.is_ok()) << r.to_string();
    want[0] = grad_q.values(c.dtype), want[1] = grad_k.values(c.dtype), want[2] = grad_v.values(c.dtype);
    grad_q.poison(numel_q), grad_k.poison(numel_kv), grad_v.poison(numel_kv);
  }

  /// Runs the engine on the device problem with a workspace of its size.
  void run(const Engine& engine, const Problem& p) {
    const Status supported = engine.supports(p);
    ASSERT_TRUE(supported.is_ok()) << supported.to_string();
    const Status prepared = engine.prepare(p);
    ASSERT_TRUE(prepared.is_ok()) << prepared.to_string();
    const size_t bytes = engine.workspace(p);
    void* ws = nullptr;
    if (bytes) {
      ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
    }
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    const Status ran = engine.run(p, Workspace{ws, bytes}, stream);
    EXPECT_TRUE(ran.is_ok()) << ran.to_string();
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaStreamDestroy(stream);
    if (ws) cudaFree(ws);
  }
};

TEST_P(AttentionCudnnGpu, ForwardMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  CUDNN_ENGINE_OR_SKIP(engine, false, false);
  Operands s(GetParam());
  std::mt19937 rng(1234);
  ASSERT_NO_FATAL_FAILURE(s.host_forward(rng));
  const std::vector<float> want_out = s.out.values(s.c.dtype), want_lse = s.lse.host;

  s.q.upload(), s.k.upload(), s.v.upload();
  if (s.c.mask) s.mask.upload();
  if (s.packed()) s.cu_q.upload(), s.cu_kv.upload();
  s.out.poison(s.numel_q), s.out.upload();
  s.lse.host.assign(s.numel_lse, NAN), s.lse.upload();
  ASSERT_NO_FATAL_FAILURE(s.run(*engine, s.problem(true, false)));
  expect_close("out", s.out.download(s.c.dtype), want_out, 2e-2);
  expect_close("lse", s.lse.download(), want_lse, 1e-3);
}

TEST_P(AttentionCudnnGpu, BackwardMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "fast");
    CUDNN_ENGINE_OR_SKIP(engine, true, deterministic);
    Operands s(GetParam());
    std::mt19937 rng(99);
    ASSERT_NO_FATAL_FAILURE(s.host_forward(rng));
    std::vector<float> want[3];
    ASSERT_NO_FATAL_FAILURE(s.host_backward(rng, want));

    // cuDNN gets the reference's out and lse, so both sides differentiate the same forward.
    for (Buffer* b : {&s.q, &s.k, &s.v, &s.out, &s.grad_out}) b->upload();
    if (s.c.mask) s.mask.upload();
    if (s.packed()) s.cu_q.upload(), s.cu_kv.upload();
    s.lse.upload();
    s.grad_q.upload(), s.grad_k.upload(), s.grad_v.upload();
    const Problem p = s.problem(true, true);
    ASSERT_NO_FATAL_FAILURE(s.run(*engine, p));
    const std::vector<float> got_q = s.grad_q.download(s.c.dtype), got_k = s.grad_k.download(s.c.dtype),
                             got_v = s.grad_v.download(s.c.dtype);
    expect_close("grad_q", got_q, want[0], 3e-2);
    expect_close("grad_k", got_k, want[1], 3e-2);
    expect_close("grad_v", got_v, want[2], 3e-2);
    if (deterministic) {  // a second run gives the same bits (row pads stay the same NaN)
      ASSERT_NO_FATAL_FAILURE(s.run(*engine, p));
      auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      EXPECT_TRUE(same_bits(s.grad_q.download(s.c.dtype), got_q)) << "grad_q";
      EXPECT_TRUE(same_bits(s.grad_k.download(s.c.dtype), got_k)) << "grad_k";
      EXPECT_TRUE(same_bits(s.grad_v.download(s.c.dtype), got_v)) << "grad_v";
    }
  }
}

/// Offsets that are not a valid packing (sequence 1 ends before it starts,
/// sequence 2 ends past the tokens) read and write nothing: both count as
/// empty, as in the bespoke kernels, so the result equals the reference's
/// over the valid sequence alone, and rows no valid sequence holds stay
/// poisoned (compute-sanitizer runs this test too).
TEST(AttentionCudnnPacked, InvalidOffsetsStayInBounds) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Case c{.name = "invalid", .heads_q = 4, .heads_kv = 2, .seq_q = 64, .seq_kv = 64, .causal = true,
               .lens_q = {40, 0, 0}, .lens_kv = {20, 0, 0}, .unused_tokens = 24};
  const std::vector<int32_t> bad_q = {0, 40, 30, 100}, bad_kv = {0, 20, 44, 44};
  auto untouched = [](const char* what, const std::vector<float>& got, const std::vector<float>& want) {
    size_t written = 0;
    for (size_t i = 0; i < got.size(); ++i) written += std::isnan(want[i]) && !std::isnan(got[i]);
    EXPECT_EQ(written, 0u) << what << ": elements outside every valid sequence were written";
  };
  {
    CUDNN_ENGINE_OR_SKIP(engine, false, false);
    Operands s(c);
    std::mt19937 rng(5);
    ASSERT_NO_FATAL_FAILURE(s.host_forward(rng));
    const std::vector<float> want_out = s.out.values(c.dtype), want_lse = s.lse.host;
    s.cu_q.host = bad_q, s.cu_kv.host = bad_kv;
    s.q.upload(), s.k.upload(), s.v.upload(), s.cu_q.upload(), s.cu_kv.upload();
    s.out.poison(s.numel_q), s.out.upload();
    s.lse.host.assign(s.numel_lse, NAN), s.lse.upload();
    ASSERT_NO_FATAL_FAILURE(s.run(*engine, s.problem(true, false)));
    const std::vector<float> out = s.out.download(c.dtype), lse = s.lse.download();
    expect_close("out", out, want_out, 2e-2);
    expect_close("lse", lse, want_lse, 1e-3);
    untouched("out", out, want_out);
    untouched("lse", lse, want_lse);
  }
  CUDNN_ENGINE_OR_SKIP(engine, true, true);
  Operands s(c);
  std::mt19937 rng(6);
  ASSERT_NO_FATAL_FAILURE(s.host_forward(rng));
  std::vector<float> want[3];
  ASSERT_NO_FATAL_FAILURE(s.host_backward(rng, want));
  s.cu_q.host = bad_q, s.cu_kv.host = bad_kv;
  for (Buffer* b : {&s.q, &s.k, &s.v, &s.out, &s.grad_out, &s.grad_q, &s.grad_k, &s.grad_v}) b->upload();
  s.lse.upload(), s.cu_q.upload(), s.cu_kv.upload();
  ASSERT_NO_FATAL_FAILURE(s.run(*engine, s.problem(true, true)));
  const std::vector<float> got[3] = {s.grad_q.download(c.dtype), s.grad_k.download(c.dtype),
                                     s.grad_v.download(c.dtype)};
  const char* names[3] = {"grad_q", "grad_k", "grad_v"};
  for (int i = 0; i < 3; ++i) {
    expect_close(names[i], got[i], want[i], 3e-2);
    untouched(names[i], got[i], want[i]);
  }
}

/// Packings in one bucket (batch, max_seqlen and tokens rounded up to powers
/// of two) run on one cuDNN graph per direction, each against the reference;
/// a packing in another bucket builds a second pair. Engines share the cache,
/// so the counts are taken relative to the graphs built before.
TEST(AttentionCudnnPacked, PackingsInOneBucketShareAGraph) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  CUDNN_ENGINE_OR_SKIP(fwd, false, false);
  CUDNN_ENGINE_OR_SKIP(bwd, true, true);
  const Case same_bucket[] = {
      {.name = "b4_s200", .heads_q = 4, .heads_kv = 1, .seq_q = 200, .seq_kv = 200, .causal = true,
       .lens_q = {37, 128, 5, 200}, .lens_kv = {37, 128, 5, 200}},  // B4 S256 T512
      {.name = "b3_s180", .heads_q = 4, .heads_kv = 1, .seq_q = 180, .seq_kv = 180, .causal = true,
       .lens_q = {100, 180, 7}, .lens_kv = {100, 180, 7}},  // B3 -> 4, S180 -> 256, T287 -> 512
      {.name = "b4_s300", .heads_q = 4, .heads_kv = 1, .seq_q = 300, .seq_kv = 300, .causal = true,
       .lens_q = {300, 3, 90, 11}, .lens_kv = {300, 3, 90, 11}}};  // S300 -> 512: another bucket
  const size_t graphs_before = cudnn_graphs_built(), new_graphs_after[] = {2, 2, 4};  // forward + backward
  for (int i = 0; i < 3; ++i) {
    const Case& c = same_bucket[i];
    SCOPED_TRACE(c.name);
    Operands s(c);
    std::mt19937 rng(40 + i);
    ASSERT_NO_FATAL_FAILURE(s.host_forward(rng));
    const std::vector<float> want_out = s.out.values(c.dtype), want_lse = s.lse.host;
    const std::vector<uint16_t> ref_out = s.out.host;
    s.q.upload(), s.k.upload(), s.v.upload(), s.cu_q.upload(), s.cu_kv.upload();
    s.out.poison(s.numel_q), s.out.upload();
    s.lse.host.assign(s.numel_lse, NAN), s.lse.upload();
    ASSERT_NO_FATAL_FAILURE(s.run(*fwd, s.problem(true, false)));
    expect_close("out", s.out.download(c.dtype), want_out, 2e-2);
    expect_close("lse", s.lse.download(), want_lse, 1e-3);

    s.out.host = ref_out, s.lse.host = want_lse;  // the backward differentiates the reference's forward
    std::vector<float> want[3];
    ASSERT_NO_FATAL_FAILURE(s.host_backward(rng, want));
    for (Buffer* b : {&s.out, &s.grad_out, &s.grad_q, &s.grad_k, &s.grad_v}) b->upload();
    s.lse.upload();
    ASSERT_NO_FATAL_FAILURE(s.run(*bwd, s.problem(true, true)));
    expect_close("grad_q", s.grad_q.download(c.dtype), want[0], 3e-2);
    expect_close("grad_k", s.grad_k.download(c.dtype), want[1], 3e-2);
    expect_close("grad_v", s.grad_v.download(c.dtype), want[2], 3e-2);
    EXPECT_EQ(cudnn_graphs_built() - graphs_before, new_graphs_after[i]) << "graphs built";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionCudnnGpu, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace

#endif  // BARACUDA_HAS_CUDA
