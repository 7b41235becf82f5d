// Status and Result<T>: errors as values across module boundaries (../shared/DESIGN.md "Errors").
//
// A Status is a code plus a message that accumulates context as it travels up:
//   "saving step 1200: writing shard rank-3 chunk 17: /ckpt/x.tmp: No space left on device"
// RETURN_IF_ERROR / ASSIGN_OR_RETURN add the caller's context (built only on the error path).
// Thread-safety: values; safe to copy/move between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace zrt {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // the caller passed something wrong (bad name, size, config)
  kNotFound,            // a file, tensor or group that does not exist
  kAlreadyExists,
  kDataLoss,            // corrupt or truncated data (checksum mismatch, short file)
  kIo,                  // an I/O call failed (errno-carrying)
  kOutOfMemory,
  kUnavailable,         // a facility this machine lacks (GPU, io_uring) or a transient failure
  kFailedPrecondition,  // the call is invalid in the current state (register after finalize)
  kInternal,            // a bug in zrt or a library it calls
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The message without the code name; empty for OK.
  std::string_view message() const { return rep_ ? std::string_view(rep_->message) : std::string_view(); }
  // "IO: opening /x: No such file or directory" or "OK".
  std::string ToString() const;

  // Prepends "context: " to the message. No effect on OK.
  Status WithContext(std::string_view context) const&;
  Status WithContext(std::string_view context) &&;

  // Explicitly discards a status where ignoring it is the right call (say why at the call site).
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null == OK; shared so copies are cheap
};

std::ostream& operator<<(std::ostream& os, const Status& s);

// Constructors named after the codes; each takes message parts that are streamed together.
namespace internal {
template <typename... Args>
std::string StrCat(const Args&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return std::string();
  } else {
    std::ostringstream os;
    (os << ... << args);
    return std::move(os).str();
  }
}
}  // namespace internal

#define ZRT_DEFINE_STATUS_CTOR(Name)                                      \
  template <typename... Args>                                            \
  Status Name##Error(const Args&... args) {                              \
    return Status(StatusCode::k##Name, internal::StrCat(args...));       \
  }
ZRT_DEFINE_STATUS_CTOR(InvalidArgument)
ZRT_DEFINE_STATUS_CTOR(NotFound)
ZRT_DEFINE_STATUS_CTOR(AlreadyExists)
ZRT_DEFINE_STATUS_CTOR(DataLoss)
ZRT_DEFINE_STATUS_CTOR(Io)
ZRT_DEFINE_STATUS_CTOR(OutOfMemory)
ZRT_DEFINE_STATUS_CTOR(Unavailable)
ZRT_DEFINE_STATUS_CTOR(FailedPrecondition)
ZRT_DEFINE_STATUS_CTOR(Internal)
#undef ZRT_DEFINE_STATUS_CTOR

// errno -> Status: "what: strerror(err)" with a code chosen from err (ENOENT -> NotFound,
// EEXIST -> AlreadyExists, ENOMEM -> OutOfMemory, EINVAL -> InvalidArgument, EAGAIN -> Unavailable,
// everything else -> Io). `err` is the positive errno value.
Status ErrnoStatus(int err, std::string_view what);

// MPI error code -> Status (MPI_SUCCESS -> OK); uses MPI_Error_string for the text.
Status MpiStatus(int mpi_error, std::string_view what);

namespace internal {
// Prints "zrt: value() of an error Result: <status>" to stderr and aborts: reading the value of an
// error is a programming error, and its message must not be lost (std::get would say only "wrong
// index for variant").
[[noreturn]] void DieOnValueOfError(const Status& s);
}  // namespace internal

// ---------------------------------------------------------------------------------------------------
// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::remove_cvref_t<T>, Status>, "Result<Status> makes no sense");

 public:
  Result(T value) : v_(std::in_place_index<1>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status)  // NOLINT: implicit by design
      : v_(std::in_place_index<0>,
           status.ok() ? InternalError("Result constructed from an OK Status without a value") : std::move(status)) {}
  template <typename U>
    requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::remove_cvref_t<U>, T> &&
             !std::is_same_v<std::remove_cvref_t<U>, Status>)
  Result(U&& value) : v_(std::in_place_index<1>, T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return v_.index() == 1; }
  // OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<0>(v_); }

  // Precondition: ok(). The value of an error Result aborts, printing the status.
  T& value() & {
    CheckOk();
    return std::get<1>(v_);
  }
  const T& value() const& {
    CheckOk();
    return std::get<1>(v_);
  }
  T&& value() && {
    CheckOk();
    return std::get<1>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const {
    if (!ok()) internal::DieOnValueOfError(std::get<0>(v_));
  }
  std::variant<Status, T> v_;
};

}  // namespace zrt

// ---- propagation macros ----------------------------------------------------------------------------
// RETURN_IF_ERROR(expr)                   returns the Status of `expr` if it is not OK
// RETURN_IF_ERROR(expr, "ctx ", x, ...)  same, with "ctx x...: " prepended (built only on error)
// ASSIGN_OR_RETURN(lhs, expr [, ctx...]) evaluates a Result, returns its error or assigns the value
//                                        (several statements: brace it under an if)
#define ZRT_CONCAT_INNER(a, b) a##b
#define ZRT_CONCAT(a, b) ZRT_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr, ...)                                                     \
  do {                                                                                 \
    ::zrt::Status zrt_status_ = ::zrt::internal::ToStatus(expr);                       \
    if (!zrt_status_.ok()) {                                                           \
      return ::zrt::internal::AddContext(std::move(zrt_status_) __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                                  \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr, ...) \
  ZRT_ASSIGN_OR_RETURN_IMPL(ZRT_CONCAT(zrt_result_, __LINE__), lhs, expr __VA_OPT__(, ) __VA_ARGS__)

#define ZRT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr, ...)                                 \
  auto tmp = (expr);                                                                   \
  if (!tmp.ok()) {                                                                     \
    return ::zrt::internal::AddContext(tmp.status() __VA_OPT__(, ) __VA_ARGS__);        \
  }                                                                                    \
  lhs = std::move(tmp).value()

namespace zrt::internal {
inline Status ToStatus(Status s) { return s; }
template <typename... Args>
Status AddContext(Status s, const Args&... context) {
  if constexpr (sizeof...(Args) == 0) {
    return s;
  } else {
    return std::move(s).WithContext(StrCat(context...));
  }
}
template <typename T>
Status ToStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace zrt::internal
