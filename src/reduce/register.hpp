// Instantiates a reduction launcher for every (reducer, input dtype, output
// dtype) of a dtype list and records it under "op:in:out".
#pragma once

#include <string>

#include "core/launch_table.hpp"
#include "core/errors.hpp"

#include "reduce/engine.hpp"
#include "reduce/gradients.hpp"

namespace baracuda::red {

using ReduceTable = LaunchTable<ReduceFn>;
ReduceTable& host_reducers();
ReduceTable& cuda_reducers();


/// Output types an op produces for input type T.
template <class R, class T>
auto output_types() {
  if constexpr (R::meta.out == OutRule::same) return TypeList<T>{};
  else if constexpr (R::meta.out == OutRule::widen_ints) return TypeList<std::conditional_t<is_float_v<T>, T, int64_t>>{};
  else if constexpr (R::meta.out == OutRule::index) return TypeList<int64_t, int32_t>{};
  else if constexpr (R::meta.out == OutRule::boolean) return TypeList<bool>{};
  else return TypeList<int64_t>{};
}

template <template <class, class, class> class Launch, class T, class R>
void register_reducer(ReduceTable& table) {
  if constexpr (accepts<R, T>) {
    for_each_type<decltype(output_types<R, T>())>([&]<class Out>(TypeTag<Out>) {
      table.add(launch_key(R::meta.name, dtype_of<T>, dtype_of<Out>), &Launch<R, T, Out>::run);
    });
    // Sums of f32/f64 scratch into narrower outputs (the loss family's reductions).
    if constexpr (std::is_same_v<R, Sum> && std::is_same_v<T, float>) {
      table.add(launch_key("sum", DType::f32, DType::f16), &Launch<R, T, __half>::run);
      table.add(launch_key("sum", DType::f32, DType::bf16), &Launch<R, T, __nv_bfloat16>::run);
      table.add(launch_key("sum", DType::f32, DType::fp8_e4m3), &Launch<R, T, __nv_fp8_e4m3>::run);
      table.add(launch_key("sum", DType::f32, DType::fp8_e5m2), &Launch<R, T, __nv_fp8_e5m2>::run);
    }
    if constexpr (std::is_same_v<R, Sum> && std::is_same_v<T, double>) {
      table.add(launch_key("sum", DType::f64, DType::f32), &Launch<R, T, float>::run);
      table.add(launch_key("sum", DType::f64, DType::f16), &Launch<R, T, __half>::run);
      table.add(launch_key("sum", DType::f64, DType::bf16), &Launch<R, T, __nv_bfloat16>::run);
      table.add(launch_key("sum", DType::f64, DType::fp8_e4m3), &Launch<R, T, __nv_fp8_e4m3>::run);
      table.add(launch_key("sum", DType::f64, DType::fp8_e5m2), &Launch<R, T, __nv_fp8_e5m2>::run);
    }
    // The mean in f32/f64 whatever the input: var/std gradients need it unrounded.
    if constexpr (std::is_same_v<R, Mean>) {
      table.add(launch_key("mean", dtype_of<T>, DType::f32), &Launch<R, T, float>::run);
      table.add(launch_key("mean", dtype_of<T>, DType::f64), &Launch<R, T, double>::run);
    }
  }
}

template <template <class, class, class> class Launch, class T, class... Rs>
void register_reducers_for(ReduceTable& table, ReducerList<Rs...>) {
  (register_reducer<Launch, T, Rs>(table), ...);
}

/// The gradient auxiliaries of a float input type, into the gradients' math
/// type (f64 on the host and for f64, else f32).
template <template <class, class, class> class Launch, bool Host, class T, class... Rs>
void register_aux_for(ReduceTable& table, ReducerList<Rs...>) {
  if constexpr (Contains<T, FloatTypes>::value) {
    using Out = std::conditional_t<Host || std::is_same_v<T, double>, double, float>;
    (table.add(launch_key(Rs::meta.name, dtype_of<T>, dtype_of<Out>), &Launch<Rs, T, Out>::run), ...);
  }
}

/// `Launch<R, T, Out>::run` is the launcher (host or CUDA) of every reducer
/// (and gradient auxiliary) for every input type of `Types`.
template <template <class, class, class> class Launch, class Types, bool Host = false>
bool register_reducers(ReduceTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) {
    register_reducers_for<Launch, T>(table, Reducers{});
    register_aux_for<Launch, Host, T>(table, AuxReducers{});
  });
  return true;
}

/// Gradient launchers of the reductions, under "op:dtype" (op: the forward name).
using GradTable = LaunchTable<ew::LaunchFn>;
GradTable& host_gradients();
GradTable& cuda_gradients();

template <class L, bool Host, class T, class... Gs>
void register_gradients_for(GradTable& table, GradList<Gs...>) {
  (table.add(launch_key(Gs::name, dtype_of<T>),
             &L::template launch<T, 1, GradFn<Gs, Host, T>, T, T, T, aux_operand_t<Gs, Host, T>>),
   ...);
}

/// `L::launch<Out, 1, Fn, Ins...>` (an elementwise launcher) for every
/// gradient and every T of `Types`.
template <class L, bool Host, class Types>
bool register_gradients(GradTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) { register_gradients_for<L, Host, T>(table, ReductionGrads{}); });
  return true;
}

}  // namespace baracuda::red
