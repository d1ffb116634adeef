// The generic sweep shared by the family tests: every dtype x attribute set x
// shape x layout of an op against the host reference in f64.
#pragma once

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "baracuda/registry.hpp"
#include "harness.hpp"

namespace baracuda::testing_support {

using namespace baracuda::harness;

inline bool quick() {
  const char* q = std::getenv("BARACUDA_TEST_QUICK");
  return q && *q && *q != '0';
}

inline std::vector<Shape> sweep_shapes([[maybe_unused]] bool gpu) {
  // [9, 64] and [3, 4, 128]: broadcast rows long enough for the row-vector path;
  // [70, 67]: whole and partial transpose tiles.
  if (quick()) return {{0}, {7}, {1023}, {7, 33}, {9, 64}, {70, 67}, {3, 5, 17}, {2, 1, 3, 1, 2, 2, 1, 3}, {}};
  std::vector<Shape> shapes{{0}, {1}, {7}, {1023}, {65537}, {7, 33}, {9, 64}, {70, 67}, {3, 4, 128}, {3, 5, 17},
                            {2, 1, 3, 1, 2, 2, 1, 3}, {}};
  return shapes;
}

/// Ops whose gradient is identically zero: their reference output is all zero.
inline bool zero_gradient(const std::string& name) {
  static const std::set<std::string> zero{"floor_backward", "ceil_backward", "round_backward",
                                          "trunc_backward", "sign_backward", "step_backward"};
  return zero.count(name) != 0;
}

inline void sweep(const OpInfo& op, Backend backend) {
  int ran = 0, nonzero = 0;
  for (DType dtype : op.dtypes) {
    for (const Attrs& attrs : op.sample_attrs) {
      for (const Shape& shape : sweep_shapes(backend != Backend::host_reference)) {
        for (LayoutKind layout : kAllLayouts) {
          CaseSpec spec{&op, dtype, shape, attrs, layout};
          RunOptions opt;
          opt.backend = backend;
          CaseOutcome r = run_case(spec, opt);
          if (r.skipped) continue;
          ++ran;
          EXPECT_TRUE(r.passed) << spec.to_string() << ": " << r.message;
          if (!r.reference_all_zero) ++nonzero;
        }
      }
    }
  }
  EXPECT_GT(ran, 0) << op.name << ": no case ran";
  if (!zero_gradient(op.name)) {
    EXPECT_GT(nonzero, 0) << op.name << ": every reference output was zero";
  }
}

/// Registered op names of one category (the parameters of a family's sweep).
inline std::vector<std::string> ops_of(OpCategory category) {
  std::vector<std::string> names;
  for (const OpInfo& op : registry())
    if (op.category == category) names.push_back(op.name);
  return names;
}

inline std::string param_name(const testing::TestParamInfo<std::string>& info) { return info.param; }

/// A family's sweep suite `Ops/Suite.*`: each op name of `names` against the
/// host reference on the host backend, and on the bespoke CUDA backend where
/// there is a device (skipped, never passed, without one).
#define BARACUDA_SWEEP_SUITE(Suite, names)                                                        \
  class Suite : public testing::TestWithParam<std::string> {};                                   \
  TEST_P(Suite, HostMatchesReference) { sweep(*find_op(GetParam()), Backend::host_reference); } \
  TEST_P(Suite, CudaMatchesReference) {                                                          \
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";                                     \
    sweep(*find_op(GetParam()), Backend::bespoke_cuda);                                          \
  }                                                                                              \
  INSTANTIATE_TEST_SUITE_P(Ops, Suite, testing::ValuesIn(names), param_name)

}  // namespace baracuda::testing_support
