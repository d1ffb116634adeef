// grouped_mm beyond the generic sweep (test_gemm.cpp sweeps every gemm-category
// op): exact small-integer products of the four forms written out here,
// empty groups, rows past the last group, sizes that are not tile multiples,
// misaligned group starts, K- and N-contiguous b, on every candidate (the
// CUTLASS one on sm_90); gradients against finite differences; the CUDA
// backward against the host's; CUDA graph capture; how CUTLASS sees a
// problem (host); bad input. Then grouped_gemm, the list of products with
// their own M, N and K, the same way (exact products on every candidate,
// beta, finite differences, graph capture, bad input).
#include <gtest/gtest.h>

#include <random>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "exec.hpp"
#include "gemm/grouped.hpp"
#include "harness.hpp"

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

std::vector<double> as_doubles(const std::vector<int>& v) { return std::vector<double>(v.begin(), v.end()); }

/// The product of one form written out: rows (a [M, K], b [G, K, N]), batch
/// (a [G, M, K], b [G, K, N]), red (a [M, K], b [K, N], K split) or cols (a
/// [G, M, K], b [K, N], N split) from logical row-major values.
std::vector<double> reference(const std::vector<Shape>& shapes, const std::vector<double>& a,
                              const std::vector<double>& b, const std::vector<int>& offs) {
  const Shape &sa = shapes[0], &sb = shapes[1];
  std::vector<double> out;
  if (sa.size() == 2 && sb.size() == 3) {  // rows
    const int64_t M = sa[0], K = sa[1], G = sb[0], N = sb[2];
    out.assign(M * N, 0);
    for (int64_t g = 0, start = 0; g < G; start = offs[g], ++g)
      for (int64_t m = start; m < offs[g]; ++m)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) out[m * N + n] += a[m * K + k] * b[(g * K + k) * N + n];
  } else if (sa.size() == 3 && sb.size() == 2) {  // cols
    const int64_t G = sa[0], M = sa[1], K = sa[2], N = sb[1];
    out.assign(M * N, 0);
    for (int64_t g = 0, start = 0; g < G; start = offs[g], ++g)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = start; n < offs[g]; ++n)
          for (int64_t k = 0; k < K; ++k) out[m * N + n] += a[(g * M + m) * K + k] * b[k * N + n];
  } else if (sa.size() == 3) {  // batch
    const int64_t G = sa[0], M = sa[1], K = sa[2], N = sb[2];
    out.assign(G * M * N, 0);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) out[(g * M + m) * N + n] += a[(g * M + m) * K + k] * b[(g * K + k) * N + n];
  } else {  // red
    const int64_t M = sa[0], K = sa[1], N = sb[1], G = int64_t(offs.size());
    out.assign(G * M * N, 0);
    for (int64_t g = 0, start = 0; g < G; start = offs[g], ++g)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = start; k < offs[g]; ++k) out[(g * M + m) * N + n] += a[m * K + k] * b[k * N + n];
  }
  return out;
}

/// Strides of b stored transposed: [G, K, N] over memory [G, N, K] (K-contiguous, the usual weight).
Shape k_contiguous(const Shape& sb) {
  if (sb.size() == 3) return {sb[1] * sb[2], 1, sb[1]};
  return {1, sb[0]};
}

struct Case {
  std::string name;
  std::vector<Shape> shapes;  // a, b
  std::vector<int> offs;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // Empty first and middle groups, rows 30..36 past the last group; K an odd multiple of 8.
      {"rows small", {{37, 24}, {4, 24, 45}}, {0, 10, 10, 30}},
      // Bigger than a 128 x 128 tile, group edges inside tiles, N not a multiple of 8.
      {"rows tiles", {{300, 40}, {3, 40, 137}}, {100, 100, 257}},
      {"rows one group all rows", {{130, 16}, {1, 16, 130}}, {130}},
      {"batch", {{3, 5, 7}, {3, 7, 9}}, {}},
      {"batch tiles", {{2, 131, 40}, {2, 40, 129}}, {}},
      // K split with an empty group and the last K columns in none.
      {"red", {{6, 29}, {29, 10}}, {5, 5, 20, 27}},
      {"red tiles", {{130, 40}, {40, 140}}, {3, 33, 40}},
      // 3D x 2D: columns split by offs, columns 40..44 past the last group.
      {"cols small", {{3, 5, 24}, {24, 45}}, {7, 7, 40}},
      {"cols tiles", {{2, 130, 40}, {40, 300}}, {100, 257}},
      // Sizes CUTLASS takes (16-byte leading dims): M not a tile multiple, empty
      // groups, starts on and off 16-byte boundaries (offs over a contiguous dim).
      {"rows aligned", {{300, 64}, {3, 64, 136}}, {100, 100, 257}},
      {"batch aligned", {{3, 130, 64}, {3, 64, 264}}, {}},
      // (Groups of at most 64 K: |sums| <= 256, exact in bf16.)
      {"red aligned", {{72, 200}, {200, 136}}, {3, 64, 64, 120}},
      {"red aligned starts", {{72, 200}, {200, 136}}, {16, 64, 64, 128}},
      {"cols aligned", {{3, 136, 64}, {64, 264}}, {5, 5, 133}},
  };
  return all;
}

