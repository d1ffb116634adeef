#include "harness.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "core/dtype_traits.hpp"
#include "core/errors.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace baracuda::harness {

const char* layout_name(LayoutKind layout) {
  switch (layout) {
    case LayoutKind::contiguous: return "contiguous";
    case LayoutKind::strided: return "strided";
    case LayoutKind::transposed: return "transposed";
    case LayoutKind::broadcast: return "broadcast";
    case LayoutKind::inplace: return "inplace";
    case LayoutKind::shifted: return "shifted";
  }
  return "?";
}

std::optional<LayoutKind> layout_from_name(std::string_view name) {
  for (LayoutKind k : kAllLayouts)
    if (name == layout_name(k)) return k;
  if (name == layout_name(LayoutKind::shifted)) return LayoutKind::shifted;
  return std::nullopt;
}

// ---------------------------------------------------------------- memory

Memory Memory::host(size_t bytes) {
  Memory m;
  m.bytes_ = bytes;
  size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  m.ptr_ = std::aligned_alloc(256, rounded);
  return m;
}

Result<Memory> Memory::device(size_t bytes) {
#ifdef BARACUDA_HAS_CUDA
  Memory m;
  m.bytes_ = bytes;
  m.device_ = true;
  cudaError_t err = cudaMalloc(&m.ptr_, std::max<size_t>(bytes, 256));
  if (err != cudaSuccess) return Status::backend("cudart", err, cat("cudaMalloc(", bytes, "): ", cudaGetErrorString(err)));
  return m;
#else
  (void)bytes;
  return unsupported("no CUDA in this build");
#endif
}

Memory& Memory::operator=(Memory&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(bytes_, o.bytes_);
  std::swap(device_, o.device_);
  return *this;
}

Memory::~Memory() {
  if (!ptr_) return;
#ifdef BARACUDA_HAS_CUDA
  if (device_) {
    cudaFree(ptr_);
    return;
  }
#endif
  std::free(ptr_);
}

