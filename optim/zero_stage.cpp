#include "nxd/optim/zero_stage.h"

#include "nxd/runtime/error.h"

namespace nxd::optim {

const char* zero_stage_name(ZeroStage s) {
  switch (s) {
    case ZeroStage::none:
      return "0";
    case ZeroStage::one:
      return "1";
    case ZeroStage::two:
      return "2";
    case ZeroStage::three:
      return "3";
  }
  return "?";
}

ZeroStage zero_stage_from_int(int64_t v, const std::string& key) {
  NXD_CHECK_T(ConfigError, v >= 0 && v <= 3, "[config] ", key, "=", v,
              " is not a ZeRO stage: 0 (none), 1 (optimizer state), 2 (and gradients) or 3 "
              "(and parameters)");
  return static_cast<ZeroStage>(v);
}

}  // namespace nxd::optim
