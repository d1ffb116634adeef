// Python bindings (nanobind): the op registry, shape inference and one
// generic `run` that executes any registered op on DLPack tensors (numpy,
// torch CPU/CUDA, cupy, ...). The per-op Python API lives in baracuda/*.py.
//
// Errors: invalid_problem -> ValueError, unsupported -> baracuda.UnsupportedError
// (a NotImplementedError and a TypeError), anything else -> RuntimeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <unordered_map>
#include <utility>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"  // cat()

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace baracuda::python {
namespace {

using InArray = nb::ndarray<nb::ro>;  // inputs may be read-only
using OutArray = nb::ndarray<>;       // outputs and workspace must be writable
using Spec = std::pair<std::string, Shape>;

PyObject* g_unsupported_error = nullptr;

template <class... Parts>
[[noreturn]] void fail(ErrorKind kind, const Parts&... parts) {
  throw Error(Status::error(kind, cat(parts...)));
}

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    const Status& s = e.status();
    if (s.kind() == ErrorKind::invalid_problem)
      PyErr_SetString(PyExc_ValueError, s.message().c_str());
    else if (s.kind() == ErrorKind::unsupported)
      PyErr_SetString(g_unsupported_error, s.message().c_str());
    else
      PyErr_SetString(PyExc_RuntimeError, s.to_string().c_str());
  }
}

/// dict("key"_a = value, ...), as Python's dict(key=value, ...).
template <class... Args>
nb::dict make_dict(Args&&... args) {
  nb::dict d;
  ((d[args.name_] = args.value), ...);
  return d;
}

const OpInfo& op_info(const std::string& name) {
  const OpInfo* info = find_op(name);
  if (!info) fail(ErrorKind::invalid_problem, "unknown op '", name, "' (see baracuda.ops())");
  return *info;
}

DType dtype_arg(const std::string& name) {
  auto d = dtype_from_name(name);
  if (!d) throw nb::type_error(cat("unknown dtype '", name, "'").c_str());
  return *d;
}

/// The dtype a DLPack producer exported, or nullopt when baracuda has none.
std::optional<DType> from_dlpack(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  struct Row {
    Code code;
    int bits;
    DType dtype;
  };
  static constexpr Row kRows[] = {
      {Code::Float, 32, DType::f32},         {Code::Float, 16, DType::f16},
      {Code::Float, 64, DType::f64},         {Code::Bfloat, 16, DType::bf16},
      {Code::Float8_E4M3FN, 8, DType::fp8_e4m3}, {Code::Float8_E5M2, 8, DType::fp8_e5m2},
      {Code::Int, 8, DType::i8},             {Code::Int, 16, DType::i16},
      {Code::Int, 32, DType::i32},           {Code::Int, 64, DType::i64},
      {Code::UInt, 8, DType::u8},            {Code::UInt, 32, DType::u32},
      {Code::Bool, 8, DType::boolean},       {Code::Complex, 64, DType::c64},
      {Code::Complex, 128, DType::c128},
  };
  if (t.lanes != 1) return std::nullopt;
  for (const Row& r : kRows)
    if (static_cast<Code>(t.code) == r.code && t.bits == r.bits) return r.dtype;
  return std::nullopt;
}

/// Op attributes from a Python dict; unknown names are a TypeError, as an
/// unexpected keyword argument would be.
Attrs to_attrs(const OpInfo& info, const nb::dict& attrs) {
  Attrs out;
  for (auto [key, value] : attrs) {
    std::string name = nb::cast<std::string>(key);
    if (!info.find_attr(name)) {
      std::string known;
      for (const auto& a : info.attrs) known += cat(known.empty() ? "" : ", ", a.name);
      throw nb::type_error(cat(info.name, ": unknown attribute '", name, "' (attributes: ",
                               known.empty() ? "none" : known, ")").c_str());
    }
    double v = 0;
    if (!nb::try_cast(value, v))
      throw nb::type_error(cat(info.name, ": attribute '", name, "' must be a number, got ",
                               nb::inst_name(value).c_str()).c_str());
    out.set(name, v);
  }
  return out;
}

std::vector<TensorSpec> to_specs(const std::vector<Spec>& specs) {
  std::vector<TensorSpec> out;
  for (const auto& [dtype, shape] : specs) out.push_back({dtype_arg(dtype), shape});
  return out;
}

std::vector<Spec> from_specs(const std::vector<TensorSpec>& specs) {
  std::vector<Spec> out;
  for (const auto& s : specs) out.emplace_back(dtype_name(s.dtype), s.shape);
  return out;
}

// ---------------------------------------------------------------- operands

/// Where the operands of one call live: all on the host, or all on one GPU.
struct Placement {
  bool known = false, cuda = false;
  int device = 0;
  std::string first;  // the operand that fixed the placement

  std::string describe(bool is_cuda, int id) const { return is_cuda ? cat("cuda:", id) : std::string("the host"); }

  void add(const OpInfo& info, const std::string& name, int device_type, int device_id) {
    bool is_cuda;
    if (device_type == nb::device::cpu::value || device_type == nb::device::cuda_host::value)
      is_cuda = false;
    else if (device_type == nb::device::cuda::value || device_type == nb::device::cuda_managed::value)
      is_cuda = true;
    else
      fail(ErrorKind::unsupported, info.name, ": '", name, "' lives on DLPack device type ", device_type,
           "; only host and CUDA memory are supported");
    if (!known) {
      known = true, cuda = is_cuda, device = device_id, first = name;
    } else if (is_cuda != cuda || (cuda && device_id != device)) {
      fail(ErrorKind::invalid_problem, info.name, ": '", name, "' is on ", describe(is_cuda, device_id), " but '",
           first, "' is on ", describe(cuda, device));
    }
  }
};

/// A view the caller describes itself: (data pointer, dtype name, shape,
/// element strides, DLPack device type, device id). Torch tensors come this
/// way: no DLPack export (whose stream handshake costs microseconds per
/// operand); the caller keeps the tensor alive for the call.
TensorView import_raw(const OpInfo& info, const nb::tuple& t, const std::string& name, Placement& placement) {
  if (nb::len(t) != 6)
    throw nb::type_error(cat(info.name, ": '", name, "' as a raw view needs 6 fields, got ", nb::len(t)).c_str());
  const auto dt = dtype_from_name(nb::cast<std::string>(t[1]));
  if (!dt) fail(ErrorKind::unsupported, info.name, ": '", name, "' has dtype ", nb::cast<std::string>(t[1]), " baracuda does not know");
  const nb::tuple shape = nb::borrow<nb::tuple>(t[2]), strides = nb::borrow<nb::tuple>(t[3]);
  const size_t rank = nb::len(shape);
  if (rank > static_cast<size_t>(kMaxRank) || nb::len(strides) != rank)
    fail(ErrorKind::invalid_problem, info.name, ": '", name, "' has rank ", rank, " (maximum ", kMaxRank,
         ") or strides of another rank");
  placement.add(info, name, nb::cast<int>(t[4]), nb::cast<int>(t[5]));
  TensorView v;
  v.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(t[0]));
  v.dtype = *dt;
  v.rank = static_cast<int>(rank);
  for (size_t i = 0; i < rank; ++i) {
    v.shape[i] = nb::cast<int64_t>(shape[i]);
    v.stride[i] = nb::cast<int64_t>(strides[i]);
  }
  return v;
}

