#pragma once
// Shared pieces of the file-reader tests (io/ and checkpoint/).
#include <functional>
#include <string>

#include "nxd/io/fileio.h"
#include "support/files.h"

namespace nxd::testing {

// What f throws: a FileError's (CheckpointError's) message, "wrong exception type: ..." for any
// other exception, or "no exception".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const io::FileError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

}  // namespace nxd::testing
