// decode_attention: the generic sweep on every candidate; cuDNN asked for
// by name on contiguous caches; paged and
// contiguous caches against a softmax written out here over gathered pages
// (awkward sizes, shuffled tables, mixed lengths with 0, softcap, window,
// GQA groups, non-contiguous q/out/lse, poisoned outputs); determinism;
// exact workspaces; bad input named; bad table entries and lengths never
// read out of bounds on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "attention/decode.hpp"
#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "exec.hpp"
#include "harness.hpp"
#include "sweep.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
#endif

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

constexpr const char* kOp = "decode_attention";

TEST(Decode, HostMatchesReference) { sweep(*find_op(kOp), Backend::host_reference); }
TEST(Decode, BespokeCudaMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  sweep(*find_op(kOp), Backend::bespoke_cuda);
}
/// cuDNN declines paged caches, softcaps, windows, forced splits and odd
/// head dims: those samples are skipped; some must run.
TEST(Decode, CudnnSweepMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  OpInfo halves = *find_op(kOp);
  halves.dtypes = {DType::f16, DType::bf16};
  sweep(halves, Backend::cudnn);
}

/// One decode problem in logical row-major f64 (values already rounded to
/// the dtype), with its caches paged (block_size > 0) or contiguous.
struct Case {
  DType dtype = DType::f32;
  int64_t batch = 1, heads_q = 1, heads_kv = 1, dim = 8, value_dim = 8;
  int64_t block_size = 0;  ///< 0: per-sequence caches of s_max keys
  int64_t num_blocks = 0, max_blocks = 0, s_max = 0;
  std::vector<int32_t> lens, table;
  std::vector<double> q, k, v;
  Attrs attrs;
  Shape q_shape() const { return {batch, heads_q, dim}; }
  Shape k_shape() const { return block_size ? Shape{num_blocks, block_size, heads_kv, dim} : Shape{batch, s_max, heads_kv, dim}; }
  Shape v_shape() const { Shape s = k_shape(); s[3] = value_dim; return s; }
  Shape table_shape() const { return block_size ? Shape{batch, max_blocks} : Shape{0}; }
};

double rounded(DType t, double x) {
  alignas(16) char buf[16];
  store_double(buf, t, 0, x);
  return load_double(buf, t, 0);
}

/// Random values; each sequence's blocks are distinct and shuffled over the
/// cache, table entries past a sequence's length are out of range (never read).
Case make_case(std::mt19937& rng, DType dtype, int64_t heads_q, int64_t heads_kv, int64_t dim, int64_t value_dim,
               int64_t block_size, std::vector<int32_t> lens, Attrs attrs = {}) {
  Case c;
  c.dtype = dtype, c.batch = int64_t(lens.size()), c.heads_q = heads_q, c.heads_kv = heads_kv;
  c.dim = dim, c.value_dim = value_dim, c.block_size = block_size, c.lens = lens, c.attrs = attrs;
  const int64_t longest = *std::max_element(lens.begin(), lens.end());
  if (block_size) {
    c.max_blocks = (longest + block_size - 1) / block_size + 1;
    int64_t used = 0;
    for (int32_t len : lens) used += (len + block_size - 1) / block_size;
    c.num_blocks = used + 3;
    std::vector<int32_t> perm(size_t(c.num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    c.table.assign(size_t(c.batch * c.max_blocks), 1 << 30);
    size_t next = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < (lens[b] + block_size - 1) / block_size; ++i) c.table[b * c.max_blocks + i] = perm[next++];
  } else {
    c.s_max = longest + 3;
  }
  std::uniform_real_distribution<double> u(-2, 2);
  auto fill = [&](std::vector<double>& x, int64_t n) {
    x.resize(size_t(n));
    for (auto& e : x) e = rounded(dtype, u(rng));
  };
  fill(c.q, numel(c.q_shape()));
  fill(c.k, numel(c.k_shape()));
  fill(c.v, numel(c.v_shape()));
  return c;
}

struct Outputs {
  std::vector<double> out, lse;
};

/// The softmax written out over the gathered keys of each sequence; keys in
/// out-of-range blocks are skipped when `mask_bad` (what the GPU promises).
Outputs reference(const Case& c, bool mask_bad = false) {
  const double scale0 = c.attrs.get("scale", 0), softcap = c.attrs.get("softcap", 0);
  const double scale = scale0 != 0 ? scale0 : 1 / std::sqrt(double(c.dim));
  const int64_t window = int64_t(c.attrs.get("window_left", -1)), group = c.heads_q / c.heads_kv;
  const Shape ks = c.k_shape();
  Outputs r;
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t len = c.lens[b];
    if (mask_bad) len = std::clamp<int64_t>(len, 0, c.block_size ? c.max_blocks * c.block_size : c.s_max);
    for (int64_t h = 0; h < c.heads_q; ++h) {
      std::vector<double> s, w;
      std::vector<int64_t> rows;  // flat [block, row] index of each key
      for (int64_t j = window >= 0 ? std::max<int64_t>(0, len - 1 - window) : 0; j < len; ++j) {
        const int64_t blk = c.block_size ? c.table[b * c.max_blocks + j / c.block_size] : b;
        const int64_t row = c.block_size ? j % c.block_size : j;
        if (blk < 0 || blk >= ks[0]) continue;
        rows.push_back(blk * ks[1] + row);
        double dot = 0;
        for (int64_t d = 0; d < c.dim; ++d)
          dot += c.q[(b * c.heads_q + h) * c.dim + d] * c.k[(rows.back() * c.heads_kv + h / group) * c.dim + d];
        dot *= scale;
        s.push_back(softcap > 0 ? softcap * std::tanh(dot / softcap) : dot);
      }
      const double top = s.empty() ? 0 : *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double x : s) w.push_back(std::exp(x - top)), sum += w.back();
      for (int64_t d = 0; d < c.value_dim; ++d) {
        double acc = 0;
        for (size_t i = 0; i < rows.size(); ++i) acc += w[i] * c.v[(rows[i] * c.heads_kv + h / group) * c.value_dim + d];
        r.out.push_back(s.empty() ? 0 : acc / sum);
      }
      r.lse.push_back(s.empty() ? -INFINITY : top + std::log(sum));
    }
  }
  return r;
}