/// Imports one DLPack array as a view. `dtype` overrides the exported dtype
/// (same element size) for types a producer cannot export (torch fp8, ...).
template <class Array>
TensorView import_operand(const OpInfo& info, nb::handle obj, const std::string& name, nb::handle dtype,
                        Placement& placement, std::vector<Array>& keep) {
  if (nb::isinstance<nb::tuple>(obj)) return import_raw(info, nb::borrow<nb::tuple>(obj), name, placement);
  Array a;
  if (!nb::try_cast(obj, a))
    throw nb::type_error(cat(info.name, ": '", name, "' must be ",
                             std::is_same_v<Array, OutArray> ? "a writable array" : "an array",
                             " (DLPack or buffer protocol), got ", nb::inst_name(obj).c_str())
                             .c_str());
  std::optional<DType> dt = dtype.is_none() ? from_dlpack(a.dtype()) : dtype_arg(nb::cast<std::string>(dtype));
  if (!dt)
    fail(ErrorKind::unsupported, info.name, ": '", name, "' has a DLPack dtype baracuda does not know (code ",
         int(a.dtype().code), ", ", int(a.dtype().bits), " bits, ", int(a.dtype().lanes), " lanes)");
  if (dtype_size(*dt) * 8 != a.dtype().bits || a.dtype().lanes != 1)
    fail(ErrorKind::invalid_problem, info.name, ": '", name, "' is declared ", dtype_name(*dt), " but holds ",
         int(a.dtype().bits), "-bit elements");
  if (a.ndim() > static_cast<size_t>(kMaxRank))
    fail(ErrorKind::invalid_problem, info.name, ": '", name, "' has rank ", a.ndim(), ", the maximum is ", kMaxRank);
  placement.add(info, name, a.device_type(), a.device_id());
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = *dt;
  v.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.stride[i] = a.stride(i);  // nanobind gives element strides
  }
  keep.push_back(std::move(a));
  return v;
}

/// Makes `device` current for the duration of a call (CUDA builds only).
class DeviceGuard {
 public:
  DeviceGuard(bool cuda, int device) {
#ifdef BARACUDA_HAS_CUDA
    int current = 0;
    if (cuda && cudaGetDevice(&current) == cudaSuccess && current != device && cudaSetDevice(device) == cudaSuccess)
      previous_ = current;
#else
    (void)cuda, (void)device;
#endif
  }
  ~DeviceGuard() {
#ifdef BARACUDA_HAS_CUDA
    if (previous_ >= 0) cudaSetDevice(previous_);
#endif
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  [[maybe_unused]] int previous_ = -1;
};

// ---------------------------------------------------------------- plan cache

/// Selected plans by descriptor, placement and preferred backend. Plans are
/// immutable, so one serves every call with the same key; shared_ptr keeps a
/// plan alive for a run in flight while the cache is cleared.
class PlanCache {
 public:
  using PlanRef = std::shared_ptr<const Plan>;
  static constexpr size_t kMaxEntries = 4096;

  static std::string key(const OpDesc& desc, const Placement& where, const PlanPreference& pref) {
    std::string k = desc.op;
    auto put = [&k](const auto& v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    for (const auto* list : {&desc.inputs, &desc.outputs}) {
      put(list->size());
      for (const auto& s : *list) {
        put(s.dtype);
        put(s.shape.size());
        for (int64_t d : s.shape) put(d);
      }
    }
    for (const auto& [name, value] : desc.attrs.values()) {
      k += name;
      put(value);
    }
    put(where.cuda);
    put(where.device);
    put(pref.backend ? static_cast<int>(*pref.backend) : -1);
    put(pref.allow_tf32);
    put(pref.deterministic_only);
    put(pref.skip_candidates);
    return k;
  }

  PlanRef get(const std::string& key, const Stream& stream, const OpDesc& desc, const PlanPreference& pref) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    PlanRef plan = check(select(stream, desc, pref));
    std::lock_guard lock(mutex_);
    if (plans_.size() >= kMaxEntries) plans_.clear();
    plans_.emplace(key, plan);
    return plan;
  }

