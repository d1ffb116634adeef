#include <cstdio>
#include <cstdlib>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "core/registry_internal.hpp"

namespace baracuda {

namespace {

template <class Enum, size_t N>
const char* name_of(Enum value, const std::array<const char*, N>& names) {
  auto i = static_cast<size_t>(value);
  return i < N ? names[i] : "?";
}

constexpr std::array<const char*, 11> kBackendNames{
    "host", "cuda", "cublaslt", "cudnn", "cufft", "cusolver", "curand", "cusparse", "nccl", "cccl", "cutlass"};
constexpr std::array<const char*, 12> kCategoryNames{
    "elementwise", "reduce", "scan", "softmax", "norm", "loss", "gemm", "attention", "shape", "index", "random", "other"};
constexpr std::array<const char*, 6> kMathNames{"exact", "f16", "bf16", "tf32", "f32", "f64"};

bool verbose_select() {
  const char* v = std::getenv("BARACUDA_VERBOSE_SELECT");
  return v && *v && *v != '0';
}

}  // namespace

const char* backend_name(Backend b) { return name_of(b, kBackendNames); }
const char* category_name(OpCategory c) { return name_of(c, kCategoryNames); }
const char* math_precision_name(MathPrecision m) { return name_of(m, kMathNames); }

std::optional<Backend> backend_from_name(std::string_view name) {
  for (size_t i = 0; i < kBackendNames.size(); ++i)
    if (name == kBackendNames[i]) return static_cast<Backend>(i);
  return std::nullopt;
}

std::string KernelSku::to_string() const {
  std::string s = cat(category_name(category), "/", op, "/", dtype_name(element));
  if (aux_element) s += cat("->", dtype_name(*aux_element));
  s += cat("/", backend_name(backend));
  if (arch) s += cat("/sm", arch);
  if (*kernel) s += cat("/", kernel);
  s += cat("/math=", math_precision_name(precision.math), ",acc=", dtype_name(precision.accumulator),
           precision.deterministic ? ",deterministic" : ",nondeterministic");
  return s;
}

std::string OpDesc::to_string() const {
  auto specs = [](const std::vector<TensorSpec>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += cat(i ? ", " : "", dtype_name(v[i].dtype), shape_str(v[i].shape));
    return s;
  };
  std::string s = cat(op, "(", specs(inputs), ") -> (", specs(outputs), ")");
  for (const auto& [k, v] : attrs.values()) s += cat(" ", k, "=", v);
  return s;
}

const AttrSpec* OpInfo::find_attr(std::string_view attr) const {
  for (const auto& a : attrs)
    if (a.name == attr) return &a;
  return nullptr;
}

Domain OpInfo::domain(size_t input) const {
  if (domains.empty()) return {};
  return domains[std::min(input, domains.size() - 1)];
}

std::vector<std::string> OpInfo::operand_names(bool inputs, size_t count) const {
  const std::vector<std::string>& names = inputs ? input_names : output_names;
  if (!variadic || names.empty()) return names;
  const size_t groups = count / names.size();
  std::vector<std::string> all;
  all.reserve(names.size() * groups);
  for (const std::string& name : names)
    for (size_t g = 0; g < groups; ++g) all.push_back(cat(name, "[", g, "]"));
  return all;
}

size_t OpInfo::operand_of(bool inputs, size_t index, size_t count) const {
  const size_t per_group = (inputs ? input_names : output_names).size();
  if (!variadic || per_group == 0 || count < per_group) return index;
  return index / (count / per_group);
}

const std::vector<OpInfo>& registry() {
  static const std::vector<OpInfo> ops = [] {
    std::vector<OpInfo> all;
    register_elementwise_ops(all);
    register_reduce_ops(all);
    register_softmax_ops(all);
    register_norm_ops(all);
    register_batch_norm_ops(all);
    register_group_norm_ops(all);
    register_scan_ops(all);
    register_loss_ops(all);
    register_ctc_ops(all);
    register_linear_ce_ops(all);
    register_gemm_ops(all);
    register_grouped_gemm_ops(all);
    register_grouped_gemm_list_ops(all);
    register_scaled_mm_ops(all);
    register_attention_ops(all);
    register_rope_ops(all);
    register_decode_ops(all);
    return all;
  }();
  return ops;
}

const OpInfo* find_op(std::string_view name) {
  for (const auto& op : registry())
    if (op.name == name) return &op;
  return nullptr;
}

Result<OpDesc> infer(const std::string& op, std::vector<TensorSpec> inputs, const Attrs& attrs) {
  const OpInfo* info = find_op(op);
  if (!info) return invalid("unknown op '", op, "'");
  OpDesc partial{op, std::move(inputs), {}, attrs};
  return info->infer(partial);
}

Result<PlanPtr> select(const Stream& stream, const OpDesc& desc, const PlanPreference& pref) {
  const OpInfo* info = find_op(desc.op);
  if (!info) return invalid("select: unknown op '", desc.op, "'");
  for (const auto& [name, value] : desc.attrs.values())
    if (!info->find_attr(name)) return invalid(desc.op, ": unknown attribute '", name, "'");
  std::string reasons;
  int to_skip = pref.skip_candidates;
  for (Backend backend : info->backends) {
    auto reject = [&](const std::string& why) {
      reasons += cat("\n  ", backend_name(backend), ": ", why);
      if (verbose_select())
        std::fprintf(stderr, "[baracuda] select %s: %s rejected: %s\n", desc.op.c_str(), backend_name(backend),
                     why.c_str());
    };
    if (pref.backend && *pref.backend != backend) {
      reject(cat("the preference asks for ", backend_name(*pref.backend)));
      continue;
    }
    if (backend == Backend::host_reference) {
      if (!stream.is_host()) {
        reject("the stream is a CUDA stream (the host backend runs on Stream::host())");
        continue;
      }
      if (!pref.allow_host_fallback) {
        reject("the preference disallows the host backend");
        continue;
      }
    } else if (stream.is_host()) {
      reject("the stream is the host stream");
      continue;
    } else if (!cuda_available()) {
      reject("no CUDA device is available");
      continue;
    }
    auto plan = info->make_plan(backend, stream, desc, pref);
    if (!plan) {
      // A wrong descriptor is the caller's error, whatever the candidate.
      if (plan.status().kind() == ErrorKind::invalid_problem) return plan.status();
      reject(plan.status().message());
      continue;
    }
    if (pref.deterministic_only && !(*plan)->precision_guarantee().deterministic) {
      reject("not deterministic and the preference asks for determinism");
      continue;
    }
    if ((*plan)->workspace_size() > pref.max_workspace_bytes) {
      reject(cat("needs ", (*plan)->workspace_size(), " workspace bytes, the preference allows ",
                 pref.max_workspace_bytes));
      continue;
    }
    if (to_skip-- > 0) {
      reject("skipped on request (PlanPreference::skip_candidates)");
      continue;
    }
    if (verbose_select())
      std::fprintf(stderr, "[baracuda] select %s: chose %s\n", desc.op.c_str(), (*plan)->sku().to_string().c_str());
    return plan;
  }
  return unsupported("select: no candidate accepts ", desc.to_string(), ":", reasons);
}

Status run_op(const Stream& stream, const std::string& op, std::span<const TensorView> inputs,
              std::span<const TensorView> outputs, const Attrs& attrs) {
  OpDesc desc{op, {}, {}, attrs};
  for (const auto& v : inputs) desc.inputs.push_back({v.dtype, v.shape_vec()});
  for (const auto& v : outputs) desc.outputs.push_back({v.dtype, v.shape_vec()});
  auto plan = select(stream, desc);
  if (!plan) return plan.status();
  if ((*plan)->workspace_size() != 0)
    return Status::too_small(ErrorKind::workspace_too_small, (*plan)->workspace_size(), 0,
                             cat(op, ": run_op passes no workspace; select a plan and give it one"));
  OpArgs args{inputs, outputs};
  BARACUDA_TRY((*plan)->can_implement(args));
  return (*plan)->run(stream, {}, args);
}

}  // namespace baracuda