Shape row_major(const Shape& s) {
  Shape st(s.size());
  int64_t step = 1;
  for (size_t d = s.size(); d-- > 0;) st[d] = step, step *= std::max<int64_t>(s[d], 1);
  return st;
}

/// A buffer on the host or the device holding a view; every element of the
/// buffer is NaN (floats) or `poison` (ints) except the view's values.
struct Placed {
  Memory memory;
  TensorView view;
  int64_t span = 0;
  std::vector<int64_t> offsets;  // of each logical element
};

Result<Placed> place(bool device, DType dtype, const Shape& shape, Shape strides, const std::vector<double>* values) {
  if (strides.empty()) strides = row_major(shape);
  Placed p;
  int64_t hi = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 0) hi += (shape[d] - 1) * strides[d];
  p.span = numel(shape) > 0 ? hi + 1 : 0;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < numel(shape); ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    p.offsets.push_back(off);
    for (size_t d = shape.size(); d-- > 0;)
      if (++idx[d] < shape[d]) break;
      else idx[d] = 0;
  }
  Memory host = Memory::host(size_t(std::max<int64_t>(p.span, 1)) * dtype_size(dtype));
  for (int64_t e = 0; e < p.span; ++e) store_double(host.data(), dtype, e, is_floating(dtype) ? NAN : -7);
  if (values)
    for (size_t i = 0; i < p.offsets.size(); ++i) store_double(host.data(), dtype, p.offsets[i], (*values)[i]);
  p.memory = std::move(host);
#ifdef BARACUDA_HAS_CUDA
  if (device) {
    auto m = Memory::device(p.memory.bytes());
    if (!m) return m.status();
    cudaMemcpy(m->data(), p.memory.data(), p.memory.bytes(), cudaMemcpyHostToDevice);
    p.memory = std::move(*m);
  }
#else
  (void)device;
#endif
  p.view = *TensorView::strided(p.memory.data(), dtype, shape, strides);
  return p;
}

std::vector<double> fetch(const Placed& p, DType dtype, bool whole = false) {
  Memory host = Memory::host(p.memory.bytes());
#ifdef BARACUDA_HAS_CUDA
  if (p.memory.on_device()) cudaMemcpy(host.data(), p.memory.data(), p.memory.bytes(), cudaMemcpyDeviceToHost);
  else
#endif
    std::memcpy(host.data(), p.memory.data(), p.memory.bytes());
  std::vector<double> v;
  if (whole)
    for (int64_t e = 0; e < p.span; ++e) v.push_back(load_double(host.data(), dtype, e));
  else
    for (int64_t off : p.offsets) v.push_back(load_double(host.data(), dtype, off));
  return v;
}

/// Views of a run: strides of q, k/v, out and lse (empty: row-major).
struct Views {
  Shape q, k, v, out, lse;
};

struct RunResult {
  Outputs got;
  std::vector<double> out_buffer;  ///< the whole output buffer (padding included)
  size_t workspace = 0;
};

