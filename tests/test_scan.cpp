// Scan family: the forward ops (and cumsum_backward) through the generic sweep
// on the host and on CUDA, long chunked rows and run-to-run determinism on
// CUDA, torch's semantics, and every backward against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "baracuda/registry.hpp"
#include "harness.hpp"
#include "sweep.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime.h>
#endif

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

/// The scans the generic driver can sample: the forward ops and cumsum_backward
/// (whose saved operand is only the input).
std::vector<std::string> sampled_scans() {
  std::vector<std::string> names;
  for (const OpInfo& op : registry())
    if (op.category == OpCategory::scan && (op.direction == Direction::forward || op.name == "cumsum_backward"))
      names.push_back(op.name);
  return names;
}

class Scan : public testing::TestWithParam<std::string> {};
TEST_P(Scan, HostMatchesReference) { sweep(*find_op(GetParam()), Backend::host_reference); }
TEST_P(Scan, CudaMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  sweep(*find_op(GetParam()), Backend::bespoke_cuda);
}
INSTANTIATE_TEST_SUITE_P(Ops, Scan, testing::ValuesIn(sampled_scans()), param_name);

/// Rows long enough to be cut into chunks (reduce-then-scan), one and several rows, both layouts.
TEST(CudaScan, ChunkedRowsMatchReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const char* op : {"cumsum", "cummax", "logcumsumexp", "cumsum_backward"}) {
    // f64 and bf16 outputs: an f32 running sum over 10^6 elements drifts past the f32 tolerance (as torch's does).
    for (DType dtype : {DType::f64, DType::bf16, DType::i32}) {
      if (dtype == DType::i32 && (std::string(op) == "logcumsumexp" || std::string(op) == "cumsum_backward")) continue;
      for (const Shape& shape : {Shape{1 << 20}, Shape{3, 300001}}) {
        for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::strided}) {
          CaseSpec spec{find_op(op), dtype, shape, Attrs{}, layout};
          RunOptions opt;
          opt.backend = Backend::bespoke_cuda;
          CaseOutcome r = run_case(spec, opt);
          EXPECT_TRUE(r.passed && !r.skipped) << spec.to_string() << ": " << r.message;
        }
      }
    }
  }
}

#ifdef BARACUDA_HAS_CUDA
TEST(CudaScan, BitwiseDeterministicRunToRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const char* op : {"cumsum", "logcumsumexp"}) {
    for (const Shape& shape : {Shape{1 << 22}, Shape{64, 65536}}) {
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
      cudaFree(x);
      cudaFree(y);
      cudaFree(ws);
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
      if (op == "cumprod") x[3] = 0;  // the exact gradient through a zero
      for (auto& v : g) v = u(rng);
      const Attrs attrs{{"dim", dim}};
      auto fwd = run_scan(op, {x}, s, attrs);
      std::vector<std::vector<double>> in{g, x};
      if (op == "cumprod" || op == "logcumsumexp") in.push_back(fwd[0]);
      if (op == "cummax" || op == "cummin") in.push_back(fwd[1]);
      auto dx = run_scan(op + "_backward", in, s, attrs)[0];
      auto loss = [&](const std::vector<double>& xs) {
        auto y = run_scan(op, {xs}, s, attrs)[0];
        double l = 0;
        for (size_t i = 0; i < y.size(); ++i) l += g[i] * y[i];
        return l;
      };
      for (int i = 0; i < 10; ++i) {
        const double h = 1e-6;
        auto xp = x, xm = x;
        xp[i] += h, xm[i] -= h;
        EXPECT_NEAR(dx[i], (loss(xp) - loss(xm)) / (2 * h), 1e-5) << op << " dim " << dim << " i " << i;
      }
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
  // The gradients other than cumsum's have no CUDA kernel: select on a CUDA stream says so.
  if (cuda_available()) {
    auto plan = select(Stream::cuda(), *infer("cumprod_backward", {{DType::f32, {8}}, {DType::f32, {8}}, {DType::f32, {8}}}));
    ASSERT_FALSE(plan);
    EXPECT_NE(plan.status().message().find("no candidate accepts cumprod_backward"), std::string::npos)
        << plan.status().message();
  }
}

}  // namespace
