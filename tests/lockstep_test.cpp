// reprise bench --lockstep: two parties take strict turns through two FIFOs.
#include "cli/lockstep.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include "util/error.h"

namespace reprise::cli {
namespace {

struct FifoPair {
  std::filesystem::path dir, a, b;
  FifoPair() {
    char tmpl[] = "/tmp/reprise-lockstep-XXXXXX";
    dir = ::mkdtemp(tmpl);
    a = dir / "a";
    b = dir / "b";
    EXPECT_EQ(::mkfifo(a.c_str(), 0600), 0);
    EXPECT_EQ(::mkfifo(b.c_str(), 0600), 0);
  }
  ~FifoPair() { std::filesystem::remove_all(dir); }
};

TEST(Lockstep, TwoPartiesTakeStrictTurns) {
  FifoPair f;
  std::mutex mu;
  std::string order;
  constexpr int kSteps = 50;
  auto party = [&](char name, const std::filesystem::path& in, const std::filesystem::path& out, bool first) {
    Lockstep turn(in, out);
    if (first) {
      // What scripts/paired_bench.sh does: give the first party its turn.
      Lockstep seed(out, in);
      seed.pass_turn();
    }
    for (int i = 0; i < kSteps; ++i) {
      turn.wait_turn();
      {
        std::lock_guard<std::mutex> lock(mu);
        order += name;
      }
      // Long enough that a party not waiting for its turn would run ahead.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      turn.pass_turn();
      EXPECT_TRUE(turn.active());
    }
  };
  std::thread a(party, 'A', f.a, f.b, true);
  std::thread b(party, 'B', f.b, f.a, false);
  a.join();
  b.join();
  std::string expected;
  for (int i = 0; i < kSteps; ++i) expected += "AB";
  EXPECT_EQ(order, expected);
}

TEST(Lockstep, APartnerThatIsGoneEndsTheLockstep) {
  FifoPair f;
  Lockstep turn(f.a, f.b);
  const auto t0 = std::chrono::steady_clock::now();
  turn.wait_turn(/*timeout_ms=*/50);  // nobody passes the turn
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
  EXPECT_FALSE(turn.active());
  turn.wait_turn();  // alone now: returns at once
  turn.pass_turn();
}

TEST(Lockstep, AMissingFifoIsAClearError) {
  FifoPair f;
  EXPECT_THROW(Lockstep(f.dir / "missing", f.b), Error);
  EXPECT_THROW(Lockstep(f.a, f.dir / "missing"), Error);
}

TEST(Lockstep, InactiveByDefault) {
  Lockstep turn;
  EXPECT_FALSE(turn.active());
  turn.wait_turn();
  turn.pass_turn();
}

}  // namespace
}  // namespace reprise::cli