Result<RunResult> run(Backend backend, const Case& c, const Views& views = {}) {
  const bool device = backend != Backend::host_reference;
  const Stream stream = device ? Stream::cuda() : Stream::host();
  const std::vector<double> table(c.table.begin(), c.table.end()), lens(c.lens.begin(), c.lens.end());
  std::vector<TensorSpec> specs{{c.dtype, c.q_shape()}, {c.dtype, c.k_shape()}, {c.dtype, c.v_shape()},
                                {DType::i32, c.table_shape()}, {DType::i32, {c.batch}}};
  PlanPreference pref;
  pref.backend = backend;
  auto plan = select(stream, OpDesc{kOp, specs, {}, c.attrs}, pref);
  if (!plan) return plan.status();
  const OpDesc& d = (*plan)->desc();
  std::vector<Placed> in, out;
  const std::pair<const std::vector<double>*, Shape> ins[] = {
      {&c.q, views.q}, {&c.k, views.k}, {&c.v, views.v}, {&table, {}}, {&lens, {}}};
  for (size_t i = 0; i < 5; ++i) {
    auto p = place(device, d.inputs[i].dtype, d.inputs[i].shape, ins[i].second, ins[i].first);
    if (!p) return p.status();
    in.push_back(std::move(*p));
  }
  for (size_t j = 0; j < 2; ++j) {
    auto p = place(device, d.outputs[j].dtype, d.outputs[j].shape, j == 0 ? views.out : views.lse, nullptr);
    if (!p) return p.status();
    out.push_back(std::move(*p));
  }
  std::vector<TensorView> vin, vout;
  for (auto& p : in) vin.push_back(p.view);
  for (auto& p : out) vout.push_back(p.view);
  RunResult r;
  r.workspace = (*plan)->workspace_size();
  Memory ws = Memory::host(r.workspace);
#ifdef BARACUDA_HAS_CUDA
  if (device) {
    auto m = Memory::device(r.workspace);
    if (!m) return m.status();
    cudaMemset(m->data(), 0xFF, r.workspace);  // NaN patterns: every partial must be written
    ws = std::move(*m);
  }
#endif
  const OpArgs args{vin, vout};
  BARACUDA_TRY((*plan)->can_implement(args));
  BARACUDA_TRY((*plan)->run(stream, Workspace{ws.data(), ws.bytes()}, args));
#ifdef BARACUDA_HAS_CUDA
  if (device)
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
      return internal_error("kernel failed: ", cudaGetErrorString(e));
#endif
  r.got.out = fetch(out[0], d.outputs[0].dtype);
  r.got.lse = fetch(out[1], d.outputs[1].dtype);
  r.out_buffer = fetch(out[0], d.outputs[0].dtype, true);
  return r;
}

double tolerance(DType t) {
  switch (t) {
    case DType::f64: return 1e-11;
    case DType::f32: return 2e-5;
    case DType::f16: return 2e-3;
    default: return 1.6e-2;
  }
}

void expect_close(const Outputs& got, const Outputs& want, DType dtype, const std::string& what) {
  ASSERT_EQ(got.out.size(), want.out.size()) << what;
  ASSERT_EQ(got.lse.size(), want.lse.size()) << what;
  const double tol = tolerance(dtype), lse_tol = dtype == DType::f64 ? 1e-11 : 2e-5;
  int bad = 0;
  for (size_t i = 0; i < want.out.size() && bad < 5; ++i)
    if (!(std::abs(got.out[i] - want.out[i]) <= tol * (1 + std::abs(want.out[i]))))
      ++bad, ADD_FAILURE() << what << ": out[" << i << "] = " << got.out[i] << ", expected " << want.out[i];
  for (size_t i = 0; i < want.lse.size() && bad < 5; ++i) {
    const bool ok = std::isinf(want.lse[i]) ? got.lse[i] == want.lse[i]
                                            : std::abs(got.lse[i] - want.lse[i]) <= lse_tol * (1 + std::abs(want.lse[i]));
    if (!ok) ++bad, ADD_FAILURE() << what << ": lse[" << i << "] = " << got.lse[i] << ", expected " << want.lse[i];
  }
}

/// An empty sequence's rows: lse exactly -inf and out exactly 0.
void expect_empty_sequences_exact(const Outputs& got, const Case& c, const std::string& what) {
  for (int64_t b = 0; b < c.batch; ++b)
    if (c.lens[size_t(b)] == 0)
      for (int64_t h = 0; h < c.heads_q; ++h) {
        EXPECT_EQ(got.lse[size_t(b * c.heads_q + h)], -INFINITY) << what;
        for (int64_t d = 0; d < c.value_dim; ++d)
          EXPECT_EQ(got.out[size_t((b * c.heads_q + h) * c.value_dim + d)], 0.0) << what;
      }
}

std::string describe(const Case& c, Backend backend) {
  std::string s = cat(backend_name(backend), " ", dtype_name(c.dtype), " Hq ", c.heads_q, " Hkv ", c.heads_kv, " D ",
                      c.dim, " Dv ", c.value_dim, c.block_size ? cat(" block_size ", c.block_size) : std::string(" contiguous"),
                      " lens");
  for (int32_t l : c.lens) s += cat(" ", l);
  for (const auto& [k, v] : c.attrs.values()) s += cat(" ", k, "=", v);
  return s;
}

struct Config {
  int64_t heads_q, heads_kv, dim, value_dim, block_size;
  std::vector<int32_t> lens;
};

/// Awkward sizes: seq_len 1, lengths off the block size, block sizes 1, 3,
/// 8, 16, 32 and 64 (the tensor-core kernel copies a step's rows from one
/// block when the block size is a multiple of its step, 16 keys at D 128 and
/// 32 at D 64, and row by row otherwise), D 40/64/128/17, groups 1, 4, 5, 8,
/// 16 and 20 (two head chunks of the tensor-core kernel, the second
/// partial), an empty sequence, a thousand keys.
const std::vector<Config>& configs() {
  static const std::vector<Config> all = {
      {4, 1, 40, 40, 16, {1, 0, 37}},          {8, 8, 64, 64, 1, {5, 16, 0, 33}},
      {8, 1, 128, 128, 16, {100, 17}},         {4, 4, 128, 128, 16, {1}},
      {8, 2, 64, 64, 0, {50, 1, 23}},          {5, 1, 40, 24, 3, {29, 2}},
      {32, 8, 128, 128, 16, {300, 0, 129}},    {2, 1, 17, 9, 0, {7, 0}},
      {40, 2, 128, 128, 16, {200, 65}},        {16, 1, 64, 64, 32, {1000, 517}},
      {8, 2, 128, 128, 8, {70, 33}},           {16, 4, 64, 64, 16, {300, 47}},
      {32, 8, 128, 128, 64, {500, 129}},
  };
  return all;
}

