#pragma once
// The NXD_* environment variables nxd reads, checked before a run: a value the runtime would
// ignore or misread (NXD_NUM_THREADS=lots, NXD_GEMM=mkl, NXD_SIM_TIMEOUT=soon) is a ConfigError
// naming the variable (docs/CONFIG.md, "Environment").
#include <cstdint>
#include <optional>

namespace nxd::io {

// ConfigError for the first variable whose value is malformed or out of range.
void check_environment();

// NXD_NUM_THREADS as a count in [1, kMaxThreads]; nullopt when unset; ConfigError otherwise.
std::optional<int64_t> env_num_threads();

constexpr int64_t kMaxThreads = 1024;

}  // namespace nxd::io
