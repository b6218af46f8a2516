#include "cache/block_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tensor/huge_pages.h"
#include "tensor/page_populator.h"

namespace reprise {
namespace {

// About this much memory per chunk: a few huge pages' worth of blocks, so a
// prompt's blocks share huge pages, without mapping much more than a small
// model's cache needs. Buffers per chunk are bounded both ways.
constexpr size_t kChunkTargetBytes = size_t{16} << 20;
constexpr int64_t kMaxPerChunk = 256;
// How far past the last block handed out a chunk's memory is populated in
// the background (PagePopulator): a few huge pages, so a request's new
// blocks find their pages ready, without faulting in much more than the
// cache will use soon.
constexpr size_t kPopulateLeadBytes = size_t{8} << 20;

size_t stride_for(uint64_t block_halfs) {
  const size_t bytes = std::max<uint64_t>(block_halfs, 1) * sizeof(uint16_t);
  return (bytes + 63) / 64 * 64;
}

}  // namespace

struct BlockPool::Chunk {
  explicit Chunk(size_t bytes) : memory(std::make_shared<HugePageMapping>(bytes)) {}
  uint8_t* base() const { return memory->base(); }
  // The populator holds it weakly: a chunk returned to the system is not
  // populated, and is unmapped at once (or after the one step in progress).
  std::shared_ptr<HugePageMapping> memory;
  int64_t fresh_from = 0;           // slots [fresh_from, per_chunk) were never handed out: still zero
  size_t populate_requested = 0;    // bytes [0, this) were given to the populator
  std::vector<int64_t> recycled;    // slots handed out before and freed since
  int64_t used = 0;
};

BlockPool::BlockPool(uint64_t block_halfs)
    : stride_(stride_for(block_halfs)),
      per_chunk_(std::clamp<int64_t>(static_cast<int64_t>(kChunkTargetBytes / stride_), 1, kMaxPerChunk)) {
  // The first chunk now, so its first blocks can be populated before the
  // first request (a server's cache is made when its model loads).
  populate_ahead(add_chunk());
}

BlockPool::~BlockPool() = default;

BlockPool::Buffer BlockPool::acquire() {
  // The fullest chunk with room, so the emptiest ones drain and can be
  // returned to the system.
  Chunk* best = nullptr;
  for (const auto& c : chunks_)
    if (c->used < per_chunk_ && (!best || c->used > best->used)) best = c.get();
  if (!best) best = &add_chunk();
  uint8_t* p;
  if (!best->recycled.empty()) {
    p = best->base() + best->recycled.back() * stride_;
    best->recycled.pop_back();
    std::memset(p, 0, stride_);
  } else {
    p = best->base() + best->fresh_from++ * stride_;
    populate_ahead(*best);
  }
  ++best->used;
  ++in_use_;
  return Buffer(reinterpret_cast<uint16_t*>(p), Releaser(this));
}

BlockPool::Chunk& BlockPool::add_chunk() {
  auto c = std::make_unique<Chunk>(stride_ * static_cast<size_t>(per_chunk_));
  Chunk& added = *c;
  const auto at = std::upper_bound(chunks_.begin(), chunks_.end(), c->base(),
                                   [](const uint8_t* p, const std::unique_ptr<Chunk>& x) { return p < x->base(); });
  chunks_.insert(at, std::move(c));
  return added;
}

void BlockPool::populate_ahead(Chunk& c) {
  // Up to the lead past the fresh slots' start, in whole huge pages.
  const size_t size = c.memory->size();
  const size_t fresh = static_cast<size_t>(c.fresh_from) * stride_;
  const size_t want = std::min(size, round_up_to_huge_pages(fresh + kPopulateLeadBytes));
  if (want <= c.populate_requested) return;
  PagePopulator& populator = PagePopulator::shared();
  if (!populator.enabled()) return;
  populator.populate(c.memory, c.base() + c.populate_requested, want - c.populate_requested);
  c.populate_requested = want;
}

namespace {
[[noreturn]] void foreign_buffer() {
  std::fputs("BlockPool: released a buffer it does not own\n", stderr);
  std::abort();
}
}  // namespace

void BlockPool::release(uint16_t* buffer) noexcept {
  const auto* p = reinterpret_cast<const uint8_t*>(buffer);
  auto it = std::upper_bound(chunks_.begin(), chunks_.end(), p,
                             [](const uint8_t* q, const std::unique_ptr<Chunk>& x) { return q < x->base(); });
  if (it == chunks_.begin()) foreign_buffer();
  --it;
  Chunk& c = **it;
  const auto offset = static_cast<size_t>(p - c.base());
  if (offset % stride_ != 0 || offset / stride_ >= static_cast<size_t>(c.fresh_from))
    foreign_buffer();
  c.recycled.push_back(static_cast<int64_t>(offset / stride_));
  --c.used;
  --in_use_;
  if (c.used > 0) return;
  // Keep one wholly free chunk for the next blocks; return any other.
  for (const auto& other : chunks_)
    if (other.get() != &c && other->used == 0) {
      chunks_.erase(it);
      return;
    }
}

}  // namespace reprise