const std::vector<Attrs>& attr_sets() {
  static const std::vector<Attrs> all = {Attrs{}, Attrs{{"softcap", 3}}, Attrs{{"window_left", 4}},
                                         Attrs{{"scale", 0.5}, {"num_splits", 4}},
                                         Attrs{{"window_left", 0}, {"num_splits", 2}}};
  return all;
}

TEST(DecodeReference, PagedAndContiguousCaches) {
  std::mt19937 rng(5);
  for (Backend backend : host_and_cuda_backends()) {
    const std::vector<DType> dtypes = backend == Backend::host_reference
                                          ? std::vector<DType>{DType::f64, DType::bf16}
                                          : std::vector<DType>{DType::bf16, DType::f16, DType::f32, DType::f64};
    for (DType dtype : dtypes)
      for (const Config& cf : configs())
        for (const Attrs& attrs : attr_sets()) {
          const Case c = make_case(rng, dtype, cf.heads_q, cf.heads_kv, cf.dim, cf.value_dim, cf.block_size, cf.lens, attrs);
          const std::string what = describe(c, backend);
          auto r = run(backend, c);
          ASSERT_TRUE(r) << what << ": " << r.status().to_string();
          const Outputs want = reference(c);
          expect_close(r->got, want, dtype, what);
          expect_empty_sequences_exact(r->got, c, what);
        }
  }
}

/// q with heads and dims swapped in memory, out with padded rows, lse
/// column-major: results as for dense views, and
/// the padding of out's buffer is left untouched (still NaN).
TEST(DecodeReference, NonContiguousViews) {
  std::mt19937 rng(9);
  for (Backend backend : host_and_cuda_backends())
    for (DType dtype : {DType::bf16, DType::f32}) {
      const Case c = make_case(rng, dtype, 8, 2, 64, 64, 16, {40, 3, 18});
      Views views;
      views.q = {64 * 8, 1, 8};                      // [B, D, Hq] in memory
      views.out = {8 * 72, 72, 1};                   // rows padded to 72
      views.lse = {1, c.batch};                      // column-major
      auto r = run(backend, c, views);
      ASSERT_TRUE(r) << r.status().to_string();
      expect_close(r->got, reference(c), dtype, describe(c, backend) + " non-contiguous");
      for (int64_t row = 0; row < c.batch * 8; ++row)
        for (int64_t pad = 64; pad < 72 && row * 72 + pad < int64_t(r->out_buffer.size()); ++pad)
          EXPECT_TRUE(std::isnan(r->out_buffer[size_t(row * 72 + pad)])) << "padding written at row " << row;
    }
}

/// torch's [B, Hkv, S, D] caches passed as permuted [B, S, Hkv, D] views.
TEST(DecodeReference, TorchLayoutCaches) {
  std::mt19937 rng(13);
  for (Backend backend : host_and_cuda_backends()) {
    const Case c = make_case(rng, DType::bf16, 8, 2, 128, 128, 0, {61, 200});
    const int64_t s = c.s_max, d = c.dim, hkv = c.heads_kv;
    Views views;
    views.k = views.v = {hkv * s * d, d, s * d, 1};
    auto r = run(backend, c, views);
    ASSERT_TRUE(r) << r.status().to_string();
    expect_close(r->got, reference(c), c.dtype, describe(c, backend) + " torch layout");
  }
}

/// Two runs give the same bits; a long cache is split (a workspace) and
/// still matches the reference.
TEST(Decode, DeterministicAndSplit) {
  std::mt19937 rng(17);
  for (Backend backend : host_and_cuda_backends()) {
    const Case c = make_case(rng, DType::bf16, 8, 2, 128, 128, 16, {3000, 1, 2047});
    auto a = run(backend, c), b = run(backend, c);
    ASSERT_TRUE(a && b) << (a ? b.status() : a.status()).to_string();
    EXPECT_EQ(std::memcmp(a->got.out.data(), b->got.out.data(), a->got.out.size() * sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(a->got.lse.data(), b->got.lse.data(), a->got.lse.size() * sizeof(double)), 0);
    expect_close(a->got, reference(c), c.dtype, describe(c, backend));
    if (backend == Backend::bespoke_cuda) {
      EXPECT_GT(a->workspace, 0u) << "a 3000-key cache should be split";
    }
  }
}

/// NaN in every K and V row no query may see: past each length (the rest of
/// its last block, the unused blocks, a contiguous cache's tail) and before
/// a window's first key. Such rows weigh nothing, not even 0 * NaN: the
/// GPU kernels copy whole steps (TMA) or zero-fill masked rows (cp.async).
void poison_unseen_rows(Case& c, int64_t window_left) {
  const int64_t rows = c.block_size ? c.num_blocks * c.block_size : c.batch * c.s_max;
  std::vector<bool> seen(size_t(rows), false);
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t len = c.lens[size_t(b)], lo = window_left < 0 ? 0 : std::max<int64_t>(0, len - 1 - window_left);
    for (int64_t j = lo; j < len; ++j)
      seen[size_t(c.block_size ? c.table[size_t(b * c.max_blocks + j / c.block_size)] * c.block_size + j % c.block_size
                               : b * c.s_max + j)] = true;
  }
  const int64_t k_row = c.heads_kv * c.dim, v_row = c.heads_kv * c.value_dim;
  for (int64_t row = 0; row < rows; ++row)
    if (!seen[size_t(row)]) {
      std::fill_n(c.k.begin() + row * k_row, k_row, NAN);
      std::fill_n(c.v.begin() + row * v_row, v_row, NAN);
    }
}