  void clear() {
    std::lock_guard lock(mutex_);
    plans_.clear();
  }
  size_t size() {
    std::lock_guard lock(mutex_);
    return plans_.size();
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, PlanRef> plans_;
};

/// torch.backends.cuda.matmul.allow_tf32's counterpart: f32 GEMMs may multiply in TF32.
std::atomic<bool> allow_tf32{false};
/// torch.use_deterministic_algorithms' counterpart: every plan must be bitwise reproducible run to run.
std::atomic<bool> deterministic_only{false};

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache();  // leaked: plans must outlive interpreter teardown order
  return *cache;
}

std::optional<Backend> backend_arg(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  auto b = backend_from_name(*name);
  if (!b) throw nb::value_error(cat("unknown backend '", *name, "'").c_str());
  return b;
}

#ifdef BARACUDA_HAS_CUDA
/// The binding's own stream-ordered pool on `device` for the workspace it
/// allocates (a plan never allocates). It keeps up to kWorkspacePoolKeep
/// bytes across synchronisations: the default pool gives all its memory
/// back at each one, so a call after a sync paid for a fresh allocation.
/// A pool of our own leaves the process's default pool (and its settings)
/// to others.
constexpr uint64_t kWorkspacePoolKeep = uint64_t(256) << 20;
cudaMemPool_t workspace_pool(int device, const char* op) {
  static std::mutex mutex;
  static std::unordered_map<int, cudaMemPool_t> pools;
  std::lock_guard lock(mutex);
  if (auto it = pools.find(device); it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  cudaError_t e = cudaMemPoolCreate(&pool, &props);
  uint64_t keep = kWorkspacePoolKeep;
  if (e == cudaSuccess) e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  if (e != cudaSuccess)
    throw Error(Status::backend("cudart", e, cat(op, ": a workspace memory pool on device ", device, ": ",
                                                 cudaGetErrorString(e))));
  return pools.emplace(device, pool).first->second;
}

// Note [Workspace kept per stream]: allocating the workspace from the pool
// and freeing it after the run cost 1.3 us a call on the H200's host
// (cudaMallocFromPoolAsync + cudaFreeAsync; checking the stream's capture
// status and id: 0.17 us). A call on a stream that is not capturing a graph
// instead takes a buffer kept for that stream (by cudaStreamGetId: a handle
// may be reused by a later stream, an id never is), grown stream-ordered
// when a call needs more. Runs on one stream are ordered, so they may share
// it; a grow frees the old buffer on the same stream, and a buffer's lock is
// held from lookup to the end of the run's launch (taken and dropped with the
// GIL released), so no launch that reads a buffer can follow its free. The
// kept buffers hold at most kWorkspacePoolKeep bytes together; a call past
// that, a capturing stream and streams past kMaxKeptStreams allocate per
// call, as does every call when BARACUDA_WORKSPACE_PER_CALL=1 (for
// comparisons and debugging).
constexpr size_t kMaxKeptStreams = 64;

struct KeptWorkspace {
  std::mutex in_use;  ///< held from lookup to the end of a run's launch
  void* data = nullptr;
  size_t bytes = 0;
};

/// The buffer kept for `stream` on `device`, or null where the call should allocate its own.
KeptWorkspace* kept_workspace(int device, cudaStream_t stream, size_t needed) {
  static const bool per_call = [] {
    const char* v = std::getenv("BARACUDA_WORKSPACE_PER_CALL");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  if (per_call || needed > kWorkspacePoolKeep) return nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone ||
      cudaStreamGetId(stream, &id) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  static std::mutex mutex;
  static auto* kept = new std::unordered_map<uint64_t, std::unique_ptr<KeptWorkspace>>();  // leaked, as the pools
  const uint64_t key = id * 64 + uint64_t(device);  // ids are per process; devices fewer than 64
  std::lock_guard lock(mutex);
  if (auto it = kept->find(key); it != kept->end()) return it->second.get();
  if (kept->size() >= kMaxKeptStreams) return nullptr;
  return kept->emplace(key, std::make_unique<KeptWorkspace>()).first->second.get();
}

/// Makes `kept` (locked by the caller) hold at least `needed` bytes, at least
/// doubling it; false (and `kept` as it was) where that would take the kept
/// buffers past kWorkspacePoolKeep together, or the pool has no memory.
bool grow_kept(KeptWorkspace& kept, size_t needed, cudaMemPool_t pool, cudaStream_t stream) {
  static std::atomic<size_t> kept_total{0};
  const size_t bytes = std::min<size_t>(std::max(needed, 2 * kept.bytes), kWorkspacePoolKeep);
  size_t total = kept_total.load();
  do {
    if (total - kept.bytes + bytes > kWorkspacePoolKeep) return false;
  } while (!kept_total.compare_exchange_weak(total, total - kept.bytes + bytes));
  void* data = nullptr;
  if (cudaMallocFromPoolAsync(&data, bytes, pool, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    kept_total -= bytes - kept.bytes;
    return false;  // the caller's own allocation reports the error, if it fails too
  }
  if (kept.data) cudaFreeAsync(kept.data, stream);
  kept.data = data, kept.bytes = bytes;
  return true;
}
#endif

// ---------------------------------------------------------------- entry points

/// Runs `plan` (or, when a candidate refuses these strides, the next one
/// that takes them) on imported views; shared by `run` and `call`.
void execute(const OpInfo& info, const OpDesc& desc, PlanCache::PlanRef plan, const std::vector<TensorView>& in_views,
             const std::vector<TensorView>& out_views, Placement& placement, PlanPreference pref, uintptr_t stream,
             nb::handle workspace) {
  DeviceGuard guard(placement.cuda, placement.device);
  const Stream s = placement.cuda ? Stream::cuda(reinterpret_cast<CUstream_st*>(stream)) : Stream::host();
  const OpArgs args{in_views, out_views};
  // A candidate that cannot take these strides (a vendor library's layout
  // rules) hands over to the next one, unless a backend was asked for.
  Status accepted = plan->can_implement(args);
  while (!accepted && accepted.kind() == ErrorKind::unsupported && !pref.backend) {
    ++pref.skip_candidates;
    try {
      plan = plan_cache().get(PlanCache::key(desc, placement, pref), s, desc, pref);
    } catch (const Error&) {
      break;  // no candidate left: report the first refusal
    }
    accepted = plan->can_implement(args);
  }
  check(accepted);
  Workspace ws;
  std::vector<OutArray> ws_keep;
  std::vector<char> host_scratch;
  void* device_scratch = nullptr;
  size_t device_needed = 0;  ///< bytes the run takes from the device: a kept buffer or device_scratch
  if (size_t needed = plan->workspace_size(); needed && workspace.is_none()) {
    // A convenience of the binding (plans never allocate): stream-ordered
    // scratch on the device (Note [Workspace kept per stream]), taken with the GIL released below.
    if (placement.cuda) {
      device_needed = needed;
    } else {
      host_scratch.resize(needed);
      ws = {host_scratch.data(), needed};
    }
  } else if (needed) {
    // A DLPack array or a raw view (which keeps nothing in ws_keep): its bytes from the view.
    TensorView w = import_operand(info, workspace, "workspace", nb::none(), placement, ws_keep);
    if (!w.is_contiguous())
      fail(ErrorKind::invalid_problem, desc.op, ": 'workspace' must be contiguous, got shape ", shape_str(w.shape_vec()));
    ws = {w.data, size_t(w.numel()) * dtype_size(w.dtype)};
    if (ws.bytes < needed)
      throw Error(Status::too_small(ErrorKind::workspace_too_small, needed, ws.bytes,
                                    cat(desc.op, ": workspace has ", ws.bytes, " bytes, the plan needs ", needed)));
  }
  Status status;
  {
    nb::gil_scoped_release release;
#ifdef BARACUDA_HAS_CUDA
    std::unique_lock<std::mutex> kept_lock;  // dropped before the GIL is taken back
    if (device_needed) {
      const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream);
      cudaMemPool_t pool = workspace_pool(placement.device, desc.op.c_str());
      KeptWorkspace* kept = kept_workspace(placement.device, cuda_stream, device_needed);
      if (kept) {
        kept_lock = std::unique_lock(kept->in_use);
        if (kept->bytes < device_needed && !grow_kept(*kept, device_needed, pool, cuda_stream)) {
          kept_lock.unlock();
          kept = nullptr;
        }
      }
      if (kept) {
        ws = {kept->data, device_needed};
      } else {
        if (cudaError_t e = cudaMallocFromPoolAsync(&device_scratch, device_needed, pool, cuda_stream); e != cudaSuccess)
          status = Status::backend("cudart", e, cat(desc.op, ": cudaMallocFromPoolAsync of ", device_needed,
                                                    " workspace bytes: ", cudaGetErrorString(e)));
        ws = {device_scratch, device_needed};
      }
    }
#endif
    if (status) status = plan->run(s, ws, args);
#ifdef BARACUDA_HAS_CUDA
    if (device_scratch) cudaFreeAsync(device_scratch, reinterpret_cast<cudaStream_t>(stream));
#endif
  }
  check(status);
}

// ---------------------------------------------------------------- call: the functional wrappers' path

// Note [Functional fast path]: every baracuda.functional wrapper ends in
// `call(op, args, attrs, out, out_specs)`. Done in Python, classifying the
// operands, inferring and allocating the outputs and exporting the views cost
// 6-10 us per call, several times the run itself on small tensors. Here numpy
// arrays are read through the numpy C API, torch tensors through a few
// attribute calls (no DLPack export), and the output specs and the plan are
// cached per (op, operand dtypes and shapes, attrs, placement); strides are
// left out of the key as in PlanCache, since can_implement sees them per run.
// What this path does not take (cupy and other DLPack producers, lists, numpy
// bf16/fp8 arrays, conjugate or negative torch views, calls with only Python
// scalars) it hands, before anything has run, to the Python path that keeps
// every rule (functional._call_python); so do the inputs of error messages.
// An `out` sequence may hold None where the call should allocate that output
// (a wrapper that wants output 0 in its input's memory layout passes that
// one and leaves the rest to the call: no specs inferred in Python).

struct Fallback {};  ///< thrown before any side effect: the Python path takes the call

/// Python callables the fast path needs (set by baracuda.functional on import).
struct CallHooks {
  nb::object fallback;       ///< (op, args, attrs, out, out_specs) -> result: the Python path
  nb::object is_torch_type;  ///< type -> bool
  nb::object torch_dtype;    ///< torch.dtype -> baracuda dtype name (UnsupportedError when none)
  nb::object torch_empty;    ///< (dtype name, shape, like) -> tensor on like's device
  nb::object torch_scalar;   ///< (value, like) -> 0-d tensor of like's dtype and device
  nb::object torch_stream_getter;  ///< () -> torch_stream (called on the first torch CUDA call)
  nb::object torch_stream;         ///< CUDA device id -> torch's current cudaStream_t there, as int
  nb::dict types;            ///< type -> True (torch) or False (the Python path), as types are seen
  nb::dict dtypes;           ///< torch.dtype -> DType code
};

CallHooks& hooks() {
  static CallHooks* h = new CallHooks();  // leaked: Python objects must not be released after finalisation
  return *h;
}

/// torch's current stream on CUDA device `device`, through the getter the
/// hook gives (torch's own builtin: no Python frame of ours a call).
uintptr_t torch_current_stream(int device) {
  CallHooks& h = hooks();
  if (!h.torch_stream.is_valid()) h.torch_stream = h.torch_stream_getter();
  return nb::cast<uintptr_t>(h.torch_stream(device));
}

/// An interned attribute name, created once.
PyObject* interned(const char* name) { return PyUnicode_InternFromString(name); }

nb::object get_attr(nb::handle x, PyObject* name) { return nb::steal(PyObject_GetAttr(x.ptr(), name)); }

/// x.name() or x.name(arg): one vectorcall.
nb::object call_method(nb::handle x, PyObject* name, nb::handle arg = {}) {
#if PY_VERSION_HEX >= 0x03090000
  PyObject* args[3] = {nullptr, x.ptr(), arg.ptr()};  // args[0]: the slot the offset flag lends the callee
  PyObject* r = PyObject_VectorcallMethod(name, args + 1, (arg ? 2 : 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
#else
  PyObject* r = PyObject_CallMethodObjArgs(x.ptr(), name, arg.ptr(), nullptr);
#endif
  if (!r) nb::raise_python_error();
  return nb::steal(r);
}

nb::object checked(nb::object o) {
  if (!o.is_valid()) nb::raise_python_error();
  return o;
}

/// The dtypes numpy holds natively, by numpy type number (ml_dtypes' bfloat16
/// and float8 are user types: not here).
constexpr std::pair<int, DType> kNumpyTypes[] = {
    {NPY_FLOAT, DType::f32},  {NPY_HALF, DType::f16},      {NPY_DOUBLE, DType::f64},   {NPY_BYTE, DType::i8},
    {NPY_UBYTE, DType::u8},   {NPY_SHORT, DType::i16},     {NPY_INT32, DType::i32},    {NPY_INT64, DType::i64},
    {NPY_UINT32, DType::u32}, {NPY_BOOL, DType::boolean},  {NPY_CFLOAT, DType::c64},   {NPY_CDOUBLE, DType::c128}};

std::optional<DType> from_numpy(int type_num) {
  for (const auto& [npy, dtype] : kNumpyTypes)
    if (npy == type_num) return dtype;
  for (const auto& [npy, dtype] : kNumpyTypes)  // aliases of another width name (long long for int64)
    if (PyArray_EquivTypenums(npy, type_num)) return dtype;
  return std::nullopt;
}

/// The numpy type number of a dtype numpy holds natively, or -1.
int to_numpy(DType dtype) {
  for (const auto& [npy, d] : kNumpyTypes)
    if (d == dtype) return npy;
  return -1;
}

enum class Kind : uint8_t { numpy, torch, scalar, missing };  ///< missing: a None in `out`, allocated

/// One operand of a call: its array (a 0-d one for a scalar once the
/// reference operand is known), view and device.
struct Operand {
  Kind kind = Kind::scalar;
  nb::object obj;
  TensorView view;
  int device_type = nb::device::cpu::value, device_id = 0;
};

Kind classify(nb::handle x) {
  PyObject* p = x.ptr();
  if (PyArray_Check(p)) return Kind::numpy;
  if (PyLong_Check(p) || PyFloat_Check(p) || PyComplex_Check(p)) return Kind::scalar;  // bool is an int
  CallHooks& h = hooks();
  nb::handle type(reinterpret_cast<PyObject*>(Py_TYPE(p)));
  PyObject* known = PyDict_GetItemWithError(h.types.ptr(), type.ptr());
  if (!known) {
    if (PyErr_Occurred()) nb::raise_python_error();
    nb::object is_torch = h.is_torch_type(type);
    h.types[type] = is_torch;
    return nb::cast<bool>(is_torch) ? Kind::torch : throw Fallback{};
  }
  if (known == Py_True) return Kind::torch;
  throw Fallback{};
}

/// A numpy array's view; Fallback for what numpy cannot describe natively
/// (user dtypes, byte-swapped data, strides not in whole elements) or an
/// output that is not writable (the Python path words those errors).
void view_numpy(Operand& o, bool writable) {
  auto* a = reinterpret_cast<PyArrayObject*>(o.obj.ptr());
  const std::optional<DType> dt = from_numpy(PyArray_TYPE(a));
  if (!dt || !PyArray_ISNOTSWAPPED(a) || (writable && !PyArray_ISWRITEABLE(a)) || PyArray_NDIM(a) > kMaxRank)
    throw Fallback{};
  const int64_t item = PyArray_ITEMSIZE(a);
  TensorView& v = o.view;
  v.data = PyArray_DATA(a);
  v.dtype = *dt;
  v.rank = PyArray_NDIM(a);
  for (int i = 0; i < v.rank; ++i) {
    const int64_t stride = PyArray_STRIDE(a, i);
    if (stride % item) throw Fallback{};
    v.shape[i] = PyArray_DIM(a, i);
    v.stride[i] = stride / item;
  }
  o.device_type = nb::device::cpu::value, o.device_id = 0;
}

/// A torch tensor's view from its attributes, as _interop._Torch.export reads
/// them; Fallback for conjugate/negative views and devices other than cpu/cuda.
void view_torch(Operand& o) {
  static PyObject *const kIsConj = interned("is_conj"), *const kIsNeg = interned("is_neg"),
                  *const kDtype = interned("dtype"), *const kIsCuda = interned("is_cuda"),
                  *const kIsCpu = interned("is_cpu"), *const kGetDevice = interned("get_device"),
                  *const kShape = interned("shape"), *const kStride = interned("stride"),
                  *const kDataPtr = interned("data_ptr");
  nb::handle t = o.obj;
  CallHooks& h = hooks();
  nb::object dtype = checked(get_attr(t, kDtype));
  PyObject* code = PyDict_GetItemWithError(h.dtypes.ptr(), dtype.ptr());
  if (!code) {
    if (PyErr_Occurred()) nb::raise_python_error();
    h.dtypes[dtype] = static_cast<int>(dtype_arg(nb::cast<std::string>(h.torch_dtype(dtype))));
    code = PyDict_GetItem(h.dtypes.ptr(), dtype.ptr());
  }
  const auto dt = static_cast<DType>(PyLong_AsLong(code));
  // Only complex tensors carry the conjugate bit; the negative bit also marks real views (x.conj().imag).
  if ((is_complex(dt) && call_method(t, kIsConj).is(nb::handle(Py_True))) ||
      call_method(t, kIsNeg).is(nb::handle(Py_True)))
    throw Fallback{};
  if (checked(get_attr(t, kIsCuda)).is(nb::handle(Py_True))) {
    o.device_type = nb::device::cuda::value;
    o.device_id = nb::cast<int>(call_method(t, kGetDevice));
  } else if (checked(get_attr(t, kIsCpu)).is(nb::handle(Py_True))) {
    o.device_type = nb::device::cpu::value, o.device_id = 0;
  } else {
    throw Fallback{};
  }
  nb::object shape = checked(get_attr(t, kShape)), strides = call_method(t, kStride);
  const Py_ssize_t rank = PyTuple_Size(shape.ptr());
  if (rank < 0 || rank > kMaxRank || PyTuple_Size(strides.ptr()) != rank) throw Fallback{};
  TensorView& v = o.view;
  v.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(call_method(t, kDataPtr)));
  v.dtype = dt;
  v.rank = static_cast<int>(rank);
  for (Py_ssize_t i = 0; i < rank; ++i) {
    v.shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    v.stride[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides.ptr(), i));
  }
}

void view_of(Operand& o, bool writable) {
  if (o.kind == Kind::numpy)
    view_numpy(o, writable);
  else
    view_torch(o);
}

/// A torch tensor this path created (C-contiguous, `dtype`, `shape`, on
/// `ref`'s device): its view without asking torch for what it already knows.
void view_created_torch(Operand& o, const Operand& ref, DType dtype, std::span<const int64_t> shape) {
  static PyObject* const kDataPtr = interned("data_ptr");
  o.device_type = ref.device_type, o.device_id = ref.device_id;
  auto view = TensorView::contiguous(reinterpret_cast<void*>(nb::cast<uintptr_t>(call_method(o.obj, kDataPtr))),
                                     dtype, shape);
  if (!view) throw Fallback{};
  o.view = *view;
}

// Note [Cached torch scalars]: a Python number beside a CUDA tensor becomes a
// 0-d tensor of the tensor's dtype (torch.full, about 5 us a call). Those are
// kept per (stream, device, dtype, value) and reused: our ops never write
// their inputs, a cached tensor is never freed (so no stream can see its
// memory reused), and it was filled on the stream that reads it, so every
// later reader on that stream is ordered after the fill. None is made while
// the stream captures a graph (the fill would live only in the graph).
struct ScalarKey {
  uintptr_t stream;
  int device;
  DType dtype;
  bool is_float;
  int64_t bits;  ///< the double's bits, or the integer
  bool operator==(const ScalarKey&) const = default;
};
struct ScalarKeyHash {
  size_t operator()(const ScalarKey& k) const {
    return std::hash<uint64_t>()(uint64_t(k.bits) * 0x9e3779b97f4a7c15ull ^ k.stream ^ (uint64_t(k.device) << 48) ^
                                 (uint64_t(k.dtype) << 40) ^ uint64_t(k.is_float));
  }
};
constexpr size_t kMaxCachedScalars = 1024;  ///< beyond this, scalars are made per call

/// The cache key of a Python int or float beside `ref` on `stream`, or none
/// (complex values, ints beyond 64 bits, host tensors, numpy).
std::optional<ScalarKey> scalar_key(nb::handle value, const Operand& ref, uintptr_t stream) {
  if (ref.kind != Kind::torch || ref.device_type != nb::device::cuda::value) return std::nullopt;  // stream 0: legacy
  ScalarKey k{stream, ref.device_id, ref.view.dtype, PyFloat_Check(value.ptr()) != 0, 0};
  if (k.is_float) {
    const double v = PyFloat_AS_DOUBLE(value.ptr());
    std::memcpy(&k.bits, &v, sizeof v);
  } else if (PyLong_Check(value.ptr())) {
    int overflow = 0;
    k.bits = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow) return std::nullopt;
  } else {
    return std::nullopt;
  }
  return k;
}

bool capturing(uintptr_t stream) {
#ifdef BARACUDA_HAS_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // unknown: make no entry
  }
  return status != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  return true;
#endif
}

/// A 0-d array of `ref`'s dtype and device holding a Python scalar:
/// np.asarray(value, dtype=ref.dtype) or torch.full((), value, ...), the
/// latter cached (Note [Cached torch scalars]); `stream` is the call's.
Operand materialise(nb::handle value, const Operand& ref, uintptr_t stream) {
  static auto* cache = new std::unordered_map<ScalarKey, Operand, ScalarKeyHash>();  // leaked: holds Python objects
  Operand o;
  o.kind = ref.kind;
  if (ref.kind == Kind::numpy) {
    PyArray_Descr* descr = PyArray_DESCR(reinterpret_cast<PyArrayObject*>(ref.obj.ptr()));
    Py_INCREF(descr);  // PyArray_FromAny steals it
    o.obj = nb::steal(PyArray_FromAny(value.ptr(), descr, 0, 0, 0, nullptr));
    checked(o.obj);
    view_of(o, false);
    return o;
  }
  const std::optional<ScalarKey> key = scalar_key(value, ref, stream);
  if (key) {  // the GIL guards the cache
    if (auto it = cache->find(*key); it != cache->end()) return it->second;
  }
  o.obj = hooks().torch_scalar(value, ref.obj);
  view_created_torch(o, ref, ref.view.dtype, {});
  if (key && cache->size() < kMaxCachedScalars && !capturing(stream)) cache->emplace(*key, o);
  return o;
}

/// An empty output like `ref` (its kind and device), C-contiguous.
Operand allocate(const TensorSpec& spec, const Operand& ref) {
  Operand o;
  o.kind = ref.kind;
  if (ref.kind == Kind::numpy) {
    const int type_num = to_numpy(spec.dtype);
    if (type_num < 0) throw Fallback{};  // bf16/fp8: ml_dtypes through the Python path
    std::array<npy_intp, kMaxRank> dims{};
    for (size_t i = 0; i < spec.shape.size(); ++i) dims[i] = static_cast<npy_intp>(spec.shape[i]);
    o.obj = checked(nb::steal(PyArray_SimpleNew(static_cast<int>(spec.shape.size()), dims.data(), type_num)));
    view_of(o, true);
  } else {
    nb::tuple shape = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(spec.shape.size())));
    for (size_t i = 0; i < spec.shape.size(); ++i)
      PyTuple_SET_ITEM(shape.ptr(), i, PyLong_FromLongLong(spec.shape[i]));
    static PyObject* const kNewEmpty = interned("new_empty");
    // ref.new_empty(shape) when the dtype is ref's: no dtype or device to parse (the hook's cost).
    o.obj = spec.dtype == ref.view.dtype ? call_method(ref.obj, kNewEmpty, shape)
                                         : hooks().torch_empty(dtype_name(spec.dtype), shape, ref.obj);
    view_created_torch(o, ref, spec.dtype, spec.shape);
  }
  return o;
}

