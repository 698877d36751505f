// Sim backend: send and recv (direct delivery to a waiting receiver, else a pooled mailbox; see
// sim_communicator.h).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "nxd/collectives/sim/sim_communicator.h"
#include "nxd/runtime/context.h"

namespace nxd::sim::detail {

using Clock = std::chrono::steady_clock;

void SimCommunicator::send(const void* buf, int64_t n, DType t, int dst, int tag) {
  check_member("send", "destination", dst);
  check_count("send", n);
  SimClock* clock = current_sim_clock();
  Message m{.dtype = t, .count = n, .meta = buf == nullptr, .sent_at = clock ? clock->now() : 0};
  const size_t nbytes = static_cast<size_t>(n * dtype_size(t));
  const int gdst = ranks()[dst];
  const std::string key = mail_key(me(), gdst, tag);
  World& w = *w_;
  RankState& rs = w.ranks[gdst];
  std::unique_lock lk(w.mu);
  if (w.aborted.load()) w.throw_aborted_locked("send", me());
  RankState::Posted& pr = rs.posted;
  if (buf && nbytes > 0 && rs.s == RankState::blocked && rs.waiting_key == key &&
      pr.s == RankState::Posted::open && pr.buf && pr.dtype == t && pr.count == n) {
    // The receiver waits in the matching recv: copy into its buffer. It stays in recv until
    // the copy is done, so the buffer outlives it even if the world aborts meanwhile.
    pr.s = RankState::Posted::filling;
    pr.sent_at = m.sent_at;
    void* dst_buf = pr.buf;
    lk.unlock();
    std::memcpy(dst_buf, buf, nbytes);
    lk.lock();
    pr.s = RankState::Posted::filled;
    w.unblock_locked(gdst);
    rs.waiting_key.clear();
    rs.cv.notify_all();
    return;
  }
  if (buf && nbytes > 0) {
    m.bytes = w.take_buffer_locked(nbytes);
    lk.unlock();
    m.bytes.assign(static_cast<const char*>(buf), static_cast<const char*>(buf) + nbytes);
    lk.lock();
    if (w.aborted.load()) w.throw_aborted_locked("send", me());
  }
  w.mail[key].push_back(std::move(m));
  if (rs.s == RankState::blocked && rs.waiting_key == key) {
    w_->unblock_locked(gdst);
    rs.waiting_key.clear();
  }
  rs.cv.notify_all();
}

std::string SimCommunicator::recv_timeout_message(const World& w, int gsrc, int tag) const {
  const RankState& peer = w.ranks[gsrc];
  return str("[recv] rank ", me(), " timed out after ", w.opts.timeout_s,
             " s waiting for a message from rank ", gsrc, " (tag ", tag, ", group ", g_->name,
             "); rank ", gsrc, " is ",
             peer.s == RankState::blocked ? "in " + peer.what
             : peer.s == RankState::done  ? std::string("done")
                                          : std::string("running"));
}

Message SimCommunicator::take_message(void* buf, int64_t n, DType t, int gsrc, int tag) {
  const std::string key = mail_key(gsrc, me(), tag);
  Message m;
  std::unique_lock lk(w_->mu);
  World& w = *w_;
  RankState& rs = w.ranks[me()];
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(w.opts.timeout_s));
  RankState::Posted& pr = rs.posted;
  for (;;) {
    if (pr.s == RankState::Posted::filled) {  // a sender copied straight into buf
      m = Message{.dtype = t, .count = n, .meta = false, .sent_at = pr.sent_at};
      break;
    }
    if (pr.s == RankState::Posted::filling) {  // never leave while a sender writes into buf
      rs.cv.wait(lk);
      continue;
    }
    if (w.aborted.load()) {
      pr.s = RankState::Posted::none;
      w.throw_aborted_locked("recv", me());
    }
    auto it = w.mail.find(key);
    if (it != w.mail.end() && !it->second.empty()) {
      m = std::move(it->second.front());
      it->second.pop_front();
      break;
    }
    if (rs.s != RankState::blocked) {
      w.block_locked(me(), str("recv(", t, ", count=", n, ") from rank ", gsrc, " tag ", tag,
                               " on group ", g_->name));
      rs.waiting_key = key;
      pr = RankState::Posted{RankState::Posted::open, buf, t, n, 0};
      w.check_deadlock_locked(me());
      continue;
    }
    if (rs.cv.wait_until(lk, deadline) == std::cv_status::timeout) {
      it = w.mail.find(key);
      if (w.aborted.load() || pr.s != RankState::Posted::open ||
          (it != w.mail.end() && !it->second.empty()))
        continue;
      pr.s = RankState::Posted::none;
      const std::string msg = recv_timeout_message(w, gsrc, tag);
      w.unblock_locked(me());
      rs.waiting_key.clear();
      w.abort_locked(me(), std::make_exception_ptr(CommError(msg)), msg);
      throw CommError(msg);
    }
  }
  pr.s = RankState::Posted::none;
  w.unblock_locked(me());
  rs.waiting_key.clear();
  return m;
}

void SimCommunicator::recv(void* buf, int64_t n, DType t, int src, int tag) {
  check_member("recv", "source", src);
  check_count("recv", n);
  SimClock* clock = current_sim_clock();
  const int gsrc = ranks()[src];
  Message m = take_message(buf, n, t, gsrc, tag);
  if (!m.bytes.empty() && m.dtype == t && m.count == n && buf)
    std::memcpy(buf, m.bytes.data(), m.bytes.size());
  if (m.bytes.capacity() > 0) {
    std::vector<std::vector<char>> evicted;
    std::lock_guard lk(w_->mu);
    evicted = w_->give_back_locked(std::move(m.bytes));
  }
  NXD_CHECK_T(CommError, m.dtype == t && m.count == n, "[recv] rank ", me(), " expected ", t,
              " count ", n, " from rank ", gsrc, " (tag ", tag, ", group ", g_->name,
              "), but it sent ", m.dtype, " count ", m.count);
  if (clock) {
    double bytes = double(n) * dtype_size(t);
    CollCost c = collective_cost(w_->machine, CollKind::send_recv, {gsrc, me()}, bytes);
    double start = std::max(clock->now(), m.sent_at);
    clock->record_comm(clock->recording() ? str("recv from ", gsrc) : std::string("recv"), start,
                       m.sent_at + c.seconds > start ? m.sent_at + c.seconds : start,
                       /*async=*/false, clock->recording() ? str("bytes=", bytes) : std::string());
  }
}

}  // namespace nxd::sim::detail
