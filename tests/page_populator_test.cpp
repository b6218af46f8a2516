#include "tensor/page_populator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tensor/huge_pages.h"
#include "test_support.h"

namespace reprise {
namespace {

// A range is faulted in, exactly that range, and its memory still reads as
// zeros; another range of the same mapping stays untouched.
TEST(PagePopulator, PopulatesTheRangeAndNothingElse) {
  PagePopulator populator;
  auto memory = std::make_shared<HugePageMapping>(size_t{8} << 20);
  ASSERT_EQ(test::resident_pages(memory->base(), memory->size()), 0);
  populator.populate(memory, memory->base() + (size_t{2} << 20), size_t{3} << 20);
  populator.wait_idle();
  if (!populator.enabled()) GTEST_SKIP() << "the kernel has no MADV_POPULATE_WRITE";
  EXPECT_EQ(test::resident_pages(memory->base() + (size_t{2} << 20), size_t{3} << 20), test::pages_in(size_t{3} << 20));
  EXPECT_EQ(test::resident_pages(memory->base() + (size_t{6} << 20), size_t{2} << 20), 0);
  for (size_t i = 2 << 20; i < (size_t{5} << 20); i += 4096) ASSERT_EQ(memory->base()[i], 0);
}

// Disabled, it does nothing.
TEST(PagePopulator, DisabledDoesNothing) {
  PagePopulator populator;
  populator.set_enabled(false);
  auto memory = std::make_shared<HugePageMapping>(size_t{4} << 20);
  populator.populate(memory, memory->base(), memory->size());
  populator.wait_idle();
  EXPECT_EQ(test::resident_pages(memory->base(), memory->size()), 0);
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
  EXPECT_LT(test::resident_pages(memory->base(), memory->size()), test::pages_in(size_t{64} << 20));
}

}  // namespace
}  // namespace reprise
