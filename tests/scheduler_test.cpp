// The scheduler's slots and queue: requests (job groups) take free slots in
// turn, jobs of one group and jobs of their own run in submission order,
// and a withdrawn job leaves the queue unrun.
#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "server/scheduler.h"
#include "test_support.h"

using namespace reprise;

namespace {

// Runs `scheduler`'s queue behind a job that holds its only slot until
// release() is called, recording the order the queued jobs run in.
struct HeldSlot {
  explicit HeldSlot(Scheduler& scheduler, uint64_t group = 0) : scheduler(scheduler) {
    std::shared_future<void> gate = released.get_future().share();
    scheduler.submit([gate] { gate.wait(); }, group);
    EXPECT_TRUE(test::eventually([&] { return scheduler.running() == 1; }));
  }
  void add(const std::string& name, uint64_t group = 0) {
    scheduler.submit(
        [this, name] {
          std::lock_guard<std::mutex> lock(mutex);
          order.push_back(name);
        },
        group);
  }
  std::vector<std::string> release_and_wait(size_t jobs) {
    released.set_value();
    EXPECT_TRUE(test::eventually([&] {
      std::lock_guard<std::mutex> lock(mutex);
      return order.size() == jobs;
    }));
    EXPECT_TRUE(test::eventually([&] { return scheduler.running() == 0 && scheduler.queued() == 0; }));
    std::lock_guard<std::mutex> lock(mutex);
    return order;
  }

  Scheduler& scheduler;
  std::promise<void> released;
  std::mutex mutex;
  std::vector<std::string> order;
};

}  // namespace

TEST(Scheduler, RequestsTakeFreeSlotsInTurn) {
  Scheduler scheduler(1);
  HeldSlot held(scheduler, /*group=*/1);  // request 1 is running one of its jobs
  held.add("a2", 1);
  held.add("a3", 1);
  held.add("a4", 1);
  held.add("b1", 2);
  held.add("c1", 3);
  held.add("b2", 2);
  EXPECT_EQ(scheduler.queued(), 6u);
  // Requests that have not started go first (in arrival order), then every
  // request in turn, each its own jobs in order.
  EXPECT_EQ(held.release_and_wait(6), (std::vector<std::string>{"b1", "c1", "a2", "b2", "a3", "a4"}));
}

TEST(Scheduler, JobsOfTheirOwnRunInSubmissionOrder) {
  Scheduler scheduler(1);
  HeldSlot held(scheduler);
  for (const char* name : {"x", "y", "z"}) held.add(name);
  EXPECT_EQ(held.release_and_wait(3), (std::vector<std::string>{"x", "y", "z"}));
}

TEST(Scheduler, AWithdrawnJobLeavesTheQueueUnrun) {
  Scheduler scheduler(1);
  HeldSlot held(scheduler, 7);
  held.add("kept", 7);
  bool ran = false;
  const uint64_t ticket = scheduler.submit([&ran] { ran = true; }, 8);
  held.add("also kept", 8);
  std::function<void()> job = scheduler.withdraw(ticket);
  ASSERT_TRUE(job);
  EXPECT_FALSE(scheduler.withdraw(ticket));  // once
  EXPECT_EQ(held.release_and_wait(2), (std::vector<std::string>{"also kept", "kept"}));
  EXPECT_FALSE(ran);
  job();  // the caller runs it (cancelled), as the server does
  EXPECT_TRUE(ran);
}
