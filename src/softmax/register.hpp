// Instantiates the softmax launchers (forward and backward) for every op of
// the family and every dtype of a list, recorded under "op:dtype".
#pragma once

#include <string>

#include "core/launch_table.hpp"
#include "core/rows.hpp"
#include "softmax/ops.hpp"

struct CUstream_st;

namespace baracuda::smax {

using rows::RowLaunch;
using SoftmaxFn = Status (*)(const RowLaunch&, const RowParams&, CUstream_st*);

using SoftmaxTable = LaunchTable<SoftmaxFn>;
SoftmaxTable& host_softmax();
SoftmaxTable& cuda_softmax();

template <template <class, class, bool> class Launch, class T, class... Ops>
void register_softmax_for(SoftmaxTable& table, OpList<Ops...>) {
  auto add = [&]<class Op>(TypeTag<Op>) {
    table.add(launch_key(Op::name, dtype_of<T>), &Launch<Op, T, false>::run);
    if constexpr (Op::kBackwardKernel)
      table.add(launch_key(std::string(Op::name) + "_backward", dtype_of<T>), &Launch<Op, T, true>::run);
  };
  (add(TypeTag<Ops>{}), ...);
}

/// `Launch<Op, T, kBackward>::run` for every op of `Ops` and every T of `Types`.
template <template <class, class, bool> class Launch, class Types, class Ops = SoftmaxOps>
bool register_softmax(SoftmaxTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) { register_softmax_for<Launch, T>(table, Ops{}); });
  return true;
}

}  // namespace baracuda::smax
