// The cuDNN attention engine: every refusal names its reason (host only, no
// GPU needed), and forward and backward match the host reference on a GPU
// (GQA, causal in both alignments, Sq != Skv, sliding windows, broadcast
// additive masks, softcaps, head dims 64 and 128, [B, S, H, D] memory, lse), with
// every output poisoned with NaN before the run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
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
  p.causal = true;
  expect_refused(*fwd, p, "softcap");
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
  p = base;
  const int32_t cu[3] = {0, 64, 128};
  p.cu_seqlens_q = p.cu_seqlens_kv = cu;
  expect_refused(*fwd, p, "cu_seqlens");
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

/// One [B, H, S, D]-sized half buffer on the host and its device copy.
struct Buffer {
  std::vector<uint16_t> host;
  void* dev = nullptr;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  ~Buffer() { if (dev) cudaFree(dev); }
  void random(size_t n, DType dtype, std::mt19937& rng, float lo = -1, float hi = 1) {
    std::uniform_real_distribution<float> dist(lo, hi);
    host.resize(n);
    for (auto& x : host) x = to_bits(dtype, dist(rng));
  }
  void poison(size_t n) { host.assign(n, 0x7FFF); }  // NaN in f16 and bf16
  void upload() {
    ASSERT_EQ(cudaMalloc(&dev, host.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> download(DType dtype) const {
    std::vector<uint16_t> bits(host.size());
    EXPECT_EQ(cudaMemcpy(bits.data(), dev, bits.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = from_bits(dtype, bits[i]);
    return out;
  }
  std::vector<float> values(DType dtype) const {
    std::vector<float> out(host.size());
    for (size_t i = 0; i < host.size(); ++i) out[i] = from_bits(dtype, host[i]);
    return out;
  }
};

struct FloatBuffer {
  std::vector<float> host;
  float* dev = nullptr;
  FloatBuffer() = default;
  FloatBuffer(const FloatBuffer&) = delete;
  ~FloatBuffer() { if (dev) cudaFree(dev); }
  void upload() {
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), host.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> download() const {
    std::vector<float> out(host.size());
    EXPECT_EQ(cudaMemcpy(out.data(), dev, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

/// Every element written (finite), the reference not all zero, and
/// |got - want| <= tol * (|want| + max|want|) elementwise.
void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double max_ref = 0;
  for (float w : want) max_ref = std::max(max_ref, double(std::fabs(w)));
  EXPECT_GT(max_ref, 0) << what << ": the reference is all zero";
  size_t unwritten = 0, bad = 0, first_bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
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
  Buffer q, k, v, out, mask, grad_out, grad_q, grad_k, grad_v;
  FloatBuffer lse;

  explicit Operands(const Case& cs) : c(cs) {
    numel_q = c.batch * c.heads_q * c.seq_q * c.head_dim;
    numel_kv = c.batch * c.heads_kv * c.seq_kv * c.head_dim;
    numel_lse = c.batch * c.heads_q * c.seq_q;
  }

  /// The problem over host (`device` false) or device memory.
  Problem problem(bool device, bool backward) {
    auto at = [&](Buffer& b) { return static_cast<char*>(device ? b.dev : static_cast<void*>(b.host.data())); };
    Problem p;
    p.dtype = c.dtype;
    p.batch = c.batch, p.heads_q = c.heads_q, p.heads_kv = c.heads_kv, p.seq_q = c.seq_q, p.seq_kv = c.seq_kv;
    p.head_dim = p.value_dim = c.head_dim;
    p.q = dense(at(q), c.batch, c.heads_q, c.seq_q, c.head_dim, c.bshd);
    p.k = dense(at(k), c.batch, c.heads_kv, c.seq_kv, c.head_dim, c.bshd);
    p.v = dense(at(v), c.batch, c.heads_kv, c.seq_kv, c.head_dim, c.bshd);
    p.out = dense(at(out), c.batch, c.heads_q, c.seq_q, c.head_dim, c.bshd);
    p.lse.data = reinterpret_cast<char*>(device ? lse.dev : lse.host.data());
    p.lse.seq = 1, p.lse.head = c.seq_q, p.lse.batch = c.heads_q * c.seq_q;
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
      p.grad_out = dense(at(grad_out), c.batch, c.heads_q, c.seq_q, c.head_dim, c.bshd);
      p.grad_q = dense(at(grad_q), c.batch, c.heads_q, c.seq_q, c.head_dim, c.bshd);
      p.grad_k = dense(at(grad_k), c.batch, c.heads_kv, c.seq_kv, c.head_dim, c.bshd);
      p.grad_v = dense(at(grad_v), c.batch, c.heads_kv, c.seq_kv, c.head_dim, c.bshd);
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
    s.grad_out.random(s.numel_q, s.c.dtype, rng);
    s.grad_q.poison(s.numel_q), s.grad_k.poison(s.numel_kv), s.grad_v.poison(s.numel_kv);
    AttentionFn ref = host_attention().find(launch_key("attention_backward", s.c.dtype));
    ASSERT_NE(ref, nullptr) << "no host reference attention_backward:" << dtype_name(s.c.dtype);
    const Status r = ref(s.problem(false, true), Workspace{}, nullptr);
    ASSERT_TRUE(r.is_ok()) << r.to_string();
    const std::vector<float> want_q = s.grad_q.values(s.c.dtype), want_k = s.grad_k.values(s.c.dtype),
                             want_v = s.grad_v.values(s.c.dtype);

    // cuDNN gets the reference's out and lse, so both sides differentiate the same forward.
    for (Buffer* b : {&s.q, &s.k, &s.v, &s.out, &s.grad_out}) b->upload();
    if (s.c.mask) s.mask.upload();
    s.lse.upload();
    s.grad_q.poison(s.numel_q), s.grad_k.poison(s.numel_kv), s.grad_v.poison(s.numel_kv);
    s.grad_q.upload(), s.grad_k.upload(), s.grad_v.upload();
    const Problem p = s.problem(true, true);
    ASSERT_NO_FATAL_FAILURE(s.run(*engine, p));
    const std::vector<float> got_q = s.grad_q.download(s.c.dtype), got_k = s.grad_k.download(s.c.dtype),
                             got_v = s.grad_v.download(s.c.dtype);
    expect_close("grad_q", got_q, want_q, 3e-2);
    expect_close("grad_k", got_k, want_k, 3e-2);
    expect_close("grad_v", got_v, want_v, 3e-2);
    if (deterministic) {  // a second run gives the same bits
      ASSERT_NO_FATAL_FAILURE(s.run(*engine, p));
      EXPECT_EQ(s.grad_q.download(s.c.dtype), got_q);
      EXPECT_EQ(s.grad_k.download(s.c.dtype), got_k);
      EXPECT_EQ(s.grad_v.download(s.c.dtype), got_v);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionCudnnGpu, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace

#endif  // BARACUDA_HAS_CUDA