/// The candidates a test runs: the host reference, the bespoke CUDA
/// kernels, and CUTLASS where select takes it (sm_90a builds with the headers).
std::vector<Backend> grouped_backends(DType t) {
  std::vector<Backend> out = host_and_cuda_backends();
  if (!cuda_available()) return out;
  PlanPreference pref;
  pref.backend = Backend::cutlass;
  if (select(Stream::cuda(), OpDesc{"grouped_mm", {{t, {8, 8}}, {t, {1, 8, 8}}, {DType::i32, {1}}}, {}, {}}, pref))
    out.push_back(Backend::cutlass);
  return out;
}

TEST(GroupedGemmExact, SmallIntegerProducts) {
  std::mt19937 rng(5);
  for (const Case& c : cases()) {
    // |sums| <= 4 * 40 = 160: exact in bf16.
    const std::vector<double> a = small_ints(numel(c.shapes[0]), rng), b = small_ints(numel(c.shapes[1]), rng);
    const std::vector<double> want = reference(c.shapes, a, b, c.offs);
    const Shape offs_shape{int64_t(c.offs.size())};
    for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64})
      for (Backend backend : grouped_backends(t))
        for (bool b_k_contiguous : {false, true}) {
          const Operand ob{b, c.shapes[1], t, b_k_contiguous ? k_contiguous(c.shapes[1]) : Shape{}};
          auto r = exec(backend, "grouped_mm", {{a, c.shapes[0], t}, ob, {as_doubles(c.offs), offs_shape, DType::i32}});
          const std::string what = cat(c.name, " ", backend_name(backend), " ", dtype_name(t),
                                       b_k_contiguous ? " b K-contiguous" : " b N-contiguous");
          ASSERT_TRUE(r) << what << ": " << r.status().to_string();
          EXPECT_EQ((*r)[0], want) << what;
        }
  }
}

/// A column-major a and strided (every other element) offs.
TEST(GroupedGemmExact, StridedOperands) {
  std::mt19937 rng(9);
  const Shape sa{20, 8}, sb{3, 8, 6};
  const std::vector<double> a = small_ints(numel(sa), rng), b = small_ints(numel(sb), rng);
  const std::vector<int> offs{4, 4, 17};
  const std::vector<double> want = reference({sa, sb}, a, b, offs);
  for (DType t : {DType::f32, DType::bf16})
    for (Backend backend : grouped_backends(t)) {
      auto r = exec(backend, "grouped_mm",
                    {{a, sa, t, {1, 20}}, {b, sb, t, {8, 1, 24}}, {as_doubles(offs), {3}, DType::i32, {2}}});
      ASSERT_TRUE(r) << r.status().to_string();
      EXPECT_EQ((*r)[0], want) << backend_name(backend) << " " << dtype_name(t);
    }
}

/// L = sum(g * grouped_mm(a, b)) is linear in each operand: central
/// differences with step 1 are exact in f64 and must equal the gradients.
TEST(GroupedGemmGradients, MatchFiniteDifferences) {
  std::mt19937 rng(13);
  const std::vector<Case> small = {
      {"rows", {{7, 3}, {3, 3, 4}}, {2, 2, 6}},
      {"batch", {{2, 3, 4}, {2, 4, 5}}, {}},
      {"red", {{3, 7}, {7, 4}}, {0, 3, 6}},
      {"cols", {{3, 2, 3}, {3, 7}}, {2, 2, 6}},
  };
  for (const Case& c : small) {
    const Shape offs_shape{int64_t(c.offs.size())};
    const Operand offs{as_doubles(c.offs), offs_shape, DType::i32};
    std::vector<Operand> fwd{{small_ints(numel(c.shapes[0]), rng, -3, 3), c.shapes[0]},
                             {small_ints(numel(c.shapes[1]), rng, -3, 3), c.shapes[1]}};
    auto run = [&](const std::vector<Operand>& ab) {
      return exec(Backend::host_reference, "grouped_mm", {ab[0], ab[1], offs});
    };
    auto y = run(fwd);
    ASSERT_TRUE(y) << y.status().to_string();
    const std::vector<double> g = small_ints(int64_t((*y)[0].size()), rng, -3, 3);
    auto loss = [&](const std::vector<Operand>& ab) {
      auto out = run(ab);
      double l = 0;
      for (size_t i = 0; i < g.size(); ++i) l += g[i] * (*out)[0][i];
      return l;
    };
    const Shape y_shape = check(infer("grouped_mm", {{DType::f64, c.shapes[0]}, {DType::f64, c.shapes[1]},
                                                     {DType::i32, offs_shape}}))
                              .outputs[0]
                              .shape;
    for (Backend backend : host_and_cuda_backends()) {
      auto grads = exec(backend, "grouped_mm_backward", {{g, y_shape}, fwd[0], fwd[1], offs});
      ASSERT_TRUE(grads) << grads.status().to_string();
      for (int operand = 0; operand < 2; ++operand)
        for (size_t i = 0; i < fwd[operand].values.size(); ++i) {
          std::vector<Operand> plus = fwd, minus = fwd;
          plus[operand].values[i] += 1;
          minus[operand].values[i] -= 1;
          EXPECT_DOUBLE_EQ((*grads)[operand][i], (loss(plus) - loss(minus)) / 2)
              << c.name << " " << backend_name(backend) << " operand " << operand << " element " << i;
        }
    }
  }
}

