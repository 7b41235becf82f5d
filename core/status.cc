#include "zrt/core/status.h"

#include <mpi.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>

namespace zrt {

void internal::DieOnValueOfError(const Status& s) {
  std::fprintf(stderr, "zrt: value() of an error Result: %s\n", s.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kIo: return "IO";
    case StatusCode::kOutOfMemory: return "OUT_OF_MEMORY";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code()));
  s += ": ";
  s += message();
  return s;
}

Status Status::WithContext(std::string_view context) const& {
  if (ok() || context.empty()) return *this;
  std::string m(context);
  m += ": ";
  m += message();
  return Status(code(), std::move(m));
}

Status Status::WithContext(std::string_view context) && {
  if (ok() || context.empty()) return std::move(*this);
  return std::as_const(*this).WithContext(context);
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

Status ErrnoStatus(int err, std::string_view what) {
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not be buf.
  const char* text = strerror_r(err, buf, sizeof(buf));
  std::string msg = internal::StrCat(what, what.empty() ? "" : ": ", text, " (errno ", err, ")");
  switch (err) {
    case ENOENT: return Status(StatusCode::kNotFound, std::move(msg));
    case EEXIST: return Status(StatusCode::kAlreadyExists, std::move(msg));
    case ENOMEM: return Status(StatusCode::kOutOfMemory, std::move(msg));
    case EINVAL: return Status(StatusCode::kInvalidArgument, std::move(msg));
    case EAGAIN: return Status(StatusCode::kUnavailable, std::move(msg));
    case 0: return Status(StatusCode::kInternal, internal::StrCat(what, ": errno 0 reported as error"));
    default: return Status(StatusCode::kIo, std::move(msg));
  }
}

Status MpiStatus(int mpi_error, std::string_view what) {
  if (mpi_error == MPI_SUCCESS) return Status();
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  std::snprintf(text, sizeof(text), "MPI error %d", mpi_error);
  int klass = mpi_error;
  // Open MPI aborts on MPI_Error_string/class outside MPI_Init..MPI_Finalize; both probes are allowed.
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int len = 0;
    MPI_Error_string(mpi_error, text, &len);
    MPI_Error_class(mpi_error, &klass);
  }
  StatusCode code = StatusCode::kInternal;
  switch (klass) {
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_ROOT:
    case MPI_ERR_BUFFER:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
    case MPI_ERR_RANK:
    case MPI_ERR_COMM:
    case MPI_ERR_TRUNCATE: code = StatusCode::kInvalidArgument; break;
    case MPI_ERR_NO_MEM: code = StatusCode::kOutOfMemory; break;
    case MPI_ERR_IO: code = StatusCode::kIo; break;
    default: break;
  }
  return Status(code, internal::StrCat(what, what.empty() ? "" : ": ", text));
}

}  // namespace zrt