namespace {

Status copy_bytes(void* dst, const void* src, size_t bytes, bool to_device, bool from_device) {
  if (!to_device && !from_device) {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
#ifdef BARACUDA_HAS_CUDA
  auto kind = to_device ? (from_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice) : cudaMemcpyDeviceToHost;
  cudaError_t err = cudaMemcpy(dst, src, bytes, kind);
  if (err != cudaSuccess) return Status::backend("cudart", err, cat("cudaMemcpy: ", cudaGetErrorString(err)));
  return Status::ok();
#else
  return unsupported("no CUDA in this build");
#endif
}

}  // namespace

// ---------------------------------------------------------------- element IO

namespace {

/// Per-dtype element conversion, resolved once per dtype instead of per element.
struct ElementIO {
  double (*load)(const void*, int64_t) = nullptr;
  void (*store)(void*, int64_t, double) = nullptr;
};

const ElementIO& element_io(DType dtype) {
  static const auto table = [] {
    std::array<ElementIO, kNumDTypes> t{};
    for_each_type<AllTypes>([&]<class T>(TypeTag<T>) {
      t[static_cast<int>(dtype_of<T>)] = {
          [](const void* base, int64_t off) { return convert<double>(static_cast<const T*>(base)[off]); },
          [](void* base, int64_t off, double v) { static_cast<T*>(base)[off] = convert<T>(v); }};
    });
    return t;
  }();
  return table[static_cast<int>(dtype)];
}

}  // namespace

double load_double(const void* base, DType dtype, int64_t offset) { return element_io(dtype).load(base, offset); }
void store_double(void* base, DType dtype, int64_t offset, double value) { element_io(dtype).store(base, offset, value); }

namespace {

double load_imag(const void* base, DType dtype, int64_t offset) {
  if (dtype == DType::c64) return static_cast<const Complex<float>*>(base)[offset].im;
  if (dtype == DType::c128) return static_cast<const Complex<double>*>(base)[offset].im;
  return 0;
}

/// The value `v` rounded to `dtype`.
double round_to(DType dtype, double v) {
  char buf[16];
  store_double(buf, dtype, 0, v);
  return load_double(buf, dtype, 0);
}

}  // namespace

Tolerance tolerance_for(DType dtype, double scale) {
  Tolerance t;
  switch (dtype) {
    // f64: a few ulps of elementwise math, or a sum of ~1e5 terms in another order.
    case DType::f64: case DType::c128: t = {1e-11, 1e-11}; break;
    case DType::f32: case DType::c64: t = {2e-5, 2e-5}; break;
    case DType::f16: t = {2e-3, 2e-3}; break;
    case DType::bf16: t = {1.6e-2, 1.6e-2}; break;
    case DType::fp8_e4m3: t = {0.13, 0.02}; break;
    case DType::fp8_e5m2: t = {0.26, 0.04}; break;
    default: break;  // exact
  }
  t.rtol *= scale;
  t.atol *= scale;
  return t;
}

std::string CaseSpec::to_string() const {
  std::string s = cat(op ? op->name : "?", " ", dtype_name(dtype), " ", shape_str(shape), " ", layout_name(layout));
  for (const auto& [k, v] : attrs.values()) s += cat(" ", k, "=", v);
  return s;
}

Shape default_shape(const OpInfo& op, int64_t elements) {
  if (op.family == "gated" && elements >= 4096) return {elements / 4096, 4096};
  // Row-wise and reducing families: a matrix, so that every axis attribute fits.
  if (op.category != OpCategory::elementwise && elements >= 1024) return {elements / 1024, 1024};
  return {elements};
}

// ---------------------------------------------------------------- placement

namespace {

/// Where an operand lives inside its buffer.
struct Placement {
  Shape shape;
  std::vector<int64_t> strides;
  int64_t offset = 0;  ///< element offset of the view's data pointer
  int64_t span = 1;    ///< elements the buffer holds
};

Placement place(const Shape& shape, LayoutKind layout, bool is_input, bool expand_dim0) {
  Placement p;
  p.shape = shape;
  const size_t rank = shape.size();
  p.strides.assign(rank, 0);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if ((layout == LayoutKind::strided || (layout == LayoutKind::transposed && is_input)) && rank > 0) {
    // Column-major; strided: with a gap of one element, inputs walking dim 0 backwards.
    const bool gaps = layout == LayoutKind::strided;
    int64_t s = gaps ? 2 : 1;
    for (size_t d = 0; d < rank; ++d) {
      p.strides[d] = s;
      s *= std::max<int64_t>(shape[d], 1);
    }
    p.span = std::max<int64_t>(s, 1);
    if (gaps && is_input && shape[0] > 1) {
      p.offset = (shape[0] - 1) * p.strides[0];
      p.strides[0] = -p.strides[0];
    }
    return p;
  }
  int64_t s = 1;
  for (size_t d = rank; d-- > 0;) {
    p.strides[d] = s;
    s *= std::max<int64_t>(shape[d], 1);
  }
  p.span = std::max<int64_t>(s, 1);
  if (expand_dim0 && rank > 0 && shape[0] > 1) {  // a stride-0 (expanded) view
    p.strides[0] = 0;
    p.span = std::max<int64_t>(s / shape[0], 1);
  }
  if (layout == LayoutKind::shifted) {
    p.offset = is_input ? 1 : 3;
    p.span += p.offset;
  }
  return p;
}

/// Calls f(offset) for every logical element of a placement, row-major.
template <class F>
void for_each_offset(const Placement& p, F&& f) {
  int64_t numel = 1;
  for (int64_t s : p.shape) numel *= s;
  std::vector<int64_t> idx(p.shape.size(), 0);
  for (int64_t i = 0; i < numel; ++i) {
    int64_t off = p.offset;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * p.strides[d];
    f(off);
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < p.shape[d]) break;
      idx[d] = 0;
    }
  }
}

