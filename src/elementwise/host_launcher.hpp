// The host reference launcher: the same functors and offset rules as the
// CUDA launcher, one element at a time, math in f64.
#pragma once

#include "elementwise/ops.hpp"

namespace baracuda::ew {

struct HostLauncher {
  template <class Out, int NOut, class Fn, class... Ins>
  static Status launch(const Launch& launch, const Params& params, CUstream_st*) {
    constexpr int kIn = sizeof...(Ins);
    const Fn fn{params};
    const auto inputs = std::index_sequence_for<Ins...>{};
    if (!launch.reduce) {
      constexpr int N = NOut + kIn;
      const OffsetCalc<N, int64_t> calc(launch.kept);
      const int64_t n = launch.kept.numel();
      for (int64_t i = 0; i < n; ++i) {
        int64_t off[N];
        calc.get(i, off);
        apply_at<Out, NOut, Ins...>(fn, launch.kept.data, off, inputs);
      }
    } else if constexpr (Reducible<Fn>) {
      constexpr int N = 1 + kIn;
      const OffsetCalc<N, int64_t> kept(launch.kept), reduced(launch.reduced);
      const int64_t n = launch.kept.numel(), reduced_n = launch.reduced.numel();
      for (int64_t i = 0; i < n; ++i) {
        int64_t off[N];
        kept.get(i, off);
        reduce_at<Out, Ins...>(fn, launch.output_index, launch.kept.data, off, reduced, reduced_n, inputs);
      }
    }
    return Status::ok();
  }
};

}  // namespace baracuda::ew
