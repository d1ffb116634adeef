// Scan family: every op through the generic sweep on the host and on CUDA,
// long rows cut across blocks and run-to-run determinism on CUDA, torch's semantics,
// every backward against finite differences, the gradients on CUDA with
// consistent saved operands (zeros, ties, large values) against the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "baracuda/registry.hpp"
#include "core/dtype_traits.hpp"
#include "core/errors.hpp"
#include "exec.hpp"
#include "gradcheck.hpp"
#include "harness.hpp"
#include "sweep.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime.h>
#endif

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

/// Every scan: the driver draws the saved operands of the gradients at random
/// (an output in [0.5, 2], indices all 0), which they take as given.
std::vector<std::string> sampled_scans() { return ops_of(OpCategory::scan); }

BARACUDA_SWEEP_SUITE(Scan, sampled_scans());

/// Rows cut across blocks (the single-pass scan): one and several rows, awkward lengths, both layouts, every op.
TEST(CudaScan, LongRowsMatchReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto check = [](const std::string& op, DType dtype, const Shape& shape, LayoutKind layout) {
    CaseSpec spec{find_op(op), dtype, shape, Attrs{}, layout};
    RunOptions opt;
    opt.backend = Backend::bespoke_cuda;
    CaseOutcome r = run_case(spec, opt);
    EXPECT_TRUE(r.passed && !r.skipped) << spec.to_string() << ": " << r.message;
  };
  for (const std::string& op : sampled_scans()) {
    // f64 and bf16 outputs: an f32 running sum over 10^6 elements drifts past the f32 tolerance (as torch's does).
    for (DType dtype : {DType::f64, DType::bf16, DType::i32}) {
      if (dtype == DType::i32 && (op == "logcumsumexp" || op.ends_with("_backward"))) continue;
      for (const Shape& shape : {Shape{300001}, Shape{3, 100001}, Shape{70, 4097}})
        for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::strided}) check(op, dtype, shape, layout);
    }
  }
  // Past the look-back window (128 tiles of 2048 to 8192 elements): 2^21 + 3
  // elements in f64 for every op, 2^22 + 3 and three rows of 2^20 + 3 in bf16
  // for three (2^26 + 3 runs in BitwiseDeterministicRunToRun, LongChainIsExact
  // and against torch in test_rows.py).
  for (const std::string& op : sampled_scans())
    check(op, DType::f64, Shape{(int64_t(1) << 21) + 3}, LayoutKind::contiguous);
  for (const char* op : {"cumsum", "cummax", "logcumsumexp_backward"})
    for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::strided})
      for (const Shape& shape : {Shape{(int64_t(1) << 22) + 3}, Shape{3, (int64_t(1) << 20) + 3}}) check(op, DType::bf16, shape, layout);
  // Lengths a multiple of the run: the gradients' reversed views then have aligned runs too (the 16-byte
  // register path of cumsum_backward, Note [Vectorised single-pass tiles]).
  for (const char* op : {"cumsum", "cummax", "cumsum_backward"})
    for (DType dtype : {DType::f64, DType::bf16}) check(op, dtype, Shape{int64_t(1) << 22}, LayoutKind::contiguous);
}

