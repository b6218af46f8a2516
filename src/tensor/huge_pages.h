// Memory for large arrays that live long and are streamed end to end: the
// packed weights, which decode reads once per token.
//
// The memory is 2 MiB-aligned and advised for transparent huge pages
// (MADV_HUGEPAGE: in THP's common `madvise` mode only advised memory gets them). With
// 4 KiB pages, a decode token's ~90 MB of weights cross ~22 000 pages, and in
// a KVM guest each TLB miss is a two-level page walk; 2 MiB pages made F16,
// Q8_0 and Q4_0 decode 4-7 % faster (docs/performance.md). Where THP is off
// the advice is ignored and the memory is ordinary.
//
// Allocations smaller than a slab share 32 MiB slabs, so the many
// sub-megabyte matrices of a model share huge pages too; larger ones get a
// mapping of their own. A slab is unmapped when the last allocation carved
// from it is freed (an unloaded model returns its memory), so at most the
// unused part of one slab outlives the model that was loading into it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace reprise {

// The transparent huge page size these mappings are aligned to.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;
// `bytes` rounded up to whole huge pages.
inline constexpr size_t round_up_to_huge_pages(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

// `size` bytes (a multiple of 4 KiB) of zeroed memory, 2 MiB-aligned and
// advised for transparent huge pages, or nullptr (errno set) when the
// system has no memory to map; the caller unmaps it (munmap(p, size)).
// HugePageMapping owns one; scratch_allocator.h maps its arrays with it.
uint8_t* map_huge_pages(size_t size);

// One anonymous mapping of at least `bytes` (rounded up to 4 KiB), zeroed,
// 2 MiB-aligned and advised for transparent huge pages; unmapped when
// destroyed. For memory that is not weights (the KV block pool): it is not
// counted in streamed_memory_stats. Throws reprise::Error when the system has
// no memory to map.
class HugePageMapping {
 public:
  explicit HugePageMapping(size_t bytes);
  ~HugePageMapping();
  HugePageMapping(const HugePageMapping&) = delete;
  HugePageMapping& operator=(const HugePageMapping&) = delete;

  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;
  size_t size_;
};

// `bytes` (at least 1) of zeroed memory, 64-byte aligned; the memory is freed
// when the last copy of the pointer is gone. Thread-safe. Throws
// reprise::Error when the system has no memory to map.
std::shared_ptr<uint8_t[]> allocate_streamed(size_t bytes);

// What allocate_streamed holds from the system right now (for tests and
// diagnostics).
struct StreamedMemoryStats {
  int64_t mappings = 0;       // slabs plus dedicated mappings alive
  int64_t mapped_bytes = 0;   // their total size
};
StreamedMemoryStats streamed_memory_stats();

}  // namespace reprise
