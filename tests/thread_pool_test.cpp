#include "tensor/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/quantize.h"
#include "test_support.h"

namespace reprise {
namespace {

struct ScratchA {
  std::vector<int> v;
};
struct ScratchB {
  std::vector<int> v;
};

TEST(ThreadPool, CallerLocalIsOnePerPoolAndType) {
  ThreadPool p1(2), p2(1);
  ScratchA& a1 = p1.caller_local<ScratchA>();
  a1.v.assign(3, 7);
  EXPECT_EQ(&p1.caller_local<ScratchA>(), &a1);  // the same instance every call
  EXPECT_EQ(p1.caller_local<ScratchA>().v.size(), 3u);
  EXPECT_NE(static_cast<void*>(&p1.caller_local<ScratchB>()), static_cast<void*>(&a1));
  EXPECT_NE(&p2.caller_local<ScratchA>(), &a1);  // another pool, another instance
  EXPECT_TRUE(p2.caller_local<ScratchA>().v.empty());
}

// Products whose activation scratch (per pool) differs in size, on two
// pools driven from two threads at once: each keeps its own scratch, so
// every result equals the one computed alone.
TEST(ThreadPool, PoolsOnSeveralThreadsKeepTheirScratchApart) {
  constexpr int64_t kIn = 256, kOut = 96;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(kIn * kOut);
  for (float& f : w) f = dist(rng);
  std::vector<uint8_t> q(dtype_row_bytes(DType::Q8_0, kIn) * kOut);
  for (int64_t r = 0; r < kOut; ++r)
    quantize_row(DType::Q8_0, w.data() + r * kIn, q.data() + r * dtype_row_bytes(DType::Q8_0, kIn), kIn);
  const PackedMatrix pm(MatrixView{DType::Q8_0, q.data(), kIn, kOut, dtype_row_bytes(DType::Q8_0, kIn)});

  const int64_t tokens[2] = {7, 61};
  std::vector<float> x[2], want[2];
  for (int i = 0; i < 2; ++i) {
    x[i].resize(tokens[i] * kIn);
    for (float& f : x[i]) f = dist(rng);
    want[i].resize(tokens[i] * kOut);
    ThreadPool alone(2);
    matmul(pm, x[i].data(), tokens[i], want[i].data(), alone);
  }
  bool same[2] = {true, true};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      ThreadPool pool(2);
      std::vector<float> y(tokens[i] * kOut);
      for (int rep = 0; rep < 300; ++rep) {
        matmul(pm, x[i].data(), tokens[i], y.data(), pool);
        if (std::memcmp(y.data(), want[i].data(), y.size() * sizeof(float)) != 0) same[i] = false;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_TRUE(same[0]);
  EXPECT_TRUE(same[1]);
}

// Workers sleep once idle; keep_awake wakes them and keeps them spinning
// until its time is up or the next job comes, after which they sleep again.
TEST(ThreadPool, KeepAwakeWakesSleepingWorkersUntilTheNextJob) {
  ThreadPool pool(3);
  std::atomic<int> ran{0};
  pool.parallel_for(8, [&](int64_t) { ran++; });
  EXPECT_EQ(ran.load(), 8);
  ASSERT_TRUE(test::eventually([&] { return !pool.workers_awake(); })) << "idle workers never slept";

  pool.keep_awake(60e6);  // a minute: only the next job ends it
  ASSERT_TRUE(test::eventually([&] { return pool.workers_awake(); })) << "keep_awake did not wake the workers";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(pool.workers_awake()) << "the workers slept while asked to stay awake";

  pool.parallel_for(8, [&](int64_t) { ran++; });
  EXPECT_EQ(ran.load(), 16);
  EXPECT_TRUE(test::eventually([&] { return !pool.workers_awake(); })) << "the job did not end the keep-awake";

  // A pool being destroyed while kept awake stops its workers.
  auto kept = std::make_unique<ThreadPool>(2);
  kept->keep_awake(60e6);
  kept.reset();
}

}  // namespace
}  // namespace reprise
