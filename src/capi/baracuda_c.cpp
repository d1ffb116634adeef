// The C ABI over the C++ plan API.
#include <cstdint>
#include <cstring>

#include "baracuda/baracuda.h"
#include "baracuda/registry.hpp"
#include "core/errors.hpp"

using namespace baracuda;

struct baracuda_plan_s {
  PlanPtr plan;
};

namespace {

thread_local std::string last_error;

baracuda_status report(const Status& s) {
  last_error = s.is_ok() ? std::string() : s.to_string();
  return static_cast<baracuda_status>(s.kind());
}

Stream to_stream(baracuda_stream s) {
  return s.is_host ? Stream::host() : Stream::cuda(static_cast<CUstream_st*>(s.cuda_stream));
}

Result<TensorView> to_view(const baracuda_tensor& t, const char* role, int32_t index) {
  auto where = [&] { return cat(role, " ", index); };
  if (t.rank < 0 || t.rank > kMaxRank)
    return invalid(where(), ": rank ", t.rank, " is outside [0, ", kMaxRank, "]");
  if (static_cast<int>(t.dtype) < 0 || static_cast<int>(t.dtype) >= kNumDTypes)
    return invalid(where(), ": unknown dtype code ", static_cast<int>(t.dtype));
  if (t.rank > 0 && !t.shape) return invalid(where(), ": shape is NULL for rank ", t.rank);
  std::span<const int64_t> shape(t.shape, t.rank);
  auto view = t.strides ? TensorView::strided(t.data, static_cast<DType>(t.dtype), shape,
                                              std::span<const int64_t>(t.strides, t.rank))
                        : TensorView::contiguous(t.data, static_cast<DType>(t.dtype), shape);
  if (!view) return view.status().with_context(where());
  return view;
}

Status to_views(const baracuda_tensor* ts, int32_t n, const char* role, std::vector<TensorView>& out) {
  if (n < 0 || (n > 0 && !ts)) return invalid(role, "s: ", n, " given with a NULL array");
  for (int32_t i = 0; i < n; ++i) {
    auto v = to_view(ts[i], role, i);
    if (!v) return v.status();
    out.push_back(*v);
  }
  return Status::ok();
}

Result<PlanPreference> to_preference(const baracuda_preference* p) {
  PlanPreference pref;
  if (!p) return pref;
  if (p->backend) {
    pref.backend = backend_from_name(p->backend);
    if (!pref.backend)
      return invalid("preference: unknown backend '", p->backend,
                     "' (host, cuda, cublaslt, cudnn, cufft, cusolver, curand, cusparse, nccl, cccl or cutlass)");
  }
  if (p->skip_candidates < 0) return invalid("preference: skip_candidates must be >= 0, got ", p->skip_candidates);
  pref.deterministic_only = p->deterministic_only != 0;
  pref.allow_tf32 = p->allow_tf32 != 0;
  pref.max_workspace_bytes = p->max_workspace_bytes;
  pref.skip_candidates = p->skip_candidates;
  return pref;
}

}  // namespace

