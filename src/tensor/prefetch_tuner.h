// Chooses, at run time and per weight type, whether decode products
// software-prefetch their weight streams.
//
// A decode product reads each weight once per token, from memory, and its
// tiles can request the stream a fixed distance ahead (MatmulArgs::prefetch).
// Whether that helps depends on the moment as much as on the CPU: on the
// shared 2-vCPU Zen 5 host, 60M F16 decode ran 1.11-1.17x faster without it
// while the host's memory was fast (~80 GB/s) and ~1.1x slower without it
// while it was slow (~33 GB/s), minutes apart (docs/performance.md). No fixed
// setting is right, so the products time both and keep the faster.
//
// How: a type starts (and, every `hold_seconds`, returns) in a measuring
// round in which each product (a matrix at a batch size: the same weights,
// the same work) alternates between the two settings on its successive
// calls, so every pair of calls compares like with like at nearly the same
// moment. After `pairs_per_round` pairs the median of their time ratios
// decides; a median within `margin` of even keeps the current setting. The
// median ignores a call that the host happened to deschedule. A decision
// that the next round confirms holds twice as long (up to
// `max_hold_seconds`), so a steady host pays for few rounds; one that flips
// goes back to `hold_seconds`.
//
// Prefetching changes no result: both settings compute the same bits.
// One tuner belongs to one thread pool's caller (ThreadPool::caller_local),
// so it needs no locking.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/dtype.h"

namespace reprise {

class PrefetchTuner {
 public:
  struct Settings {
    int pairs_per_round = 96;   // paired calls a decision rests on
    double hold_seconds = 2.0;       // how long a new decision stands before the next round
    double max_hold_seconds = 32.0;  // each round that confirms the last doubles the hold, up to this
    double margin = 0.01;       // log-ratio a switch needs (about 1 %)
  };

  // One product's plan: whether to prefetch, and whether its time is wanted.
  struct Plan {
    bool prefetch = true;
    bool timed = false;
    int arm = 0;  // 0: prefetch, 1: not
    DType type = DType::F32;
    uint64_t key = 0;
  };

  PrefetchTuner() : PrefetchTuner(Settings{}) {}
  explicit PrefetchTuner(Settings settings) : settings_(settings) {}

  // The plan for a product whose weights start at `matrix` (its identity;
  // any stable address) of `type`, at a batch of n_tokens, at time `now`
  // (seconds, any monotonic origin).
  Plan plan(DType type, const void* matrix, int64_t n_tokens, double now);
  // A timed plan's product took `seconds`.
  void report(const Plan& plan, double seconds, double now);

  // Whether `type` prefetches outside a measuring round.
  bool prefetches(DType type) const { return types_[index(type)].chosen_arm == 0; }
  // Decisions taken so far for `type` (measuring rounds completed).
  int rounds(DType type) const { return types_[index(type)].rounds; }
  // The standing decisions, for reports: "F16 off, Q8_0 on" (types that
  // completed a round), or "" when none has.
  std::string summary() const;

 private:
  static constexpr size_t kTypeSlots = 64;  // every DType's value is below it: a slot's index is its type
  static constexpr size_t kMaxProducts = 4096;  // forget older products past this (models come and go)

  struct TypeState {
    bool measuring = true;
    int chosen_arm = 0;
    int rounds = 0;
    uint32_t round_id = 0;
    double hold_from = 0.0;
    double hold = 0.0;  // seconds the standing decision holds (0: not yet decided)
    std::vector<double> log_ratios;  // log(off / on) per pair
  };
  struct ProductState {
    uint32_t round_id = UINT32_MAX;
    uint32_t calls = 0;  // this round's calls; its parity is the arm
    double seconds[2] = {0.0, 0.0};
    bool have[2] = {false, false};
  };

  static size_t index(DType type) { return static_cast<size_t>(type) % kTypeSlots; }
  void decide(TypeState& t, double now);

  Settings settings_;
  std::array<TypeState, kTypeSlots> types_{};
  std::unordered_map<uint64_t, ProductState> products_;
};

}  // namespace reprise
