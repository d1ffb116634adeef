// Instantiates the normalization launchers (forward and backward) for every
// member of the family and every dtype of a list, recorded under "op:dtype".
#pragma once

#include <string>

#include "core/launch_table.hpp"
#include "core/rows.hpp"
#include "norm/ops.hpp"

struct CUstream_st;

namespace baracuda::norm {

using rows::RowLaunch;
/// (launch, attributes, splits of the parameter-gradient pass, stream).
using NormFn = Status (*)(const RowLaunch&, const NormParams&, int, CUstream_st*);

using NormTable = LaunchTable<NormFn>;
NormTable& host_norms();
NormTable& cuda_norms();

template <template <class, class, bool> class Launch, class T, class S>
void register_norm(NormTable& table) {
  table.add(launch_key(S::name, dtype_of<T>), &Launch<S, T, false>::run);
  if constexpr (S::kHasBackward && has_gradient_v<T>) table.add(launch_key(std::string(S::name) + "_backward", dtype_of<T>), &Launch<S, T, true>::run);
}

template <template <class, class, bool> class Launch, class T, class... Ss>
void register_norms_for(NormTable& table, SpecList<Ss...>) {
  (register_norm<Launch, T, Ss>(table), ...);
}

/// `Launch<S, T, kBackward>::run` for every member and every T of `Types`.
template <template <class, class, bool> class Launch, class Types>
bool register_norms(NormTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) { register_norms_for<Launch, T>(table, NormSpecs{}); });
  return true;
}

}  // namespace baracuda::norm
