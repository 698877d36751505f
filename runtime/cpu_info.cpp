#include "nxd/runtime/cpu_info.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace nxd::cpu {

namespace {

Features detect() {
  Features f;
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12);
  if (!osxsave) return f;
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const uint64_t xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
  const bool tiles = (xcr0 & (3u << 17)) == (3u << 17);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const unsigned max_sub = a;
  f.avx2 = ymm && (b & (1u << 5));
  f.fma = ymm && fma;
  f.avx512f = zmm && (b & (1u << 16));
  f.avx512bw = zmm && (b & (1u << 30)) && (b & (1u << 31)) && (b & (1u << 17));
  f.amx_bf16 = tiles && (d & (1u << 24)) && (d & (1u << 22));
  if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
    f.avx512_bf16 = f.avx512bw && (a & (1u << 5));
#endif
  return f;
}

}  // namespace

const Features& features() {
  static const Features f = detect();
  return f;
}

const std::string& model_name() {
  static const std::string name = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("model name", 0) == 0) {
        const size_t colon = line.find(':');
        if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
      }
    return std::string("unknown");
  }();
  return name;
}

const char* compiled_isa() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  return "x86-64-v4";
#elif defined(__AVX2__) && defined(__FMA__)
  return "x86-64-v3";
#elif defined(__SSE4_2__) && defined(__POPCNT__)
  return "x86-64-v2";
#else
  return "x86-64";
#endif
}

const char* cpu_isa() {
  const Features& f = features();
  if (f.avx512f && f.avx512bw) return "x86-64-v4";
  if (f.avx2 && f.fma) return "x86-64-v3";
  return "x86-64-v2 or lower";
}

double load_average() {
  double l[1];
  return getloadavg(l, 1) == 1 ? l[0] : -1.0;
}

std::string describe() {
  const Features& f = features();
  std::string feats;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!feats.empty()) feats += ",";
    feats += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.avx512f, "avx512f");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_bf16, "amx_bf16");
  double l[3] = {-1, -1, -1};
  getloadavg(l, 3);
  char load[64];
  std::snprintf(load, sizeof load, "%.2f,%.2f,%.2f", l[0], l[1], l[2]);
  return str("cpu=\"", model_name(), "\" isa_built=", compiled_isa(), " isa_cpu=", cpu_isa(),
             " features=", feats.empty() ? "none" : feats,
             " gemm_engine=", blas::engine_name(blas::engine()),
             " bf16_kernel=", blas::bf16_kernel_name(blas::bf16_kernel()),
             " threads=", blas::threads(), " load=", load);
}

}  // namespace nxd::cpu
