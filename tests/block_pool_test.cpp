#include "cache/block_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tensor/huge_pages.h"
#include "tensor/page_populator.h"
#include "test_support.h"

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

// Turns the shared populator on or off for one test, and back on after it.
class PopulatorSetting {
 public:
  explicit PopulatorSetting(bool on) { PagePopulator::shared().set_enabled(on); }
  ~PopulatorSetting() { PagePopulator::shared().set_enabled(true); }
};

// A chunk's memory is faulted in ahead of the blocks handed out, without
// anything written to it: blocks not yet handed out are resident (and read
// as zeros when they are), and so is nothing beyond the lead. The
// populator disabled, the same pages stay unmapped until written.
TEST(BlockPool, FreshMemoryIsPopulatedAheadOfTheBlocks) {
  constexpr uint64_t kHalfs = uint64_t{1} << 17;  // 256 KiB buffers: 64 in a 16 MiB chunk
  constexpr size_t kBytes = kHalfs * 2;
  for (bool on : {false, true}) {
    PopulatorSetting setting(on);
    BlockPool pool(kHalfs);
    ASSERT_EQ(pool.buffers_per_chunk(), 64);
    BlockPool::Buffer first = pool.acquire();
    PagePopulator::shared().wait_idle();
    if (on && !PagePopulator::shared().enabled()) GTEST_SKIP() << "the kernel has no MADV_POPULATE_WRITE";
    const auto* base = reinterpret_cast<const uint8_t*>(first.get());
    // The second through fourth megabytes: no buffer there handed out yet.
    const int64_t ahead = test::resident_pages(base + kBytes * 4, size_t{3} << 20);
    // Beyond the lead (8 MiB past the first fresh block, in huge pages).
    const int64_t beyond = test::resident_pages(base + (size_t{12} << 20), size_t{4} << 20);
    if (on) {
      EXPECT_EQ(ahead, test::pages_in(size_t{3} << 20)) << "not populated ahead";
      EXPECT_EQ(beyond, 0) << "populated past the lead";
    } else {
      EXPECT_EQ(ahead, 0);
    }
    std::vector<BlockPool::Buffer> more;
    for (int i = 1; i < 64; ++i) {
      more.push_back(pool.acquire());
      ASSERT_TRUE(all_equal(more.back().get(), kHalfs, 0)) << "buffer " << i;
    }
    PagePopulator::shared().wait_idle();
  }
}

// A pool destroyed while its chunks are still being populated: the
// populator keeps the memory mapped until it is done with it.
TEST(BlockPool, PoolsMayGoWhileTheirMemoryIsPopulated) {
  PopulatorSetting setting(true);
  for (int round = 0; round < 20; ++round) {
    BlockPool pool(uint64_t{1} << 17);
    std::vector<BlockPool::Buffer> held;
    for (int i = 0; i < 70; ++i) held.push_back(pool.acquire());
    for (const BlockPool::Buffer& b : held) ASSERT_EQ(b[0], 0);
  }
  PagePopulator::shared().wait_idle();
}

}  // namespace
}  // namespace reprise
