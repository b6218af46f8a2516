#include "cache/block_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tensor/huge_pages.h"

namespace reprise {
namespace {

bool all_equal(const uint16_t* p, uint64_t n, uint16_t v) {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != v) return false;
  return true;
}

TEST(BlockPool, RecycledBuffersAreZeroed) {
  constexpr uint64_t kHalfs = 3000;  // not a multiple of 64 bytes
  BlockPool pool(kHalfs);
  std::vector<BlockPool::Buffer> held;
  for (int i = 0; i < 5; ++i) {
    held.push_back(pool.acquire());
    ASSERT_TRUE(all_equal(held.back().get(), kHalfs, 0)) << "fresh buffer " << i;
    std::fill_n(held.back().get(), kHalfs, uint16_t{0xabcd});
  }
  held.clear();  // every buffer back, dirty
  EXPECT_EQ(pool.buffers_in_use(), 0);
  for (int i = 0; i < 5; ++i) {
    held.push_back(pool.acquire());
    EXPECT_TRUE(all_equal(held.back().get(), kHalfs, 0)) << "recycled buffer " << i;
  }
}

// Random acquires and releases across several chunks: live buffers never
// overlap (each keeps the pattern written into it), are 64-byte aligned, and
// the counts add up; with everything released one chunk stays.
TEST(BlockPool, RandomChurnKeepsBuffersApart) {
  constexpr uint64_t kHalfs = 40000;  // 80 KB: a couple of hundred per chunk
  BlockPool pool(kHalfs);
  const int64_t per_chunk = pool.buffers_per_chunk();
  ASSERT_GT(per_chunk, 1);
  std::mt19937 rng(7);
  struct Live {
    BlockPool::Buffer buffer;
    uint16_t tag;
  };
  std::vector<Live> live;
  uint16_t next_tag = 1;
  const int64_t peak = 3 * per_chunk + per_chunk / 2;
  for (int step = 0; step < 4000; ++step) {
    const bool grow = live.empty() || (static_cast<int64_t>(live.size()) < peak && rng() % 3 != 0);
    if (grow) {
      Live l{pool.acquire(), next_tag++};
      if (next_tag == 0) next_tag = 1;
      ASSERT_EQ(reinterpret_cast<uintptr_t>(l.buffer.get()) % 64, 0u);
      ASSERT_TRUE(all_equal(l.buffer.get(), kHalfs, 0));
      std::fill_n(l.buffer.get(), kHalfs, l.tag);
      live.push_back(std::move(l));
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(all_equal(live[i].buffer.get(), kHalfs, live[i].tag)) << "buffer overwritten";
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_EQ(pool.buffers_in_use(), static_cast<int64_t>(live.size()));
  }
  for (const Live& l : live) EXPECT_TRUE(all_equal(l.buffer.get(), kHalfs, l.tag));
  EXPECT_GE(pool.chunks(), 2);
  live.clear();
  EXPECT_EQ(pool.buffers_in_use(), 0);
  EXPECT_EQ(pool.chunks(), 1) << "wholly free chunks beyond one go back to the system";
}

// The pool's memory is its own, not the weights' (whose gauge the server
// reports), and large buffers get a chunk each.
TEST(BlockPool, ChunksAreNotCountedAsWeights) {
  constexpr uint64_t kHalfs = uint64_t{4} << 20;  // 8 MiB buffers
  const StreamedMemoryStats before = streamed_memory_stats();
  BlockPool pool(kHalfs);
  EXPECT_EQ(pool.buffers_per_chunk(), 2);
  std::vector<BlockPool::Buffer> held;
  for (int i = 0; i < 6; ++i) held.push_back(pool.acquire());
  EXPECT_EQ(pool.chunks(), 3);
  EXPECT_EQ(streamed_memory_stats().mapped_bytes, before.mapped_bytes);
  held.clear();
  EXPECT_EQ(pool.chunks(), 1);
}

}  // namespace
}  // namespace reprise
