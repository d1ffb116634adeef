// The host reference grouped GEMM: checks the offsets (non-decreasing, within
// the split extent), then every element's products summed in order in f64.
#include "core/errors.hpp"
#include "gemm/epilogue.hpp"
#include "gemm/grouped.hpp"

namespace baracuda::gemm {

namespace {

Status check_offsets(const GroupedProblem& p) {
  const int64_t extent = p.split_extent();
  const char* what = p.mode == GroupedMode::rows ? "the rows of 'a'" : "the K of 'a' and 'b'";
  int64_t prev = 0;
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t o = p.offs[g * p.offs_stride];
    if (o < prev)
      return invalid("'offs' must be non-decreasing from 0: offs[", g, "] = ", o,
                     g ? cat(" < offs[", g - 1, "] = ", prev) : std::string(" < 0"));
    if (o > extent) return invalid("'offs' past ", what, ": offs[", g, "] = ", o, " > ", extent);
    prev = o;
  }
  return Status::ok();
}

template <class T>
struct HostGrouped {
  static Status run(const GroupedProblem& p, CUstream_st*) {
    using Acc = acc_t<T, true>;
    if (p.mode != GroupedMode::batch) BARACUDA_TRY(check_offsets(p));
    const T* a = reinterpret_cast<const T*>(p.a.data);
    const T* b = reinterpret_cast<const T*>(p.b.data);
    T* d = reinterpret_cast<T*>(p.d.data);
    auto store = [&](int64_t g, int64_t m, int64_t n, Acc v) {
      d[g * p.d.group + m * p.d.row + n * p.d.col] = convert<T>(v);
    };
    int64_t start = 0;
    for (int64_t g = 0; g < p.groups; ++g) {
      const int64_t end = p.mode == GroupedMode::batch ? 0 : p.offs[g * p.offs_stride];
      const int64_t m_lo = p.mode == GroupedMode::rows ? start : 0, m_hi = p.mode == GroupedMode::rows ? end : p.m;
      const int64_t k_lo = p.mode == GroupedMode::red ? start : 0, k_hi = p.mode == GroupedMode::red ? end : p.k;
      for (int64_t m = m_lo; m < m_hi; ++m)
        for (int64_t n = 0; n < p.n; ++n) {
          Acc acc = 0;
          for (int64_t k = k_lo; k < k_hi; ++k)
            acc += convert<Acc>(a[g * p.a.group + m * p.a.row + k * p.a.col]) *
                   convert<Acc>(b[g * p.b.group + k * p.b.row + n * p.b.col]);
          store(g, m, n, acc);
        }
      start = end;
    }
    if (p.mode == GroupedMode::rows)  // rows past the last group
      for (int64_t m = start; m < p.m; ++m)
        for (int64_t n = 0; n < p.n; ++n) store(0, m, n, Acc(0));
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_launchers<FloatTypes, HostGrouped>(host_grouped(), "grouped_mm");

}  // namespace
}  // namespace baracuda::gemm
