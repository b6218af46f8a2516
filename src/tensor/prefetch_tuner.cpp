#include "tensor/prefetch_tuner.h"

#include <algorithm>
#include <cmath>

namespace reprise {

PrefetchTuner::Plan PrefetchTuner::plan(DType type, const void* matrix, int64_t n_tokens, double now) {
  TypeState& t = types_[index(type)];
  Plan p;
  p.type = type;
  if (!t.measuring && now - t.hold_from >= t.hold) {
    t.measuring = true;
    t.log_ratios.clear();
    ++t.round_id;
  }
  if (!t.measuring) {
    p.arm = t.chosen_arm;
    p.prefetch = p.arm == 0;
    return p;
  }
  // Products are told apart by their weights and batch size: the same
  // weights at another batch size are other work.
  p.key = (static_cast<uint64_t>(reinterpret_cast<uintptr_t>(matrix)) << 8) ^ static_cast<uint64_t>(n_tokens & 0xff);
  if (products_.size() >= kMaxProducts && !products_.contains(p.key)) products_.clear();
  ProductState& s = products_[p.key];
  if (s.round_id != t.round_id) s = ProductState{t.round_id};
  p.arm = static_cast<int>(s.calls++ & 1);
  p.prefetch = p.arm == 0;
  p.timed = true;
  return p;
}

void PrefetchTuner::report(const Plan& plan, double seconds, double now) {
  if (!plan.timed) return;
  TypeState& t = types_[index(plan.type)];
  auto it = products_.find(plan.key);
  // A product forgotten, or a round that ended, since the plan was made.
  if (!t.measuring || it == products_.end() || it->second.round_id != t.round_id) return;
  ProductState& s = it->second;
  s.seconds[plan.arm] = seconds;
  s.have[plan.arm] = true;
  if (!(s.have[0] && s.have[1])) return;
  if (s.seconds[0] > 0.0 && s.seconds[1] > 0.0) t.log_ratios.push_back(std::log(s.seconds[1] / s.seconds[0]));
  s.have[0] = s.have[1] = false;
  if (static_cast<int>(t.log_ratios.size()) >= settings_.pairs_per_round) decide(t, now);
}

void PrefetchTuner::decide(TypeState& t, double now) {
  std::vector<double>& r = t.log_ratios;
  const auto mid = r.begin() + static_cast<std::ptrdiff_t>(r.size() / 2);
  std::nth_element(r.begin(), mid, r.end());
  const double median = *mid;  // > 0: off took longer than on
  const int before = t.chosen_arm;
  if (median > settings_.margin) t.chosen_arm = 0;
  else if (median < -settings_.margin) t.chosen_arm = 1;
  const bool confirmed = t.rounds > 0 && t.chosen_arm == before;
  t.hold = confirmed ? std::min(2 * t.hold, settings_.max_hold_seconds) : settings_.hold_seconds;
  t.measuring = false;
  t.hold_from = now;
  ++t.rounds;
  r.clear();
}

}  // namespace reprise

namespace reprise {

std::string PrefetchTuner::summary() const {
  std::string s;
  for (size_t i = 0; i < types_.size(); ++i) {
    const TypeState& t = types_[i];
    if (t.rounds == 0) continue;
    if (!s.empty()) s += ", ";
    s += dtype_name(static_cast<uint32_t>(i)) + (t.chosen_arm == 0 ? " on" : " off");
  }
  return s;
}

}  // namespace reprise