#ifdef BARACUDA_HAS_CUDA
TEST(CudaScan, BitwiseDeterministicRunToRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string op : {"cumsum", "cumprod", "logcumsumexp"}) {
    for (const Shape& shape : {Shape{1 << 22}, Shape{64, 65536}, Shape{(int64_t(1) << 26) + 3}, Shape{1000003}}) {
      auto desc = infer(op, {{DType::f32, shape}});
      ASSERT_TRUE(desc);
      auto plan = select(Stream::cuda(), *desc);
      ASSERT_TRUE(plan) << plan.status().to_string();
      const int64_t n = desc->inputs[0].numel();
      std::vector<float> host(n), first(n), again(n);
      std::mt19937 rng(11);
      std::uniform_real_distribution<float> u(-1, 1);
      for (auto& v : host) v = u(rng);
      void *x = nullptr, *y = nullptr, *ws = nullptr;
      ASSERT_EQ(cudaMalloc(&x, n * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&y, n * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&ws, std::max<size_t>((*plan)->workspace_size(), 1)), cudaSuccess);
      cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice);
      std::array<TensorView, 1> in{*TensorView::contiguous(x, DType::f32, shape)};
      std::array<TensorView, 1> out{*TensorView::contiguous(y, DType::f32, shape)};
      const Workspace w{ws, (*plan)->workspace_size()};
      ASSERT_TRUE((*plan)->run(Stream::cuda(), w, OpArgs{in, out}));
      cudaMemcpy(first.data(), y, n * 4, cudaMemcpyDeviceToHost);
      for (int rep = 0; rep < 3; ++rep) {
        cudaMemset(y, 0xFF, n * 4);
        ASSERT_TRUE((*plan)->run(Stream::cuda(), w, OpArgs{in, out}));
        cudaMemcpy(again.data(), y, n * 4, cudaMemcpyDeviceToHost);
        EXPECT_EQ(std::memcmp(first.data(), again.data(), n * 4), 0) << op << " " << shape_str(shape);
      }
      if (op == "cumsum") {  // a new input through the same workspace (reset in the stream): exactly the negated sums
        for (auto& v : host) v = -v;
        cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice);
        ASSERT_TRUE((*plan)->run(Stream::cuda(), w, OpArgs{in, out}));
        cudaMemcpy(again.data(), y, n * 4, cudaMemcpyDeviceToHost);
        int64_t bad = 0;
        for (int64_t e = 0; e < n; ++e) bad += std::memcmp(&again[e], &(first[e] = -first[e]), 4) != 0;
        EXPECT_EQ(bad, 0) << "cumsum of the negated input " << shape_str(shape);
      }
      cudaFree(x);
      cudaFree(y);
      cudaFree(ws);
    }
  }
}

/// Rows of 16385 tiles: a chain of 128 look-back hops a row (Note
/// [Deterministic single-pass scan]); an integer cumsum over two such rows (a
/// partial last tile each) must be exact, every element.
TEST(CudaScan, LongChainIsExact) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t cols = (int64_t(1) << 26) + 3, rows = 2, n = rows * cols;  // 4096-element tiles (i64 state): 16385 a row
  auto desc = infer("cumsum", {{DType::i32, Shape{rows, cols}}});
  ASSERT_TRUE(desc);
  ASSERT_EQ(desc->outputs[0].dtype, DType::i64);
  auto plan = select(Stream::cuda(), *desc);
  ASSERT_TRUE(plan) << plan.status().to_string();
  std::vector<int32_t> host(n);
  std::mt19937 rng(3);
  for (auto& v : host) v = int32_t(rng() % 7) - 3;
  void *x = nullptr, *y = nullptr, *ws = nullptr;
  ASSERT_EQ(cudaMalloc(&x, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y, n * 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ws, std::max<size_t>((*plan)->workspace_size(), 1)), cudaSuccess);
  cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemset(y, 0xFF, n * 8);  // poisoned
  std::array<TensorView, 1> in{*TensorView::contiguous(x, DType::i32, Shape{rows, cols})};
  std::array<TensorView, 1> out{*TensorView::contiguous(y, DType::i64, Shape{rows, cols})};
  ASSERT_TRUE((*plan)->run(Stream::cuda(), Workspace{ws, (*plan)->workspace_size()}, OpArgs{in, out}));
  std::vector<int64_t> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), y, n * 8, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t bad = 0, first_bad = -1;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      sum += host[r * cols + c];
      if (got[r * cols + c] != sum && bad++ == 0) first_bad = r * cols + c;
    }
  }
  EXPECT_EQ(bad, 0) << "first wrong element " << first_bad;
  cudaFree(x);
  cudaFree(y);
  cudaFree(ws);
}