/// The descriptor and plan of one call key: the outputs inferred (or given).
struct CallEntry {
  OpDesc desc;
  PlanCache::PlanRef plan;
};

class CallCache {
 public:
  using EntryRef = std::shared_ptr<const CallEntry>;

  EntryRef find(const std::string& key) {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : it->second;
  }
  void put(const std::string& key, EntryRef entry) {
    std::lock_guard lock(mutex_);
    if (entries_.size() >= PlanCache::kMaxEntries) entries_.clear();
    entries_.emplace(key, std::move(entry));
  }
  void clear() {
    std::lock_guard lock(mutex_);
    entries_.clear();
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, EntryRef> entries_;
};

CallCache& call_cache() {
  static CallCache* cache = new CallCache();  // leaked, as the plan cache
  return *cache;
}

/// The cache key of a call, or false when an attribute is not a plain number
/// or name (such calls go uncached; to_attrs words their errors).
bool call_key(std::string& k, const OpInfo& info, const std::vector<Operand>& ins, const std::vector<Operand>& outs,
              bool out_given, const nb::dict& attrs, nb::handle out_specs, const Placement& where,
              const PlanPreference& pref) {
  auto put = [&k](const auto& v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  k.clear();
  put(&info);
  put(where.cuda);
  put(where.device);
  put(pref.allow_tf32);
  put(pref.deterministic_only);
  put(out_given);
  for (const auto* list : {&ins, &outs}) {
    put(list->size());
    for (const Operand& o : *list) {
      put(o.kind);  // a missing output has no view: its entry is inferred
      put(o.view.dtype);
      put(o.view.rank);
      k.append(reinterpret_cast<const char*>(o.view.shape.data()), sizeof(int64_t) * o.view.rank);
    }
  }
  for (auto [key, value] : attrs) {
    Py_ssize_t size = 0;
    const char* name = PyUnicode_Check(key.ptr()) ? PyUnicode_AsUTF8AndSize(key.ptr(), &size) : nullptr;
    if (!name || !(PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr()))) {
      PyErr_Clear();
      return false;
    }
    const double v = PyFloat_AsDouble(value.ptr());
    if (v == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    put(size);
    k.append(name, static_cast<size_t>(size));
    put(v);
  }
  if (!out_given && !out_specs.is_none()) {  // out_specs: few ops (where_backward, sum_to); their repr is exact
    nb::object repr = checked(nb::steal(PyObject_Repr(out_specs.ptr())));
    k += nb::borrow<nb::str>(repr).c_str();
  }
  return true;
}

const OpInfo& op_info_fast(nb::handle op) {
  static const auto* by_name = [] {
    auto* m = new std::unordered_map<std::string_view, const OpInfo*>();  // leaked: registry() is static
    for (const OpInfo& info : registry()) m->emplace(info.name, &info);
    return m;
  }();
  Py_ssize_t size = 0;
  const char* name = PyUnicode_Check(op.ptr()) ? PyUnicode_AsUTF8AndSize(op.ptr(), &size) : nullptr;
  if (!name) throw nb::type_error("op must be a str");
  auto it = by_name->find(std::string_view(name, static_cast<size_t>(size)));
  if (it == by_name->end()) return op_info(std::string(name, static_cast<size_t>(size)));  // words the error
  return *it->second;
}

/// Operands of a sequence argument (a tuple or list), classified; None is
/// Kind::missing where `none_is_missing` (outputs), else the Python path's.
std::vector<Operand> operands(nb::handle seq, bool none_is_missing = false) {
  nb::object fast = nb::steal(PySequence_Fast(seq.ptr(), "operands must be a sequence"));
  checked(fast);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  std::vector<Operand> out(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i].obj = nb::borrow(items[i]);
    out[i].kind = none_is_missing && items[i] == Py_None ? Kind::missing : classify(items[i]);
  }
  return out;
}

/// The names of a call's `count` inputs (or outputs): the registered ones,
/// not copied (every call of the fast path asks), or a variadic op's per-group
/// names ("a[0]", ...), made into `store`.
const std::vector<std::string>& operand_names(const OpInfo& info, bool inputs, size_t count,
                                              std::vector<std::string>& store) {
  if (!info.variadic) return inputs ? info.input_names : info.output_names;
  store = info.operand_names(inputs, count);
  return store;
}

nb::object call_fast(nb::handle op, nb::handle args, const nb::dict& attrs, nb::handle out, nb::handle out_specs) {
  const OpInfo& info = op_info_fast(op);
  std::vector<Operand> ins = operands(args);
  const bool out_given = !out.is_none();
  std::vector<Operand> outs;
  bool out_missing = false;  ///< some `out` entries are None: allocated as when out is not given
  if (out_given) {
    if (PyTuple_Check(out.ptr()) || PyList_Check(out.ptr())) {
      outs = operands(out, /*none_is_missing=*/true);
    } else {
      outs.resize(1);
      outs[0].obj = nb::borrow(out), outs[0].kind = classify(out);
    }
    for (Operand& o : outs) {
      if (o.kind == Kind::scalar) throw Fallback{};
      if (o.kind == Kind::missing)
        out_missing = true;
      else
        view_of(o, true);
    }
  }
  const size_t per_group = info.input_names.size();
  const bool counts_fit =
      info.variadic ? !ins.empty() && per_group > 0 && ins.size() % per_group == 0 &&
                          (!out_given || outs.size() == ins.size() / per_group * info.output_names.size())
                    : ins.size() == per_group && (!out_given || outs.size() == info.output_names.size());
  if (!counts_fit) throw Fallback{};  // the Python path words the miscount as it always has
  std::vector<std::string> list_in, list_out;
  const std::vector<std::string>& input_names = operand_names(info, true, ins.size(), list_in);
  const std::vector<std::string>& output_names =
      operand_names(info, false, info.variadic ? ins.size() / per_group * info.output_names.size() : 0, list_out);

  // The reference operand: the first array that is not bool (else the first array).
  const Operand* ref = nullptr;
  for (Operand& o : ins)
    if (o.kind != Kind::scalar) view_of(o, false);
  for (const auto* list : {&ins, &outs})
    for (const Operand& o : *list)
      if (o.kind != Kind::scalar && o.kind != Kind::missing &&
          (!ref || (ref->view.dtype == DType::boolean && o.view.dtype != DType::boolean)))
        ref = &o;
  if (!ref) throw Fallback{};  // only Python scalars: numpy decides their dtypes
  const Operand reference = *ref;
  const uintptr_t ref_stream = reference.kind == Kind::torch && reference.device_type == nb::device::cuda::value
                                   ? torch_current_stream(reference.device_id)
                                   : 0;
  for (Operand& o : ins)
    if (o.kind == Kind::scalar) o = materialise(o.obj, reference, ref_stream);

  Placement placement;
  for (size_t i = 0; i < ins.size(); ++i)
    placement.add(info, input_names[i], ins[i].device_type, ins[i].device_id);
  for (size_t j = 0; j < outs.size(); ++j)
    if (outs[j].kind != Kind::missing)
      placement.add(info, output_names[j], outs[j].device_type, outs[j].device_id);

  PlanPreference pref;
  pref.allow_tf32 = allow_tf32.load();
  pref.deterministic_only = deterministic_only.load();
  thread_local std::string key;
  const bool cacheable = call_key(key, info, ins, outs, out_given, attrs, out_specs, placement, pref);
  CallCache::EntryRef entry = cacheable ? call_cache().find(key) : nullptr;
  const uintptr_t stream = reference.kind != Kind::torch || !placement.cuda ? 0
                           : ref_stream && placement.device == reference.device_id
                               ? ref_stream
                               : torch_current_stream(placement.device);
  if (!entry) {
    auto fresh = std::make_shared<CallEntry>();
    fresh->desc = {info.name, {}, {}, to_attrs(info, attrs)};
    for (const Operand& o : ins) fresh->desc.inputs.push_back({o.view.dtype, o.view.shape_vec()});
    if (out_given && !out_missing) {
      for (const Operand& o : outs) fresh->desc.outputs.push_back({o.view.dtype, o.view.shape_vec()});
    } else {
      OpDesc partial{info.name, fresh->desc.inputs, {}, fresh->desc.attrs};
      if (!out_specs.is_none()) partial.outputs = to_specs(nb::cast<std::vector<Spec>>(out_specs));
      fresh->desc.outputs = check(info.infer(partial)).outputs;
      for (size_t j = 0; j < outs.size(); ++j)  // the given ones as given (the plan checks them)
        if (outs[j].kind != Kind::missing) fresh->desc.outputs[j] = {outs[j].view.dtype, outs[j].view.shape_vec()};
    }
    const Stream s = placement.cuda ? Stream::cuda(reinterpret_cast<CUstream_st*>(stream)) : Stream::host();
    {
      DeviceGuard guard(placement.cuda, placement.device);
      fresh->plan = plan_cache().get(PlanCache::key(fresh->desc, placement, pref), s, fresh->desc, pref);
    }
    entry = fresh;
    if (cacheable) call_cache().put(key, entry);
  }
  if (!out_given || out_missing) {
    outs.resize(entry->desc.outputs.size());
    for (size_t j = 0; j < outs.size(); ++j) {
      if (out_given && outs[j].kind != Kind::missing) continue;
      outs[j] = allocate(entry->desc.outputs[j], reference);
      placement.add(info, output_names[j], outs[j].device_type, outs[j].device_id);
    }
  }

  std::vector<TensorView> in_views, out_views;
  in_views.reserve(ins.size()), out_views.reserve(outs.size());
  for (const Operand& o : ins) in_views.push_back(o.view);
  for (const Operand& o : outs) out_views.push_back(o.view);
  execute(info, entry->desc, entry->plan, in_views, out_views, placement, pref, stream, nb::none());
  if (outs.size() == 1) return outs[0].obj;
  nb::tuple result = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(outs.size())));
  for (size_t j = 0; j < outs.size(); ++j) PyTuple_SET_ITEM(result.ptr(), j, outs[j].obj.release().ptr());
  return result;
}

