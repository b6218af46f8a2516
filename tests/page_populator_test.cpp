#include "tensor/page_populator.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tensor/huge_pages.h"

namespace reprise {
namespace {

int64_t resident_pages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  if (mincore(const_cast<void*>(p), bytes, in_core.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char c : in_core) n += c & 1;
  return n;
}

int64_t pages(size_t bytes) { return static_cast<int64_t>(bytes / static_cast<size_t>(sysconf(_SC_PAGESIZE))); }

// A range is faulted in, exactly that range, and its memory still reads as
// zeros; another range of the same mapping stays untouched.
TEST(PagePopulator, PopulatesTheRangeAndNothingElse) {
  PagePopulator populator;
  auto memory = std::make_shared<HugePageMapping>(size_t{8} << 20);
  ASSERT_EQ(resident_pages(memory->base(), memory->size()), 0);
  populator.populate(memory, memory->base() + (size_t{2} << 20), size_t{3} << 20);
  populator.wait_idle();
  if (!populator.enabled()) GTEST_SKIP() << "the kernel has no MADV_POPULATE_WRITE";
  EXPECT_EQ(resident_pages(memory->base() + (size_t{2} << 20), size_t{3} << 20), pages(size_t{3} << 20));
  EXPECT_EQ(resident_pages(memory->base() + (size_t{6} << 20), size_t{2} << 20), 0);
  for (size_t i = 2 << 20; i < (size_t{5} << 20); i += 4096) ASSERT_EQ(memory->base()[i], 0);
}

// Disabled, it does nothing.
TEST(PagePopulator, DisabledDoesNothing) {
  PagePopulator populator;
  populator.set_enabled(false);
  auto memory = std::make_shared<HugePageMapping>(size_t{4} << 20);
  populator.populate(memory, memory->base(), memory->size());
  populator.wait_idle();
  EXPECT_EQ(resident_pages(memory->base(), memory->size()), 0);
}

// Ranges whose owner has gone are dropped, and a populator destroyed with
// ranges queued returns at once, without touching them.
TEST(PagePopulator, DropsOrphanedRangesAndStopsPromptly) {
  {
    PagePopulator populator;
    for (int i = 0; i < 50; ++i) {
      auto memory = std::make_shared<HugePageMapping>(size_t{4} << 20);
      populator.populate(memory, memory->base(), memory->size());
    }  // every owner gone: nothing left to map
    populator.wait_idle();
  }
  auto memory = std::make_shared<HugePageMapping>(size_t{64} << 20);
  {
    PagePopulator populator;
    for (int i = 0; i < 32; ++i) populator.populate(memory, memory->base() + (size_t{2} << 20) * i, size_t{2} << 20);
  }
  // At most the step in progress ran (each waits for a 2 ms quiet spell
  // first), not the 32 queued.
  EXPECT_LT(resident_pages(memory->base(), memory->size()), pages(size_t{64} << 20));
}

}  // namespace
}  // namespace reprise
