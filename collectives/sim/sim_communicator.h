#pragma once
// Sim backend: shared-memory collectives between rank threads (internal header).
//
// Every collective is a rendezvous of the group's members. Each member posts its call (op,
// dtype, count, root, buffers, ready time) in its slot of the group and arrives; when the last
// member arrives, every member reads all the calls, checks they match (all compute the same
// verdict, so all throw together), charges the modeled time of the collective to its SimClock,
// and moves data straight between the members' buffers. The data phase is a list of work items
// per member (64 KiB blocks of that member's result):
//   all_reduce      member i's items are the blocks of chunk i (64-byte aligned): each is
//                   reduced from every member's send buffer in rank order (L1-sized blocks)
//                   and stored into every member's recv buffer.
//   reduce_scatter  member i's items reduce block i of every send buffer in rank order.
//   all_gather, broadcast, all_to_all, reduce: copies (or the reduction) into member i's output.
// A member claims its own items first, then whatever is left of the others' (so a descheduled
// peer does not stall the call; the bits do not depend on who does an item), and the call
// completes when the group's count of remaining items reaches zero, which also keeps every
// buffer alive until the peers are done with it.
// Point to point: a send whose receiver is already waiting in the matching recv (same key,
// dtype and count) copies straight into the posted buffer (one copy, outside the world mutex;
// the receiver does not leave, even on abort, until that copy is done). Otherwise the send is
// buffered in a mailbox per (group, src, dst, tag) and recv copies it out; mailbox buffers come
// from a small pool, so a stream of large messages does not fault in fresh pages every time.
// Either way send returns without waiting for the receiver, and a key's messages arrive in order.
//
// Arrivals are rounds of the group: a member's k-th call is round k, which every member has
// reached when the group's arrival counter is (k+1) x size. The call slots, claim cursors and
// remaining-item counters are double-buffered by round parity (a member can be at most one
// round ahead of any peer). A waiting member spins briefly (only when the world has no more
// ranks than hardware threads, so a spinner never takes a core from the peer it waits for;
// adaptively), then sleeps on a futex. The last arriver wakes hardware_threads - 1 sleepers to
// share the data phase; the others sleep until it is done. A sleeping member is marked blocked
// under the world mutex, which also guards the mailboxes; a world-wide count of running ranks
// detects deadlock (every live rank blocked), and every wait has a deadline
// (LaunchOptions::timeout_s).
//
// Files: futex.h (sleep/wake), world.h (world, groups, mailboxes, CallDesc), collectives.cpp
// (rendezvous and data phase), point_to_point.cpp (send/recv), launch.cpp (split, launch).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nxd/collectives/sim/world.h"

namespace nxd::sim::detail {

class WaitFinish : public Work::Impl {
 public:
  WaitFinish(SimClock* c, double t, std::string name) : clock_(c), t_(t), name_(std::move(name)) {}
  void wait() override {
    if (clock_) clock_->wait_until(t_, "wait " + name_);
    clock_ = nullptr;
  }
  bool test() override { return true; }

 private:
  SimClock* clock_;
  double t_;
  std::string name_;
};

// How run() completes a call: before returning, or through the Work it returns (the i* calls).
enum class Completion : uint8_t { blocking, async };
struct WaitOptions {
  // false: a world abort does not end the wait (the data phase of a call always completes, and
  // peers may still be writing into this member's buffers)
  bool abortable = true;
};

class SimCommunicator final : public Communicator {
 public:
  SimCommunicator(std::shared_ptr<World> w, std::shared_ptr<Group> g, int idx, std::string uid)
      : Communicator(idx, g->members), w_(std::move(w)), g_(std::move(g)), uid_(std::move(uid)) {}

  const char* backend() const override { return "sim"; }

