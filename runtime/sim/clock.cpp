#include "nxd/runtime/sim/clock.h"

#include <algorithm>

namespace nxd::sim {

double roofline_seconds(const CoreSpec& core, double flops, double bytes, DType dtype) {
  double peak = dtype == DType::bf16 ? core.bf16_flops : core.fp32_flops;
  double t_flops = peak > 0 ? flops / peak : 0;
  double t_bytes = core.hbm_bandwidth > 0 ? bytes / core.hbm_bandwidth : 0;
  return std::max(t_flops, t_bytes);
}

SimClock::SimClock(MachineSpec machine, int rank, Timeline* timeline)
    : machine_(std::move(machine)), rank_(rank), timeline_(timeline) {}

void SimClock::charge_compute(const char* op, double flops, double bytes, DType dtype) {
  double t = roofline_seconds(machine_.core, flops, bytes, dtype);
  if (timeline_ && t > 0)
    timeline_->add(rank_, TraceEvent{op ? op : "kernel", "compute", now_, t,
                                     str("flops=", flops, " bytes=", bytes, " ", dtype)});
  now_ += t;
  compute_ += t;
}

void SimClock::wait_until(double t, const std::string& why) {
  if (t <= now_) return;
  if (timeline_) timeline_->add(rank_, TraceEvent{why, "wait", now_, t - now_, ""});
  wait_ += t - now_;
  now_ = t;
}

void SimClock::record_comm(const std::string& name, double start, double end, bool async,
                           const std::string& args) {
  if (timeline_ && end > start)
    timeline_->add(rank_,
                   TraceEvent{name, async ? "comm-async" : "comm", start, end - start, args});
  comm_ += end - start;
  if (async) {
    comm_free_ = std::max(comm_free_, end);
  } else {
    if (start > now_) wait_until(start, timeline_ ? str("wait for ", name) : std::string());
    now_ = std::max(now_, end);
    comm_free_ = std::max(comm_free_, end);
  }
}

void SimClock::record_phase(const std::string& name, double start, double end) {
  if (timeline_ && end > start)
    timeline_->add(rank_, TraceEvent{name, "phase", start, end - start});
}

SimClock* current_sim_clock() {
  return dynamic_cast<SimClock*>(current_context().cost_model());
}

}  // namespace nxd::sim
