// Internal helpers to build Status values with readable messages.
#pragma once

#include <sstream>

#include "baracuda/core.hpp"

namespace baracuda {

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <class... Parts>
Status invalid(const Parts&... parts) {
  return Status::error(ErrorKind::invalid_problem, cat(parts...));
}
template <class... Parts>
Status unsupported(const Parts&... parts) {
  return Status::error(ErrorKind::unsupported, cat(parts...));
}
template <class... Parts>
Status internal_error(const Parts&... parts) {
  return Status::error(ErrorKind::internal, cat(parts...));
}

#define BARACUDA_TRY(expr)                  \
  do {                                      \
    ::baracuda::Status status_ = (expr);    \
    if (!status_.is_ok()) return status_;   \
  } while (0)

}  // namespace baracuda
