// Machine read bandwidth: the roofline for decode, which streams every weight
// once per token.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace reprise {

class ThreadPool;

// Memory read end to end by all of a pool's threads, in 1 MiB chunks claimed
// in order. Reads come in two patterns: 8 interleaved streams per thread
// (the contiguous weight layout's decode pattern, the faster on Ice Lake)
// and one sequential stream per thread (the interleaved layout's, the faster
// on Zen 5).
class ReadProbe {
 public:
  // A buffer of its own, `bytes` rounded up to whole chunks, in the memory
  // the weights live in (allocated and touched with the pool's threads).
  // Size it like the weights a decode token streams, so cache effects match.
  ReadProbe(size_t bytes, ThreadPool& pool);
  // Borrowed memory, read region by region in this order (each region's
  // last partial 512 bytes are left out; packed weights have none); the
  // caller keeps it alive. Nothing to read leaves bytes() 0.
  ReadProbe(std::span<const std::span<const uint8_t>> regions, ThreadPool& pool);

  // The bytes a pass reads.
  size_t bytes() const { return bytes_; }
  // Reads everything once with `streams` (1 or 8) streams per thread;
  // returns the seconds it took (0 with nothing to read).
  double pass(int streams);

 private:
  ThreadPool& pool_;
  std::shared_ptr<uint8_t[]> owned_;
  std::vector<std::span<const uint8_t>> chunks_;
  size_t bytes_ = 0;
};

// The best of `passes` passes in each pattern over a buffer of its own
// (after one warm-up pass each), in bytes per second.
double measure_read_bandwidth(size_t bytes, ThreadPool& pool, int passes = 5);

// While one is alive, the matrix products called on the thread that created
// it append the packed weights they read to it, in call order: what a
// decode step streams, for a ReadProbe that reads the same bytes in the same
// order (`reprise bench`). At most one per thread.
class WeightReadLog {
 public:
  WeightReadLog();
  ~WeightReadLog();
  WeightReadLog(const WeightReadLog&) = delete;
  WeightReadLog& operator=(const WeightReadLog&) = delete;

  const std::vector<std::span<const uint8_t>>& regions() const { return regions_; }
  // Called by the products (kernels.cpp).
  static void note(const uint8_t* data, size_t bytes);

 private:
  std::vector<std::span<const uint8_t>> regions_;
};

}  // namespace reprise
