// Bent descriptors: every op on every backend, from a valid sample case,
// with one thing changed at a time: an operand's size along one dim, its
// rank, its dtype, an attribute, or integer inputs (class indices, lengths,
// offsets, block tables) drawn far outside their domain. Each variant must be
// refused with a message or run within the bounds its own descriptor gives:
// the buffers are exactly the descriptor's size, so a kernel that trusts a
// relation between operands nobody checked reads or writes past one. The
// plain build catches crashes; on the host a build with -fsanitize=address
// (see scripts/asan_fuzz.sh) catches the silent out-of-bounds accesses too,
// and on the GPU compute-sanitizer memcheck over FuzzCuda.* does (device
// buffers are exact cudaMalloc allocations, which memcheck bounds exactly).
// BARACUDA_FUZZ_TRACE=1 prints each variant before it runs (the last line
// names the one that crashed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "baracuda/registry.hpp"
#include "harness.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace baracuda;

namespace {

constexpr int64_t kMaxBytes = int64_t(16) << 20;  ///< a variant whose operands need more is not run

int64_t bytes_of(const TensorSpec& t) {
  int64_t n = 1;
  for (int64_t s : t.shape) {
    if (s < 0 || (s > 0 && n > kMaxBytes / s)) return kMaxBytes + 1;
    n *= s;
  }
  return n * int64_t(dtype_size(t.dtype));
}

/// Bytes on the host (new[]) or the device (cudaMalloc) of exactly the size asked: ASan and memcheck
/// bound an access by the allocation, so any slack would hide an overrun.
struct ExactBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  bool device = false;
  ExactBuffer(size_t n, bool on_device) : bytes(n), device(on_device) {
#ifdef BARACUDA_HAS_CUDA
    if (device) {
      if (n && cudaMalloc(&data, n) != cudaSuccess) ADD_FAILURE() << "cudaMalloc(" << n << ") failed";
      return;
    }
#endif
    data = n ? new unsigned char[n] : nullptr;
  }
  ExactBuffer(const ExactBuffer&) = delete;
  ExactBuffer(ExactBuffer&& o) noexcept : data(std::exchange(o.data, nullptr)), bytes(o.bytes), device(o.device) {}
  ~ExactBuffer() {
#ifdef BARACUDA_HAS_CUDA
    if (device) {
      cudaFree(data);
      return;
    }
#endif
    delete[] static_cast<unsigned char*>(data);
  }
  void upload(const std::vector<unsigned char>& from) {
    if (from.empty() || !data) return;
#ifdef BARACUDA_HAS_CUDA
    if (device) {
      cudaMemcpy(data, from.data(), from.size(), cudaMemcpyHostToDevice);
      return;
    }
#endif
    std::memcpy(data, from.data(), from.size());
  }
};

/// Random contents of `count` elements: floats in [-2, 2], integers in [-3, 40] (in and out of any small index
/// range) or in the operand's domain, bools 0/1.
std::vector<unsigned char> random_bytes(const TensorSpec& t, std::mt19937_64& rng, bool wild_integers, const Domain& dom) {
  const int64_t n = bytes_of(t) / int64_t(dtype_size(t.dtype));
  std::vector<unsigned char> bytes(size_t(bytes_of(t)));
  std::uniform_real_distribution<double> real(-2, 2);
  std::uniform_int_distribution<int> wild(-3, 40), in_domain(int(dom.lo), int(std::max(dom.lo, dom.hi)));
  for (int64_t i = 0; i < n; ++i) {
    double v = 0;
    if (t.dtype == DType::boolean) v = double(rng() & 1);
    else if (is_floating(t.dtype)) v = real(rng);
    else v = wild_integers ? wild(rng) : in_domain(rng);
    harness::store_double(bytes.data(), t.dtype, i, v);
  }
  return bytes;
}

const DType kOtherDtypes[] = {DType::f32, DType::f64, DType::f16, DType::i32, DType::i64, DType::boolean};

/// Bends descriptors and plans and runs each variant on one backend, counting what happened.
struct Fuzzer {
  Backend backend = Backend::host_reference;
  std::mt19937_64 rng{20261128};
  int64_t refused = 0, ran = 0, failed_at_run = 0;
  bool device_fault = false;  ///< a CUDA error after a run: the context is lost, stop

  bool on_device() const { return backend != Backend::host_reference; }