/// Every CUDA candidate's gradients of the aligned cases equal the host's
/// (small integers: exact in bf16 and f16).
TEST(GroupedGemmGradients, CudaMatchesHost) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(21);
  for (const Case& c : cases()) {
    if (c.name.find("aligned") == std::string::npos) continue;
    const Shape offs_shape{int64_t(c.offs.size())};
    const Shape y_shape = check(infer("grouped_mm", {{DType::f64, c.shapes[0]}, {DType::f64, c.shapes[1]},
                                                     {DType::i32, offs_shape}}))
                              .outputs[0]
                              .shape;
    const std::vector<double> a = small_ints(numel(c.shapes[0]), rng, -1, 1), b = small_ints(numel(c.shapes[1]), rng, -1, 1);
    const std::vector<double> g = small_ints(numel(y_shape), rng, -1, 1);
    auto in = [&](DType t) {
      return std::vector<Operand>{{g, y_shape, t}, {a, c.shapes[0], t}, {b, c.shapes[1], t},
                                  {as_doubles(c.offs), offs_shape, DType::i32}};
    };
    auto want = exec(Backend::host_reference, "grouped_mm_backward", in(DType::f64));
    ASSERT_TRUE(want) << want.status().to_string();
    for (DType t : {DType::bf16, DType::f16})
      for (Backend backend : grouped_backends(t)) {
        if (backend == Backend::host_reference) continue;
        auto got = exec(backend, "grouped_mm_backward", in(t));
        ASSERT_TRUE(got) << c.name << " " << backend_name(backend) << ": " << got.status().to_string();
        EXPECT_EQ((*got)[0], (*want)[0]) << c.name << " " << backend_name(backend) << " " << dtype_name(t) << " grad_a";
        EXPECT_EQ((*got)[1], (*want)[1]) << c.name << " " << backend_name(backend) << " " << dtype_name(t) << " grad_b";
      }
  }
}

/// How CUTLASS takes a problem: orientation, operand majors, leading dims,
/// and what it refuses (host logic, no device).
TEST(GroupedGemmCutlass, View) {
  alignas(16) static char buffer[64];
  gemm::GroupedProblem p;
  p.dtype = DType::bf16;
  p.mode = gemm::GroupedMode::rows;
  p.groups = 2, p.m = 100, p.n = 64, p.k = 32;
  p.a = {buffer, 0, 32, 1};            // [M, K] row-major
  p.b = {buffer, 32 * 64, 1, 32};      // [G, K, N] stored [G, N, K]
  p.d = {buffer, 0, 64, 1};            // [M, N] row-major
  gemm::CutlassView v = gemm::cutlass_view(p);
  EXPECT_EQ(v.why, nullptr) << v.why;
  EXPECT_FALSE(v.transpose);
  EXPECT_TRUE(v.a_k_major);
  EXPECT_TRUE(v.b_k_major);
  EXPECT_EQ(v.lda, 32);
  EXPECT_EQ(v.ldb, 32);
  EXPECT_EQ(v.ldd, 64);
  EXPECT_TRUE(v.split_aligned);
  p.b = {buffer, 32 * 64, 64, 1};  // N-contiguous
  v = gemm::cutlass_view(p);
  EXPECT_FALSE(v.b_k_major);
  EXPECT_EQ(v.ldb, 64);
  p.d = {buffer, 0, 1, 104};  // column-major out (leading dim 104): D^T = B^T A^T
  v = gemm::cutlass_view(p);
  EXPECT_EQ(v.why, nullptr) << v.why;
  EXPECT_TRUE(v.transpose);
  EXPECT_FALSE(v.a_k_major);  // B^T [N, K] is N-contiguous
  EXPECT_EQ(v.lda, 64);
  EXPECT_TRUE(v.b_k_major);   // A^T as CUTLASS's B is K-contiguous
  EXPECT_EQ(v.ldb, 32);
  EXPECT_EQ(v.ldd, 104);
  EXPECT_FALSE(v.split_aligned);  // row starts move D's base by 2 bytes a row
  p.d = {buffer, 0, 64, 1};
  p.a = {buffer, 0, 36, 1};  // a leading dim of 72 bytes
  EXPECT_NE(gemm::cutlass_view(p).why, nullptr);
  p.a = {buffer + 2, 0, 32, 1};  // a base off 16 bytes
  EXPECT_NE(gemm::cutlass_view(p).why, nullptr);
  p.a = {buffer, 0, 32, 1};
  p.k = 0;
  EXPECT_NE(gemm::cutlass_view(p).why, nullptr);
  p.k = 32;
  p.mode = gemm::GroupedMode::red;  // K split over a's unit stride: checked per group on the device
  EXPECT_EQ(gemm::cutlass_view(p).why, nullptr);
  EXPECT_FALSE(gemm::cutlass_view(p).split_aligned);
}

