// Runs one op on one backend from host values with chosen strides: the
// helper the family tests use for hand-written cases (exact values, finite
// differences, awkward views) outside the generic sweep.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "harness.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace baracuda::testing_support {

using namespace baracuda::harness;

/// A host operand: values of a logical shape laid out with `strides` (empty:
/// row-major) in a buffer of `dtype`.
struct Operand {
  std::vector<double> values;  // row-major logical order
  Shape shape;
  DType dtype = DType::f64;
  Shape strides = {};
};

inline int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

inline Shape row_major(const Shape& s) {
  Shape st(s.size());
  int64_t step = 1;
  for (size_t d = s.size(); d-- > 0;) st[d] = step, step *= std::max<int64_t>(s[d], 1);
  return st;
}

/// Physical offsets of each logical (row-major) element; the buffer length.
inline std::pair<std::vector<int64_t>, int64_t> offsets(const Shape& shape, const Shape& strides) {
  std::vector<int64_t> out;
  int64_t lo = 0, hi = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 0) (strides[d] < 0 ? lo : hi) += (shape[d] - 1) * strides[d];
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < numel(shape); ++i) {
    int64_t off = -lo;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    out.push_back(off);
    for (size_t d = shape.size(); d-- > 0;)
      if (++idx[d] < shape[d]) break;
      else idx[d] = 0;
  }
  return {out, hi - lo + 1};
}

/// Runs `op` on `backend` (the host or CUDA with the given candidate);
/// output j is laid out with output_strides[j] when given (else row-major)
/// and every output is returned as f64 in row-major order. CUDA with
/// `graph_replays` > 0: the run is captured into a CUDA graph on a stream of
/// its own and the graph launched that many times instead. The workspace
/// starts `workspace_offset` bytes into its allocation (alignment tests).
/// Outputs start as NaN, or output_values[j] (row-major) where given (ops
/// that read their output: grouped_gemm's beta).
inline Result<std::vector<std::vector<double>>> exec(Backend backend, const std::string& op, const std::vector<Operand>& inputs,
                                              const Attrs& attrs = {}, const PlanPreference& base = {},
                                              const std::vector<Shape>& output_strides = {},
                                              [[maybe_unused]] int graph_replays = 0,  // (host-only builds)
                                              size_t workspace_offset = 0,
                                              const std::vector<std::vector<double>>& output_values = {}) {
  const bool device = backend != Backend::host_reference;
  std::vector<TensorSpec> specs;
  for (const auto& o : inputs) specs.push_back({o.dtype, o.shape});
  PlanPreference pref = base;
  pref.backend = backend;
  auto plan = select(device ? Stream::cuda() : Stream::host(), OpDesc{op, specs, {}, attrs}, pref);
  if (!plan) return plan.status();
  const OpDesc& full = (*plan)->desc();
  std::vector<Memory> memory;
  std::vector<TensorView> in, out;
  auto place = [&](const Operand& o, bool fill) -> Result<TensorView> {
    const Shape strides = o.strides.empty() ? row_major(o.shape) : o.strides;
    auto [offs, span] = offsets(o.shape, strides);
    Memory host = Memory::host(size_t(span) * dtype_size(o.dtype));
    int64_t base_off = 0;
    for (size_t d = 0; d < o.shape.size(); ++d)
      if (strides[d] < 0 && o.shape[d] > 0) base_off -= (o.shape[d] - 1) * strides[d];
    for (int64_t e = 0; e < span; ++e) store_double(host.data(), o.dtype, e, NAN);
    if (fill)
      for (size_t i = 0; i < offs.size(); ++i) store_double(host.data(), o.dtype, offs[i], o.values[i]);
    Memory target = std::move(host);
#ifdef BARACUDA_HAS_CUDA
    if (device) {
      auto m = Memory::device(target.bytes());
      if (!m) return m.status();
      cudaMemcpy(m->data(), target.data(), target.bytes(), cudaMemcpyHostToDevice);
      target = std::move(*m);
    }
#endif
    memory.push_back(std::move(target));
    char* data = static_cast<char*>(memory.back().data()) + base_off * int64_t(dtype_size(o.dtype));
    return *TensorView::strided(data, o.dtype, o.shape, strides);
  };
  for (const auto& o : inputs) {
    auto v = place(o, true);
    if (!v) return v.status();
    in.push_back(*v);
  }
  std::vector<Operand> outs;
  for (const auto& s : full.outputs) {
    const size_t j = outs.size();
    outs.push_back({j < output_values.size() ? output_values[j] : std::vector<double>{}, s.shape, s.dtype,
                    j < output_strides.size() ? output_strides[j] : Shape{}});
  }
  for (const auto& o : outs) {
    auto v = place(o, !o.values.empty());
    if (!v) return v.status();
    out.push_back(*v);
  }
  const size_t first_out = memory.size() - outs.size();
  Memory ws_memory = Memory::host((*plan)->workspace_size() + workspace_offset);
#ifdef BARACUDA_HAS_CUDA
  if (device && (*plan)->workspace_size()) {
    auto m = Memory::device((*plan)->workspace_size() + workspace_offset);
    if (!m) return m.status();
    ws_memory = std::move(*m);
  }
#endif
  const Workspace ws{static_cast<char*>(ws_memory.data()) + workspace_offset, (*plan)->workspace_size()};
  OpArgs args{in, out};
  BARACUDA_TRY((*plan)->can_implement(args));
#ifdef BARACUDA_HAS_CUDA
  if (device && graph_replays > 0) {
    struct Captured {  // released on every path out
      cudaStream_t stream = nullptr;
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t instance = nullptr;
      ~Captured() {
        if (instance) cudaGraphExecDestroy(instance);
        if (graph) cudaGraphDestroy(graph);
        if (stream) cudaStreamDestroy(stream);
      }
    } g;
    auto failed = [](const char* what, cudaError_t e) {
      return internal_error("exec: ", what, ": ", cudaGetErrorString(e));
    };
    if (auto e = cudaStreamCreate(&g.stream); e != cudaSuccess) return failed("cudaStreamCreate", e);
    if (auto e = cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeGlobal); e != cudaSuccess)
      return failed("cudaStreamBeginCapture", e);
    const Status ran = (*plan)->run(Stream::cuda(g.stream), ws, args);
    const cudaError_t captured = cudaStreamEndCapture(g.stream, &g.graph);
    BARACUDA_TRY(ran);
    if (captured != cudaSuccess) return failed("cudaStreamEndCapture", captured);
    if (auto e = cudaGraphInstantiate(&g.instance, g.graph, 0); e != cudaSuccess)
      return failed("cudaGraphInstantiate", e);
    for (int r = 0; r < graph_replays; ++r)
      if (auto e = cudaGraphLaunch(g.instance, g.stream); e != cudaSuccess) return failed("cudaGraphLaunch", e);
    if (auto e = cudaStreamSynchronize(g.stream); e != cudaSuccess) return failed("graph replay", e);
  } else
