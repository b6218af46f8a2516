// Two bench processes that take turns, one timed step each, so that on a
// shared, noisy host both see the same moments: `reprise bench --lockstep`
// (scripts/paired_bench.sh starts the pair and compares their step times).
//
// The turn is a byte passed through two FIFOs. A process holds the turn
// through all its work (loading, probes, untimed prefill) and passes it only
// after each timed step, so exactly one of the two runs at any time and
// step i of one process is measured right next to step i of the other.
#pragma once
#include <string>

namespace reprise::cli {

class Lockstep {
 public:
  // Inactive: every call returns at once.
  Lockstep() = default;
  // Takes turns by reading `in_fifo` and writing `out_fifo` (both must
  // exist; opened read-write, so opening never blocks). Throws Error when
  // either cannot be opened.
  Lockstep(const std::string& in_fifo, const std::string& out_fifo);
  ~Lockstep();
  Lockstep(const Lockstep&) = delete;
  Lockstep& operator=(const Lockstep&) = delete;

  bool active() const { return in_ >= 0; }
  // Blocks until the partner passes the turn. A partner silent for
  // `timeout_ms` has gone (finished, or failed): the lockstep ends with a
  // note on stderr and the process goes on alone. The default allows for a
  // partner's untimed work within a turn (a large model's prefill to -d).
  void wait_turn(int timeout_ms = 600000);
  // Hands the turn to the partner.
  void pass_turn();

 private:
  void stop(const char* why);
  int in_ = -1;
  int out_ = -1;
};

}  // namespace reprise::cli
