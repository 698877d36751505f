#pragma once
// The hook through which ops report themselves to a tracer (trace/ implements the recorder; the
// ops below it only call this interface). While a rank's Context holds an active OpRecorder
// (TraceSlot, set by trace::Tracer), every op that opens an OpScope and finishes at nesting depth
// 1 is recorded with its inputs, outputs and attributes; ops it calls internally (depth > 1) are
// part of it and are not recorded. Reading a traced tensor's value on the host (Tensor::item,
// at, to_vector) outside an op is refused by the recorder: the trace would keep one branch.
// With no recorder the cost of an OpScope is one lookup in the Context's extension slots.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "nxd/runtime/tensor.h"

namespace nxd {

// An op attribute: an integer, a real, a string or a list of integers.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;

struct OpAttrs {
  std::vector<std::pair<std::string, AttrValue>> items;
  OpAttrs& set(std::string k, AttrValue v) {
    items.emplace_back(std::move(k), std::move(v));
    return *this;
  }
  bool has(const std::string& k) const;
  int64_t i(const std::string& k) const;  // throws naming the key when missing or of another type
  double f(const std::string& k) const;
  const std::string& s(const std::string& k) const;
  const std::vector<int64_t>& ints(const std::string& k) const;
};

struct OpCall {
  std::vector<Tensor> inputs;
  OpAttrs attrs;
};

class OpRecorder {
 public:
  virtual ~OpRecorder() = default;
  // One op at depth 1: its inputs (undefined = absent optional input), outputs and attributes.
  virtual void record(const char* op, const std::vector<Tensor>& inputs,
                      const std::vector<Tensor>& outputs, const OpAttrs& attrs) = 0;
  // A host read of t's values (`what` is e.g. "Tensor::item") at depth `depth`; throws when it
  // reads a traced value outside an op.
  virtual void host_read(const char* what, const Tensor& t, int depth) = 0;
  int depth = 0;               // ops open at the moment
  std::string innermost = "";  // the op at depth 1, for messages
};

// The Context slot holding the rank's active recorder (null when not tracing).
struct TraceSlot {
  OpRecorder* recorder = nullptr;
};
OpRecorder* active_recorder();

// A replay's static memory plan places an op's output at an offset of the graph's arena: while
// armed, the next host allocation of exactly `nbytes` on this rank returns `data` (not owned, not
// counted) and disarms the slot. Storage::allocate consults it.
struct PlacementSlot {
  void* data = nullptr;
  int64_t nbytes = 0;
  bool armed = false;
};
// Called by Tensor's host reads.
void check_host_read(const char* what, const Tensor& t);

// Opened at the top of an op: out() records the op when it is outermost.
class OpScope {
 public:
  explicit OpScope(const char* op) : op_(op), rec_(active_recorder()) {
    if (rec_ && ++rec_->depth == 1) rec_->innermost = op;
  }
  ~OpScope() {
    if (rec_) --rec_->depth;
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  bool recording() const { return rec_ && rec_->depth == 1; }
  // `call` builds the op's inputs and attributes (only when recording: no cost otherwise).
  template <class F>
  Tensor out(Tensor y, F&& call) {
    if (recording()) {
      OpCall c = call();
      rec_->record(op_, c.inputs, {y}, c.attrs);
    }
    return y;
  }
  template <class F>
  std::vector<Tensor> outs(std::vector<Tensor> ys, F&& call) {
    if (recording()) {
      OpCall c = call();
      rec_->record(op_, c.inputs, ys, c.attrs);
    }
    return ys;
  }

 private:
  const char* op_;
  OpRecorder* rec_;
};

}  // namespace nxd
