// Status and Result<T>: errors with context for failures caused by the
// environment or by bad input (files, flags, graphs, frames). Broken
// invariants use SHOAL_CHECK instead. Value types; thread-compatible.
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace shoal {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDeadlineExceeded,
  kAborted,
  kDataLoss,
  kFailedPrecondition,
  kCancelled,  // ended on purpose, not failed (an elastic generation that regroups)
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

  // Prepends context ("while loading x: ") to the message, keeping the code.
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }

#define SHOAL_DEFINE_ERROR_FN(name, code)                                         \
  template <typename... Args>                                                     \
  Status name(fmt::format_string<Args...> f, Args&&... args) {                    \
    return Status(StatusCode::code, fmt::format(f, std::forward<Args>(args)...)); \
  }
SHOAL_DEFINE_ERROR_FN(invalid_argument, kInvalidArgument)
SHOAL_DEFINE_ERROR_FN(not_found, kNotFound)
SHOAL_DEFINE_ERROR_FN(already_exists, kAlreadyExists)
SHOAL_DEFINE_ERROR_FN(out_of_range, kOutOfRange)
SHOAL_DEFINE_ERROR_FN(unimplemented, kUnimplemented)
SHOAL_DEFINE_ERROR_FN(internal_error, kInternal)
SHOAL_DEFINE_ERROR_FN(unavailable, kUnavailable)
SHOAL_DEFINE_ERROR_FN(deadline_exceeded, kDeadlineExceeded)
SHOAL_DEFINE_ERROR_FN(aborted, kAborted)
SHOAL_DEFINE_ERROR_FN(data_loss, kDataLoss)
SHOAL_DEFINE_ERROR_FN(failed_precondition, kFailedPrecondition)
SHOAL_DEFINE_ERROR_FN(cancelled, kCancelled)
#undef SHOAL_DEFINE_ERROR_FN

// std::expected-shaped: holds a T or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok())
      v_ = Status(StatusCode::kInternal, "Result built from ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return const_cast<Result*>(this)->checked(); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->checked(); }

 private:
  T& checked();
  std::variant<T, Status> v_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* expr,
                               const std::string& msg);

template <typename T>
T& Result<T>::checked() {
  if (!ok()) check_failed(__FILE__, __LINE__, "Result::value()", std::get<Status>(v_).to_string());
  return std::get<T>(v_);
}

}  // namespace shoal

#define SHOAL_CHECK(cond, ...)                                                                  \
  do {                                                                                          \
    if (!(cond)) ::shoal::check_failed(__FILE__, __LINE__, #cond, fmt::format("" __VA_ARGS__)); \
  } while (0)

#define SHOAL_CONCAT_INNER(a, b) a##b
#define SHOAL_CONCAT(a, b) SHOAL_CONCAT_INNER(a, b)

#define SHOAL_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::shoal::Status _shoal_st = (expr);    \
    if (!_shoal_st.ok()) return _shoal_st; \
  } while (0)

#define SHOAL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#define SHOAL_ASSIGN_OR_RETURN(lhs, expr) \
  SHOAL_ASSIGN_OR_RETURN_IMPL(SHOAL_CONCAT(_shoal_res_, __LINE__), lhs, expr)