/// Sums and products of f32, bf16 and f16 rows of stride 1 stream their tiles
/// (Note [Streamed single-pass tiles]): integer-valued inputs whose running
/// sums and products stay exact in the f32 state, checked element by element
/// against exact host scans rounded once to the storage type, over rows of
/// full tiles, rows with a partial last tile, and more tiles than blocks
/// resident (every block takes several); outputs poisoned. Rows not 16-byte
/// aligned (a row stride that is not a multiple of 16 bytes: each row of
/// 100003 or 2^20 + 5 elements starts at another offset in its 16-byte word)
/// stream by 4-byte copies in f32 and by skewed 16-byte copies in the half
/// types, and store through shifted 16-byte words, checked the same way.
template <class T>
void check_streamed_rows(DType dtype) {
  const Shape shapes[] = {{7, 3 * 8192},  {3, (int64_t(1) << 20) + 8}, {(int64_t(1) << 22) + 16},
                         {2, 100003}, {4, 8196}, {3, (int64_t(1) << 20) + 5}};
  for (const std::string op : {"cumsum", "cumprod"}) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(op + " " + dtype_name(dtype) + " " + shape_str(shape));
      auto desc = infer(op, {{dtype, shape}});
      ASSERT_TRUE(desc);
      ASSERT_EQ(desc->outputs[0].dtype, dtype);
      auto plan = select(Stream::cuda(), *desc);
      ASSERT_TRUE(plan) << plan.status().to_string();
      const int64_t n = desc->inputs[0].numel(), cols = shape.back(), rows = n / cols;
      std::vector<T> host(n), got(n);
      std::mt19937 rng(17);
      for (auto& v : host) v = convert<T>(op == "cumsum" ? float(int(rng() % 7) - 3) : (rng() % 2 ? 1.f : -1.f));
      if (op == "cumprod") host[n / 2] = host[n - 1] = convert<T>(0.f);  // zeros hold to the end of their row
      void *x = nullptr, *y = nullptr, *ws = nullptr;
      ASSERT_EQ(cudaMalloc(&x, n * sizeof(T)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&y, n * sizeof(T)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&ws, std::max<size_t>((*plan)->workspace_size(), 1)), cudaSuccess);
      cudaMemcpy(x, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
      cudaMemset(y, 0xFF, n * sizeof(T));
      std::array<TensorView, 1> in{*TensorView::contiguous(x, dtype, shape)};
      std::array<TensorView, 1> out{*TensorView::contiguous(y, dtype, shape)};
      ASSERT_TRUE((*plan)->run(Stream::cuda(), Workspace{ws, (*plan)->workspace_size()}, OpArgs{in, out}));
      ASSERT_EQ(cudaMemcpy(got.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
      int64_t bad = 0, first_bad = -1;
      for (int64_t r = 0; r < rows; ++r) {
        double acc = op == "cumsum" ? 0 : 1;
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t e = r * cols + c;
          acc = op == "cumsum" ? acc + double(widen(host[e])) : acc * double(widen(host[e]));
          const T want = convert<T>(float(acc));  // |acc| < 2^24: exact in f32, rounded once
          if (std::memcmp(&got[e], &want, sizeof(T)) != 0 && bad++ == 0) first_bad = e;
        }
      }
      EXPECT_EQ(bad, 0) << "first wrong element " << first_bad << " of " << n;
      cudaFree(x);
      cudaFree(y);
      cudaFree(ws);
    }
  }
}

TEST(CudaScan, StreamedRowsAreExact) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  check_streamed_rows<float>(DType::f32);
  check_streamed_rows<__nv_bfloat16>(DType::bf16);
  check_streamed_rows<__half>(DType::f16);
}

