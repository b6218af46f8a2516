// A decode step (one token per sequence) run by all of a pool's threads at
// once.
//
// A decode step of a small model is ~40 products and attention dispatches
// of a few microseconds each. Dispatched one by one (ThreadPool::parallel_for)
// each pays the pool's publish, wake-up and completion count on top of its
// bytes; on the 2-vCPU host, whose vCPUs are ~250 ns apart, that measured
// ~0.7 us more per 0.28-1.6 MB product than the same products run by
// threads that stay inside one dispatch and meet at a spin barrier after
// each (docs/performance.md, Decode teams). A team is that: run() enters
// every pool thread once, and each member walks the same sequence of works
// (products, attention), claiming items of each (its own share first, then
// the others' from the back, as run_decode splits a product) and meeting the
// others at barrier() before the work's outputs are read.
//
// Every member must call barrier() the same number of times in a run, and
// claim only between barriers. Work that every member needs between two
// barriers (norms, residual adds, activation quantizing) each member does
// itself, on its own buffers, so it needs no barrier; which member computes
// an output changes no bits.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace reprise {

class ThreadPool;

class DecodeTeam {
 public:
  // One thread's part in a run.
  class Member {
   public:
    int index() const { return index_; }
    int size() const;
    ThreadPool& pool() const;
    // Claims items [i0, i1) of the current work, which has n_items items
    // (every member must pass the same count): first from this member's own
    // share (items n_items * index / size ..), then from the back of the
    // others'; `halves` takes half of what is left of a share at a time,
    // else one item. False when no item of the work is left.
    bool claim(int64_t n_items, bool halves, int64_t& i0, int64_t& i1);
    // Waits until every member has arrived here; the next work starts.
    void barrier();

   private:
    friend class DecodeTeam;
    Member(DecodeTeam& team, int index, uint64_t work, uint64_t arrivals)
        : team_(team), index_(index), work_(work), arrivals_(arrivals) {}
    DecodeTeam& team_;
    int index_;
    uint64_t work_;      // works begun by the team before this one
    uint64_t arrivals_;  // team arrivals that complete this member's next barrier, minus size
    int share_ = 0;      // the share being claimed from: own (0), then the next members'
    uint64_t waited_ = 0;  // ticks spent waiting at barriers in this run
  };

  // A team of all of pool's threads (pool.size() members).
  explicit DecodeTeam(ThreadPool& pool);
  ~DecodeTeam();
  DecodeTeam(const DecodeTeam&) = delete;
  DecodeTeam& operator=(const DecodeTeam&) = delete;

  int size() const { return size_; }

  // Runs fn(member) on every thread of the pool (the caller is one of them)
  // and returns when all have returned. Not reentrant. If a member throws,
  // the others leave at their next barrier and run() rethrows the first
  // exception; the team is then as new.
  template <typename Fn>
  void run(Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run_members([](void* ctx, Member& m) { (*static_cast<F*>(ctx))(m); }, &fn);
  }

  // Whether a team should run now. A member that waits ~1 ms at a barrier
  // means a teammate lost its CPU (other work, or more threads than CPUs),
  // and every barrier of a step can then cost a scheduler time slice where
  // dispatched products would have been taken over by the threads still
  // running: after two runs in a row that waited so, teams stand down, for
  // 50 ms at first and twice as long each time they stand down again soon
  // after the last, up to a second.
  bool ready() const;
  // The last stand-down's length in seconds, 0 before the first (tests).
  double last_stand_down_seconds() const;

  // Whether single-token steps run as teams: on by default with more than
  // one thread; REPRISE_DECODE_TEAM=0 turns it off (for comparisons), as
  // does set_enabled(false) (tests).
  static bool enabled();
  static void set_enabled(bool on);
  // Whether a pool of `threads` may run as a team: no more threads than
  // the CPUs this process may use (its affinity mask, its cgroup quota).
  static bool fits_cpus(int threads);
  // Runs completed by all teams of the process (for tests).
  static uint64_t runs();
  // Time-stamp counter ticks that members of all teams of the process have
  // spent waiting at barriers, summed over members, counted when a run
  // returns: what a split of the works between the members left idle. For
  // reports, against the ticks the runs took (__rdtsc() around them) times
  // the team's size.
  static uint64_t waited_ticks();

 private:
  using MemberFn = void (*)(void*, Member&);
  void run_members(MemberFn fn, void* ctx);
  // Back to a new team's counts and shares (after an aborted run).
  void reset();

  // Item ranges [next, end) of one share, tagged with the work they belong
  // to: the first member to claim from a share in a new work starts it.
  struct alignas(64) Share {
    std::atomic<uint64_t> word{0};
  };

  ThreadPool& pool_;
  int size_;
  // Two works' shares, alternating: consecutive works are separated by a
  // barrier, so a set is idle while the other is claimed from.
  std::unique_ptr<Share[]> shares_;
  alignas(64) std::atomic<uint64_t> arrived_{0};
  std::atomic<bool> aborted_{false};  // a member threw: the others leave at their next barrier
  std::atomic<bool> stalled_{false};  // a member waited ~1 ms at a barrier in this run
  int stalled_runs_ = 0;              // consecutive runs that stalled
  double stood_down_until_ = 0.0;     // seconds (steady clock); see ready()
  double stand_down_seconds_ = 0.0;   // the last stand-down's length (0: none yet)
  uint64_t works_ = 0;  // works begun in earlier runs (all members agree)
};

}  // namespace reprise