#ifdef BARACUDA_HAS_CUDA
/// A captured run replays correctly: run neither syncs nor reads offsets on the host.
TEST(GroupedGemmCuda, GraphCapture) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  const Shape sa{300, 64}, sb{3, 64, 136}, so{300, 136}, so_shape{3}, so_stride{1};
  const std::vector<int> offs{100, 100, 257};
  const std::vector<double> a = small_ints(numel(sa), rng), b = small_ints(numel(sb), rng);
  const std::vector<double> want = reference({sa, sb}, a, b, offs);
  for (Backend backend : grouped_backends(DType::bf16)) {
    if (backend == Backend::host_reference) continue;
    PlanPreference pref;
    pref.backend = backend;
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    auto plan = select(Stream::cuda(stream),
                       OpDesc{"grouped_mm", {{DType::bf16, sa}, {DType::bf16, sb}, {DType::i32, {3}}}, {}, {}}, pref);
    ASSERT_TRUE(plan) << plan.status().to_string();
    auto upload = [](const std::vector<double>& v, DType t) {
      Memory host = Memory::host(v.size() * dtype_size(t));
      for (size_t i = 0; i < v.size(); ++i) store_double(host.data(), t, int64_t(i), v[i]);
      Memory dev = check(Memory::device(host.bytes()));
      cudaMemcpy(dev.data(), host.data(), host.bytes(), cudaMemcpyHostToDevice);
      return dev;
    };
    Memory da = upload(a, DType::bf16), db = upload(b, DType::bf16), doffs = upload(as_doubles(offs), DType::i32);
    Memory dout = upload(std::vector<double>(numel(so), NAN), DType::bf16);
    Memory ws = check(Memory::device(std::max<size_t>((*plan)->workspace_size(), 1)));
    const TensorView in[3] = {check(TensorView::strided(da.data(), DType::bf16, sa, row_major(sa))),
                              check(TensorView::strided(db.data(), DType::bf16, sb, row_major(sb))),
                              check(TensorView::strided(doffs.data(), DType::i32, so_shape, so_stride))};
    const TensorView out[1] = {check(TensorView::strided(dout.data(), DType::bf16, so, row_major(so)))};
    OpArgs args{in, out};
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const Status st = (*plan)->run(Stream::cuda(stream), Workspace{ws.data(), ws.bytes()}, args);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    cudaGraphExec_t exec_graph;
    ASSERT_EQ(cudaGraphInstantiate(&exec_graph, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec_graph, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    Memory host = Memory::host(dout.bytes());
    cudaMemcpy(host.data(), dout.data(), dout.bytes(), cudaMemcpyDeviceToHost);
    std::vector<double> got(numel(so));
    for (size_t i = 0; i < got.size(); ++i) got[i] = load_double(host.data(), DType::bf16, int64_t(i));
    EXPECT_EQ(got, want) << backend_name(backend);
    cudaGraphExecDestroy(exec_graph);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}
#endif

TEST(GroupedGemmErrors, BadInputIsNamed) {
  auto message = [](const std::string& op, std::vector<TensorSpec> in) {
    auto r = infer(op, std::move(in), {});
    return error_message(r);
  };
  const DType f = DType::bf16, i = DType::i32;
  std::string m = message("grouped_mm", {{f, {8, 4}}, {f, {2, 5, 6}}, {i, {2}}});
  EXPECT_TRUE(has(m, "'a' [8, 4] and 'b' [2, 5, 6] cannot be multiplied (4 != 5)")) << m;
  m = message("grouped_mm", {{f, {8, 4}}, {f, {2, 4, 6}}, {i, {3}}});
  EXPECT_TRUE(has(m, "'offs' must be [2]")) << m;
  m = message("grouped_mm", {{f, {8, 4}}, {f, {2, 4, 6}}, {DType::i64, {2}}});
  EXPECT_TRUE(has(m, "'offs' dtype i64, expected i32")) << m;
  m = message("grouped_mm", {{f, {2, 8, 4}}, {f, {3, 4, 6}}, {i, {0}}});
  EXPECT_TRUE(has(m, "group counts differ")) << m;
  m = message("grouped_mm", {{f, {2, 8, 4}}, {f, {2, 4, 6}}, {i, {2}}});
  EXPECT_TRUE(has(m, "'offs' must be [0] (absent) for 3D x 3D")) << m;
  m = message("grouped_mm", {{f, {2, 8, 4}}, {f, {4, 6}}, {i, {3}}});
  EXPECT_TRUE(has(m, "'offs' must be [2] (one end column per group of 'a' [2, 8, 4]), got [3]")) << m;
  m = message("grouped_mm", {{f, {8}}, {f, {4, 6}}, {i, {2}}});
  EXPECT_TRUE(has(m, "must be 2D x 3D")) << m;
  m = message("grouped_mm", {{f, {8, 4}}, {DType::f16, {2, 4, 6}}, {i, {2}}});
  EXPECT_TRUE(has(m, "'b' dtype f16, expected bf16")) << m;
  m = message("grouped_mm", {{DType::i32, {8, 4}}, {DType::i32, {2, 4, 6}}, {i, {2}}});
  EXPECT_TRUE(has(m, "dtype i32 is not supported")) << m;
  m = message("grouped_mm_backward", {{f, {8, 5}}, {f, {8, 4}}, {f, {2, 4, 6}}, {i, {2}}});
  EXPECT_TRUE(has(m, "'grad_output' shape [8, 5], expected grouped_mm's output [8, 6]")) << m;

  // Offsets are read on the host reference: decreasing or past the split extent are named.
  auto run = [](std::vector<double> offs, bool red) {
    const int64_t g = int64_t(offs.size());
    std::vector<Operand> in;
    if (red) in = {{std::vector<double>(4 * 6, 1), {4, 6}}, {std::vector<double>(6 * 3, 1), {6, 3}}};
    else in = {{std::vector<double>(6 * 4, 1), {6, 4}}, {std::vector<double>(g * 4 * 3, 1), {g, 4, 3}}};
    in.push_back({offs, {g}, DType::i32});
    auto r = exec(Backend::host_reference, "grouped_mm", in);
    return error_message(r);
  };
  m = run({3, 2}, false);
  EXPECT_TRUE(has(m, "grouped_mm: 'offs' must be non-decreasing from 0: offs[1] = 2 < offs[0] = 3")) << m;
  m = run({-1, 2}, false);
  EXPECT_TRUE(has(m, "offs[0] = -1 < 0")) << m;
  m = run({3, 7}, false);
  EXPECT_TRUE(has(m, "'offs' past the rows of 'a': offs[1] = 7 > 6")) << m;
  m = run({2, 9}, true);
  EXPECT_TRUE(has(m, "'offs' past the K of 'a' and 'b': offs[1] = 9 > 6")) << m;
}

/// The CUDA kernels cannot report bad offsets without a sync: they clamp
/// them into [0, extent] (Note [Offsets on the device]) and stay in bounds.
TEST(GroupedGemmErrors, DeviceClampsOffsets) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(17);
  const Shape sa{9, 8}, sb{2, 8, 5};
  const std::vector<double> a = small_ints(numel(sa), rng), b = small_ints(numel(sb), rng);
  const std::vector<double> want = reference({sa, sb}, a, b, {4, 9});
  for (DType t : {DType::f32, DType::bf16}) {
    auto r = exec(Backend::bespoke_cuda, "grouped_mm", {{a, sa, t}, {b, sb, t}, {{4, 1000}, {2}, DType::i32}});
    ASSERT_TRUE(r) << r.status().to_string();
    EXPECT_EQ((*r)[0], want) << dtype_name(t);
  }
}

// ---------------------------------------------------------------- grouped_gemm (a list of products)

/// One group of grouped_gemm: a [M, K] and b [K, N] with their strides (empty: row-major).
struct ListGroup {
  int64_t m, k, n;
  Shape a_strides = {}, b_strides = {};
};

/// Groups whose M, N and K all differ: an empty group (M = 0), K = 0 (out =
/// beta * out), sizes past 128-tile multiples, a column-major a, a b stored
/// transposed (K-contiguous) and a b walked backwards along N.
const std::vector<ListGroup>& list_groups() {
  static const std::vector<ListGroup> all = {
      {5, 7, 3},
      {0, 4, 6},
      {131, 33, 70, {1, 131}, {}},
      {9, 0, 11},
      {64, 72, 136, {}, {1, 72}},
      {17, 19, 23, {}, {23, -1}},
  };
  return all;
}

/// out[g] = alpha * a[g] @ b[g] + beta * c[g] from row-major values.
std::vector<double> list_product(const ListGroup& g, const std::vector<double>& a, const std::vector<double>& b,
                                 double alpha = 1, double beta = 0, const std::vector<double>& c = {}) {
  std::vector<double> out(size_t(g.m * g.n), 0);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < g.k; ++k) sum += a[i * g.k + k] * b[k * g.n + j];
      out[i * g.n + j] = alpha * sum + (beta != 0 ? beta * c[i * g.n + j] : 0);
    }
  return out;
}