/// Rows whose start is not 16-byte aligned (views from element 1 of a buffer,
/// for the input, the outputs or both) take the single-pass kernel's scalar
/// path and must give the bits the vectorised path gives for the same values
/// at aligned addresses (Note [Vectorised single-pass tiles]).
TEST(CudaScan, MisalignedRowsMatchAlignedBitwise) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string op : {"cumsum", "cumprod", "cummax", "logcumsumexp"}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Shape shape{(int64_t(1) << 21) + 5};  // past the look-back window, a partial last tile
      auto desc = infer(op, {{dtype, shape}});
      ASSERT_TRUE(desc);
      auto plan = select(Stream::cuda(), *desc);
      ASSERT_TRUE(plan) << plan.status().to_string();
      const int64_t n = desc->inputs[0].numel();
      const size_t es = dtype_size(dtype);
      std::vector<char> host(n * es);
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> u(op == "cumprod" ? 0.999f : -1.f, op == "cumprod" ? 1.001f : 1.f);
      for (int64_t e = 0; e < n; ++e) {
        const float f = u(rng);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        if (dtype == DType::bf16) {
          const uint16_t h = uint16_t(bits >> 16);
          std::memcpy(host.data() + e * 2, &h, 2);
        } else {
          std::memcpy(host.data() + e * 4, &bits, 4);
        }
      }
      // Element offsets of the input and of the outputs: aligned first, then shifts within a 16-byte word
      // (cumsum and cumprod: f32 inputs at +1 copy in 4-byte copies, bf16 ones in skewed 16-byte copies; outputs
      // at any shift take the shifted 16-byte stores).
      const int offsets[7][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {0, 3}, {3, 2}};
      constexpr int kPad = 3;  // elements the offsets need past n
      std::vector<std::vector<std::vector<char>>> results;
      void* ws = nullptr;
      ASSERT_EQ(cudaMalloc(&ws, std::max<size_t>((*plan)->workspace_size(), 1)), cudaSuccess);
      for (const auto& o : offsets) {
        char* x = nullptr;
        ASSERT_EQ(cudaMalloc(&x, (n + kPad) * es), cudaSuccess);
        cudaMemcpy(x + o[0] * es, host.data(), n * es, cudaMemcpyHostToDevice);
        std::array<TensorView, 1> in{*TensorView::contiguous(x + o[0] * es, dtype, shape)};
        std::vector<char*> ys;
        std::vector<TensorView> out;
        for (const auto& spec : desc->outputs) {
          const size_t os = dtype_size(spec.dtype);
          char* y = nullptr;
          ASSERT_EQ(cudaMalloc(&y, (n + kPad) * os), cudaSuccess);
          cudaMemset(y, 0xFF, (n + kPad) * os);
          ys.push_back(y);
          out.push_back(*TensorView::contiguous(y + o[1] * os, spec.dtype, spec.shape));
        }
        const Workspace w{ws, (*plan)->workspace_size()};
        ASSERT_TRUE((*plan)->run(Stream::cuda(), w, OpArgs{in, out}));
        results.emplace_back();
        for (size_t k = 0; k < ys.size(); ++k) {
          const size_t os = dtype_size(desc->outputs[k].dtype);
          std::vector<char> whole((n + kPad) * os);
          cudaMemcpy(whole.data(), ys[k], whole.size(), cudaMemcpyDeviceToHost);
          cudaFree(ys[k]);
          const size_t first = o[1] * os, last = first + n * os;  // the output's bytes
          for (size_t b = 0; b < whole.size(); ++b) {
            if (b < first || b >= last) {
              ASSERT_EQ(uint8_t(whole[b]), 0xFF) << op << " " << dtype_name(dtype) << " output " << k << " at +" << o[1]
                                                 << ": byte " << b << " outside the output was written";
            }
          }
          results.back().emplace_back(whole.begin() + first, whole.begin() + last);
        }
        cudaFree(x);
      }
      cudaFree(ws);
      for (size_t c = 1; c < results.size(); ++c)
        for (size_t k = 0; k < results[c].size(); ++k)
          EXPECT_TRUE(results[c][k] == results[0][k])
              << op << " " << dtype_name(dtype) << " output " << k << ": input at +" << offsets[c][0] << ", outputs at +"
              << offsets[c][1] << " differ from the aligned run";
    }
  }
}
#endif