#endif
    BARACUDA_TRY((*plan)->run(device ? Stream::cuda() : Stream::host(), ws, args));
  std::vector<std::vector<double>> result;
  for (size_t j = 0; j < outs.size(); ++j) {
    const Memory& m = memory[first_out + j];
    Memory host = Memory::host(m.bytes());
#ifdef BARACUDA_HAS_CUDA
    if (device) cudaMemcpy(host.data(), m.data(), m.bytes(), cudaMemcpyDeviceToHost);
    else
#endif
      std::memcpy(host.data(), m.data(), m.bytes());
    auto [offs, span] = offsets(outs[j].shape, outs[j].strides.empty() ? row_major(outs[j].shape) : outs[j].strides);
    std::vector<double> v;
    for (int64_t off : offs) v.push_back(load_double(host.data(), outs[j].dtype, off));
    result.push_back(v);
  }
  return result;
}

inline std::vector<double> small_ints(int64_t n, std::mt19937& rng, int lo = -2, int hi = 2) {
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// What a bad-input test reads: the error's message, or "(no error)".
template <class T>
std::string error_message(const Result<T>& r) {
  return r ? std::string("(no error)") : r.status().message();
}

/// Whether an error message contains `part`.
inline bool has(const std::string& message, const std::string& part) { return message.find(part) != std::string::npos; }

/// The host reference, and the bespoke CUDA backend when a GPU is present.
inline std::vector<Backend> host_and_cuda_backends() {
  std::vector<Backend> b{Backend::host_reference};
  if (cuda_available()) b.push_back(Backend::bespoke_cuda);
  return b;
}

}  // namespace baracuda::testing_support
