#include "tensor/read_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "tensor/huge_pages.h"
#include "tensor/kernels_impl.h"
#include "tensor/thread_pool.h"
#include "util/error.h"

namespace reprise {

namespace {
constexpr size_t kChunk = size_t{1} << 20;
constexpr size_t kReadUnit = 512;  // read_sum's length multiple

thread_local WeightReadLog* t_weight_log = nullptr;
}  // namespace

ReadProbe::ReadProbe(size_t bytes, ThreadPool& pool) : pool_(pool) {
  const size_t total = std::max<size_t>(1, (bytes + kChunk - 1) / kChunk) * kChunk;
  owned_ = allocate_streamed(total);
  uint8_t* buf = owned_.get();
  for (size_t off = 0; off < total; off += kChunk) chunks_.emplace_back(buf + off, kChunk);
  bytes_ = total;
  pool_.parallel_for(static_cast<int64_t>(chunks_.size()),
                     [&](int64_t c) { std::memset(buf + c * kChunk, static_cast<int>(c & 0xff), kChunk); });
}

ReadProbe::ReadProbe(std::span<const std::span<const uint8_t>> regions, ThreadPool& pool) : pool_(pool) {
  for (const auto& r : regions) {
    const size_t usable = r.size() / kReadUnit * kReadUnit;
    for (size_t off = 0; off < usable; off += kChunk) {
      chunks_.emplace_back(r.data() + off, std::min(kChunk, usable - off));
      bytes_ += chunks_.back().size();
    }
  }
}

double ReadProbe::pass(int streams) {
  if (chunks_.empty()) return 0;
  const kernels::IsaKernels& isa = kernels::isa_kernels();
  std::atomic<uint64_t> sink{0};  // keeps the reads from being optimised away
  const auto t0 = std::chrono::steady_clock::now();
  pool_.parallel_for(static_cast<int64_t>(chunks_.size()), [&](int64_t c) {
    sink.fetch_add(isa.read_sum(chunks_[c].data(), chunks_[c].size(), streams), std::memory_order_relaxed);
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double measure_read_bandwidth(size_t bytes, ThreadPool& pool, int passes) {
  ReadProbe probe(bytes, pool);
  double best = 0;
  for (int pass = 0; pass < 2 * (passes + 1); ++pass) {  // each pattern's first pass warms up
    const double dt = probe.pass(pass % 2 ? 1 : 8);
    if (pass >= 2) best = std::max(best, probe.bytes() / dt);
  }
  return best;
}

WeightReadLog::WeightReadLog() {
  if (t_weight_log) throw Error("WeightReadLog: one is already recording on this thread");
  t_weight_log = this;
}

WeightReadLog::~WeightReadLog() { t_weight_log = nullptr; }

void WeightReadLog::note(const uint8_t* data, size_t bytes) {
  if (t_weight_log && data && bytes > 0) t_weight_log->regions_.emplace_back(data, bytes);
}

}  // namespace reprise
