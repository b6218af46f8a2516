// The memory behind the prefix cache's KV blocks: fixed-size buffers carved
// from large chunks and recycled, instead of one heap allocation per block.
//
// Why: a block is hundreds of KB to a few MB, so the heap maps each one
// fresh and unmaps it when freed, and every new block then faults its pages
// in one 4 KiB page at a time. In a KVM guest those faults took ~19 % of a
// 1850-token prompt's prefill through the engine (docs/performance.md,
// session 24). Chunks are mappings of their own (HugePageMapping: 2 MiB-
// aligned, advised for transparent huge pages), so a prompt faults in a few
// huge pages, and a freed block's buffer is reused by the next block
// without the system. (Not allocate_streamed: that memory counts as weights.)
//
// Every buffer handed out reads as zeros: fresh chunk memory is zero, and a
// recycled buffer is cleared before it is handed out again, so no state of
// an earlier block (another tenant's) can be read through a new one.
//
// Accounting: the cache charges blocks, not chunks. The first chunk is
// mapped when the pool is made, another only when every chunk is full, so
// the pool never holds more than the most blocks ever in use at once plus
// one chunk; a chunk whose last block is freed goes back to the system
// unless it is the only wholly free one.
//
// Fresh chunk memory is faulted in a few huge pages ahead of the blocks
// handed out, on a background thread that runs only where a CPU is idle
// (PagePopulator), so the cost of first touching it falls between requests
// rather than on them.
//
// Not thread-safe: the cache calls it under its own lock.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace reprise {

class BlockPool {
 public:
  class Releaser;
  // A block's buffer; returns to the pool when destroyed. The pool must
  // outlive every buffer it handed out.
  using Buffer = std::unique_ptr<uint16_t[], Releaser>;

  class Releaser {
   public:
    Releaser() = default;
    explicit Releaser(BlockPool* pool) : pool_(pool) {}
    void operator()(uint16_t* p) const noexcept {
      if (pool_) pool_->release(p);
    }

   private:
    BlockPool* pool_ = nullptr;
  };

  // Buffers of `block_halfs` 16-bit values (at least 1), 64-byte aligned.
  explicit BlockPool(uint64_t block_halfs);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A zeroed buffer. Throws reprise::Error when the system has no memory.
  Buffer acquire();

  int64_t buffers_in_use() const { return in_use_; }
  int64_t chunks() const { return static_cast<int64_t>(chunks_.size()); }
  int64_t buffers_per_chunk() const { return per_chunk_; }

 private:
  struct Chunk;
  // Aborts on a pointer the pool did not hand out (a bug, not bad input).
  void release(uint16_t* p) noexcept;
  // Maps one more chunk, kept in address order.
  Chunk& add_chunk();
  // Asks the populator for c's memory up to a lead past its fresh slots.
  void populate_ahead(Chunk& c);

  const size_t stride_;  // bytes per buffer, a multiple of 64
  const int64_t per_chunk_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // ordered by address
  int64_t in_use_ = 0;
};

}  // namespace reprise
