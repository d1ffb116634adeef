// A name -> launcher map that each family's kernel translation units fill at
// load time (one table per backend), and its plans look up by key.
#pragma once

#include <string>
#include <unordered_map>

#include "baracuda/core.hpp"
#include "core/dtype_traits.hpp"

namespace baracuda {

/// "op:dtype" and "op:in:out", the keys every family registers under.
inline std::string launch_key(std::string_view op, DType dtype) {
  return std::string(op) + ':' + dtype_name(dtype);
}
inline std::string launch_key(std::string_view op, DType in, DType out) {
  return launch_key(op, in) + ':' + dtype_name(out);
}

template <class Fn>
class LaunchTable {
 public:
  void add(std::string key, Fn fn) { fns_[std::move(key)] = fn; }
  /// nullptr when no launcher was registered under `key`.
  Fn find(const std::string& key) const {
    auto it = fns_.find(key);
    return it == fns_.end() ? nullptr : it->second;
  }
  size_t size() const { return fns_.size(); }

 private:
  std::unordered_map<std::string, Fn> fns_;
};

/// Adds `Launch<T>::run` under launch_key(op, T) for every T of `List`;
/// returns true, for a file's static registration.
template <class List, template <class> class Launch, class Table>
bool register_launchers(Table& table, std::string_view op) {
  for_each_type<List>([&]<class T>(TypeTag<T>) { table.add(launch_key(op, dtype_of<T>), &Launch<T>::run); });
  return true;
}

}  // namespace baracuda
