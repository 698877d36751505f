// The self backend: a world of one rank (make_self_communicator in communicator.h).
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "nxd/collectives/communicator.h"

namespace nxd {
namespace {
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(int global) : Communicator(0, {global}) {}
  const char* backend() const override { return "self"; }
  void all_reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    check_reduction("all_reduce", n, {t, op});
    copy(s, r, n, t);
  }
  void all_gather(const void* s, void* r, int64_t n, DType t) override {
    check_count("all_gather", n);
    copy(s, r, n, t);
  }
  void reduce_scatter(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    check_reduction("reduce_scatter", n, {t, op});
    copy(s, r, n, t);
  }
  void broadcast(void*, int64_t n, DType t, int root) override {
    check_count("broadcast", n);
    check_member("broadcast", "root", root);
  }
  void reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op, int root) override {
    check_reduction("reduce", n, {t, op});
    check_member("reduce", "root", root);
    copy(s, r, n, t);
  }
  void all_to_all(const void* s, void* r, int64_t n, DType t) override {
    check_count("all_to_all", n);
    NXD_CHECK(s != r || !s, "[all_to_all] in-place all_to_all is not supported");
    copy(s, r, n, t);
  }
  void send(const void* b, int64_t n, DType t, int dst, int tag) override {
    check_member("send", "destination", dst);
    Msg m{t, n, {}};
    if (b)
      m.bytes.assign(static_cast<const char*>(b), static_cast<const char*>(b) + n * dtype_size(t));
    box_[tag].push_back(std::move(m));
  }
  void recv(void* b, int64_t n, DType t, int src, int tag) override {
    check_member("recv", "source", src);
    auto& q = box_[tag];
    NXD_CHECK_T(CommError, !q.empty(),
                "[recv] rank 0 of a 1-rank group waits for a message from "
                "itself (tag ",
                tag, ") that was never sent: deadlock");
    Msg m = std::move(q.front());
    q.pop_front();
    NXD_CHECK_T(CommError, m.dtype == t && m.count == n, "[recv] expected ", t, " count ", n,
                ", got ", m.dtype, " count ", m.count, " (tag ", tag, ")");
    if (b && !m.bytes.empty()) std::memcpy(b, m.bytes.data(), m.bytes.size());
  }
  void barrier() override {}
  std::shared_ptr<Communicator> split(int color, int) override {
    if (color < 0) return nullptr;
    return std::make_shared<SelfCommunicator>(ranks()[0]);
  }

 private:
  static void copy(const void* s, void* r, int64_t n, DType t) {
    if (s && r && s != r) std::memcpy(r, s, n * dtype_size(t));
  }
  struct Msg {
    DType dtype;
    int64_t count;
    std::vector<char> bytes;
  };
  std::map<int, std::deque<Msg>> box_;
};
}  // namespace

std::shared_ptr<Communicator> make_self_communicator(int global_rank) {
  return std::make_shared<SelfCommunicator>(global_rank);
}

}  // namespace nxd