/// Strides for a logical shape: `given` with a negative entry meaning "walk
/// that dim backwards" over row-major storage (exec places the base).
Shape list_strides(const Shape& shape, const Shape& given) {
  if (given.empty()) return row_major(shape);
  Shape st = given;
  for (size_t d = 0; d < st.size(); ++d)
    if (st[d] == -1) st[d] = -row_major(shape)[d];
  return st;
}

/// Every candidate grouped_gemm has here: the host reference, and with a
/// device the bespoke kernel and cuBLASLt.
std::vector<Backend> list_backends() {
  std::vector<Backend> out = host_and_cuda_backends();
  if (cuda_available()) out.push_back(Backend::cublaslt);
  return out;
}

TEST(GroupedGemmListExact, SmallIntegerProducts) {
  std::mt19937 rng(31);
  const auto& groups = list_groups();
  std::vector<std::vector<double>> a, b;
  for (const ListGroup& g : groups)
    a.push_back(small_ints(g.m * g.k, rng)), b.push_back(small_ints(g.k * g.n, rng));
  for (double alpha : {1.0, -2.0})
    for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::i32, DType::i64})
      for (Backend backend : list_backends()) {
        // cuBLASLt takes a unit stride in each matrix: it refuses the list with the backwards b, by name.
        const size_t count = backend == Backend::cublaslt ? groups.size() - 1 : groups.size();
        auto operands = [&](size_t n) {
          std::vector<Operand> in;
          for (size_t i = 0; i < n; ++i) {
            const Shape s{groups[i].m, groups[i].k};
            in.push_back({a[i], s, t, list_strides(s, groups[i].a_strides)});
          }
          for (size_t i = 0; i < n; ++i) {
            const Shape s{groups[i].k, groups[i].n};
            in.push_back({b[i], s, t, list_strides(s, groups[i].b_strides)});
          }
          return in;
        };
        const std::string what = cat(backend_name(backend), " ", dtype_name(t), " alpha ", alpha);
        auto r = exec(backend, "grouped_gemm", operands(count), {{"alpha", alpha}});
        if (!r && r.status().kind() == ErrorKind::unsupported && backend == Backend::cublaslt && t != DType::f32 &&
            t != DType::f16 && t != DType::bf16 && t != DType::f64)
          continue;  // cuBLASLt takes int8 only in some layouts, i32/i64 never: the bespoke kernel serves them
        ASSERT_TRUE(r) << what << ": " << r.status().to_string();
        ASSERT_EQ(r->size(), count) << what;
        // |out| <= 4 K |alpha| <= 8 K: integers exact in bf16 to 256 (K <= 32), in f16 to 2048.
        for (size_t i = 0; i < count; ++i) {
          if (t == DType::bf16 && 8 * groups[i].k > 256) continue;
          EXPECT_EQ((*r)[i], list_product(groups[i], a[i], b[i], alpha)) << what << " group " << i;
        }
        if (backend == Backend::cublaslt && is_floating(t)) {
          auto refused = exec(backend, "grouped_gemm", operands(groups.size()), {{"alpha", alpha}});
          ASSERT_FALSE(refused) << what << ": cuBLASLt cannot take a negative stride";
          EXPECT_EQ(refused.status().kind(), ErrorKind::unsupported) << refused.status().to_string();
          const std::string m = refused.status().message();
          EXPECT_NE(m.find("output 'out[5]'"), std::string::npos) << m;
        }
      }
}