TEST(Decode, UnseenCacheRowsCarryNoWeight) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(29);
  const Config shapes[] = {{32, 8, 128, 128, 16, {300, 47, 129}}, {16, 4, 64, 64, 32, {300, 47, 129}},
                           {8, 2, 128, 128, 64, {300, 47, 129}},  {8, 2, 64, 64, 0, {300, 47, 129}},
                           {32, 8, 128, 128, 0, {1000, 1, 77}},   {8, 1, 128, 128, 24, {100, 33}}};
  const Attrs attr_list[] = {Attrs{}, Attrs{{"num_splits", 3}}, Attrs{{"window_left", 20}, {"num_splits", 2}}};
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Config& s : shapes)
      for (const Attrs& attrs : attr_list) {
        Case c = make_case(rng, dtype, s.heads_q, s.heads_kv, s.dim, s.value_dim, s.block_size, s.lens, attrs);
        poison_unseen_rows(c, attrs.has("window_left") ? 20 : -1);
        auto r = run(Backend::bespoke_cuda, c);
        ASSERT_TRUE(r) << r.status().to_string();
        expect_close(r->got, reference(c), dtype, describe(c, Backend::bespoke_cuda) + " NaN in unseen rows");
      }
}

/// The tensor-core kernel over 2 to 40 forced splits (up to 38 partials a
/// row for the combine) and 64 sequences (512 units): each against the
/// reference and repeated for the same bits, with splits that see no key
/// (short and empty sequences), NaN in every unseen cache row, and 32 query
/// heads a kv head (two chunks of 16).
TEST(Decode, ManySplitsAndChunksMatchTheReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(41);
  std::vector<int32_t> many(64);
  for (size_t i = 0; i < many.size(); ++i) many[i] = int32_t(40 + 37 * i % 300);
  const Config shapes[] = {{32, 8, 128, 128, 0, {4000, 1, 0, 2500}}, {64, 2, 64, 64, 16, {3000, 700}},
                           {32, 8, 128, 128, 32, many}};
  for (const Config& s : shapes)
    for (int splits : {2, 7, 16, 17, 40}) {
      if (s.lens.size() == 64 && splits != 2) continue;
      Case c = make_case(rng, DType::bf16, s.heads_q, s.heads_kv, s.dim, s.value_dim, s.block_size, s.lens,
                         Attrs{{"num_splits", splits}});
      poison_unseen_rows(c, -1);
      auto a = run(Backend::bespoke_cuda, c), b = run(Backend::bespoke_cuda, c);
      ASSERT_TRUE(a && b) << (a ? b.status() : a.status()).to_string();
      const std::string what = describe(c, Backend::bespoke_cuda) + " " + std::to_string(splits) + " splits";
      expect_close(a->got, reference(c), DType::bf16, what);
      EXPECT_EQ(std::memcmp(a->got.out.data(), b->got.out.data(), a->got.out.size() * sizeof(double)), 0) << what;
      EXPECT_EQ(std::memcmp(a->got.lse.data(), b->got.lse.data(), a->got.lse.size() * sizeof(double)), 0) << what;
    }
}

