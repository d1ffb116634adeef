// baracuda CLI: list ops, run/verify/time one op, or run the standard suite
// (every registered op x dtype, checked against the host reference and timed).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "baracuda/registry.hpp"
#include "harness.hpp"

using namespace baracuda;
using namespace baracuda::harness;

namespace {

void usage() {
  std::puts(
      "usage:\n"
      "  baracuda list [--json]                      every op: family, direction, dtypes, backends\n"
      "  baracuda run OP [--dtype D] [--shape 4096,4096] [--attr name=value]... [--layout L]\n"
      "               [--backend B] [--deterministic] [--json]  verify against the host reference and time\n"
      "                                              (ms: device time a run; host_us: the caller's time a run)\n"
      "  baracuda suite [--backend B] [--deterministic] [--elements N] [--filter TEXT] [--json]\n"
      "                                              the standard suite (the main job)\n"
      "layouts: contiguous strided transposed broadcast inplace shifted\n"
      "backends: host cuda cublaslt cudnn cufft cusolver curand cusparse nccl cccl cutlass (default: cuda\n"
      "          with a GPU, else host); --deterministic: only plans that give the same bits every run");
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

std::string dtypes_text(const OpInfo& op, const char* sep) {
  std::string s;
  for (DType d : op.dtypes) s += std::string(s.empty() ? "" : sep) + dtype_name(d);
  return s;
}

int cmd_list(bool json) {
  if (json) {
    std::printf("[\n");
    for (size_t i = 0; i < registry().size(); ++i) {
      const OpInfo& op = registry()[i];
      std::printf("  {\"name\": \"%s\", \"category\": \"%s\", \"family\": \"%s\", \"direction\": \"%s\", "
                  "\"gradient\": \"%s\", \"dtypes\": [",
                  op.name.c_str(), category_name(op.category), op.family.c_str(),
                  op.direction == Direction::forward ? "fwd" : "bwd", op.gradient.c_str());
      for (size_t k = 0; k < op.dtypes.size(); ++k) std::printf("%s\"%s\"", k ? ", " : "", dtype_name(op.dtypes[k]));
      std::printf("], \"backends\": [");
      for (size_t k = 0; k < op.backends.size(); ++k)
        std::printf("%s\"%s\"", k ? ", " : "", backend_name(op.backends[k]));
      std::printf("], \"attrs\": {");
      for (size_t k = 0; k < op.attrs.size(); ++k)
        std::printf("%s\"%s\": %g", k ? ", " : "", op.attrs[k].name.c_str(), op.attrs[k].default_value);
      std::printf("}}%s\n", i + 1 < registry().size() ? "," : "");
    }
    std::printf("]\n");
    return 0;
  }
  std::printf("%-24s %-12s %-4s %-22s %-12s %s\n", "op", "family", "dir", "gradient", "backends", "dtypes");
  for (const OpInfo& op : registry()) {
    std::string backends;
    for (Backend b : op.backends) backends += std::string(backends.empty() ? "" : ",") + backend_name(b);
    std::printf("%-24s %-12s %-4s %-22s %-12s %s\n", op.name.c_str(), op.family.c_str(),
                op.direction == Direction::forward ? "fwd" : "bwd", op.gradient.empty() ? "-" : op.gradient.c_str(),
                backends.c_str(), dtypes_text(op, " ").c_str());
  }
  size_t fwd = std::count_if(registry().begin(), registry().end(),
                             [](const OpInfo& o) { return o.direction == Direction::forward; });
  std::printf("%zu ops (%zu forward, %zu backward)\n", registry().size(), fwd, registry().size() - fwd);
  return 0;
}

Shape parse_shape(const char* text) {
  Shape s;
  std::string t(text);
  size_t pos = 0;
  while (pos <= t.size() && !t.empty()) {
    size_t comma = t.find_first_of(",x", pos);
    s.push_back(std::atoll(t.substr(pos, comma - pos).c_str()));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return s;
}

struct Row {
  CaseSpec spec;
  CaseOutcome verify, timed;
};

double gbps(const CaseOutcome& c) { return c.milliseconds > 0 ? c.bytes / (c.milliseconds * 1e-3) / 1e9 : 0; }

void print_row(const Row& r, double copy_gbps, bool json, bool& first) {
  const char* status = r.verify.skipped ? "skip" : (r.verify.passed ? "ok" : "FAIL");
  double bw = gbps(r.timed);
  if (json) {
    std::printf("%s  {\"op\": \"%s\", \"dtype\": \"%s\", \"shape\": \"%s\", \"layout\": \"%s\", \"status\": \"%s\", "
                "\"max_abs_error\": %.3g, \"ms\": %.5f, \"host_us\": %.2f, \"gb_per_s\": %.1f, \"copy_fraction\": %.3f, "
                "\"sku\": \"%s\", \"message\": \"%s\"}",
                first ? "" : ",\n", r.spec.op->name.c_str(), dtype_name(r.spec.dtype),
                shape_str(r.spec.shape).c_str(), layout_name(r.spec.layout), status, r.verify.max_abs_error,
                r.timed.milliseconds, r.timed.host_microseconds, bw, copy_gbps > 0 ? bw * 1e9 / copy_gbps : 0.0,
                json_escape(r.timed.sku.empty() ? r.verify.sku : r.timed.sku).c_str(),
                json_escape(r.verify.message).c_str());
    first = false;
    return;
  }
  std::string attrs;
  for (const auto& [k, v] : r.spec.attrs.values())
    attrs += (attrs.empty() ? "" : ",") + k + "=" + (k == "dtype" ? dtype_name(DType(int(v))) : std::to_string(v));
  std::printf("%-22s %-9s %-14s %-5s %10.4f %8.2f %9.1f %6.1f%%  %-10.3g %s%s%s\n", r.spec.op->name.c_str(),
              dtype_name(r.spec.dtype), attrs.c_str(), status, r.timed.milliseconds, r.timed.host_microseconds, bw,
              copy_gbps > 0 ? 100.0 * bw * 1e9 / copy_gbps : 0.0, r.verify.max_abs_error,
              r.verify.passed || r.verify.skipped ? "" : " ", r.verify.passed ? "" : r.verify.message.c_str(), "");
}

void print_header(bool json) {
  if (json) {
    std::printf("[\n");
    return;
  }
  std::printf("%-22s %-9s %-14s %-5s %10s %8s %9s %7s  %-10s\n", "op", "dtype", "attrs", "check", "ms", "host_us", "GB/s",
              "copy%",
              "max_err");
}

/// Run options on the default backend (cuda with a GPU, else host).
RunOptions default_options() {
  RunOptions opt;
  opt.backend = cuda_available() ? Backend::bespoke_cuda : Backend::host_reference;
  return opt;
}

/// Sets opt.backend from a --backend value; false (after naming it and the usage) when no backend has that name.
bool set_backend(const std::string& name, RunOptions& opt) {
  const auto b = backend_from_name(name);
  if (!b) {
    std::fprintf(stderr, "--backend: unknown backend '%s'\n", name.c_str());
    usage();
    return false;
  }
  opt.backend = *b;
  return true;
}

int cmd_run(int argc, char** argv) {
  if (argc < 1) {
    usage();
    return 2;
  }
  const OpInfo* op = find_op(argv[0]);
  if (!op) {
    std::fprintf(stderr, "unknown op '%s' (see 'baracuda list')\n", argv[0]);
    return 2;
  }
  CaseSpec spec;
  spec.op = op;
  spec.dtype = op->dtypes.empty() ? DType::f32 : op->dtypes[0];
  spec.shape = default_shape(*op, 1 << 24);
  RunOptions opt = default_options();
  opt.time = true;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--dtype") {
      auto d = dtype_from_name(next());
      if (!d) {
        std::fprintf(stderr, "unknown dtype\n");
        return 2;
      }
      spec.dtype = *d;
    } else if (a == "--shape") {
      spec.shape = parse_shape(next());
    } else if (a == "--attr") {
      std::string kv = next();
      size_t eq = kv.find('=');
      std::string key = kv.substr(0, eq), value = eq == std::string::npos ? "" : kv.substr(eq + 1);
      if (auto d = dtype_from_name(value)) spec.attrs.set(key, double(int(*d)));
      else spec.attrs.set(key, std::atof(value.c_str()));
    } else if (a == "--layout") {
      const std::string l = next();
      const auto layout = layout_from_name(l);
      if (!layout) {
        std::fprintf(stderr, "--layout: unknown layout '%s'\n", l.c_str());
        usage();
        return 2;
      }
      spec.layout = *layout;
    } else if (a == "--backend") {
      if (!set_backend(next(), opt)) return 2;
    } else if (a == "--deterministic") {
      opt.deterministic_only = true;
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  // An attribute not given that every sample set of the op fixes to one value takes it:
  // the sample operands are drawn for it (cross_entropy's ignore_index -1 among its targets).
  if (!op->sample_attrs.empty())
    for (const auto& [name, value] : op->sample_attrs.front().values()) {
      bool fixed = true;
      for (const Attrs& a : op->sample_attrs) fixed = fixed && a.has(name) && a.get(name, 0) == value;
      if (fixed && !spec.attrs.has(name)) spec.attrs.set(name, value);
    }
  int64_t n = 1;
  for (int64_t s : spec.shape) n *= s;
  Row row{spec, {}, {}};
  RunOptions check = opt;
  check.time = false;
  // The host reference checks up to 2^26 elements; attention's ([B, H, S, D] queries) costs B H S^2 D
  // multiply-adds, so it checks up to 2^31 of them (a few seconds on the host). RoPE, the KV cache and
  // decode share the category but not the quadratic cost: the element rule stays theirs.
  const bool quadratic = op->family == "attention" && spec.shape.size() == 4;
  check.verify = quadratic ? n * spec.shape[2] <= (int64_t(1) << 31) : n <= (int64_t(1) << 26);
  row.verify = run_case(spec, check);
  if (!check.verify && !row.verify.skipped) {  // a skip that names itself (an "ok" would claim a check)
    row.verify.skipped = true;
    row.verify.passed = false;
    row.verify.message = quadratic ? "not verified (over 2^31 multiply-adds on the host)" : "not verified (over 2^26 elements)";
  }
  RunOptions timing = opt;
  timing.verify = false;
  row.timed = run_case(spec, timing);
  double copy = opt.backend == Backend::host_reference ? 0 : measure_copy_bandwidth(size_t(1) << 30);
  bool first = true;
  print_header(json);
  print_row(row, copy, json, first);
  if (json) std::printf("\n]\n");
  else {
    std::printf("sku: %s\n", row.timed.sku.c_str());
    if (copy > 0) std::printf("device copy bandwidth: %.1f GB/s\n", copy / 1e9);
  }
  return row.verify.skipped || row.verify.passed ? 0 : 1;
}

int cmd_suite(int argc, char** argv) {
  RunOptions opt = default_options();
  bool json = false;
  std::string filter;
  int64_t elements = -1;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--backend" && i + 1 < argc) {
      if (!set_backend(argv[++i], opt)) return 2;
    } else if (a == "--deterministic") opt.deterministic_only = true;
    else if (a == "--elements" && i + 1 < argc) elements = std::atoll(argv[++i]);
    else if (a == "--filter" && i + 1 < argc) filter = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      usage();
      return 2;
    }
  }
  const bool gpu = opt.backend != Backend::host_reference;
  const int64_t verify_elements = gpu ? 1 << 16 : 4099;
  if (elements < 0) elements = gpu ? (int64_t(1) << 24) : (int64_t(1) << 16);
  double copy = gpu ? measure_copy_bandwidth(size_t(1) << 30) : 0;
  if (!json) {
    std::printf("baracuda standard suite: backend %s, verify at %lld elements, time at %lld elements\n",
                backend_name(opt.backend), (long long)verify_elements, (long long)elements);
    if (gpu) std::printf("device copy bandwidth: %.1f GB/s\n", copy / 1e9);
  }
  print_header(json);
  int passed = 0, failed = 0, skipped = 0;
  bool first = true;
  for (const OpInfo& op : registry()) {
    if (!filter.empty() && op.name.find(filter) == std::string::npos) continue;
    for (DType d : op.dtypes) {
      for (const Attrs& attrs : op.sample_attrs) {
        Row row;
        row.spec.op = &op;
        row.spec.dtype = d;
        row.spec.attrs = attrs;
        row.spec.shape = default_shape(op, verify_elements);
        RunOptions check = opt;
        row.verify = run_case(row.spec, check);
        RunOptions timing = opt;
        timing.verify = false;
        timing.time = true;
        timing.iterations = gpu ? 10 : 4;
        row.spec.shape = default_shape(op, elements);
        if (!row.verify.skipped) row.timed = run_case(row.spec, timing);
        (row.verify.skipped ? skipped : (row.verify.passed ? passed : failed))++;
        print_row(row, copy, json, first);
      }
    }
  }
  if (json) std::printf("\n]\n");
  std::fprintf(json ? stderr : stdout, "suite: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "list") return cmd_list(argc > 2 && std::strcmp(argv[2], "--json") == 0);
  if (cmd == "run") return cmd_run(argc - 2, argv + 2);
  if (cmd == "suite") return cmd_suite(argc - 2, argv + 2);
  usage();
  return 2;
}
