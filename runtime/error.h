#pragma once
// Errors: every failure is an exception derived from nxd::Error whose message names the operation
// and the values involved, e.g. "[matmul] inner dims differ: a=[8,64] b=[32,16]".
// Library code never calls exit(); tools map Error kinds to exit codes (UserError -> 2).
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace nxd {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Mistakes of the caller: bad arguments, shapes, configs, files. Tools exit with code 2.
class UserError : public Error {
 public:
  using Error::Error;
};
class InvalidArgument : public UserError {
 public:
  using UserError::UserError;
};
class ShapeError : public UserError {
 public:
  using UserError::UserError;
};
class ConfigError : public UserError {
 public:
  using UserError::UserError;
};
class IoError : public UserError {
 public:
  using UserError::UserError;
};
// Collective failures: mismatched calls, a peer that failed or timed out, MPI errors.
class CommError : public Error {
 public:
  using Error::Error;
};
// An allocation beyond a (simulated) device's memory capacity.
class OutOfDeviceMemory : public Error {
 public:
  using Error::Error;
};
// A broken internal invariant: a bug in nxd.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Builds a message from any streamable values: str("[op] x=", x).
template <class... Args>
std::string str(Args&&... args) {
  return detail::cat(std::forward<Args>(args)...);
}

}  // namespace nxd

// NXD_CHECK(cond, "[op] message ", value, ...) throws InvalidArgument unless cond holds.
#define NXD_CHECK(cond, ...)                                            \
  do {                                                                  \
    if (!(cond)) throw ::nxd::InvalidArgument(::nxd::str(__VA_ARGS__)); \
  } while (0)
// NXD_CHECK_T(ErrorType, cond, ...) throws the given error type.
#define NXD_CHECK_T(type, cond, ...)                  \
  do {                                                \
    if (!(cond)) throw type(::nxd::str(__VA_ARGS__)); \
  } while (0)
#define NXD_CHECK_SHAPE(cond, ...) NXD_CHECK_T(::nxd::ShapeError, cond, __VA_ARGS__)
// NXD_CHECK_EQ(a, b, "[op] context") -> "[op] context: expected a == b, got 3 vs 4"
#define NXD_CHECK_EQ(a, b, ...)                                                                  \
  do {                                                                                           \
    const auto& nxd_a_ = (a);                                                                    \
    const auto& nxd_b_ = (b);                                                                    \
    if (!(nxd_a_ == nxd_b_))                                                                     \
      throw ::nxd::InvalidArgument(                                                              \
          ::nxd::str(__VA_ARGS__, ": expected " #a " == " #b ", got ", nxd_a_, " vs ", nxd_b_)); \
  } while (0)
#define NXD_INTERNAL_CHECK(cond, ...) \
  NXD_CHECK_T(::nxd::InternalError, cond, "internal: ", __VA_ARGS__)