/// cuDNN's fused attention on contiguous caches (Note [Decode on cuDNN]),
/// asked for by name: GQA groups 1-8, head dims 40-256 (Dv apart from D),
/// empty sequences (out 0, lse -inf: cuDNN's padding mask leaves their rows
/// to the padding-lengths kernel), NaN in every cache row past a length,
/// torch's permuted caches, out rows padded (the padding stays NaN), a
/// column-major lse, lengths past the capacity or negative (clamped). Its
/// lse is not bitwise reproducible at long lengths (two runs of 4100 keys
/// differed in the last bits on an H100): each run matches the reference,
/// and the plan says it is not deterministic.
TEST(Decode, CudnnMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  const Config shapes[] = {{8, 2, 64, 64, 0, {50, 1, 23}},     {32, 8, 128, 128, 0, {1000, 0, 77}},
                           {4, 1, 40, 40, 0, {7, 130}},         {16, 16, 128, 128, 0, {300}},
                           {8, 1, 256, 256, 0, {129, 0, 2}},    {8, 2, 64, 32, 0, {33, 7}},
                           {32, 8, 128, 128, 0, {4100, 2047}}};
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Config& s : shapes) {
      Case c = make_case(rng, dtype, s.heads_q, s.heads_kv, s.dim, s.value_dim, 0, s.lens);
      poison_unseen_rows(c, -1);
      const std::string what = describe(c, Backend::cudnn);
      auto a = run(Backend::cudnn, c);
      ASSERT_TRUE(a) << what << ": " << a.status().to_string();
      expect_close(a->got, reference(c), dtype, what);
      expect_empty_sequences_exact(a->got, c, what);
      auto again = run(Backend::cudnn, c);
      ASSERT_TRUE(again) << again.status().to_string();
      expect_close(again->got, reference(c), dtype, what + " (again)");
    }
  // torch's [B, Hkv, S, D] caches as permuted views, out rows padded to Dv + 8, lse column-major.
  for (DType dtype : {DType::bf16, DType::f16}) {
    Case c = make_case(rng, dtype, 16, 4, 128, 128, 0, {61, 0, 200});
    poison_unseen_rows(c, -1);
    const int64_t s = c.s_max, d = c.dim, hkv = c.heads_kv, pitch = c.value_dim + 8;
    Views views;
    views.k = views.v = {hkv * s * d, d, s * d, 1};
    views.out = {c.heads_q * pitch, pitch, 1};
    views.lse = {1, c.batch};
    auto r = run(Backend::cudnn, c, views);
    ASSERT_TRUE(r) << r.status().to_string();
    expect_close(r->got, reference(c), dtype, describe(c, Backend::cudnn) + " torch layout, padded out");
    for (int64_t row = 0; row < c.batch * c.heads_q; ++row)
      for (int64_t pad = c.value_dim; pad < pitch && row * pitch + pad < int64_t(r->out_buffer.size()); ++pad)
        EXPECT_TRUE(std::isnan(r->out_buffer[size_t(row * pitch + pad)])) << "padding written at row " << row;
  }
  // Lengths past the capacity read the whole cache; negative ones none.
  Case c = make_case(rng, DType::bf16, 8, 2, 128, 128, 0, {90, 33, 50});
  c.lens[1] = -5;
  c.lens[2] = int32_t(c.s_max + 4000);
  auto r = run(Backend::cudnn, c);
  ASSERT_TRUE(r) << r.status().to_string();
  expect_close(r->got, reference(c, true), c.dtype, describe(c, Backend::cudnn) + " clamped lengths");
}

/// What cuDNN declines names the reason; the split kernels serve it. The
/// automatic choice is the split kernels; cuDNN is the next candidate, and
/// a preference for determinism refuses it.
TEST(Decode, CudnnDeclinesWhatTheSplitKernelsServe) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<TensorSpec> specs{{DType::bf16, {2, 32, 128}}, {DType::bf16, {2, 4096, 8, 128}},
                                      {DType::bf16, {2, 4096, 8, 128}}, {DType::i32, {0}}, {DType::i32, {2}}};
  const OpDesc desc{kOp, specs, {}, {}};
  EXPECT_EQ(check(select(Stream::cuda(), desc))->sku().backend, Backend::bespoke_cuda);
  PlanPreference next;
  next.skip_candidates = 1;
  auto second = check(select(Stream::cuda(), desc, next));
  EXPECT_EQ(second->sku().backend, Backend::cudnn);
  EXPECT_FALSE(second->precision_guarantee().deterministic);
  PlanPreference strict;
  strict.backend = Backend::cudnn;
  strict.deterministic_only = true;
  auto refused = select(Stream::cuda(), desc, strict);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("not deterministic"), std::string::npos) << refused.status().message();
  std::mt19937 rng(37);
  const Case paged = make_case(rng, DType::bf16, 8, 2, 64, 64, 16, {40, 3});
  const Case wide = make_case(rng, DType::f32, 8, 2, 64, 64, 0, {40, 3});
  Case capped = make_case(rng, DType::bf16, 8, 2, 64, 64, 0, {40, 3});
  capped.attrs = Attrs{{"softcap", 5}};
  Case windowed = capped;
  windowed.attrs = Attrs{{"window_left", 4}};
  const std::pair<const Case*, const char*> cases[] = {
      {&paged, "paged caches"}, {&wide, "f16 and bf16 only"}, {&capped, "'softcap'"}, {&windowed, "'window_left'"}};
  for (const auto& [c, reason] : cases) {
    auto r = run(Backend::cudnn, *c);
    ASSERT_FALSE(r) << reason;
    EXPECT_NE(r.status().message().find(reason), std::string::npos) << r.status().message();
    EXPECT_TRUE(run(Backend::bespoke_cuda, *c)) << reason;
  }
}

/// The workspace is exact: split rows of Dv + 1 f32 values, none for short caches or the host.
TEST(Decode, WorkspaceIsExact) {
  auto plan_for = [](const Stream& stream, Backend backend, int64_t keys, Attrs attrs) {
    const int64_t blocks = keys / 16;
    std::vector<TensorSpec> specs{{DType::bf16, {2, 32, 128}}, {DType::bf16, {blocks * 2, 16, 8, 128}},
                                  {DType::bf16, {blocks * 2, 16, 8, 128}}, {DType::i32, {2, blocks}}, {DType::i32, {2}}};
    PlanPreference pref;
    pref.backend = backend;
    return check(select(stream, OpDesc{kOp, specs, {}, attrs}, pref));
  };
  EXPECT_EQ(plan_for(Stream::host(), Backend::host_reference, 32768, {})->workspace_size(), 0u);
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(plan_for(Stream::cuda(), Backend::bespoke_cuda, 128, {})->workspace_size(), 0u);
  const size_t row = 2 * 32 * 129 * sizeof(float);
  // 4096 keys in 5 splits: ceil(4096 / 5) = 820 rounds up to 832 keys a split.
  EXPECT_EQ(plan_for(Stream::cuda(), Backend::bespoke_cuda, 4096, {{"num_splits", 5}})->workspace_size(), 5 * row);
  const size_t auto_ws = plan_for(Stream::cuda(), Backend::bespoke_cuda, 32768, {})->workspace_size();
  EXPECT_GT(auto_ws, row);
  EXPECT_EQ(auto_ws % row, 0u);
}

