#include <sstream>

#include "baracuda/core.hpp"

namespace baracuda {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::ok: return "ok";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::invalid_problem: return "invalid problem";
    case ErrorKind::misaligned_operand: return "misaligned operand";
    case ErrorKind::workspace_too_small: return "workspace too small";
    case ErrorKind::buffer_too_small: return "buffer too small";
    case ErrorKind::backend_error: return "backend error";
    case ErrorKind::internal: return "internal error";
  }
  return "unknown";
}

Status Status::error(ErrorKind kind, std::string message) {
  Status s;
  s.kind_ = kind;
  s.message_ = std::move(message);
  return s;
}

Status Status::too_small(ErrorKind kind, size_t needed, size_t got, std::string message) {
  Status s = error(kind, std::move(message));
  s.needed_ = needed;
  s.got_ = got;
  return s;
}

Status Status::backend(std::string library, long code, std::string message) {
  Status s = error(ErrorKind::backend_error, std::move(message));
  s.library_ = std::move(library);
  s.code_ = code;
  return s;
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(error_kind_name(kind_)) + ": " + message_;
}

Status& Status::with_context(std::string_view context) {
  if (is_ok()) return *this;  // every successful run passes here: nothing to build
  // A message that already names this context (an op's own check) keeps one prefix.
  const std::string_view message(message_);
  if (!(message.starts_with(context) && message.substr(context.size()).starts_with(": ")))
    message_ = std::string(context) + ": " + message_;
  return *this;
}

double Attrs::get(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

}  // namespace baracuda