  void all_reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    run({.kind = CollKind::all_reduce,
         .dtype = t,
         .count = n,
         .rop = op,
         .reduces = true,
         .send = s,
         .recv = r},
        Completion::blocking);
  }
  void all_gather(const void* s, void* r, int64_t n, DType t) override {
    run({.kind = CollKind::all_gather, .dtype = t, .count = n, .send = s, .recv = r},
        Completion::blocking);
  }
  void reduce_scatter(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    run({.kind = CollKind::reduce_scatter,
         .dtype = t,
         .count = n,
         .rop = op,
         .reduces = true,
         .send = s,
         .recv = r},
        Completion::blocking);
  }
  void broadcast(void* b, int64_t n, DType t, int root) override {
    run({.kind = CollKind::broadcast, .dtype = t, .count = n, .root = root, .send = b, .recv = b},
        Completion::blocking);
  }
  void reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op, int root) override {
    run({.kind = CollKind::reduce,
         .dtype = t,
         .count = n,
         .root = root,
         .rop = op,
         .reduces = true,
         .send = s,
         .recv = r},
        Completion::blocking);
  }
  void all_to_all(const void* s, void* r, int64_t n, DType t) override {
    NXD_CHECK(!s || s != r, "[all_to_all] in-place all_to_all is not supported (group ", g_->name,
              ")");
    run({.kind = CollKind::all_to_all, .dtype = t, .count = n, .send = s, .recv = r},
        Completion::blocking);
  }
  void barrier() override {
    run({.kind = CollKind::barrier, .dtype = DType::f32, .count = 0}, Completion::blocking);
  }
  Work iall_reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    return run({.kind = CollKind::all_reduce,
                .dtype = t,
                .count = n,
                .rop = op,
                .reduces = true,
                .send = s,
                .recv = r},
               Completion::async);
  }
  Work iall_gather(const void* s, void* r, int64_t n, DType t) override {
    return run({.kind = CollKind::all_gather, .dtype = t, .count = n, .send = s, .recv = r},
               Completion::async);
  }
  Work ireduce_scatter(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    return run({.kind = CollKind::reduce_scatter,
                .dtype = t,
                .count = n,
                .rop = op,
                .reduces = true,
                .send = s,
                .recv = r},
               Completion::async);
  }
  Work ibroadcast(void* b, int64_t n, DType t, int root) override {
    return run(
        {.kind = CollKind::broadcast, .dtype = t, .count = n, .root = root, .send = b, .recv = b},
        Completion::async);
  }

  void send(const void* buf, int64_t n, DType t, int dst, int tag) override;
  void recv(void* buf, int64_t n, DType t, int src, int tag) override;
  std::shared_ptr<Communicator> split(int color, int key) override;

 private:
  // Posts call `d` (kind, dtype, count, root, rop, reduces, send, recv; run fills meta, ready
  // and seq), then completes it (async: returns a Work that waits for its modeled end).
  Work run(CallDesc d, Completion completion);
  // run's steps. post: checks the call and fills its meta, ready and seq (returns the rank's sim
  // clock, or null). arrive: posts it in this round's slots and waits for every member (CommError
  // naming each member's call when they differ). model_time: the call's modeled end, recorded on
  // the clock. move_data: the data phase, shared by the members, until every result is written.
  struct Slot {
    uint64_t round;
    int par;       // round parity: which of the group's two slot sets
    int64_t mine;  // this member's items in the data phase
  };
  SimClock* post(CallDesc& d);
  Slot arrive(const CallDesc& d);
  double model_time(const std::vector<CallDesc>& calls, const CallDesc& d, SimClock* clock,
                    bool async);
  void move_data(const std::vector<CallDesc>& calls, const CallDesc& d, const Slot& slot);
  // Waits until done() (spin, then sleep as a blocked rank; throws on abort or timeout). `call`
  // names the call in messages (formatted only when sleeping or failing).
  template <class Done>
  void wait_for(uint64_t round, Done done, const char* op, const CallDesc& call,
                WaitOptions opts = {});
  void release(uint64_t round, int count);
  // recv's wait: the message from global rank gsrc with `tag`, copied straight into buf by a
  // sender that finds this rank waiting, or taken from the mailbox (CommError on abort or
  // timeout).
  Message take_message(void* buf, int64_t n, DType t, int gsrc, int tag);
  std::string recv_timeout_message(const World& w, int gsrc, int tag) const;
  int64_t items_of(const CallDesc& d, int m) const;
  void do_item(const std::vector<CallDesc>& calls, int m, int64_t j);
  int me() const { return ranks()[rank()]; }
  std::string mail_key(int src, int dst, int tag) const {
    return str(uid_, "|", src, ">", dst, "#", tag);
  }
  const GroupLinks& links() {
    if (!links_) links_ = group_links(w_->machine, ranks());
    return *links_;
  }

  std::shared_ptr<World> w_;
  std::shared_ptr<Group> g_;
  std::string uid_;
  uint64_t seq_ = 0, splits_ = 0, round_ = 0;
  std::optional<GroupLinks> links_;
  double spin_budget_ = 10e-6;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
};

}  // namespace nxd::sim::detail