/// Auto splits (tensor-core kernel, 32K keys, Hq 32 / Hkv 8): a contiguous
/// cache's CTAs fill one slot an SM; a paged cache's two once the sequences
/// and kv heads alone make 16 CTAs (B8) where two fit an SM, one at B1
/// (choose_splits).
TEST(Decode, AutoSplitsFillTheDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
#ifdef BARACUDA_HAS_CUDA
  const int64_t sms = current_sm_count(), keys = 32768;
  // The split kernel's 96 KiB CTAs: two an SM on Hopper (228 KiB), one where
  // an SM holds less (A100 164 KiB, sm_89 100 KiB).
  const int fit = attn::decode_tc_resident_ctas(128);
  ASSERT_GE(fit, 1) << "the occupancy query failed";
  EXPECT_EQ(attn::decode_tc_resident_ctas(64), fit);
  if (current_sm_version() == 90) {
    EXPECT_EQ(fit, 2);
  }
  auto splits = [&](int64_t batch, bool paged) {
    const int64_t blocks = keys / 16;
    const Shape cache = paged ? Shape{batch * blocks, 16, 8, 128} : Shape{batch, keys, 8, 128};
    std::vector<TensorSpec> specs{{DType::bf16, {batch, 32, 128}}, {DType::bf16, cache}, {DType::bf16, cache},
                                  {DType::i32, paged ? Shape{batch, blocks} : Shape{0}}, {DType::i32, {batch}}};
    PlanPreference pref;
    pref.backend = Backend::bespoke_cuda;
    const size_t row = size_t(batch * 32 * 129) * sizeof(float);  // a split's rows: Dv + 1 floats each
    const size_t ws = check(select(Stream::cuda(), OpDesc{kOp, specs, {}, {}}, pref))->workspace_size();
    EXPECT_EQ(ws % row, 0u);
    return int64_t(ws / row);
  };
  for (int64_t batch : {1, 8}) {
    const int64_t ctas = batch * 8, contiguous = splits(batch, false), paged = splits(batch, true);
    EXPECT_LE(contiguous * ctas, sms) << "B" << batch << " contiguous";
    EXPECT_GT((contiguous + 1) * ctas, sms) << "B" << batch << " contiguous";
    const int64_t per_sm = batch == 1 ? 1 : std::min(2, fit);
    EXPECT_LE(paged * ctas, per_sm * sms) << "B" << batch << " paged";
    EXPECT_GT((paged + 1) * ctas, per_sm * sms) << "B" << batch << " paged";
  }
#endif
}

/// Short caches (B1, Hkv 8, D 128, contiguous): up to 256 keys unsplit;
/// longer ones in splits of at least 64 keys, as many as one wave of the
/// device's slots holds (choose_splits).
TEST(Decode, ShortCachesSplitDownToOneStepAWarp) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
#ifdef BARACUDA_HAS_CUDA
  const int64_t sms = current_sm_count();
  auto splits = [](int64_t keys) {
    std::vector<TensorSpec> specs{{DType::bf16, {1, 32, 128}}, {DType::bf16, {1, keys, 8, 128}},
                                  {DType::bf16, {1, keys, 8, 128}}, {DType::i32, {0}}, {DType::i32, {1}}};
    PlanPreference pref;
    pref.backend = Backend::bespoke_cuda;
    const size_t row = size_t(32 * 129) * sizeof(float);
    const size_t ws = check(select(Stream::cuda(), OpDesc{kOp, specs, {}, {}}, pref))->workspace_size();
    EXPECT_EQ(ws % row, 0u);
    return int64_t(ws / row);
  };
  EXPECT_EQ(splits(200), 0) << "unsplit: no workspace";
  EXPECT_EQ(splits(256), 0) << "unsplit: no workspace";
  for (int64_t keys : {512, 1024, 2048}) {
    const int64_t n = splits(keys);
    EXPECT_LE(n * 64, keys) << keys << " keys: splits of 64 keys or more";
    EXPECT_LE(n * 8, sms) << keys << " keys: one wave";
    EXPECT_TRUE(n * 64 == keys || (n + 1) * 8 > sms) << keys << " keys: " << n << " splits leave a wave's slots free";
  }
#endif
}