/// `call`: the fast path, or the Python path for what it does not take.
nb::object call(nb::handle op, nb::handle args, const nb::dict& attrs, nb::handle out, nb::handle out_specs) {
  if (!hooks().fallback.is_valid()) throw std::runtime_error("baracuda: call() before baracuda.functional set its hooks");
  try {
    return call_fast(op, args, attrs, out, out_specs);
  } catch (const Fallback&) {
    return hooks().fallback(op, args, attrs, out, out_specs);
  }
}

/// `obj`'s view as the fast path reads it, where `obj` is a numpy array or
/// torch tensor that path takes: no DLPack export (torch's costs microseconds
/// a tensor). None for anything else, which `run` imports through DLPack.
std::optional<Operand> direct_operand(nb::handle obj, bool writable) {
  if (!hooks().fallback.is_valid()) return std::nullopt;  // baracuda.functional not imported: no torch hooks
  try {
    Operand o;
    o.obj = nb::borrow(obj);
    o.kind = classify(obj);
    if (o.kind != Kind::numpy && o.kind != Kind::torch) return std::nullopt;
    view_of(o, writable);
    return o;
  } catch (const Fallback&) {
    return std::nullopt;
  }
}

void run(const std::string& op, const nb::sequence& inputs, const nb::sequence& outputs, const nb::dict& attrs,
         uintptr_t stream, const nb::object& dtypes, const std::optional<std::string>& backend,
         const nb::object& workspace) {
  const OpInfo& info = op_info(op);
  const size_t n_in = nb::len(inputs), n_out = nb::len(outputs);
  if (info.variadic) {
    const size_t per_in = info.input_names.size(), per_out = info.output_names.size();
    if (n_in == 0 || per_in == 0 || n_in % per_in != 0 || n_out != n_in / per_in * per_out)
      throw nb::type_error(cat(op, ": expected ", per_in, " inputs and ", per_out, " outputs a group (at least one "
                               "group), got ", n_in, " and ", n_out).c_str());
  } else if (n_in != info.input_names.size() || n_out != info.output_names.size()) {
    throw nb::type_error(cat(op, ": expected ", info.input_names.size(), " inputs and ", info.output_names.size(),
                             " outputs, got ", n_in, " and ", n_out).c_str());
  }
  std::vector<std::string> list_in, list_out;
  const std::vector<std::string>& input_names = operand_names(info, true, n_in, list_in);
  const std::vector<std::string>& output_names = operand_names(info, false, n_out, list_out);
  if (!dtypes.is_none() && nb::len(dtypes) != n_in + n_out)
    throw nb::type_error(cat(op, ": 'dtypes' must have one entry (a dtype name or None) per input and output, got ",
                             nb::len(dtypes)).c_str());
  auto override_of = [&](size_t i) -> nb::object { return dtypes.is_none() ? nb::none() : dtypes[i]; };

  OpDesc desc{op, {}, {}, to_attrs(info, attrs)};
  Placement placement;
  std::vector<InArray> in_keep;
  std::vector<OutArray> out_keep;
  std::vector<TensorView> in_views, out_views;
  in_keep.reserve(n_in), out_keep.reserve(n_out);
  std::vector<Operand> direct;  ///< holds the operands read directly for the call
  direct.reserve(n_in + n_out);
  auto view = [&](nb::handle obj, const std::string& name, nb::handle dtype, bool writable, auto& keep) {
    if (dtype.is_none()) {
      if (std::optional<Operand> o = direct_operand(obj, writable)) {
        placement.add(info, name, o->device_type, o->device_id);
        direct.push_back(std::move(*o));
        return direct.back().view;
      }
    }
    return import_operand(info, obj, name, dtype, placement, keep);
  };
  for (size_t i = 0; i < n_in; ++i)
    in_views.push_back(view(inputs[i], input_names[i], override_of(i), false, in_keep));
  for (size_t j = 0; j < n_out; ++j)
    out_views.push_back(view(outputs[j], output_names[j], override_of(n_in + j), true, out_keep));
  for (const auto& v : in_views) desc.inputs.push_back({v.dtype, v.shape_vec()});
  for (const auto& v : out_views) desc.outputs.push_back({v.dtype, v.shape_vec()});

  PlanPreference pref;
  pref.backend = backend_arg(backend);
  pref.allow_tf32 = allow_tf32.load();
  pref.deterministic_only = deterministic_only.load();
  const Stream s = placement.cuda ? Stream::cuda(reinterpret_cast<CUstream_st*>(stream)) : Stream::host();
  PlanCache::PlanRef plan;
  {
    DeviceGuard guard(placement.cuda, placement.device);
    plan = plan_cache().get(PlanCache::key(desc, placement, pref), s, desc, pref);
  }
  execute(info, desc, std::move(plan), in_views, out_views, placement, pref, stream, workspace);
}