void fill_random(void* base, DType dtype, int64_t count, const OpInfo& op, Domain dom, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int64_t i = 0; i < count; ++i) {
    double v;
    if (dtype == DType::boolean) {
      v = unit(rng) < 0.5 ? 0 : 1;
    } else if (is_integral(dtype)) {
      const bool in_domain = op.integer_valued_inputs || dom.index;
      double lo = in_domain ? dom.lo : -30, hi = in_domain ? dom.hi : 30;
      v = std::floor(lo + (hi - lo + 1) * unit(rng));
      if (dom.symmetric && op.integer_valued_inputs && unit(rng) < 0.5) v = -v;
      if (dtype == DType::u8 || dtype == DType::u32) v = std::abs(v);
    } else {
      v = dom.lo + (dom.hi - dom.lo) * unit(rng);
      if (dom.symmetric && unit(rng) < 0.5) v = -v;
      if (op.integer_valued_inputs) v = std::round(v);
      if (dom.specials && unit(rng) < 0.1) v = unit(rng) < 0.5 ? NAN : (unit(rng) < 0.5 ? INFINITY : -INFINITY);
    }
    store_double(base, dtype, i, v);
    if (is_complex(dtype)) {  // give complex values an imaginary part too
      if (dtype == DType::c64) static_cast<Complex<float>*>(base)[i].im = float(unit(rng) - 0.5);
      else static_cast<Complex<double>*>(base)[i].im = unit(rng) - 0.5;
    }
  }
}

void poison(void* base, DType dtype, int64_t count, unsigned char int_pattern) {
  if (is_floating(dtype) || is_complex(dtype)) {
    for (int64_t i = 0; i < count; ++i) store_double(base, dtype, i, NAN);
    if (is_complex(dtype)) std::memset(base, 0xFF, count * dtype_size(dtype));  // NaN bit patterns
  } else {
    std::memset(base, int_pattern, count * dtype_size(dtype));
  }
}

DType reference_dtype(DType d) { return is_floating(d) ? DType::f64 : d; }

