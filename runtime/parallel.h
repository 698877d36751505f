#pragma once
// nxd's one compute thread pool. GEMM and the row-parallel kernels share it, so there is never a
// second pool spinning next to it: helpers sleep on a condition variable between jobs, and
// OpenBLAS's own pool is sized to the same count by set_threads.
//
// The pool is process-wide. A call from inside a pool job, or from a second thread while a job
// runs (sim ranks are threads; they run with one thread each), runs serially on the caller: a
// job is never nested and never blocks on another.
#include <cstdint>
#include <functional>

namespace nxd::parallel {

// Compute threads: the caller plus threads() - 1 helpers. Set through nxd::set_num_threads /
// blas::set_threads, which also size OpenBLAS's pool.
int threads();
void resize(int threads);

// Runs fn(part) for every part in [0, parts), spread over the caller and the helpers; returns
// when all are done. The first exception thrown by a part is rethrown after every worker has
// stopped (a worker skips its remaining parts after a throw).
void run(int parts, const std::function<void(int)>& fn);

// Splits [0, n) into at most threads() contiguous ranges of at least `grain` items and runs
// fn(begin, end) on each. Ranges depend only on n, grain and threads(), never on timing, so a
// kernel that writes each output from one range is deterministic for a given thread count; one
// that reduces per range and combines must not depend on the split (combine in a fixed order).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// True on a pool helper or on a caller inside run(): nested parallelism runs serially.
bool in_parallel_region();

}  // namespace nxd::parallel