std::vector<Spec> infer_specs(const std::string& op, const std::vector<Spec>& inputs, const nb::dict& attrs,
                              const std::optional<std::vector<Spec>>& outputs) {
  const OpInfo& info = op_info(op);
  OpDesc partial{op, to_specs(inputs), outputs ? to_specs(*outputs) : std::vector<TensorSpec>{}, to_attrs(info, attrs)};
  return from_specs(check(info.infer(partial)).outputs);
}

nb::dict plan_info(const std::string& op, const std::vector<Spec>& inputs, const nb::dict& attrs,
                   const std::optional<std::vector<Spec>>& outputs, const std::string& device,
                   const std::optional<std::string>& backend) {
  const OpInfo& info = op_info(op);
  if (device != "cpu" && device != "cuda") throw nb::value_error("device must be 'cpu' or 'cuda'");
  OpDesc partial{op, to_specs(inputs), outputs ? to_specs(*outputs) : std::vector<TensorSpec>{}, to_attrs(info, attrs)};
  OpDesc desc = check(info.infer(partial));
  PlanPreference pref;
  pref.backend = backend_arg(backend);
  pref.allow_tf32 = allow_tf32.load();
  pref.deterministic_only = deterministic_only.load();
  const Stream s = device == "cuda" ? Stream::cuda() : Stream::host();
  PlanPtr plan = check(select(s, desc, pref));
  KernelSku sku = plan->sku();
  return make_dict("sku"_a = sku.to_string(), "backend"_a = backend_name(sku.backend),
                  "workspace_size"_a = plan->workspace_size(), "math"_a = math_precision_name(sku.precision.math),
                  "accumulator"_a = dtype_name(sku.precision.accumulator),
                  "deterministic"_a = sku.precision.deterministic, "outputs"_a = from_specs(desc.outputs));
}