/// Runs a scan op on the host over contiguous operands (f64 values, i64 indices).
std::vector<std::vector<double>> run_scan(const std::string& op, const std::vector<std::vector<double>>& inputs,
                                          const Shape& shape, const Attrs& attrs = {}) {
  const OpInfo& info = *find_op(op);
  std::vector<TensorSpec> specs;
  std::vector<std::vector<int64_t>> index_storage;
  std::vector<TensorView> in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool index = info.input_names[i] == "indices";
    specs.push_back({index ? DType::i64 : DType::f64, shape});
    if (index) {
      index_storage.emplace_back(inputs[i].begin(), inputs[i].end());
      in.push_back(*TensorView::contiguous(index_storage.back().data(), DType::i64, shape));
    } else {
      in.push_back(*TensorView::contiguous(const_cast<double*>(inputs[i].data()), DType::f64, shape));
    }
  }
  auto desc = infer(op, specs, attrs);
  EXPECT_TRUE(desc) << desc.status().to_string();
  if (!desc) return {};
  std::vector<std::vector<char>> bytes;
  std::vector<TensorView> out;
  for (const auto& o : desc->outputs) {
    bytes.emplace_back(std::max<int64_t>(o.numel(), 1) * dtype_size(o.dtype));
    out.push_back(*TensorView::contiguous(bytes.back().data(), o.dtype, o.shape));
  }
  Status s = run_op(Stream::host(), op, in, out, attrs);
  EXPECT_TRUE(s) << s.to_string();
  std::vector<std::vector<double>> result;
  for (size_t j = 0; j < out.size(); ++j) {
    result.emplace_back();
    for (int64_t e = 0; e < desc->outputs[j].numel(); ++e) result.back().push_back(load_double(bytes[j].data(), out[j].dtype, e));
  }
  return result;
}

