#include "nxd/layers/init_scheme.h"

#include <algorithm>
#include <cmath>

#include "nxd/runtime/error.h"

namespace nxd {

const char* init_method_name(InitMethod m) {
  switch (m) {
    case InitMethod::nxd:
      return "nxd";
    case InitMethod::normal:
      return "normal";
    case InitMethod::scaled_normal:
      return "scaled_normal";
  }
  return "?";
}

InitMethod parse_init_method(const std::string& s) {
  for (InitMethod m : {InitMethod::nxd, InitMethod::normal, InitMethod::scaled_normal})
    if (s == init_method_name(m)) return m;
  throw ConfigError("unknown init method '" + s + "' (expected nxd, normal or scaled_normal)");
}

ParamInit InitScheme::weight(WeightRole role) const {
  switch (method) {
    case InitMethod::nxd:
      return ParamInit::fan_in_uniform();
    case InitMethod::normal:
      return ParamInit::normal(std);
    case InitMethod::scaled_normal:
      return ParamInit::normal(
          role == WeightRole::residual_output
              ? std / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(1, num_layers)))
              : std);
  }
  return ParamInit::normal(std);
}

ParamInit InitScheme::bias() const {
  return method == InitMethod::nxd ? ParamInit::fan_in_uniform() : ParamInit::zeros();
}

ParamInit InitScheme::embedding() const {
  return method == InitMethod::nxd ? ParamInit::normal(1.0) : ParamInit::normal(std);
}

}  // namespace nxd