nb::list ops() {
  nb::list out;
  for (const OpInfo& op : registry()) {
    std::vector<std::string> dtypes, backends;
    for (DType d : op.dtypes) dtypes.push_back(dtype_name(d));
    for (Backend b : op.backends) backends.push_back(backend_name(b));
    nb::dict attrs;
    for (const auto& a : op.attrs) attrs[a.name.c_str()] = a.default_value;
    nb::list domains, samples;
    for (const auto& d : op.domains) domains.append(nb::make_tuple(d.lo, d.hi, d.symmetric));
    for (const auto& s : op.sample_attrs) {
      nb::dict sample;
      for (const auto& [k, v] : s.values()) sample[k.c_str()] = v;
      samples.append(sample);
    }
    out.append(make_dict("name"_a = op.name, "category"_a = category_name(op.category), "family"_a = op.family,
                        "direction"_a = op.direction == Direction::forward ? "forward" : "backward",
                        "gradient"_a = op.gradient.empty() ? nb::none() : nb::cast(op.gradient),
                        "input_names"_a = op.input_names, "output_names"_a = op.output_names,
                        "variadic"_a = op.variadic, "dtypes"_a = dtypes,
                        "attrs"_a = attrs, "backends"_a = backends, "doc"_a = op.doc, "domains"_a = domains,
                        "sample_attrs"_a = samples, "tolerance_scale"_a = op.tolerance_scale,
                        "integer_inputs"_a = op.integer_valued_inputs));
  }
  return out;
}

}  // namespace
}  // namespace baracuda::python

