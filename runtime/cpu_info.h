#pragma once
// What this CPU is and what nxd was compiled for: printed by the benches and nxd-train so every
// figure says where it came from, and used by the tests that pin which engine and kernel each
// instruction set selects.
#include <string>

namespace nxd::cpu {

struct Features {
  bool avx2 = false, fma = false;          // x86-64-v3
  bool avx512f = false, avx512bw = false;  // x86-64-v4 (with VL, DQ, CD)
  bool avx512_bf16 = false;                // Cooper Lake, Zen 4
  bool amx_bf16 = false;                   // Sapphire Rapids (cpuid; the OS grant is checked apart)
};

// The CPU's features from cpuid (and XCR0: the OS must save the registers).
const Features& features();
// "AMD EPYC 7R13 Processor" (/proc/cpuinfo's model name), or "unknown".
const std::string& model_name();
// The instruction-set level nxd was compiled for: "x86-64-v4", "x86-64-v3", "x86-64-v2",
// "x86-64" (from the compiler's macros; -march=native on an AVX-512 machine reports x86-64-v4).
const char* compiled_isa();
// The CPU's own level by the same names.
const char* cpu_isa();
// One line: cpu=..., isa (built / cpu), the f32 GEMM engine, the bf16 kernel, compute threads,
// and the 1/5/15-minute load average at the call.
std::string describe();
// The 1-minute load average (getloadavg), or -1 when unavailable.
double load_average();

}  // namespace nxd::cpu