/// beta != 0 reads out[g] (cuBLAS's C = D); beta = 0 never does (exec's NaN outputs above).
TEST(GroupedGemmListExact, BetaAccumulatesIntoOut) {
  std::mt19937 rng(37);
  const std::vector<ListGroup> groups = {{6, 5, 4}, {3, 0, 7}, {130, 24, 9}};
  std::vector<Operand> in;
  std::vector<std::vector<double>> a, b, c;
  for (const ListGroup& g : groups) {
    a.push_back(small_ints(g.m * g.k, rng)), b.push_back(small_ints(g.k * g.n, rng));
    c.push_back(small_ints(g.m * g.n, rng));
    in.push_back({a.back(), {g.m, g.k}, DType::f32});
  }
  for (size_t i = 0; i < groups.size(); ++i) in.push_back({b[i], {groups[i].k, groups[i].n}, DType::f32});
  for (DType t : {DType::f32, DType::bf16, DType::f64})
    for (Backend backend : list_backends()) {
      std::vector<Operand> typed = in;
      for (Operand& o : typed) o.dtype = t;
      // Column-major outputs, as an accumulating caller may hold them.
      std::vector<Shape> out_strides;
      for (const ListGroup& g : groups) out_strides.push_back({1, std::max<int64_t>(g.m, 1)});
      auto r = exec(backend, "grouped_gemm", typed, {{"alpha", 2}, {"beta", -3}}, {}, out_strides, 0, 0, c);
      ASSERT_TRUE(r) << backend_name(backend) << " " << dtype_name(t) << ": " << r.status().to_string();
      for (size_t i = 0; i < groups.size(); ++i)
        EXPECT_EQ((*r)[i], list_product(groups[i], a[i], b[i], 2, -3, c[i]))
            << backend_name(backend) << " " << dtype_name(t) << " group " << i;
    }
}

