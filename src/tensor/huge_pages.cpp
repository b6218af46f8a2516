#include "tensor/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include "util/error.h"

// Under AddressSanitizer the parts of a mapping no allocation owns are
// poisoned, so an overrun from one matrix into the next is still reported
// as it was with one heap block per matrix.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define REPRISE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define REPRISE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define REPRISE_POISON(p, n) ((void)(p), (void)(n))
#define REPRISE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace reprise {
namespace {

constexpr size_t kSlabBytes = size_t{32} << 20;
// Larger allocations get a mapping of their own: carving them from slabs
// would leave up to this much of a slab unused.
constexpr size_t kOwnMappingBytes = kSlabBytes / 4;
constexpr size_t kAlign = 64;

std::atomic<int64_t> g_mappings{0};
std::atomic<int64_t> g_mapped_bytes{0};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A weights mapping: counted in streamed_memory_stats.
class Mapping {
 public:
  explicit Mapping(size_t bytes) : pages_(bytes) {
    REPRISE_POISON(pages_.base(), pages_.size());
    g_mappings.fetch_add(1, std::memory_order_relaxed);
    g_mapped_bytes.fetch_add(static_cast<int64_t>(pages_.size()), std::memory_order_relaxed);
  }
  ~Mapping() {
    REPRISE_UNPOISON(pages_.base(), pages_.size());  // the address range may be mapped again
    g_mappings.fetch_sub(1, std::memory_order_relaxed);
    g_mapped_bytes.fetch_sub(static_cast<int64_t>(pages_.size()), std::memory_order_relaxed);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  uint8_t* base() const { return pages_.base(); }
  size_t size() const { return pages_.size(); }

 private:
  HugePageMapping pages_;
};

// The slab small allocations are carved from. Held weakly: allocations keep
// their slab alive, the allocator does not.
struct SlabCursor {
  std::mutex mutex;
  std::weak_ptr<Mapping> slab;
  size_t used = 0;
};

SlabCursor& cursor() {
  static SlabCursor c;
  return c;
}

}  // namespace

uint8_t* map_huge_pages(size_t size) {
  // Over-map by a huge page and trim, so the start is 2 MiB-aligned and
  // every whole 2 MiB of the mapping can be a huge page.
  const size_t span = size + kHugePageBytes;
  if (span < size) {
    errno = ENOMEM;
    return nullptr;
  }
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  auto* start = static_cast<uint8_t*>(raw);
  auto* aligned = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(start), kHugePageBytes));
  if (aligned > start) ::munmap(start, static_cast<size_t>(aligned - start));
  uint8_t* end = aligned + size;
  if (start + span > end) ::munmap(end, static_cast<size_t>(start + span - end));
  // Advice only: without THP the memory is ordinary pages.
  ::madvise(aligned, size, MADV_HUGEPAGE);
  return aligned;
}

HugePageMapping::HugePageMapping(size_t bytes) : size_(round_up(std::max<size_t>(bytes, 1), 4096)) {
  base_ = map_huge_pages(size_);
  if (base_ == nullptr) throw Error("cannot map " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
}

HugePageMapping::~HugePageMapping() { ::munmap(base_, size_); }

std::shared_ptr<uint8_t[]> allocate_streamed(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes > kOwnMappingBytes) {
    auto own = std::make_shared<Mapping>(bytes);
    REPRISE_UNPOISON(own->base(), bytes);
    return std::shared_ptr<uint8_t[]>(own, own->base());
  }
  SlabCursor& c = cursor();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::shared_ptr<Mapping> slab = c.slab.lock();
  if (!slab || c.used + bytes > slab->size()) {
    slab = std::make_shared<Mapping>(kSlabBytes);
    c.slab = slab;
    c.used = 0;
  }
  uint8_t* p = slab->base() + c.used;
  REPRISE_UNPOISON(p, bytes);
  c.used = round_up(c.used + bytes, kAlign);
  return std::shared_ptr<uint8_t[]>(slab, p);
}

StreamedMemoryStats streamed_memory_stats() {
  return {g_mappings.load(std::memory_order_relaxed), g_mapped_bytes.load(std::memory_order_relaxed)};
}

}  // namespace reprise
