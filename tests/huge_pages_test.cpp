#include "tensor/huge_pages.h"

#include "tensor/scratch_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

namespace reprise {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

// The VmFlags line of the mapping in /proc/self/smaps that contains p.
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find('-') < 17) {
      inside = addr >= lo && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// Whether the mapping that contains p was given MADV_HUGEPAGE ("hg").
bool advised_for_huge_pages(const void* p) {
  const std::string flags = vm_flags_of(p);
  EXPECT_FALSE(flags.empty()) << "no mapping found for " << p;
  std::istringstream words(flags);
  std::string w;
  bool advised = false;
  while (words >> w) advised |= w == "hg";
  return advised;
}

TEST(HugePages, AllocationsAreAlignedZeroedAndDisjoint) {
  const std::vector<size_t> sizes = {1, 63, 64, 4095, 100000, 3 * kMiB, 9 * kMiB, 1, 5 * kMiB};
  std::vector<std::shared_ptr<uint8_t[]>> blocks;
  for (size_t i = 0; i < sizes.size(); ++i) {
    blocks.push_back(allocate_streamed(sizes[i]));
    uint8_t* p = blocks.back().get();
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << "size " << sizes[i];
    EXPECT_TRUE(all_zero(p, sizes[i])) << "size " << sizes[i];
    std::memset(p, static_cast<int>(i + 1), sizes[i]);
  }
  // Every block still holds its own pattern: no two overlap.
  for (size_t i = 0; i < sizes.size(); ++i)
    for (size_t j = 0; j < sizes[i]; ++j)
      ASSERT_EQ(blocks[i][j], static_cast<uint8_t>(i + 1)) << "block " << i << " byte " << j;
}

TEST(HugePages, SmallAllocationsShareASlabThatTheLastOneFrees) {
  const StreamedMemoryStats before = streamed_memory_stats();
  auto a = allocate_streamed(512 * 1024);
  auto b = allocate_streamed(1536 * 1024);
  EXPECT_EQ(streamed_memory_stats().mappings, before.mappings + 1);
  EXPECT_EQ(b.get() - a.get(), 512 * 1024) << "carved one after the other";
  a.reset();
  EXPECT_EQ(streamed_memory_stats().mappings, before.mappings + 1) << "b still uses the slab";
  b.reset();
  EXPECT_EQ(streamed_memory_stats().mappings, before.mappings) << "the allocator must not keep the slab";
  EXPECT_EQ(streamed_memory_stats().mapped_bytes, before.mapped_bytes);
}

TEST(HugePages, AFullSlabOpensAnother) {
  const StreamedMemoryStats before = streamed_memory_stats();
  std::vector<std::shared_ptr<uint8_t[]>> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(allocate_streamed(7 * kMiB));
  EXPECT_EQ(streamed_memory_stats().mappings, before.mappings + 1) << "four 7 MiB blocks fit one 32 MiB slab";
  blocks.push_back(allocate_streamed(7 * kMiB));
  EXPECT_EQ(streamed_memory_stats().mappings, before.mappings + 2);
  blocks.clear();
  EXPECT_EQ(streamed_memory_stats().mappings, before.mappings);
}

TEST(HugePages, LargeAllocationsGetTheirOwnHugePageAlignedMapping) {
  const StreamedMemoryStats before = streamed_memory_stats();
  const size_t bytes = 9 * kMiB + 123;
  auto big = allocate_streamed(bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.get()) % (2 * kMiB), 0u);
  const StreamedMemoryStats during = streamed_memory_stats();
  EXPECT_EQ(during.mappings, before.mappings + 1);
  EXPECT_EQ(during.mapped_bytes - before.mapped_bytes, static_cast<int64_t>((bytes + 4095) / 4096 * 4096));
  big.reset();
  EXPECT_EQ(streamed_memory_stats().mappings, before.mappings);
}

TEST(HugePages, MemoryIsAdvisedForHugePages) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  auto small = allocate_streamed(4096);
  auto big = allocate_streamed(12 * kMiB);
  // "hg": the mapping was given MADV_HUGEPAGE.
  for (const uint8_t* p : {small.get(), big.get(), big.get() + 12 * kMiB - 1})
    EXPECT_TRUE(advised_for_huge_pages(p)) << vm_flags_of(p);
}

TEST(ScratchAllocator, LargeArraysGetHugePageMappingsThatTheyReturn) {
  const int64_t before = scratch_mapped_bytes();
  {
    ScratchVector<float> v(3 * kMiB / sizeof(float) + 5);  // 3 MiB + 20 bytes: two huge pages
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % (2 * kMiB), 0u);
    EXPECT_EQ(scratch_mapped_bytes() - before, static_cast<int64_t>(4 * kMiB));
    for (float f : v) ASSERT_EQ(f, 0.0f);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1000);
    if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
      EXPECT_TRUE(advised_for_huge_pages(v.data())) << vm_flags_of(v.data());
      EXPECT_TRUE(advised_for_huge_pages(&v.back())) << vm_flags_of(&v.back());
    }
    // Growing moves the contents to a larger mapping and returns the old one.
    const size_t old_size = v.size();
    v.resize(old_size * 3);
    EXPECT_EQ(scratch_mapped_bytes() - before, static_cast<int64_t>(10 * kMiB));  // 9 MiB + 60 bytes
    for (size_t i = 0; i < old_size; ++i) ASSERT_EQ(v[i], static_cast<float>(i % 1000)) << i;
    for (size_t i = old_size; i < v.size(); ++i) ASSERT_EQ(v[i], 0.0f) << i;
  }
  EXPECT_EQ(scratch_mapped_bytes(), before) << "every mapping must be unmapped with its array";
}

TEST(ScratchAllocator, SmallArraysComeFromTheHeap) {
  const int64_t before = scratch_mapped_bytes();
  ScratchVector<float> small(1000);
  ScratchVector<uint8_t> just_below(kScratchMappingBytes - 1);
  EXPECT_EQ(scratch_mapped_bytes(), before);
  ScratchVector<uint8_t> at_bound(kScratchMappingBytes);
  EXPECT_EQ(scratch_mapped_bytes() - before, static_cast<int64_t>(2 * kMiB));
  at_bound.clear();
  at_bound.shrink_to_fit();
  EXPECT_EQ(scratch_mapped_bytes(), before);
}

TEST(ScratchAllocator, ImpossibleSizesThrowBadAlloc) {
  const int64_t before = scratch_mapped_bytes();
  ScratchAllocator<float> alloc;
  EXPECT_THROW(alloc.allocate(SIZE_MAX / sizeof(float)), std::bad_alloc);  // rounding up would overflow
  EXPECT_THROW(alloc.allocate(size_t{1} << 50), std::bad_alloc);           // 4 PiB: more than the address space
  EXPECT_EQ(scratch_mapped_bytes(), before);
}

#if defined(__SANITIZE_ADDRESS__)
// Matrices share slabs, so only poisoning keeps AddressSanitizer reporting an
// overrun from one into the next (REPRISE_SANITIZE builds).
TEST(HugePagesDeathTest, AnOverrunIsReportedUnderAddressSanitizer) {
  auto a = allocate_streamed(1000);
  auto b = allocate_streamed(1000);
  volatile uint8_t* p = a.get();
  EXPECT_DEATH(p[1000] = 1, "AddressSanitizer");
  auto big = allocate_streamed(9 * kMiB + 10);
  volatile uint8_t* q = big.get();
  EXPECT_DEATH(q[9 * kMiB + 10] = 1, "AddressSanitizer");
}
#endif

}  // namespace
}  // namespace reprise