TEST(ScanKnownValues, TorchSemantics) {
  const Shape s{2, 3};
  const std::vector<double> x{1, 2, 3, 4, 5, 6};
  EXPECT_EQ(run_scan("cumsum", {x}, s)[0], (std::vector<double>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(run_scan("cumsum", {x}, s, {{"dim", 0}})[0], (std::vector<double>{1, 2, 3, 5, 7, 9}));
  EXPECT_EQ(run_scan("cumprod", {x}, s)[0], (std::vector<double>{1, 2, 6, 4, 20, 120}));
  auto l = run_scan("logcumsumexp", {x}, s)[0];
  EXPECT_NEAR(l[2], std::log(std::exp(1) + std::exp(2) + std::exp(3)), 1e-12);
  // cummax: ties move to the later index; NaN sticks, a later NaN takes its index.
  auto m = run_scan("cummax", {{1, 3, 3, 2}}, {4});
  EXPECT_EQ(m[0], (std::vector<double>{1, 3, 3, 3}));
  EXPECT_EQ(m[1], (std::vector<double>{0, 1, 2, 2}));
  auto n = run_scan("cummin", {{2, NAN, 0, NAN}}, {4});
  EXPECT_TRUE(std::isnan(n[0][1]) && std::isnan(n[0][2]));
  EXPECT_EQ(n[1], (std::vector<double>{0, 1, 1, 3}));
  // Integer inputs accumulate in i64.
  auto d = infer("cumsum", {{DType::i32, {4}}});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->outputs[0].dtype, DType::i64);
}

TEST(ScanFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<double> u(0.5, 2);
  const Shape s{2, 5};
  for (const char* name : {"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"}) {
    for (double dim : {-1.0, 0.0}) {
      const std::string op = name;
      std::vector<double> x(10), g(10);
      for (auto& v : x) v = u(rng) * (u(rng) < 1.2 ? -1 : 1);
      if (op == "cumprod") x[3] = 0, x[dim == 0 ? 8 : 1] = 0;  // the exact gradient through two zeros on an axis
      for (auto& v : g) v = u(rng);
      const Attrs attrs{{"dim", dim}};
      auto fwd = run_scan(op, {x}, s, attrs);
      std::vector<std::vector<double>> in{g, x};
      if (op == "cumprod" || op == "logcumsumexp") in.push_back(fwd[0]);
      if (op == "cummax" || op == "cummin") in.push_back(fwd[1]);
      auto dx = run_scan(op + "_backward", in, s, attrs)[0];
      auto loss = [&](const std::vector<double>& xs) { return weighted_sum(g, run_scan(op, {xs}, s, attrs)[0]); };
      for (int i = 0; i < 10; ++i)
        EXPECT_NEAR(dx[i], central_difference(loss, x, i), 1e-5) << op << " dim " << dim << " i " << i;
    }
  }
}

TEST(ScanErrors, BadInputIsNamed) {
  auto d = infer("cumsum", {{DType::f32, {2, 3}}}, {{"dim", 2}});
  ASSERT_FALSE(d);
  EXPECT_NE(d.status().message().find("dim 2 is out of range for rank 2"), std::string::npos);
  // Indices that a running extreme cannot have: an error, never a stray write.
  std::vector<double> g{1, 1, 1}, x{1, 2, 3}, bad_idx{0, 2, 1};
  std::vector<int64_t> idx(bad_idx.begin(), bad_idx.end());
  const Shape s{3};
  std::vector<double> dx(3);
  TensorView in[3] = {*TensorView::contiguous(g.data(), DType::f64, s), *TensorView::contiguous(x.data(), DType::f64, s),
                      *TensorView::contiguous(idx.data(), DType::i64, s)};
  TensorView out = *TensorView::contiguous(dx.data(), DType::f64, s);
  Status st = run_op(Stream::host(), "cummax_backward", in, std::span(&out, 1));
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("'indices' holds 2 at position 1"), std::string::npos) << st.message();
  // Indices that decrease, or point at a position that does not hold itself.
  for (const auto& [bad, want] : std::vector<std::pair<std::vector<double>, std::string>>{
           {{0, 1, 0}, "'indices' decreases from 1 to 0 at position 2"},
           {{0, 0, 1}, "'indices' holds 1 at position 2 but 0 at position 1"}}) {
    auto r = exec(Backend::host_reference, "cummax_backward",
                  {{g, s, DType::f32}, {x, s, DType::f32}, {bad, s, DType::i64}});
    ASSERT_FALSE(r);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  }
  // Saved operands of the wrong dtype or shape name the operand, expected vs given.
  auto e = infer("cummax_backward", {{DType::f32, {2, 3}}, {DType::f32, {2, 3}}, {DType::i32, {2, 3}}});
  ASSERT_FALSE(e);
  EXPECT_NE(e.status().message().find("'indices' must be i64[2, 3], got i32[2, 3]"), std::string::npos)
      << e.status().message();
  e = infer("cumprod_backward", {{DType::f32, {2, 3}}, {DType::f32, {2, 3}}, {DType::f32, {2, 4}}});
  ASSERT_FALSE(e);
  EXPECT_NE(e.status().message().find("'output' must be f32[2, 3], got f32[2, 4]"), std::string::npos)
      << e.status().message();
  e = infer("logcumsumexp_backward", {{DType::f32, {2, 3}}, {DType::bf16, {2, 3}}, {DType::f32, {2, 3}}});
  ASSERT_FALSE(e);
  EXPECT_NE(e.status().message().find("'grad_output' must be bf16[2, 3], got f32[2, 3]"), std::string::npos)
      << e.status().message();
  // On CUDA grad_input may be in place over grad_output only.
  if (cuda_available()) {
    auto desc = infer("cumprod_backward", {{DType::f32, {8}}, {DType::f32, {8}}, {DType::f32, {8}}});
    ASSERT_TRUE(desc);
    PlanPreference pref;
    pref.backend = Backend::bespoke_cuda;
    auto plan = select(Stream::cuda(), *desc, pref);
    ASSERT_TRUE(plan) << plan.status().to_string();
    auto mem = Memory::device(3 * 8 * sizeof(float));
    ASSERT_TRUE(mem);
    float* base = static_cast<float*>(mem->data());
    const Shape s8{8};
    std::array<TensorView, 3> ins{*TensorView::contiguous(base, DType::f32, s8),
                                  *TensorView::contiguous(base + 8, DType::f32, s8),
                                  *TensorView::contiguous(base + 16, DType::f32, s8)};
    std::array<TensorView, 1> outs{ins[0]};
    EXPECT_TRUE((*plan)->can_implement(OpArgs{ins, outs}));
    outs[0] = ins[1];
    Status c = (*plan)->can_implement(OpArgs{ins, outs});
    ASSERT_FALSE(c);
    EXPECT_NE(c.message().find("'grad_input' overlaps 'input'"), std::string::npos) << c.message();
  }
  e = infer("cummin_backward", {{DType::f32, {2, 3}}, {DType::f32, {2, 3}}});
  ASSERT_FALSE(e);
  EXPECT_NE(e.status().message().find("expected 3 inputs, got 2"), std::string::npos) << e.status().message();
}

