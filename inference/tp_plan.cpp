// The TP plan broadcast (tp_plan.h).
#include "nxd/inference/tp_plan.h"

#include "nxd/collectives/communicator.h"
#include "nxd/runtime/error.h"

namespace nxd::inference {

namespace {
constexpr int kRoot = 0;
// The payload: ids, start, lengths, tables, one after the other.
int64_t payload_size(const ModelCall& c) {
  return c.B * c.S + 2 * c.B + c.B * c.MB;
}
}  // namespace

void send_plan(Communicator& tp, PlanMessage kind, const ModelCall* call) {
  int64_t head[4] = {static_cast<int64_t>(kind), 0, 0, 0};
  if (carries_call(kind)) {
    NXD_INTERNAL_CHECK(call != nullptr, "a call message needs its call");
    head[1] = call->B, head[2] = call->S, head[3] = call->MB;
  }
  tp.broadcast(head, 4, DType::i64, kRoot);
  if (!carries_call(kind)) return;
  std::vector<int64_t> p;
  p.reserve(payload_size(*call));
  for (const auto* v : {&call->ids, &call->start, &call->lengths, &call->tables})
    p.insert(p.end(), v->begin(), v->end());
  NXD_INTERNAL_CHECK(static_cast<int64_t>(p.size()) == payload_size(*call), "plan payload of ",
                     p.size(), " values, expected ", payload_size(*call));
  tp.broadcast(p.data(), static_cast<int64_t>(p.size()), DType::i64, kRoot);
}

PlanMessage receive_plan(Communicator& tp, ModelCall& c) {
  int64_t head[4] = {0, 0, 0, 0};
  tp.broadcast(head, 4, DType::i64, kRoot);
  const auto kind = static_cast<PlanMessage>(head[0]);
  NXD_CHECK(head[0] >= 0 && head[0] <= 4, "[Engine] TP plan message of unknown kind ", head[0]);
  if (!carries_call(kind)) return kind;
  c.B = head[1], c.S = head[2], c.MB = head[3];
  std::vector<int64_t> p(payload_size(c));
  tp.broadcast(p.data(), static_cast<int64_t>(p.size()), DType::i64, kRoot);
  auto take = [&, at = size_t{0}](std::vector<int64_t>& v, int64_t n) mutable {
    v.assign(p.begin() + at, p.begin() + at + n);
    at += n;
  };
  take(c.ids, c.B * c.S);
  take(c.start, c.B);
  take(c.lengths, c.B);
  take(c.tables, c.B * c.MB);
  return kind;
}

}  // namespace nxd::inference
