// Run under mpirun with 3 ranks: the MPI backend's collective timeout (mpi::set_collective_timeout,
// 1 s here). Modes:
//   hang, hang_ring  rank 1 never arrives at an all_reduce (it sleeps 60 s): the others abort the
//                    job within a few seconds, naming rank 1, the call, its group and sequence
//                    number (hang_ring: nxd's ring over point-to-point instead of MPI_Allreduce)
//   slow             rank 1 arrives late (0.3 s) at every kind of call: nothing aborts and every
//                    result is right; prints "slow: ok"
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "nxd/collectives/mpi/mpi.h"

namespace {

void late(nxd::Communicator& w, double seconds) {
  if (w.rank() == 1) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw nxd::InternalError("[mpi_hang_check] wrong result: " + what);
}

void slow(nxd::Communicator& w) {
  const int n = w.size(), me = w.rank();
  std::vector<float> x(1000, static_cast<float>(me + 1)), y(1000 * n);
  late(w, 0.3);
  w.all_reduce(x.data(), x.data(), 1000, nxd::DType::f32, nxd::ReduceOp::sum);
  expect(x[999] == n * (n + 1) / 2.0f, "all_reduce");
  late(w, 0.3);
  w.all_gather(x.data(), y.data(), 1000, nxd::DType::f32);
  expect(y[1000 * n - 1] == x[0], "all_gather");
  std::vector<double> v = {me == 0 ? 42.0 : 0.0};
  late(w, 0.3);
  w.broadcast(v.data(), 1, nxd::DType::f64, 0);
  expect(v[0] == 42.0, "broadcast");
  late(w, 0.3);
  nxd::Work work = w.iall_reduce(v.data(), v.data(), 1, nxd::DType::f64, nxd::ReduceOp::sum);
  work.wait();
  expect(v[0] == 42.0 * n, "iall_reduce");
  late(w, 0.3);
  w.barrier();
  if (me == 0) w.recv(v.data(), 1, nxd::DType::f64, 1, 7);
  if (me == 1) {
    late(w, 0.3);
    const double s = 5;
    w.send(&s, 1, nxd::DType::f64, 0, 7);
  }
  expect(me != 0 || v[0] == 5.0, "send/recv");
  if (me == 0) std::printf("slow: ok\n");
}

}  // namespace

int main(int argc, char** argv) {
  nxd::mpi::Session session(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "hang";
  nxd::mpi::set_collective_timeout(1.0);
  if (mode == "hang_ring") {
    nxd::mpi::Tuning t = nxd::mpi::tuning();
    t.algorithm = nxd::mpi::Algorithm::ring;
    nxd::mpi::set_tuning(t);
  }
  return nxd::mpi::run_or_abort([&] {
    nxd::Communicator& w = nxd::world();
    if (mode == "slow") return slow(w);
    std::vector<float> x(4096, 1.0f);
    w.all_reduce(x.data(), x.data(), 4096, nxd::DType::f32, nxd::ReduceOp::sum);  // #1: all here
    late(w, 60);                                                                  // rank 1 hangs
    w.all_reduce(x.data(), x.data(), 4096, nxd::DType::f32, nxd::ReduceOp::sum);
    std::printf("rank %d: the hung rank's all_reduce completed\n", w.rank());
  });
}
