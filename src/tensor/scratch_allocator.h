// An allocator for a pass's large scratch arrays (activations, the FFN's
// gate and up rows), which a long prompt's first pass touches for the first
// time.
//
// Arrays of at least kScratchMappingBytes get a mapping of their own,
// rounded up to 2 MiB, 2 MiB-aligned and advised for transparent huge pages
// (huge_pages.h), so that first pass faults in a few 2 MiB pages instead of
// thousands of 4 KiB ones: in this KVM guest a 4 KiB fault cost ~17 us, and
// a 60M model's first 1961-token prompt in a process took 0.30 s against
// 0.24 s for the same prompt after it (docs/performance.md, session 43).
// Smaller arrays come from operator new. Where THP is off the advice is
// ignored and the memory is ordinary pages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

namespace reprise {

inline constexpr size_t kScratchMappingBytes = size_t{1} << 20;

// A 2 MiB-aligned mapping of `bytes` rounded up to 2 MiB, advised for huge
// pages; throws std::bad_alloc when the system has no memory to map.
void* map_scratch(size_t bytes);
// Unmaps what map_scratch(bytes) returned.
void unmap_scratch(void* p, size_t bytes) noexcept;
// Bytes mapped by map_scratch and not yet unmapped (for tests).
int64_t scratch_mapped_bytes();

template <class T>
struct ScratchAllocator {
  using value_type = T;
  ScratchAllocator() = default;
  template <class U>
  ScratchAllocator(const ScratchAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    if (n * sizeof(T) >= kScratchMappingBytes) return static_cast<T*>(map_scratch(n * sizeof(T)));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) >= kScratchMappingBytes)
      unmap_scratch(p, n * sizeof(T));
    else
      std::allocator<T>().deallocate(p, n);
  }
  friend bool operator==(const ScratchAllocator&, const ScratchAllocator&) { return true; }
};

template <class T>
using ScratchVector = std::vector<T, ScratchAllocator<T>>;

}  // namespace reprise
