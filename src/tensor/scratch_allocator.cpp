#include "tensor/scratch_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <new>

#include "tensor/huge_pages.h"

namespace reprise {
namespace {

std::atomic<int64_t> g_scratch_bytes{0};

// What a scratch array of `bytes` maps: whole huge pages.
size_t mapped_size(size_t bytes) {
  return round_up_to_huge_pages(std::max<size_t>(bytes, 1));
}

}  // namespace

void* map_scratch(size_t bytes) {
  const size_t size = mapped_size(bytes);
  if (size < bytes) throw std::bad_alloc();
  uint8_t* p = map_huge_pages(size);
  if (p == nullptr) throw std::bad_alloc();
  g_scratch_bytes.fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed);
  return p;
}

void unmap_scratch(void* p, size_t bytes) noexcept {
  const size_t size = mapped_size(bytes);
  ::munmap(p, size);
  g_scratch_bytes.fetch_sub(static_cast<int64_t>(size), std::memory_order_relaxed);
}

int64_t scratch_mapped_bytes() { return g_scratch_bytes.load(std::memory_order_relaxed); }

}  // namespace reprise