TEST(DecodeErrors, BadInputIsNamed) {
  auto message = [](std::vector<TensorSpec> in, const Attrs& attrs = {}) {
    auto r = infer(kOp, std::move(in), attrs);
    return error_message(r);
  };
  const DType h = DType::bf16, i = DType::i32;
  const TensorSpec q{h, {2, 8, 64}}, k{h, {10, 16, 2, 64}}, table{i, {2, 4}}, lens{i, {2}};
  EXPECT_EQ(message({q, k, k, table, lens}), "(no error)");
  std::string m = message({{h, {2, 6, 64}}, {h, {10, 16, 4, 64}}, {h, {10, 16, 4, 64}}, table, lens});
  EXPECT_TRUE(has(m, "Hq = 6") && has(m, "Hkv = 4")) << m;
  m = message({q, k, k, {i, {2, 4, 1}}, lens});
  EXPECT_TRUE(has(m, "'block_table' must be [B, max_blocks]")) << m;
  m = message({q, k, k, {DType::i64, {2, 4}}, lens});
  EXPECT_TRUE(has(m, "'block_table' dtype i64, expected i32")) << m;
  m = message({q, {h, {10, 16, 2, 32}}, {h, {10, 16, 2, 32}}, table, lens});
  EXPECT_TRUE(has(m, "'k_cache' head dim 32 != 'q' head dim 64")) << m;
  m = message({q, k, k, table, {i, {3}}});
  EXPECT_TRUE(has(m, "'seq_lens' must be [B] = [2], got shape [3]")) << m;
  m = message({q, k, k, table, {DType::i64, {2}}});
  EXPECT_TRUE(has(m, "'seq_lens' dtype i64, expected i32")) << m;
  m = message({q, k, {DType::f16, {10, 16, 2, 64}}, table, lens});
  EXPECT_TRUE(has(m, "'v_cache' dtype f16, expected bf16")) << m;
  m = message({q, k, {h, {10, 8, 2, 64}}, table, lens});
  EXPECT_TRUE(has(m, "'v_cache' [10, 8, 2, 64] and 'k_cache' [10, 16, 2, 64]")) << m;
  m = message({q, k, k, {i, {3, 4}}, lens});
  EXPECT_TRUE(has(m, "'block_table' has 3 rows, expected B = 2")) << m;
  m = message({q, {h, {3, 16, 2, 64}}, {h, {3, 16, 2, 64}}, {i, {0}}, lens});
  EXPECT_TRUE(has(m, "without a block table 'k_cache' must be [B, S_max, Hkv, D] with B = 2")) << m;
  m = message({q, k, k, table, lens}, {{"num_splits", 2.5}});
  EXPECT_TRUE(has(m, "'num_splits' must be")) << m;
  m = message({q, k, k, table, lens}, {{"window_left", -3}});
  EXPECT_TRUE(has(m, "'window_left' must be")) << m;
  m = message({q, k, k, table, lens}, {{"softcap", -1}});
  EXPECT_TRUE(has(m, "'softcap' must be >= 0")) << m;
  m = message({{DType::i8, {2, 8, 64}}, k, k, table, lens});
  EXPECT_TRUE(has(m, "dtype i8 is not supported")) << m;
}

/// The host reference names the sequence and the bad value.
TEST(DecodeErrors, HostNamesBadTableEntryAndLength) {
  std::mt19937 rng(21);
  Case c = make_case(rng, DType::f32, 4, 2, 64, 64, 16, {40, 20});
  Case bad_entry = c;
  bad_entry.table[1 * c.max_blocks + 1] = int32_t(c.num_blocks + 5);  // sequence 1 reads block column 1
  auto r = run(Backend::host_reference, bad_entry);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find(cat("block_table[1, 1] = ", c.num_blocks + 5, " is out of range [0, ", c.num_blocks, ")")),
            std::string::npos) << r.status().message();
  Case negative = c;
  negative.table[0] = -2;
  r = run(Backend::host_reference, negative);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("block_table[0, 0] = -2"), std::string::npos) << r.status().message();
  Case too_long = c;
  too_long.lens[0] = int32_t(c.max_blocks * 16 + 1);
  r = run(Backend::host_reference, too_long);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find(cat("seq_lens[0] = ", c.max_blocks * 16 + 1, " is outside [0, ", c.max_blocks * 16, "]")),
            std::string::npos) << r.status().message();
  // Entries past a sequence's length (out of range in every case here) are never read.
  EXPECT_TRUE(run(Backend::host_reference, c));
}

/// On the GPU bad entries and lengths never fault: their keys are masked
/// (lengths clamp to the capacity) and the kernel finishes cleanly.
TEST(DecodeErrors, CudaMasksBadTableEntriesAndLengths) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  for (DType dtype : {DType::bf16, DType::f32}) {
    Case c = make_case(rng, dtype, 8, 2, 128, 128, 16, {90, 33, 50});
    c.table[0 * c.max_blocks + 2] = int32_t(c.num_blocks + 1000);
    c.table[1 * c.max_blocks + 0] = -5;
    c.lens[2] = int32_t(c.max_blocks * 16 + 4000);  // beyond the capacity: the whole table row is read
    for (int64_t i = 0; i < c.max_blocks; ++i)
      if (c.table[2 * c.max_blocks + i] >= c.num_blocks) c.table[2 * c.max_blocks + i] = int32_t(i % c.num_blocks);
    for (const Attrs& attrs : {Attrs{}, Attrs{{"num_splits", 3}}}) {
      c.attrs = attrs;
      auto r = run(Backend::bespoke_cuda, c);
      ASSERT_TRUE(r) << r.status().to_string();
      expect_close(r->got, reference(c, true), dtype, describe(c, Backend::bespoke_cuda) + " masked");
    }
  }
}

}  // namespace