/// L = sum_g sum(w[g] * out[g]) is linear in each operand: central
/// differences with step 1 are exact in f64 and must equal the gradients.
TEST(GroupedGemmListGradients, MatchFiniteDifferences) {
  std::mt19937 rng(41);
  const std::vector<ListGroup> groups = {{3, 4, 2}, {1, 3, 5}, {4, 2, 3}, {0, 2, 2}};
  const double alpha = -1.5;
  const size_t n = groups.size();
  std::vector<Operand> fwd;
  for (const ListGroup& g : groups) fwd.push_back({small_ints(g.m * g.k, rng, -3, 3), {g.m, g.k}});
  for (const ListGroup& g : groups) fwd.push_back({small_ints(g.k * g.n, rng, -3, 3), {g.k, g.n}});
  std::vector<Operand> w;
  for (const ListGroup& g : groups) w.push_back({small_ints(g.m * g.n, rng, -3, 3), {g.m, g.n}});
  auto loss = [&](const std::vector<Operand>& ab) {
    auto out = exec(Backend::host_reference, "grouped_gemm", ab, {{"alpha", alpha}});
    double l = 0;
    for (size_t g = 0; g < n; ++g)
      for (size_t i = 0; i < w[g].values.size(); ++i) l += w[g].values[i] * (*out)[g][i];
    return l;
  };
  std::vector<Operand> bwd_in = w;
  bwd_in.insert(bwd_in.end(), fwd.begin(), fwd.end());
  for (Backend backend : list_backends()) {
    auto grads = exec(backend, "grouped_gemm_backward", bwd_in, {{"alpha", alpha}});
    ASSERT_TRUE(grads) << backend_name(backend) << ": " << grads.status().to_string();
    ASSERT_EQ(grads->size(), 2 * n);
    for (size_t operand = 0; operand < 2 * n; ++operand)  // grad_a[0..n), then grad_b[0..n): fwd's order
      for (size_t i = 0; i < fwd[operand].values.size(); ++i) {
        std::vector<Operand> plus = fwd, minus = fwd;
        plus[operand].values[i] += 1;
        minus[operand].values[i] -= 1;
        EXPECT_DOUBLE_EQ((*grads)[operand][i], (loss(plus) - loss(minus)) / 2)
            << backend_name(backend) << " operand " << operand << " element " << i;
      }
  }
}

/// A captured run replays to the same outputs on every CUDA candidate.
TEST(GroupedGemmListCuda, GraphCapture) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(43);
  // Every group but the backwards b, which cuBLASLt refuses (SmallIntegerProducts).
  const std::vector<ListGroup> groups(list_groups().begin(), list_groups().end() - 1);
  std::vector<Operand> in;
  std::vector<std::vector<double>> a, b;
  for (const ListGroup& g : groups)
    a.push_back(small_ints(g.m * g.k, rng)), in.push_back({a.back(), {g.m, g.k}, DType::f16});
  for (const ListGroup& g : groups)
    b.push_back(small_ints(g.k * g.n, rng)), in.push_back({b.back(), {g.k, g.n}, DType::f16});
  for (Backend backend : list_backends()) {
    if (backend == Backend::host_reference) continue;
    auto r = exec(backend, "grouped_gemm", in, {}, {}, {}, /*graph_replays=*/3);
    ASSERT_TRUE(r) << backend_name(backend) << ": " << r.status().to_string();
    for (size_t i = 0; i < groups.size(); ++i)  // |sums| <= 4 * 72: exact in f16
      EXPECT_EQ((*r)[i], list_product(groups[i], a[i], b[i])) << backend_name(backend) << " group " << i;
  }
}

