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
using SoftmaxFn = Status (*)(const RowLaunch&, CUstream_st*);

using SoftmaxTable = LaunchTable<SoftmaxFn>;
SoftmaxTable& host_softmax();
SoftmaxTable& cuda_softmax();

template <template <class, class, bool> class Launch, class T, class... Ops>
void register_softmax_for(SoftmaxTable& table, OpList<Ops...>) {
  ((table.add(launch_key(Ops::name, dtype_of<T>), &Launch<Ops, T, false>::run),
    table.add(launch_key(std::string(Ops::name) + "_backward", dtype_of<T>), &Launch<Ops, T, true>::run)), ...);
}

/// `Launch<Op, T, kBackward>::run` for every op and every T of `Types`.
template <template <class, class, bool> class Launch, class Types>
bool register_softmax(SoftmaxTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) { register_softmax_for<Launch, T>(table, SoftmaxOps{}); });
  return true;
}

}  // namespace baracuda::smax
