#pragma once
// The message of the nxd UserError (InvalidArgument, ConfigError, ShapeError, ...) that f throws,
// or "no error": for tests that check an error names its values.
#include <functional>
#include <string>

#include "nxd/runtime/error.h"

namespace nxd::testing {

inline std::string user_error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace nxd::testing
