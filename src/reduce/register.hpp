// Instantiates a reduction launcher for every (reducer, input dtype, output
// dtype) of a dtype list and records it under "op:in:out".
#pragma once

#include <string>
#include <unordered_map>

#include "reduce/engine.hpp"

namespace baracuda::red {

class ReduceTable {
 public:
  void add(std::string key, ReduceFn fn) { fns_[std::move(key)] = fn; }
  ReduceFn find(const std::string& key) const {
    auto it = fns_.find(key);
    return it == fns_.end() ? nullptr : it->second;
  }

 private:
  std::unordered_map<std::string, ReduceFn> fns_;
};
ReduceTable& host_reducers();
ReduceTable& cuda_reducers();

std::string reducer_key(std::string_view op, DType in, DType out);

/// Output types an op produces for input type T.
template <class R, class T>
auto output_types() {
  if constexpr (R::meta.out == OutRule::same) return TypeList<T>{};
  else if constexpr (R::meta.out == OutRule::widen_ints) return TypeList<std::conditional_t<is_float_v<T>, T, int64_t>>{};
  else if constexpr (R::meta.out == OutRule::index) return TypeList<int64_t, int32_t>{};
  else if constexpr (R::meta.out == OutRule::boolean) return TypeList<bool>{};
  else return TypeList<int64_t>{};
}

/// `Launch<R, T, Out>` is the launcher function template (host or CUDA).
template <template <class, class, class> class Launch, class Types>
bool register_reducers(ReduceTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) {
    [&]<class... Rs>(ReducerList<Rs...>) {
      ([&] {
        if constexpr (accepts<Rs, T>) {
          for_each_type<decltype(output_types<Rs, T>())>([&]<class Out>(TypeTag<Out>) {
            table.add(reducer_key(Rs::meta.name, dtype_of<T>, dtype_of<Out>), &Launch<Rs, T, Out>::run);
          });
        }
      }(), ...);
    }(Reducers{});
  });
  return true;
}

}  // namespace baracuda::red