  /// Plans `d` and, where it is accepted, runs it on exactly-sized random operands.
  void try_variant(const OpInfo& op, const OpDesc& d, bool wild_integers, const std::string& what) {
    if (device_fault) return;
    SCOPED_TRACE(op.name + " on " + backend_name(backend) + ": " + what + ": " + d.to_string());
    if (std::getenv("BARACUDA_FUZZ_TRACE"))
      std::fprintf(stderr, "TRACE %s on %s: %s: %s\n", op.name.c_str(), backend_name(backend), what.c_str(),
                   d.to_string().c_str());
    for (const auto& t : d.inputs)
      if (bytes_of(t) > kMaxBytes) return;
    for (const auto& t : d.outputs)
      if (bytes_of(t) > kMaxBytes) return;
    PlanPreference pref;
    pref.backend = backend;
    const Stream stream = on_device() ? Stream::cuda() : Stream::host();
    auto plan = select(stream, d, pref);
    if (!plan) {
      EXPECT_FALSE(plan.status().message().empty());
      ++refused;
      return;
    }
    // Each operand its own allocation of exactly its size (no slack for an overrun to hide in).
    std::vector<ExactBuffer> memory;
    memory.reserve(d.inputs.size() + d.outputs.size() + 1);
    auto place = [&](const TensorSpec& t, const std::vector<unsigned char>& bytes) -> TensorView {
      memory.emplace_back(bytes.size(), on_device());
      memory.back().upload(bytes);
      return *TensorView::contiguous(memory.back().data, t.dtype, t.shape);
    };
    std::vector<TensorView> in_views, out_views;
    for (size_t i = 0; i < d.inputs.size(); ++i)
      in_views.push_back(place(d.inputs[i], random_bytes(d.inputs[i], rng, wild_integers,
                                                         op.domain(op.operand_of(true, i, d.inputs.size())))));
    for (const auto& t : d.outputs)  // poisoned: all bits set (NaN for floats)
      out_views.push_back(place(t, std::vector<unsigned char>(size_t(bytes_of(t)), 0xff)));
    const OpArgs args{in_views, out_views};
    const ExactBuffer& workspace = memory.emplace_back((*plan)->workspace_size(), on_device());
    Status s = (*plan)->can_implement(args);
    if (s.is_ok()) s = (*plan)->run(stream, Workspace{workspace.data, workspace.bytes}, args);
#ifdef BARACUDA_HAS_CUDA
    if (on_device()) {
      const cudaError_t e = cudaDeviceSynchronize();
      if (e != cudaSuccess) {
        device_fault = true;
        ADD_FAILURE() << "CUDA error after the run: " << cudaGetErrorString(e);
        return;
      }
    }
#endif
    if (s.is_ok()) {
      ++ran;
    } else {
      EXPECT_FALSE(s.message().empty());
      ++failed_at_run;
    }
  }

  /// Every one-change variant of the valid descriptor `base`.
  void bend(const OpInfo& op, const OpDesc& base) {
    try_variant(op, base, false, "as sampled");
    try_variant(op, base, true, "integer inputs out of their domain");
    // Shapes and dtypes, inputs re-inferred (outputs dropped where the op infers them) and kept as sampled.
    auto operands = [&](bool inputs) -> size_t { return inputs ? base.inputs.size() : base.outputs.size(); };
    for (bool inputs : {true, false}) {
      for (size_t k = 0; k < operands(inputs); ++k) {
        const std::vector<std::string> names = op.operand_names(inputs, operands(inputs));
        const std::string name = k < names.size() ? names[k] : "out";
        auto variant = [&](const std::string& what, const std::function<void(TensorSpec&)>& change) {
          OpDesc d = base;
          change(inputs ? d.inputs[k] : d.outputs[k]);
          try_variant(op, d, false, "'" + name + "' " + what);
          if (inputs) {  // the outputs the changed inputs imply, where infer accepts them
            OpDesc partial = d;
            partial.outputs.clear();
            if (auto inferred = op.infer(partial)) try_variant(op, *inferred, false, "'" + name + "' " + what + ", outputs inferred");
          }
        };
        const Shape shape = inputs ? base.inputs[k].shape : base.outputs[k].shape;
        for (size_t a = 0; a < shape.size(); ++a) {
          variant("dim " + std::to_string(a) + " + 1", [a](TensorSpec& t) { t.shape[a] += 1; });
          variant("dim " + std::to_string(a) + " - 1", [a](TensorSpec& t) { t.shape[a] = std::max<int64_t>(t.shape[a] - 1, 0); });
          variant("dim " + std::to_string(a) + " = 0", [a](TensorSpec& t) { t.shape[a] = 0; });
        }
        if (!shape.empty()) variant("rank - 1", [](TensorSpec& t) { t.shape.pop_back(); });
        variant("rank + 1", [](TensorSpec& t) { t.shape.insert(t.shape.begin(), 2); });
        for (DType other : kOtherDtypes)
          variant(std::string("as ") + dtype_name(other), [other](TensorSpec& t) { t.dtype = other; });
      }
    }
    // Attributes: each one at values around and far from the usual ones.
    for (const AttrSpec& attr : op.attrs) {
      for (double v : {-1000.0, -3.0, -1.0, 0.0, 1.0, 2.0, 5.0, 1e6, 0.5}) {
        OpDesc partial = base;
        partial.attrs.set(attr.name, v);
        partial.outputs.clear();
        const std::string what = attr.name + " = " + std::to_string(v);
        if (auto inferred = op.infer(partial)) try_variant(op, *inferred, false, what + ", outputs inferred");
        OpDesc kept = base;
        kept.attrs.set(attr.name, v);
        try_variant(op, kept, false, what);
      }
    }
  }
};

