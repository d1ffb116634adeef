// Instantiates the loss launchers for every loss and dtype of a list:
//  pointwise (elementwise launcher): "name:T" -> T, "name:T:W" -> the f32/f64
//  scratch the reduction sums, "name_backward:T" -> the gradients;
//  class losses (see class_losses.hpp): "name:T:target dtype", every mode;
//  fp8 (e4m3, e5m2): the losses alone, computed in f32 (no gradients);
//  row losses (see row_losses.hpp): "name:T:target dtype" (T without a target).
#pragma once

#include <string>
#include <utility>

#include "core/fp8_traits.hpp"
#include "core/launch_table.hpp"
#include "elementwise/engine.hpp"
#include "loss/class_losses.hpp"
#include "loss/pointwise.hpp"
#include "loss/row_losses.hpp"

namespace baracuda::loss {

using PointwiseTable = LaunchTable<ew::LaunchFn>;
PointwiseTable& host_pointwise();
PointwiseTable& cuda_pointwise();

using ClassTable = LaunchTable<ClassFn>;
ClassTable& host_class_losses();
ClassTable& cuda_class_losses();

using RowTable = LaunchTable<RowFn>;
RowTable& host_row_losses();
RowTable& cuda_row_losses();

/// Storage types of the losses: the four floats, and fp8 for the losses alone.
using LossTypes = Concat<FloatTypes, Fp8Types>::type;

/// The per-element scratch type a reduced loss is summed from.
template <class T, bool Host>
using scratch_t = std::conditional_t<Host || std::is_same_v<T, double>, double, float>;

template <size_t, class T>
using Same = T;

template <class L, class Launcher, bool Host, class T, size_t... I>
void register_pointwise_loss(PointwiseTable& table, std::index_sequence<I...>) {
  using W = scratch_t<T, Host>;
  using Fwd = LossForward<L, Host, T, Same<I, T>...>;
  constexpr DType d = dtype_of<T>;
  table.add(launch_key(L::meta.name, d), &Launcher::template launch<T, 1, Fwd, Same<I, T>...>);
  table.add(launch_key(L::meta.name, d, dtype_of<W>), &Launcher::template launch<W, 1, Fwd, Same<I, T>...>);
  if constexpr (has_gradient_v<T>)  // fp8: the loss only
    table.add(launch_key(std::string(L::meta.name) + "_backward", d),
              &Launcher::template launch<T, L::meta.grads, LossBackward<L, Host, T, Same<I, T>...>, T, Same<I, T>...>);
}

/// Every pointwise loss for every T of `Types`, run by `Launcher` (ew::HostLauncher or ew::CudaLauncher).
template <class Launcher, bool Host, class Types>
bool register_pointwise(PointwiseTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) {
    [&]<class... Ls>(LossList<Ls...>) {
      (register_pointwise_loss<Ls, Launcher, Host, T>(table, std::make_index_sequence<Ls::meta.inputs>{}), ...);
    }(PointwiseLosses{});
  });
  return true;
}

/// `Launch<L, T, Index>::run` for every class loss and T of `Types`, under
/// "name:T:index dtype"; cross_entropy also takes probabilities (Index = T).
template <template <class, class, class> class Launch, class Types>
bool register_class_losses(ClassTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) {
    [&]<class... Ls>(ClassLossList<Ls...>) {
      auto one = [&]<class L, class Index>() {
        table.add(launch_key(L::name, dtype_of<T>, dtype_of<Index>), &Launch<L, T, Index>::run);
      };
      ((one.template operator()<Ls, int64_t>(), one.template operator()<Ls, int32_t>()), ...);
    }(ClassLosses{});
    table.add(launch_key(CrossEntropy::name, dtype_of<T>, dtype_of<T>), &Launch<CrossEntropy, T, T>::run);
  });
  return true;
}

/// `Launch<L, T, Index>::run` for every row loss and T of `Types`, under
/// "name:T:index dtype": i64 and i32 class indices, and T too for a sign target.
template <template <class, class, class> class Launch, class Types>
bool register_row_losses(RowTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) {
    [&]<class... Ls>(RowLossList<Ls...>) {
      auto one = [&]<class L, class Index>() {
        table.add(launch_key(L::meta.name, dtype_of<T>, dtype_of<Index>), &Launch<L, T, Index>::run);
      };
      auto loss = [&]<class L>() {
        if constexpr (L::meta.target == TargetKind::none || L::meta.target == TargetKind::sign)
          one.template operator()<L, T>();
        if constexpr (L::meta.target != TargetKind::none)
          one.template operator()<L, int64_t>(), one.template operator()<L, int32_t>();
      };
      (loss.template operator()<Ls>(), ...);
    }(RowLosses{});
  });
  return true;
}

}  // namespace baracuda::loss
