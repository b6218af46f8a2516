// Work accounting that keeps a hostile template from hanging or exhausting
// memory: every loop iteration, macro call and value traversal costs steps,
// every produced byte costs bytes, and nesting is capped so the C++ stack
// cannot overflow. Exceeding any limit throws reprise::Error.
//
// Value algorithms (equality, repr, tojson...) have no renderer at hand, so
// the active budget is reached through a thread-local set for the duration
// of one render. Outside a render nothing is charged.
#pragma once
#include <cstddef>
#include <cstdint>

namespace reprise::jinja {

struct BudgetLimits {
  uint64_t max_steps = 5'000'000;         // evaluated nodes, loop iterations, calls, traversed values
  uint64_t max_work_bytes = 1ull << 30;   // bytes produced by string operations
  size_t max_output_bytes = 16u << 20;    // size of any one string/output buffer
  int max_call_depth = 200;               // nested macro/callable calls
  int max_nesting = 600;                  // evaluator and value recursion depth
};

class Budget {
 public:
  explicit Budget(const BudgetLimits& limits) : limits_(limits) {}

  void charge_steps(uint64_t n);
  void charge_bytes(uint64_t n);
  // Throws if a string or buffer of `size` bytes would exceed the output cap.
  void check_size(size_t size) const;
  const BudgetLimits& limits() const { return limits_; }

  // RAII depth counters. Nesting also charges one step: the renderer opens
  // one per evaluated statement or expression.
  class Nesting {
   public:
    explicit Nesting(Budget* budget);
    ~Nesting();
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Budget* budget_;
  };
  class CallDepth {
   public:
    explicit CallDepth(Budget& budget);
    ~CallDepth();
    CallDepth(const CallDepth&) = delete;
    CallDepth& operator=(const CallDepth&) = delete;

   private:
    Budget& budget_;
  };

  // The budget of the render running on this thread, or nullptr.
  static Budget* current();
  class Activate {
   public:
    explicit Activate(Budget& budget);
    ~Activate();
    Activate(const Activate&) = delete;
    Activate& operator=(const Activate&) = delete;

   private:
    Budget* previous_;
  };

 private:
  BudgetLimits limits_;
  uint64_t steps_ = 0;
  uint64_t bytes_ = 0;
  int call_depth_ = 0;
  int nesting_ = 0;
};

// Convenience wrappers that charge the current budget if there is one.
void charge_steps(uint64_t n);
void check_size(size_t size);

// Depth guard for recursive value algorithms; without an active budget it
// still caps recursion at a fixed depth.
class ValueNesting {
 public:
  ValueNesting();
  ~ValueNesting();
  ValueNesting(const ValueNesting&) = delete;
  ValueNesting& operator=(const ValueNesting&) = delete;
};

}  // namespace reprise::jinja