/// Gradients with their closed forms: cumprod through zeros (one, two,
/// three per row) against the product formula, cummax/cummin through ties.
TEST(ScanKnownValues, GradientsThroughZerosAndTies) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1.5, 1.5);
  const int64_t n = 9;
  for (int zeros = 0; zeros <= 3; ++zeros) {
    std::vector<double> x(n), g(n);
    for (auto& v : x) v = u(rng);
    for (auto& v : g) v = u(rng);
    for (int z = 0; z < zeros; ++z) x[std::uniform_int_distribution<int64_t>(0, n - 1)(rng)] = 0;
    const auto out = run_scan("cumprod", {x}, {n})[0];
    const auto dx = run_scan("cumprod_backward", {g, x, out}, {n})[0];
    for (int64_t i = 0; i < n; ++i) {  // sum_{j >= i} g_j prod_{k <= j, k != i} x_k
      double want = 0;
      for (int64_t j = i; j < n; ++j) {
        double p = 1;
        for (int64_t k = 0; k <= j; ++k)
          if (k != i) p *= x[k];
        want += g[j] * p;
      }
      EXPECT_NEAR(dx[i], want, 1e-12) << zeros << " zeros, i " << i;
    }
  }
  // Ties: the gradient goes to the index torch keeps (the later one).
  const std::vector<double> x{1, 3, 3, 2, 3}, g{1, 10, 100, 1000, 10000};
  auto m = run_scan("cummax", {x}, {5});
  EXPECT_EQ(run_scan("cummax_backward", {g, x, m[1]}, {5})[0], (std::vector<double>{1, 10, 1100, 0, 10000}));
  m = run_scan("cummin", {x}, {5});
  EXPECT_EQ(run_scan("cummin_backward", {g, x, m[1]}, {5})[0], (std::vector<double>{11111, 0, 0, 0, 0}));
  // logcumsumexp far from 0: exp(x) alone would overflow in f64.
  const std::vector<double> big{1000, 1001, 999};
  auto y = run_scan("logcumsumexp", {big}, {3})[0];
  auto dl = run_scan("logcumsumexp_backward", {{1, 1, 1}, big, y}, {3})[0];
  // sum_j exp(x_i - y_j) for the three outputs.
  for (int i = 0; i < 3; ++i) {
    double want = 0;
    for (int j = i; j < 3; ++j) want += std::exp(big[i] - y[j]);
    EXPECT_NEAR(dl[i], want, 1e-12) << i;
  }
}