extern "C" {

baracuda_preference baracuda_preference_default(void) {
  baracuda_preference p;
  p.backend = nullptr;
  p.deterministic_only = 0;
  p.allow_tf32 = 0;
  p.max_workspace_bytes = SIZE_MAX;
  p.skip_candidates = 0;
  return p;
}

baracuda_status baracuda_plan_create(baracuda_plan* plan, baracuda_stream stream, const char* op,
                                     const baracuda_tensor* inputs, int32_t n_inputs,
                                     const baracuda_tensor* outputs, int32_t n_outputs,
                                     const baracuda_attr* attrs, int32_t n_attrs) {
  return baracuda_plan_create_with(plan, stream, op, inputs, n_inputs, outputs, n_outputs, attrs, n_attrs, nullptr);
}

baracuda_status baracuda_plan_create_with(baracuda_plan* plan, baracuda_stream stream, const char* op,
                                          const baracuda_tensor* inputs, int32_t n_inputs,
                                          const baracuda_tensor* outputs, int32_t n_outputs,
                                          const baracuda_attr* attrs, int32_t n_attrs,
                                          const baracuda_preference* preference) {
  if (!plan || !op) return report(invalid("baracuda_plan_create: plan and op must not be NULL"));
  *plan = nullptr;
  auto pref = to_preference(preference);
  if (!pref) return report(pref.status());
  std::vector<TensorView> in, out;
  if (Status s = to_views(inputs, n_inputs, "input", in); !s) return report(s);
  if (Status s = to_views(outputs, n_outputs, "output", out); !s) return report(s);
  OpDesc desc{op, {}, {}, {}};
  for (const auto& v : in) desc.inputs.push_back({v.dtype, v.shape_vec()});
  for (const auto& v : out) desc.outputs.push_back({v.dtype, v.shape_vec()});
  for (int32_t i = 0; i < n_attrs; ++i) {
    if (!attrs || !attrs[i].name) return report(invalid("baracuda_plan_create: attribute ", i, " has no name"));
    desc.attrs.set(attrs[i].name, attrs[i].value);
  }
  if (desc.outputs.empty()) {
    const OpInfo* info = find_op(op);
    if (!info) return report(invalid("unknown op '", op, "'"));
    auto full = info->infer(desc);
    if (!full) return report(full.status());
    desc = std::move(*full);
  }
  auto selected = select(to_stream(stream), desc, *pref);
  if (!selected) return report(selected.status());
  *plan = new baracuda_plan_s{std::move(*selected)};
  return report(Status::ok());
}

void baracuda_plan_destroy(baracuda_plan plan) { delete plan; }

baracuda_status baracuda_plan_workspace_size(baracuda_plan plan, size_t* bytes) {
  if (!plan || !bytes) return report(invalid("baracuda_plan_workspace_size: NULL argument"));
  *bytes = plan->plan->workspace_size();
  return report(Status::ok());
}

baracuda_status baracuda_plan_deterministic(baracuda_plan plan, int32_t* deterministic) {
  if (!plan || !deterministic) return report(invalid("baracuda_plan_deterministic: NULL argument"));
  *deterministic = plan->plan->precision_guarantee().deterministic ? 1 : 0;
  return report(Status::ok());
}

baracuda_status baracuda_plan_sku(baracuda_plan plan, char* buf, size_t buf_len) {
  if (!plan || !buf) return report(invalid("baracuda_plan_sku: NULL argument"));
  std::string s = plan->plan->sku().to_string();
  if (buf_len < s.size() + 1)
    return report(Status::too_small(ErrorKind::buffer_too_small, s.size() + 1, buf_len,
                                    cat("baracuda_plan_sku: buffer of ", buf_len, " bytes, needs ", s.size() + 1)));
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return report(Status::ok());
}

baracuda_status baracuda_plan_output(baracuda_plan plan, int32_t i, baracuda_dtype* dtype, int32_t* rank,
                                     int64_t* shape) {
  if (!plan || !dtype || !rank || !shape) return report(invalid("baracuda_plan_output: NULL argument"));
  const auto& outs = plan->plan->desc().outputs;
  if (i < 0 || i >= static_cast<int32_t>(outs.size()))
    return report(invalid("baracuda_plan_output: index ", i, " outside [0, ", outs.size(), ")"));
  *dtype = static_cast<baracuda_dtype>(outs[i].dtype);
  *rank = static_cast<int32_t>(outs[i].shape.size());
  std::copy(outs[i].shape.begin(), outs[i].shape.end(), shape);
  return report(Status::ok());
}

baracuda_status baracuda_plan_run(baracuda_plan plan, baracuda_stream stream, void* workspace,
                                  size_t workspace_bytes, const baracuda_tensor* inputs, int32_t n_inputs,
                                  const baracuda_tensor* outputs, int32_t n_outputs) {
  if (!plan) return report(invalid("baracuda_plan_run: plan is NULL"));
  std::vector<TensorView> in, out;
  if (Status s = to_views(inputs, n_inputs, "input", in); !s) return report(s);
  if (Status s = to_views(outputs, n_outputs, "output", out); !s) return report(s);
  size_t needed = plan->plan->workspace_size();
  if (workspace_bytes < needed)
    return report(Status::too_small(ErrorKind::workspace_too_small, needed, workspace_bytes,
                                    cat("workspace of ", workspace_bytes, " bytes, the plan needs ", needed)));
  return report(plan->plan->run(to_stream(stream), Workspace{workspace, workspace_bytes}, OpArgs{in, out}));
}

const char* baracuda_last_error(void) { return last_error.c_str(); }
int32_t baracuda_op_count(void) { return static_cast<int32_t>(registry().size()); }
const char* baracuda_op_name(int32_t index) {
  return index >= 0 && index < baracuda_op_count() ? registry()[index].name.c_str() : nullptr;
}
const char* baracuda_dtype_name(baracuda_dtype dtype) {
  int d = static_cast<int>(dtype);
  return d >= 0 && d < kNumDTypes ? baracuda::dtype_name(static_cast<DType>(d)) : "?";
}
int baracuda_cuda_available(void) { return cuda_available() ? 1 : 0; }

}  // extern "C"