/// One operand of a run: its placement and host (+ device) buffers.
struct Operand {
  Placement place;
  DType dtype;
  Memory host;    // staging, the target dtype
  Memory target;  // where the plan reads/writes (== host for the host backend)
  Memory ref;     // reference buffer, reference dtype
  int alias = -1; // output aliasing input `alias` (in-place)
  TensorView view(const Memory& m, DType d) const {
    char* data = static_cast<char*>(m.data()) + place.offset * int64_t(dtype_size(d));
    return *TensorView::strided(data, d, place.shape, place.strides);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

// ---------------------------------------------------------------- run a case

namespace {

/// A case's operand shapes before inference, and which inputs the broadcast layout expands.
struct CaseShapes {
  OpDesc desc;  ///< inputs, and the outputs the op needs given
  std::vector<bool> expand;
};

Result<CaseShapes> case_shapes(const CaseSpec& spec) {
  const OpInfo& op = *spec.op;
  const bool backward = op.direction == Direction::backward;
  const bool gated = op.family == "gated";
  const size_t rank = spec.shape.size();
  size_t n_in = op.input_names.size();
  std::vector<Shape> in_shapes(n_in, spec.shape);
  CaseShapes out{OpDesc{op.name, {}, {}, spec.attrs}, std::vector<bool>(n_in, false)};
  OpDesc& desc = out.desc;
  std::vector<bool>& expand = out.expand;
  if (gated) {
    if (rank == 0) return unsupported("gated ops need rank >= 1");
    double dim_attr = spec.attrs.get("dim", -1);
    int dim = dim_attr < 0 ? int(dim_attr) + int(rank) : int(dim_attr);
    if (dim < 0 || dim >= int(rank)) return unsupported("dim out of range for this shape");
    in_shapes[backward ? 1 : 0][dim] *= 2;
  }
  if (op.family == "fill") desc.outputs = {{spec.dtype, spec.shape}};
  if (op.sample_shapes) {
    auto shapes = op.sample_shapes(spec.dtype, spec.shape, spec.attrs);
    if (!shapes) return unsupported("no sample for this shape and these attributes");
    in_shapes = shapes->inputs;
    n_in = in_shapes.size();  // a variadic op's groups
    expand.resize(n_in, false);
    desc.outputs = shapes->outputs;
    if (spec.layout == LayoutKind::broadcast) std::fill(expand.begin(), expand.end(), true);
  } else if (spec.layout == LayoutKind::broadcast) {
    const bool multi = op.family == "binary" || op.family == "compare" || op.family == "ternary" ||
                       (op.family == "where" && !backward);
    if (multi && rank >= 2) {
      for (size_t i = backward ? 1 : 0, k = 0; i < n_in; ++i, ++k) {
        if (k % 2 == 0) in_shapes[i][0] = 1;
        else in_shapes[i][rank - 1] = 1;
      }
    } else if (op.family == "where" && backward && rank >= 2) {
      Shape a = spec.shape, b = spec.shape;
      a[0] = 1;
      b[rank - 1] = 1;
      desc.outputs = {{spec.dtype, a}, {spec.dtype, b}};
    } else {
      std::fill(expand.begin(), expand.end(), true);
    }
  }
  const auto in_dtypes = op.input_dtypes(spec.dtype);
  for (size_t i = 0; i < n_in; ++i) desc.inputs.push_back({in_dtypes[op.operand_of(true, i, n_in)], in_shapes[i]});
  return out;
}

}  // namespace

uint64_t seed_from_environment() {
  const char* text = std::getenv("BARACUDA_TEST_SEED");
  return text && *text ? std::strtoull(text, nullptr, 10) : 0;
}

CaseOutcome run_case(const CaseSpec& spec, const RunOptions& opt) {
  CaseOutcome out;
  const OpInfo& op = *spec.op;
  auto fail = [&](std::string msg) {
    out.passed = false;
    out.message = std::move(msg);
    return out;
  };
  auto skip = [&](std::string msg) {
    out.skipped = true;
    out.message = std::move(msg);
    return out;
  };
  if (std::find(op.backends.begin(), op.backends.end(), opt.backend) == op.backends.end())
    return skip(cat("no ", backend_name(opt.backend), " backend for this op yet"));
  const bool backward = op.direction == Direction::backward;
  auto shapes = case_shapes(spec);
  if (!shapes) return skip(shapes.status().message());
  std::vector<bool> expand = std::move(shapes->expand);
  auto full = op.infer(shapes->desc);
  if (!full) return fail("infer: " + full.status().to_string());
  OpDesc desc = std::move(*full);
  const size_t n_in = desc.inputs.size();
  out.elements = 1;
  for (int64_t s : (backward ? desc.inputs[0].shape : desc.outputs[0].shape)) out.elements *= s;

  // In-place: output 0 takes input 0's memory when dtype and shape agree.
  int inplace_input = -1;
  if (spec.layout == LayoutKind::inplace) {
    if (!op.in_place) return skip("the op writes no output over an input");
    for (size_t i = 0; i < n_in && inplace_input < 0; ++i)
      if (desc.inputs[i].dtype == desc.outputs[0].dtype && desc.inputs[i].shape == desc.outputs[0].shape)
        inplace_input = static_cast<int>(i);
    if (inplace_input < 0) return skip("no input matches output 0 for in-place");
  }

  const bool on_device = opt.backend != Backend::host_reference;
  out.seed = opt.seed ? opt.seed : seed_from_environment();
  while (out.seed == 0) out.seed = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
  std::mt19937_64 rng(out.seed);

  // Inputs: random physical buffers.
  std::vector<Operand> ins(n_in), outs(desc.outputs.size());
  for (size_t i = 0; i < n_in; ++i) {
    Operand& o = ins[i];
    o.dtype = desc.inputs[i].dtype;
    o.place = place(desc.inputs[i].shape, spec.layout, true, expand[i]);
    o.host = Memory::host(o.place.span * dtype_size(o.dtype));
    // Timing-only runs tile one random block: the values stay random, the set-up fast.
    const int64_t block = opt.verify ? o.place.span : std::min<int64_t>(o.place.span, 1 << 16);
    const Domain domain = op.domain(op.operand_of(true, i, n_in));
    fill_random(o.host.data(), o.dtype, block, op, domain, rng);
    for (int64_t done = block; done < o.place.span; done += block)
      std::memcpy(static_cast<char*>(o.host.data()) + done * dtype_size(o.dtype), o.host.data(),
                  std::min(block, o.place.span - done) * dtype_size(o.dtype));
    if (domain.sorted) {  // non-decreasing along the view's logical order
      std::vector<double> v;
      for_each_offset(o.place, [&](int64_t off) { v.push_back(load_double(o.host.data(), o.dtype, off)); });
      std::sort(v.begin(), v.end());
      size_t next = 0;
      for_each_offset(o.place, [&](int64_t off) { store_double(o.host.data(), o.dtype, off, v[next++]); });
    }
    out.bytes += double(std::min(o.place.span, [&] {
                   int64_t n = 1;
                   for (int64_t s : o.place.shape) n *= s;
                   return n;
                 }())) * dtype_size(o.dtype);
  }
  for (size_t j = 0; j < outs.size(); ++j) {
    Operand& o = outs[j];
    o.dtype = desc.outputs[j].dtype;
    if (j == 0 && inplace_input >= 0) {
      o.place = ins[inplace_input].place;
      o.alias = inplace_input;
    } else {
      o.place = place(desc.outputs[j].shape, spec.layout, false, false);
    }
    int64_t n = 1;
    for (int64_t s : o.place.shape) n *= s;
    out.bytes += double(n) * dtype_size(o.dtype);
  }

  // Reference: the same op on the host in f64, same layouts.
  OpDesc ref_desc = desc;
  for (auto& s : ref_desc.inputs) s.dtype = reference_dtype(s.dtype);
  for (auto& s : ref_desc.outputs) s.dtype = reference_dtype(s.dtype);
  if (op.family == "cast")
    ref_desc.attrs.set("dtype", double(static_cast<int>(reference_dtype(desc.outputs[0].dtype))));
  std::vector<TensorView> ref_in, ref_out, tgt_in, tgt_out;
  if (opt.verify) {
    for (auto& o : ins) {
      DType rd = reference_dtype(o.dtype);
      o.ref = Memory::host(o.place.span * dtype_size(rd));
      for (int64_t e = 0; e < o.place.span; ++e) {
        if (rd == o.dtype) std::memcpy(static_cast<char*>(o.ref.data()) + e * dtype_size(rd),
                                       static_cast<char*>(o.host.data()) + e * dtype_size(rd), dtype_size(rd));
        else store_double(o.ref.data(), rd, e, load_double(o.host.data(), o.dtype, e));
      }
      ref_in.push_back(o.view(o.ref, rd));
    }
    for (auto& o : outs) {
      DType rd = reference_dtype(o.dtype);
      if (o.alias >= 0) {
        ref_out.push_back(ins[o.alias].view(ins[o.alias].ref, rd));
        continue;
      }
      o.ref = Memory::host(o.place.span * dtype_size(rd));
      poison(o.ref.data(), rd, o.place.span, 0xA5);
      ref_out.push_back(o.view(o.ref, rd));
    }
    PlanPreference host_pref;
    host_pref.backend = Backend::host_reference;
    auto ref_plan = select(Stream::host(), ref_desc, host_pref);
    if (!ref_plan) return fail("reference select: " + ref_plan.status().to_string());
    Memory ref_ws = Memory::host((*ref_plan)->workspace_size());
    Status s = (*ref_plan)->run(Stream::host(), Workspace{ref_ws.data(), ref_ws.bytes()}, OpArgs{ref_in, ref_out});
    if (!s) return fail("reference run: " + s.to_string());
  }

  // Target buffers: the staging copy itself on the host backend, a device copy otherwise.
  // Timing-only runs leave outputs unpoisoned and skip their upload.
  auto target_view = [&](Operand& o, bool upload) -> Result<TensorView> {
    if (!on_device) return o.view(o.host, o.dtype);
    auto m = Memory::device(o.host.bytes());
    if (!m) return m.status();
    o.target = std::move(*m);
    if (upload) BARACUDA_TRY(copy_bytes(o.target.data(), o.host.data(), o.host.bytes(), true, false));
    return o.view(o.target, o.dtype);
  };
  for (auto& o : ins) {
    auto v = target_view(o, true);
    if (!v) return fail(v.status().to_string());
    tgt_in.push_back(*v);
  }
  for (auto& o : outs) {
    if (o.alias >= 0) {
      tgt_out.push_back(tgt_in[o.alias]);
      continue;
    }
    o.host = Memory::host(o.place.span * dtype_size(o.dtype));
    if (opt.verify) poison(o.host.data(), o.dtype, o.place.span, 0x5A);
    auto v = target_view(o, opt.verify);
    if (!v) return fail(v.status().to_string());
    tgt_out.push_back(*v);
  }

  PlanPreference pref;
  pref.backend = opt.backend;
  pref.deterministic_only = opt.deterministic_only;
  Stream stream = on_device ? Stream::cuda() : Stream::host();
  auto plan = select(stream, desc, pref);
  // Bespoke kernels and the host reference serve every advertised case; a
  // vendor library (cuDNN, cuBLASLt) may refuse one in select, with its reason.
  const bool vendor = opt.backend != Backend::bespoke_cuda && opt.backend != Backend::host_reference;
  if (!plan && vendor && plan.status().kind() == ErrorKind::unsupported)
    return skip("the vendor candidate refuses this case: " + plan.status().message());
  if (!plan) return fail("select: " + plan.status().to_string());
  out.sku = (*plan)->sku().to_string();
  OpArgs args{tgt_in, tgt_out};
  Memory ws_memory;
  if (size_t bytes = (*plan)->workspace_size(); bytes > 0) {
    if (on_device) {
      auto m = Memory::device(bytes);
      if (!m) return fail(m.status().to_string());
      ws_memory = std::move(*m);
    } else {
      ws_memory = Memory::host(bytes);
    }
  }
  const Workspace ws{ws_memory.data(), ws_memory.bytes()};
  // A candidate chosen by the descriptor may not take these strides (a vendor
  // library's layout rules): that is its documented answer, not a failure.
  if (Status s = (*plan)->can_implement(args); !s) {
    if (s.kind() == ErrorKind::unsupported) return skip("the plan does not take these views: " + s.message());
    return fail("can_implement: " + s.to_string());
  }
  if (Status s = (*plan)->run(stream, ws, args); !s) return fail("run: " + s.to_string());
#ifdef BARACUDA_HAS_CUDA
  if (on_device) {
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) return fail(cat("kernel failed: ", cudaGetErrorString(err)));
  }
#endif

  // Compare every logical output element with the reference.
  if (opt.verify) {
    out.passed = true;
    for (size_t j = 0; j < outs.size(); ++j) {
      Operand& o = outs[j];
      const Operand& storage = o.alias >= 0 ? ins[o.alias] : o;
      Memory got = Memory::host(storage.host.bytes());
      if (on_device) {
        if (Status s = copy_bytes(got.data(), storage.target.data(), got.bytes(), false, true); !s) return fail(s.to_string());
      } else {
        std::memcpy(got.data(), storage.host.data(), got.bytes());
      }
      const void* ref = storage.ref.data();
      const DType rd = reference_dtype(o.dtype);
      const bool exact = !is_floating(o.dtype);
      const Tolerance tol = tolerance_for(o.dtype, op.tolerance_scale);
      int64_t bad = 0;
      std::string first_bad;
      for_each_offset(o.place, [&](int64_t off) {
        bool ok;
        double g = 0, r = 0;
        if (o.dtype == DType::boolean) {
          unsigned char gb = static_cast<const unsigned char*>(got.data())[off];
          unsigned char rb = static_cast<const unsigned char*>(ref)[off];
          ok = gb == rb && gb <= 1;
          g = gb, r = rb;
        } else if (exact) {
          g = load_double(got.data(), o.dtype, off);
          r = load_double(ref, rd, off);
          ok = (g == r || (std::isnan(g) && std::isnan(r))) &&
               load_imag(got.data(), o.dtype, off) == load_imag(ref, rd, off);
        } else {
          g = load_double(got.data(), o.dtype, off);
          r = load_double(ref, rd, off);
          if (r != 0 && !std::isnan(r)) out.reference_all_zero = false;
          double rr = round_to(o.dtype, r);
          if (std::isnan(r) || std::isnan(rr)) ok = std::isnan(g);
          else if (std::isinf(r) || std::isinf(rr)) ok = g == rr || g == r;
          else ok = g == rr || std::abs(g - r) <= tol.atol + tol.rtol * std::abs(r);
          if (!std::isnan(g) && !std::isnan(r) && !std::isinf(g) && !std::isinf(r))
            out.max_abs_error = std::max(out.max_abs_error, std::abs(g - r));
        }
        if (exact && r != 0) out.reference_all_zero = false;
        if (!ok && bad++ == 0) {
          char text[96];
          std::snprintf(text, sizeof text, "offset %lld: got %.17g, expected %.17g", (long long)off, g, r);
          first_bad = text;
        }
      });
      if (bad) {
        out.passed = false;
        out.message = cat("output '", op.operand_names(false, outs.size())[j], "': ", bad, " wrong elements; first at ",
                          first_bad, " (BARACUDA_TEST_SEED=", out.seed, " draws these inputs again)");
        break;
      }
    }
  } else {
    out.passed = true;
  }

  // Timing.
  if (opt.time) {
    std::vector<double> ms;
#ifdef BARACUDA_HAS_CUDA
    if (on_device) {
      cudaEvent_t start, stop;
      cudaEventCreate(&start);
      cudaEventCreate(&stop);
      for (int i = 0; i < opt.warmup; ++i) (void)(*plan)->run(stream, ws, args);
      for (int i = 0; i < opt.iterations; ++i) {
        cudaEventRecord(start);
        (void)(*plan)->run(stream, ws, args);
        cudaEventRecord(stop);
        cudaEventSynchronize(stop);
        float t = 0;
        cudaEventElapsedTime(&t, start, stop);
        ms.push_back(t);
      }
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      constexpr int kBatch = 32;  // runs per batch: well inside the launch queue
      double best = 0;
      for (int batch = 0; batch < 3; ++batch) {
        cudaStreamSynchronize(stream.cuda_stream());
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kBatch; ++i) (void)(*plan)->run(stream, ws, args);
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        best = batch == 0 ? us : std::min(best, us);
      }
      cudaStreamSynchronize(stream.cuda_stream());
      out.host_microseconds = best / kBatch;
    }
#endif
    if (!on_device) {
      for (int i = 0; i < std::max(1, opt.iterations / 4); ++i) {
        auto t0 = std::chrono::steady_clock::now();
        (void)(*plan)->run(stream, ws, args);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    out.milliseconds = median(ms);
  }
  return out;
}

Result<OpDesc> case_descriptor(const CaseSpec& spec) {
  auto shapes = case_shapes(spec);
  if (!shapes) return shapes.status();
  return spec.op->infer(shapes->desc);
}

double measure_copy_bandwidth(size_t bytes) {
#ifdef BARACUDA_HAS_CUDA
  if (!cuda_available()) return 0;
  auto a = Memory::device(bytes), b = Memory::device(bytes);
  if (!a || !b) return 0;
  cudaMemset(a->data(), 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> ms;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (i >= 3) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  double t = median(ms);
  return t > 0 ? 2.0 * double(bytes) / (t * 1e-3) : 0;
#else
  (void)bytes;
  return 0;
#endif
}

}  // namespace baracuda::harness