TEST(GroupedGemmListErrors, BadInputIsNamed) {
  auto message = [](const std::string& op, std::vector<TensorSpec> in, const Attrs& attrs = {}) {
    auto r = infer(op, std::move(in), attrs);
    return error_message(r);
  };
  const DType f = DType::bf16;
  std::string m = message("grouped_gemm", {});
  EXPECT_TRUE(has(m, "grouped_gemm: expected 2 inputs a group (every a, then every b) and at least one group, got 0"))
      << m;
  m = message("grouped_gemm", {{f, {2, 3}}, {f, {3, 4}}, {f, {4, 5}}});
  EXPECT_TRUE(has(m, "got 3 inputs")) << m;
  m = message("grouped_gemm", {{f, {2, 3}}, {f, {5, 3}}, {f, {3, 4}}, {f, {4, 5}}});
  EXPECT_TRUE(has(m, "'a[1]' [5, 3] and 'b[1]' [4, 5] cannot be multiplied (3 != 4)")) << m;
  m = message("grouped_gemm", {{f, {2, 3}}, {f, {5, 4}}, {f, {3, 4}}, {DType::f16, {4, 5}}});
  EXPECT_TRUE(has(m, "'b[1]' dtype f16, expected bf16 (the dtype of 'a[0]')")) << m;
  m = message("grouped_gemm", {{f, {2, 3}}, {f, {1, 3, 4}}});
  EXPECT_TRUE(has(m, "'b[0]' must be a matrix (rank 2), got shape [1, 3, 4]")) << m;
  m = message("grouped_gemm", {{DType::boolean, {2, 3}}, {DType::boolean, {3, 4}}});
  EXPECT_TRUE(has(m, "dtype bool is not supported")) << m;
  m = message("grouped_gemm", {{DType::i8, {2, 3}}, {DType::i8, {3, 4}}}, {{"alpha", 0.5}});
  EXPECT_TRUE(has(m, "alpha and beta must be integers for integer dtypes")) << m;
  m = message("grouped_gemm_backward", {{f, {2, 4}}, {f, {2, 3}}, {f, {3, 5}}});
  EXPECT_TRUE(has(m, "'grad_output[0]' shape [2, 4], expected the product's [2, 5]")) << m;
  m = message("grouped_gemm_backward", {{DType::i32, {2, 5}}, {DType::i32, {2, 3}}, {DType::i32, {3, 5}}});
  EXPECT_TRUE(has(m, "dtype i32 is not supported (f32 f16 bf16 f64)")) << m;
  // Given outputs are checked under their group names.
  auto given = infer("grouped_gemm", {{f, {2, 3}}, {f, {3, 4}}, {f, {3, 4}}, {f, {4, 5}}}, {});
  ASSERT_TRUE(given) << given.status().to_string();
  OpDesc bad = *given;
  bad.outputs[1].shape = {3, 6};
  auto plan = select(Stream::host(), bad, {});
  ASSERT_FALSE(plan);
  EXPECT_TRUE(has(plan.status().message(), "output 'out[1]' must be bf16[3, 5], got bf16[3, 6]"))
      << plan.status().message();
  // An attribute the backward does not take.
  OpDesc backward = check(infer("grouped_gemm_backward", {{f, {2, 4}}, {f, {2, 3}}, {f, {3, 4}}}, {}));
  backward.attrs.set("beta", 1);
  plan = select(Stream::host(), backward, {});
  ASSERT_FALSE(plan);
  EXPECT_TRUE(has(plan.status().message(), "unknown attribute 'beta'")) << plan.status().message();

  // An output over an input, and tensors that differ from the descriptor, by name.
  const OpDesc square = check(infer("grouped_gemm", {{DType::f32, {2, 2}}, {DType::f32, {2, 2}}}, {}));
  auto fwd = check(select(Stream::host(), square, {}));
  std::vector<float> buffer(8, 0.f);
  const Shape two_by_two{2, 2}, one_by_four{1, 4};
  const TensorView x = check(TensorView::contiguous(buffer.data(), DType::f32, two_by_two));
  const TensorView y = check(TensorView::contiguous(buffer.data() + 4, DType::f32, two_by_two));
  const TensorView ins[2] = {x, y}, outs[1] = {x};
  Status st = fwd->can_implement(OpArgs{ins, outs});
  EXPECT_TRUE(has(st.message(), "output 'out[0]' overlaps input 'a[0]'")) << st.message();
  const TensorView wrong = check(TensorView::contiguous(buffer.data(), DType::f32, one_by_four));
  const TensorView ins2[2] = {x, wrong}, outs2[1] = {check(TensorView::contiguous(nullptr, DType::f32, two_by_two))};
  st = fwd->can_implement(OpArgs{ins2, outs2});
  EXPECT_TRUE(has(st.message(), "'b[0]' shape [1, 4] != descriptor shape [2, 2]")) << st.message();
}

}  // namespace
