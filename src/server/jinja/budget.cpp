#include "server/jinja/budget.h"

#include <string>

#include "util/error.h"

namespace reprise::jinja {

namespace {
thread_local Budget* active_budget = nullptr;
thread_local int value_depth = 0;
constexpr int kDefaultValueDepth = 600;
}  // namespace

void Budget::charge_steps(uint64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps) {
    throw Error("template exceeded its work limit of " + std::to_string(limits_.max_steps) +
                " steps (runaway loop or recursion?)");
  }
}

void Budget::charge_bytes(uint64_t n) {
  bytes_ += n;
  if (bytes_ > limits_.max_work_bytes) {
    throw Error("template exceeded its work limit of " + std::to_string(limits_.max_work_bytes) +
                " produced bytes");
  }
}

void Budget::check_size(size_t size) const {
  if (size > limits_.max_output_bytes) {
    throw Error("template output exceeds the limit of " + std::to_string(limits_.max_output_bytes) +
                " bytes");
  }
}

Budget::Nesting::Nesting(Budget* budget) : budget_(budget) {
  if (!budget_) return;
  budget_->charge_steps(1);  // every evaluated node is a step
  if (++budget_->nesting_ > budget_->limits_.max_nesting) {
    --budget_->nesting_;
    throw Error("template nesting too deep (limit " + std::to_string(budget_->limits_.max_nesting) +
                ")");
  }
}

Budget::Nesting::~Nesting() {
  if (budget_) --budget_->nesting_;
}

Budget::CallDepth::CallDepth(Budget& budget) : budget_(budget) {
  if (++budget_.call_depth_ > budget_.limits_.max_call_depth) {
    --budget_.call_depth_;
    throw Error("maximum recursion depth exceeded (limit " +
                std::to_string(budget_.limits_.max_call_depth) + " nested calls)");
  }
}

Budget::CallDepth::~CallDepth() { --budget_.call_depth_; }

Budget* Budget::current() { return active_budget; }

Budget::Activate::Activate(Budget& budget) : previous_(active_budget) { active_budget = &budget; }

Budget::Activate::~Activate() { active_budget = previous_; }

void charge_steps(uint64_t n) {
  if (active_budget) active_budget->charge_steps(n);
}

void check_size(size_t size) {
  if (active_budget) active_budget->check_size(size);
}

ValueNesting::ValueNesting() {
  // Counted apart from the evaluator's nesting; both are capped, so their
  // sum is bounded too.
  int limit = active_budget ? active_budget->limits().max_nesting : kDefaultValueDepth;
  if (++value_depth > limit) {
    --value_depth;
    throw Error("value nesting too deep (limit " + std::to_string(limit) + ")");
  }
}

ValueNesting::~ValueNesting() { --value_depth; }

}  // namespace reprise::jinja
