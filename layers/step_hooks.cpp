#include "nxd/layers/step_hooks.h"

#include <algorithm>

#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

namespace nxd {

StepMetrics::Metric& StepMetrics::find(const std::string& name, Combine how) {
  for (Metric& m : metrics_)
    if (m.name == name) {
      NXD_CHECK(m.combine == how, "[StepMetrics] ", name, " is reported with two combine rules (",
                static_cast<int>(m.combine), " and ", static_cast<int>(how), ")");
      return m;
    }
  return metrics_.push_back({name, how, 0.0, false}), metrics_.back();
}

void StepMetrics::add(const std::string& name, Combine how, double value) {
  Metric& m = find(name, how);
  if (how == Combine::sum)
    m.value += value;
  else if (!m.any)
    m.value = value;
  else
    m.value = how == Combine::max ? std::max(m.value, value) : std::min(m.value, value);
  m.any = true;
}

void StepMetrics::declare(const std::string& name, Combine how) {
  find(name, how);
}

namespace {
struct LossScaleSlot {
  double scale = 1.0;
};
}  // namespace

TrainingLossScale::TrainingLossScale(double scale)
    : prev_(current_context().ext<LossScaleSlot>().scale) {
  current_context().ext<LossScaleSlot>().scale = scale;
}
TrainingLossScale::~TrainingLossScale() {
  current_context().ext<LossScaleSlot>().scale = prev_;
}
double TrainingLossScale::current() {
  return current_context().ext<LossScaleSlot>().scale;
}

}  // namespace nxd
