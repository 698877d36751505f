#pragma once
// What a training loop and a model tell each other about a step without either knowing the other
// (the trainer includes no model header):
//   - StepMetrics: figures a model reports for the step just run (Module::step_metrics), e.g. a
//     mixture of experts' auxiliary loss and expert loads, which the loop logs; under pipeline
//     parallelism combined over the stages.
//   - TrainingLossScale: the factor the loop multiplies the training loss by before backward
//     (1/accumulation steps, 1/microbatches), for layers that inject an auxiliary loss's gradient
//     in backward and must scale it alike.
#include <string>
#include <vector>

namespace nxd {

class StepMetrics {
 public:
  // How a figure combines over the layers, chunks and pipeline stages that report it.
  enum class Combine { sum, max, min };
  struct Metric {
    std::string name;
    Combine combine;
    double value;  // sum: 0 when nothing was added; max/min: meaningful only if `any`
    bool any;      // a value was added
  };
  // Adds `value` to the named figure (created on first use, in the order of first use): summed,
  // or kept if larger (max) or smaller (min). A figure's name always comes with the same Combine
  // (InvalidArgument otherwise).
  void add(const std::string& name, Combine how, double value);
  // Creates the named figure without a value (a stage that holds none of the layers that report
  // it still reports it, so every stage combines the same figures).
  void declare(const std::string& name, Combine how);
  const std::vector<Metric>& metrics() const { return metrics_; }
  bool empty() const { return metrics_.empty(); }
  // The value to log: a max or min figure no one gave a value is logged as 0.
  static double logged(const Metric& m) { return m.any || m.combine == Combine::sum ? m.value : 0; }

 private:
  Metric& find(const std::string& name, Combine how);
  std::vector<Metric> metrics_;
};

// The training-loss scale in force while it lives (restores the previous one; 1 by default, per
// rank): wrap the forward and backward of a loss that is multiplied by `scale` before backward,
// recomputation included.
class TrainingLossScale {
 public:
  explicit TrainingLossScale(double scale);
  ~TrainingLossScale();
  TrainingLossScale(const TrainingLossScale&) = delete;
  TrainingLossScale& operator=(const TrainingLossScale&) = delete;
  // The scale in force on this rank.
  static double current();

 private:
  double prev_;
};

}  // namespace nxd