/// The gradients on CUDA from consistent saved operands (the host forward of
/// the same rounded input): cumprod with zeros, cummax/cummin with ties,
/// logcumsumexp with a row far from 0; short, tiled and chunked rows, both
/// axes; against the host reference in f64, relative to the largest value;
/// bitwise equal from run to run.
TEST(CudaScan, GradientsMatchHostWithSavedOperands) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> u(-1, 1);
  for (const char* name : {"cumprod", "logcumsumexp", "cummax", "cummin"}) {
    const std::string op = name;
    for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      for (const Shape& shape : {Shape{5, 37}, Shape{300, 20}, Shape{4, 3000}, Shape{2, 70001}}) {
        for (double dim : {-1.0, 0.0}) {
          const int64_t count = numel(shape);
          std::vector<double> x(count), g(count);
          for (int64_t e = 0; e < count; ++e) {
            g[e] = u(rng);
            if (op == "cumprod") x[e] = (u(rng) < 0 ? -1 : 1) * std::exp(0.01 * u(rng));  // products stay in f16's range
            else if (op == "logcumsumexp") x[e] = 3 * u(rng) + (e < shape[1] ? 500 : 0);  // row 0 far from 0
            else x[e] = std::round(3 * u(rng));  // ties
          }
          if (op == "cumprod")
            for (int64_t e = count / 11; e < count; e += 1 + count / 7) x[e] = 0;  // zeros, several per axis
          auto rounded = [&](std::vector<double> v) {  // what a dtype tensor holds
            std::vector<char> b(dtype_size(dtype));
            for (auto& e : v) store_double(b.data(), dtype, 0, e), e = load_double(b.data(), dtype, 0);
            return v;
          };
          x = rounded(x), g = rounded(g);
          const Attrs attrs{{"dim", dim}};
          auto fwd = exec(Backend::host_reference, op, {{x, shape, DType::f64}}, attrs);
          ASSERT_TRUE(fwd) << fwd.status().to_string();
          const bool extreme = op == "cummax" || op == "cummin";
          std::vector<Operand> in{{g, shape, dtype}, {x, shape, dtype},
                                  extreme ? Operand{(*fwd)[1], shape, DType::i64} : Operand{rounded((*fwd)[0]), shape, dtype}};
          auto got = exec(Backend::bespoke_cuda, op + "_backward", in, attrs);
          ASSERT_TRUE(got) << got.status().to_string();
          auto again = exec(Backend::bespoke_cuda, op + "_backward", in, attrs);  // bitwise run to run
          ASSERT_TRUE(again) << again.status().to_string();
          EXPECT_EQ(std::memcmp((*got)[0].data(), (*again)[0].data(), count * sizeof(double)), 0) << op << " rerun";
          for (auto& o : in) o.dtype = o.dtype == DType::i64 ? o.dtype : DType::f64;
          auto want = exec(Backend::host_reference, op + "_backward", in, attrs);
          ASSERT_TRUE(want) << want.status().to_string();
          double scale = 0, worst = 0;
          for (double v : (*want)[0]) scale = std::max(scale, std::abs(v));
          for (int64_t e = 0; e < count; ++e) {  // NaN (an unwritten output) counts as worst
            const double d = std::abs((*got)[0][e] - (*want)[0][e]);
            if (!(d <= worst)) worst = d;
          }
          const Tolerance tol = tolerance_for(dtype, 8);
          EXPECT_LE(worst, tol.rtol * scale + tol.atol)
              << op << "_backward " << dtype_name(dtype) << shape_str(shape) << " dim " << dim << " (scale " << scale << ")";
          EXPECT_GT(scale, 0) << op;
        }
      }
    }
  }
}

}  // namespace
