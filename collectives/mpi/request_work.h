#pragma once
// An MPI request as a Work (the MPI backend's nonblocking calls). Internal to the backend:
// includes <mpi.h>.
#include <mpi.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/mpi/watchdog.h"

namespace nxd::mpi::detail {

// One MPI request, owned: a Work dropped without wait() does not leak it. A dropped receive is
// cancelled (its buffer may be gone, and a posted receive would take a later message); a dropped
// send is released to complete on its own (MPI_Request_free); a dropped collective is completed
// (it cannot be cancelled, and the other members are in it), then its `done` step runs.
class RequestWork : public Work::Impl {
 public:
  enum class Kind : uint8_t { collective, send, recv };
  struct Request {
    MPI_Request req = MPI_REQUEST_NULL;
    Kind kind = Kind::collective;
    std::function<void()> done;              // after completion (avg's division), also when dropped
    std::optional<detail::Waiting> waiting;  // with a collective timeout: what wait() reports
  };
  RequestWork(Request r, std::string what)
      : req_(r.req),
        kind_(r.kind),
        done_(std::move(r.done)),
        waiting_(std::move(r.waiting)),
        what_(std::move(what)) {}
  ~RequestWork() override {
    if (finished_ || req_ == MPI_REQUEST_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    switch (kind_) {
      case Kind::recv:
        MPI_Cancel(&req_);
        MPI_Wait(&req_, MPI_STATUS_IGNORE);
        break;
      case Kind::send:
        MPI_Request_free(&req_);
        break;
      case Kind::collective:
        if (MPI_Wait(&req_, MPI_STATUS_IGNORE) == MPI_SUCCESS && done_) {
          try {
            done_();
          } catch (...) {  // a destructor must not throw; the values stay as MPI left them
          }
        }
        break;
    }
  }
  void wait() override {
    if (finished_) return;
    finished_ = true;
    int rc = waiting_ ? detail::wait_all(1, &req_, *waiting_) : MPI_Wait(&req_, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      char s[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, s, &len);
      throw CommError(str(what_, ": MPI error: ", std::string(s, len)));
    }
    if (done_) done_();
  }
  bool test() override {
    if (finished_) return true;
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (flag) {
      finished_ = true;
      if (done_) done_();
    }
    return flag != 0;
  }

 private:
  MPI_Request req_;
  Kind kind_;
  std::function<void()> done_;
  std::optional<detail::Waiting> waiting_;
  std::string what_;
  bool finished_ = false;
};

}  // namespace nxd::mpi::detail
