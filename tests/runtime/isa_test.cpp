// Which f32 engine and bf16 kernel each instruction set selects, pinned: a change of default on
// any CPU class shows up here first. tools/test runs this on the native build and on the
// x86-64-v3 and x86-64-v2 builds (NXD_DISPATCH_ABOVE_MARCH=OFF), so an AVX-512 or AMX machine
// also checks what an AVX2 or SSE4.2 CPU runs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/cpu_info.h"

using namespace nxd;

TEST(Isa, TheBuildAndTheCpuAreDescribed) {
  const std::string d = cpu::describe();
  std::printf("    %s\n", d.c_str());
  for (const char* key :
       {"cpu=", "isa_built=", "isa_cpu=", "gemm_engine=", "bf16_kernel=", "load="})
    EXPECT_NE(d.find(key), std::string::npos) << key << " in " << d;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  EXPECT_STREQ(cpu::compiled_isa(), "x86-64-v4");
#elif defined(__AVX2__) && defined(__FMA__)
  EXPECT_STREQ(cpu::compiled_isa(), "x86-64-v3");
#endif
  // A binary runs only on a CPU that has what it was compiled for.
  if (std::string(cpu::compiled_isa()) == "x86-64-v4") {
    EXPECT_TRUE(cpu::features().avx512f);
  }
  if (std::string(cpu::compiled_isa()) == "x86-64-v3") {
    EXPECT_TRUE(cpu::features().avx2);
  }
}

TEST(Isa, TheF32EngineIsNxdsDeterministicOneOnEveryCpu) {
  if (std::getenv("NXD_GEMM") != nullptr) GTEST_SKIP() << "NXD_GEMM is set";
  EXPECT_EQ(blas::engine(), blas::Engine::eigen);
}

TEST(Isa, TheBf16KernelFollowsTheInstructionsThisBuildMayUse) {
  if (std::getenv("NXD_BF16_KERNEL") != nullptr) GTEST_SKIP() << "NXD_BF16_KERNEL is set";
#if defined(NXD_NO_DISPATCH_ABOVE_MARCH) && !defined(__AVX512BF16__)
  // A baseline build behaves as on a CPU without bf16 instructions, whatever this CPU has.
  EXPECT_FALSE(blas::bf16_kernel_available(blas::Bf16Kernel::avx512_bf16));
  EXPECT_FALSE(blas::bf16_kernel_available(blas::Bf16Kernel::amx));
  EXPECT_EQ(blas::bf16_kernel(), blas::Bf16Kernel::portable);
#else
  EXPECT_EQ(blas::bf16_kernel_available(blas::Bf16Kernel::avx512_bf16),
            cpu::features().avx512_bf16);
  const blas::Bf16Kernel expect = blas::bf16_kernel_available(blas::Bf16Kernel::amx)
                                      ? blas::Bf16Kernel::amx
                                      : blas::Bf16Kernel::portable;
  EXPECT_EQ(blas::bf16_kernel(), expect);
#endif
}
