// The reduction problem shared by the CUDA kernels and the host reference:
// `outputs` results, each reducing `count` input elements. Operand 0 is the
// output, operand 1 the input; `kept` walks the outputs, `reduced` the
// elements of one output (input strides only).
#pragma once

#include "elementwise/engine.hpp"
#include "reduce/reducers.hpp"

struct CUstream_st;

namespace baracuda::red {

using ew::OffsetCalc;
using ew::Problem;

struct ReduceLaunch {
  Problem kept;      ///< operands {output, input} over the output elements
  Problem reduced;   ///< operands {output (stride 0), input} over one output's elements
  int64_t outputs = 0, count = 0;
  int splits = 1;         ///< blocks per output: partial results go to the workspace, then merge
  int64_t chunk = 0;      ///< reduced elements per split
  void* workspace = nullptr;
};

using ReduceFn = Status (*)(const ReduceLaunch&, const RParams&, CUstream_st*);

/// Splits of the reduced range that keep `sm_count` SMs busy (1 when the
/// outputs alone fill the GPU), each of at least `min_per_split` reduced
/// elements; a function of the shapes only, so that the workspace size is
/// known when the plan is made.
inline int choose_splits(int64_t outputs, int64_t count, int sm_count, int64_t min_per_split = 1024) {
  if (outputs <= 0 || count <= 0) return 1;
  const int64_t resident_threads = int64_t(sm_count) * 2048;
  int64_t by_parallelism = (resident_threads + outputs - 1) / outputs;
  int64_t by_work = (count + min_per_split - 1) / min_per_split;
  int64_t s = std::min(by_parallelism, by_work);
  return int(std::clamp<int64_t>(s, 1, 1024));
}

/// Least reduced elements per split for an input of `in`: narrow elements
/// bring half the bytes, so 512 keep a split's loads as long as 1024 f32 do
/// (H100, dim-0 sum of 8192x8192: bf16 +3%, while f32 with 512 lost 2%).
inline int64_t min_split_elements(DType in) { return dtype_size(in) < 4 ? 512 : 1024; }

/// A sum over some axes, for other families (the losses): `in` summed over
/// the axes in `mask` (bit a = axis a) into `out` (those axes dropped).
struct SumStep {
  ReduceFn fn = nullptr;
  int splits = 1;
  size_t workspace = 0;  ///< bytes
};
/// `in_shape` is the shape summed; dtypes: any registered "sum:in:out".
Result<SumStep> make_sum_step(Backend backend, DType in, DType out, const Shape& in_shape, uint32_t mask);
Status run_sum_step(const SumStep& step, const TensorView& in, const TensorView& out, uint32_t mask, void* workspace,
                    CUstream_st* stream);

/// The host reference: every output in f64 (floats), one element at a time.
template <class R, class T, class Out>
Status reduce_on_host(const ReduceLaunch& l, const RParams& r, CUstream_st*) {
  using A = typename R::template Acc<T, true>;
  const OffsetCalc<2, int64_t> kept(l.kept), reduced(l.reduced);
  const T* in = reinterpret_cast<const T*>(l.kept.data[1]);
  Out* out = reinterpret_cast<Out*>(l.kept.data[0]);
  for (int64_t o = 0; o < l.outputs; ++o) {
    int64_t base[2];
    kept.get(o, base);
    A acc = R::template init<A>(r);
    for (int64_t i = 0; i < l.count; ++i) {
      int64_t off[2];
      reduced.get(i, off);
      acc = R::step(acc, load_value<T, true>(in[base[1] + off[1]]), i, r);
    }
    out[base[0]] = convert<Out>(R::finish(acc, l.count, r));
  }
  return Status::ok();
}

}  // namespace baracuda::red