NB_MODULE(_baracuda, m) {
  using namespace baracuda;
  using namespace baracuda::python;
  m.doc() = "baracuda native bindings: registry, shape inference and a generic op runner";
  if (_import_array() < 0) throw nb::python_error();

  nb::object bases = nb::make_tuple(nb::handle(PyExc_NotImplementedError), nb::handle(PyExc_TypeError));
  g_unsupported_error = PyErr_NewExceptionWithDoc(
      "baracuda.UnsupportedError",
      "The op, dtype, layout or device is not offered (a NotImplementedError and a TypeError).", bases.ptr(),
      nullptr);
  m.attr("UnsupportedError") = nb::handle(g_unsupported_error);
  nb::register_exception_translator(translate_error);

  m.def("ops", &ops, "Every registered op as a dict (name, family, direction, gradient, input_names, "
                     "output_names, dtypes, attrs {name: default}, backends, doc, test hints).");
  m.def("dtypes", [] {
    std::vector<std::string> names;
    for (DType d : all_dtypes()) names.push_back(dtype_name(d));
    return names;
  }, "Dtype names in code order (the index is the code the 'cast' op takes).");
  m.def("dtype_code", [](const std::string& name) { return static_cast<int>(dtype_arg(name)); }, "name"_a,
        "The code of a dtype name or alias ('f16', 'float16', 'half', ...).");
  m.def("cuda_available", &cuda_available, "True when a CUDA device is usable.");
  m.def("infer", &infer_specs, "op"_a, "inputs"_a, "attrs"_a = nb::dict(), "outputs"_a = nb::none(),
        "Output (dtype, shape) specs of an op for input specs [(dtype, shape), ...]. Outputs given are checked "
        "(ops such as 'fill' and 'where_backward' take them).");
  m.def("run", &run, "op"_a, "inputs"_a, "outputs"_a, "attrs"_a = nb::dict(), "stream"_a = 0,
        "dtypes"_a = nb::none(), "backend"_a = nb::none(), "workspace"_a = nb::none(),
        "Runs op on arrays, writing outputs in place: numpy arrays and torch tensors read directly, other DLPack "
        "producers imported. All operands on the host (host backend) or all on one GPU (on `stream`, a "
        "cudaStream_t as int). `dtypes` optionally overrides each operand's exported dtype (same element size; "
        "such operands go through DLPack). The GIL is released while the kernel runs.");
  m.def("plan_info", &plan_info, "op"_a, "inputs"_a, "attrs"_a = nb::dict(), "outputs"_a = nb::none(),
        "device"_a = "cpu", "backend"_a = nb::none(),
        "The plan `select` picks for these specs on 'cpu' or 'cuda': sku, backend, workspace_size, precision.");
  m.def("clear_plan_cache", [] {
    plan_cache().clear();
    call_cache().clear();
  }, "Drops every cached plan.");
  m.def("call", &call, "op"_a, "args"_a, "attrs"_a, "out"_a = nb::none(), "out_specs"_a = nb::none(),
        "What baracuda.functional's wrappers run: op on `args` (arrays or Python scalars, which take the "
        "dtype of the first non-bool array), writing into `out` or into outputs allocated like that array "
        "(specs inferred, or given by `out_specs`). Returns the output or a tuple of outputs.");
  m.def("_set_call_hooks", [](nb::object fallback, nb::object is_torch_type, nb::object torch_dtype,
                              nb::object torch_empty, nb::object torch_scalar, nb::object torch_stream_getter) {
    CallHooks& h = hooks();
    h.fallback = std::move(fallback), h.is_torch_type = std::move(is_torch_type);
    h.torch_dtype = std::move(torch_dtype), h.torch_empty = std::move(torch_empty);
    h.torch_scalar = std::move(torch_scalar), h.torch_stream_getter = std::move(torch_stream_getter);
    h.torch_stream = nb::object();
    h.types.clear(), h.dtypes.clear();
  }, "fallback"_a, "is_torch_type"_a, "torch_dtype"_a, "torch_empty"_a, "torch_scalar"_a, "torch_stream_getter"_a,
        "The Python callables `call` uses (set by baracuda.functional).");
  m.def("set_allow_tf32", [](bool allow) { allow_tf32.store(allow); },
        "Whether f32 GEMMs may multiply in TF32 (torch.backends.cuda.matmul.allow_tf32); off by default.");
  m.def("get_allow_tf32", [] { return allow_tf32.load(); });
  m.def("set_deterministic", [](bool only) { deterministic_only.store(only); },
        "Whether every plan must be bitwise reproducible run to run (torch.use_deterministic_algorithms): "
        "the attention backward then sums dQ in a fixed order; off by default.");
  m.def("get_deterministic", [] { return deterministic_only.load(); });
  m.def("plan_cache_size", [] { return plan_cache().size(); }, "Number of cached plans.");
}