/// varlen_attention and its backward have no sample shapes (their offsets must be valid): two sequences
/// of 9 query and 7 key tokens in all, 4 query heads over 2 key heads, D 8.
Result<OpDesc> packed_sequences(const OpInfo& op, DType dtype, const Attrs& attrs) {
  if (!op.name.starts_with("varlen_attention")) return Status::error(ErrorKind::unsupported, "not packed");
  const TensorSpec q{dtype, {9, 4, 8}}, kv{dtype, {7, 2, 8}}, offsets{DType::i32, {3}}, no_alibi{dtype, {0}};
  auto forward = find_op("varlen_attention")->infer(OpDesc{"varlen_attention", {q, kv, kv, offsets, offsets, no_alibi}, {}, attrs});
  if (!forward || op.name == "varlen_attention") return forward;
  const TensorSpec &out = forward->outputs[0], &lse = forward->outputs[1];
  return op.infer(OpDesc{op.name, {out, q, kv, kv, out, lse, offsets, offsets, no_alibi}, {}, attrs});
}

bool has_backend(const OpInfo& op, Backend backend) {
  return std::find(op.backends.begin(), op.backends.end(), backend) != op.backends.end();
}

/// Bends every op `backend` serves (all of them when none is given): its first and last dtype, up to
/// three sample attribute sets. Returns the number of ops bent.
int bend_every_op(Fuzzer& fuzzer, const std::vector<Backend>& backends) {
  int ops = 0;
  for (const OpInfo& op : registry()) {
    if (op.dtypes.empty()) continue;
    std::vector<DType> dtypes{op.dtypes.front()};
    if (op.dtypes.back() != op.dtypes.front()) dtypes.push_back(op.dtypes.back());
    bool sampled = false;
    for (Backend backend : backends) {
      if (!has_backend(op, backend) || fuzzer.device_fault) continue;
      fuzzer.backend = backend;
      for (DType dtype : dtypes) {
        for (size_t s = 0; s < op.sample_attrs.size() && s < 3; ++s) {
          // The op's typical shape, else the first small shape of rank 0 or 2 to 4 it has a sample for
          // (dot, matmuls, trace, group/instance norms, paged attention), else packed sequences.
          Result<OpDesc> base = Status::error(ErrorKind::unsupported, "no sample shape");
          for (const Shape& shape : {harness::default_shape(op, 24), Shape{}, Shape{4, 6}, Shape{2, 4, 6}, Shape{2, 4, 3, 2}}) {
            base = harness::case_descriptor(harness::CaseSpec{&op, dtype, shape, op.sample_attrs[s]});
            if (base) break;
          }
          if (!base) base = packed_sequences(op, dtype, op.sample_attrs[s]);
          if (!base) continue;
          sampled = true;
          fuzzer.bend(op, *base);
        }
      }
    }
    ops += sampled;
    EXPECT_TRUE(sampled || !has_backend(op, Backend::host_reference)) << op.name << ": no base descriptor to bend";
  }
  std::printf("fuzz: %d ops, %lld variants refused at select, %lld refused at run, %lld ran\n", ops,
              (long long)fuzzer.refused, (long long)fuzzer.failed_at_run, (long long)fuzzer.ran);
  return ops;
}

TEST(Fuzz, BentDescriptorsAreRefusedOrRunInBounds) {
  Fuzzer fuzzer;
  const int ops = bend_every_op(fuzzer, {Backend::host_reference});
  // The fuzz did something of each kind (a driver that planned nothing would pass vacuously).
  // (2026-11-28: 328 ops, 49186 refused at select, 2118 at run, 30022 ran.)
  EXPECT_GT(ops, 300);
  EXPECT_GT(fuzzer.refused, 20000);
  EXPECT_GT(fuzzer.ran, 20000);
}

// The same on every GPU backend: cuDNN, cuBLASLt and the bespoke kernels see the bent descriptors the
// host refuses or runs, with integer inputs (indices, lengths, offsets, block tables) out of range.
TEST(FuzzCuda, BentDescriptorsAreRefusedOrRunInBounds) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<Backend> gpu;
  for (const OpInfo& op : registry())
    for (Backend b : op.backends)
      if (b != Backend::host_reference && std::find(gpu.begin(), gpu.end(), b) == gpu.end()) gpu.push_back(b);
  Fuzzer fuzzer;
  const int ops = bend_every_op(fuzzer, gpu);
  // (2026-11-28, H200: 328 ops, 60499 refused at select, 55 at run, 32846 ran in 8.4 s; under
  // compute-sanitizer memcheck in 32 s with 0 errors.)
  EXPECT_GT(ops, 300);
  EXPECT_GT(fuzzer.refused, 20000);
  EXPECT_GT(fuzzer.ran, 20000);
}

}  // namespace
