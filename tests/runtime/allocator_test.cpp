#include <gtest/gtest.h>

#include "nxd/runtime/context.h"
#include "nxd/runtime/host_memory.h"
#include "nxd/runtime/tensor.h"

using namespace nxd;

TEST(Allocator, CountsLiveAndPeakPerRank) {
  Context ctx(ContextOptions{.rank = 0, .world_size = 1});
  ContextGuard g(ctx);
  EXPECT_EQ(ctx.memory().live(), 0);
  {
    Tensor a = empty({256}, DType::f32);
    EXPECT_EQ(ctx.memory().live(), 1024);
    Tensor b = a.view({16, 16});  // a view allocates nothing
    EXPECT_EQ(ctx.memory().live(), 1024);
    Tensor c = empty({128}, DType::bf16);
    EXPECT_EQ(ctx.memory().live(), 1024 + 256);
  }
  EXPECT_EQ(ctx.memory().live(), 0);
  EXPECT_EQ(ctx.memory().peak(), 1280);
}

TEST(Allocator, CapacityThrowsOutOfDeviceMemory) {
  Context ctx(ContextOptions{.rank = 3, .world_size = 4, .memory_capacity = 4096});
  ContextGuard g(ctx);
  Tensor a = empty({512});  // 2048 bytes
  try {
    Tensor b = empty({1024});
    FAIL() << "expected OutOfDeviceMemory";
  } catch (const OutOfDeviceMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank 3"), std::string::npos) << m;
    EXPECT_NE(m.find("4096"), std::string::npos) << m;
    EXPECT_NE(m.find("2048"), std::string::npos) << m;
  }
  EXPECT_EQ(ctx.memory().live(), 2048);
}

TEST(Allocator, MetaCountedSeparately) {
  Context ctx;
  ContextGuard g(ctx);
  int64_t meta_before = device_memory(Device::meta).live();
  Tensor m = empty({1 << 20}, DType::f32, Device::meta);
  EXPECT_EQ(device_memory(Device::meta).live() - meta_before, 4 << 20);
}

TEST(Allocator, HostBlocksAreReusedNotLeaked) {
  Context ctx;
  ContextGuard g(ctx);
  release_host_cache();
  void* first;
  {
    Tensor a = empty({1 << 16});
    first = a.raw_data();
  }
  Tensor b = empty({1 << 16});
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_EQ(b.raw_data(), first);  // same size: the cached block comes back
  { Tensor c = empty({1 << 17}); }
  EXPECT_EQ(host_cache_bytes(), 4 << 17);  // a freed block is kept, not returned to the OS
#else
  (void)first;  // the sanitizers' allocators do not hand the same block back
#endif
  EXPECT_EQ(ctx.memory().live(), 4 << 16);  // accounting counts live tensors, not the cache
  release_host_cache();
  EXPECT_EQ(host_cache_bytes(), 0);
}

// runtime/host_memory.h: a tensor made inside a HostMemoryScope charges the rank's host counter,
// not its device counter, and releases it when freed; scopes nest; HostPlacement::off is no scope.
TEST(HostMemory, ScopedAllocationsChargeTheHostCounterNotTheDevice) {
  Context ctx;
  ContextGuard g(ctx);
  MemoryCounter& dev = ctx.memory();
  MemoryCounter& host = host_memory();
  const int64_t d0 = dev.live(), h0 = host.live();
  {
    Tensor t;
    {
      const HostMemoryScope outer;
      const HostMemoryScope inner;
      t = zeros({256});
    }
    EXPECT_EQ(host.live() - h0, 1024);
    EXPECT_EQ(dev.live(), d0);
    const Tensor u = zeros({64});  // after the scopes: the device again
    EXPECT_EQ(dev.live() - d0, 256);
    {
      const HostMemoryScope off(HostPlacement::off);
      const Tensor v = zeros({64});
      EXPECT_EQ(dev.live() - d0, 512);
    }
  }
  EXPECT_EQ(host.live(), h0);
  EXPECT_EQ(dev.live(), d0);
  EXPECT_GE(host.peak(), 1024);
}
