// The read probe and the weight read log behind `reprise bench`'s paired
// roofline: the log must name exactly the packed weights a thread's
// products read, in order, and the probe must read exactly those bytes.
#include "tensor/read_probe.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "tensor/decode_team.h"
#include "tensor/kernels.h"
#include "tensor/thread_pool.h"
#include "util/error.h"

namespace reprise {
namespace {

struct F32Matrix {
  std::vector<float> values;
  MatrixView view;
  F32Matrix(int64_t n_in, int64_t n_out) : values(n_in * n_out) {
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 13) - 6.0f;
    view = MatrixView{DType::F32, reinterpret_cast<const uint8_t*>(values.data()), n_in, n_out,
                      static_cast<size_t>(n_in) * sizeof(float)};
  }
};

bool same_region(std::span<const uint8_t> region, const PackedMatrix& m) {
  return region.data() == m.groups() && region.size() == m.packed_bytes();
}

TEST(WeightReadLog, NamesEachProductsPackedWeightsInCallOrder) {
  ThreadPool pool(2);
  const F32Matrix a(64, 48), b(64, 32), c(64, 80);
  const PackedMatrix pa(a.view), pb(b.view), pc(c.view);
  std::vector<float> x(64, 1.0f), ya(48), yb(32), yc(80);
  matmul(pa, x.data(), 1, ya.data(), pool);  // before the log: not recorded
  std::vector<std::span<const uint8_t>> regions;
  {
    WeightReadLog log;
    matmul(pc, x.data(), 1, yc.data(), pool);
    const MatmulOutput both[] = {{&pa, ya.data()}, {&pb, yb.data()}};
    matmul_many(both, x.data(), 1, pool);
    regions = log.regions();
  }
  ASSERT_EQ(regions.size(), 3u);
  EXPECT_TRUE(same_region(regions[0], pc));
  EXPECT_TRUE(same_region(regions[1], pa));
  EXPECT_TRUE(same_region(regions[2], pb));
  // The log is gone: a new one starts empty and sees only what follows.
  WeightReadLog next;
  EXPECT_TRUE(next.regions().empty());
  matmul(pb, x.data(), 1, yb.data(), pool);
  ASSERT_EQ(next.regions().size(), 1u);
  EXPECT_TRUE(same_region(next.regions()[0], pb));
}

// A decode team's products are recorded by whichever member runs on the
// thread that holds the log (the pool's caller may be any member), once
// each: a log kept only by member 0 missed the step when a worker took
// index 0, and `reprise bench` then printed no paired roofline.
TEST(WeightReadLog, NamesATeamStepsProductsWhicheverMemberTheCallerIs) {
  ThreadPool pool(2);
  DecodeTeam team(pool);
  const F32Matrix a(64, 48), b(64, 32);
  const PackedMatrix pa(a.view), pb(b.view);
  std::vector<float> x(64, 1.0f), ya(48), yb(32);
  const PackedMatrix* firsts[] = {&pa, &pb};
  TeamStepPlan plan;
  for (int run = 0; run < 200; ++run) {
    plan_team_step(firsts, 1, plan, pool);
    WeightReadLog log;
    team.run([&](DecodeTeam::Member& m) {
      const MatmulOutput first[] = {{&pa, ya.data()}};
      const MatmulOutput second[] = {{&pb, yb.data()}};
      team_matmul_many(first, x.data(), m, plan, 0);
      team_matmul_many(second, x.data(), m, plan, 1);
    });
    report_team_step(plan, pool);
    ASSERT_EQ(log.regions().size(), 2u) << "run " << run;
    EXPECT_TRUE(same_region(log.regions()[0], pa));
    EXPECT_TRUE(same_region(log.regions()[1], pb));
  }
}

TEST(WeightReadLog, OnePerThreadAndOnlyItsThreadsProducts) {
  ThreadPool pool(1);
  const F32Matrix a(64, 32);
  const PackedMatrix pa(a.view);
  std::vector<float> x(64, 1.0f), y(32);
  WeightReadLog log;
  EXPECT_THROW(WeightReadLog second, Error);
  std::thread other([&] {
    ThreadPool own(1);
    matmul(pa, x.data(), 1, y.data(), own);
  });
  other.join();
  EXPECT_TRUE(log.regions().empty());
}

TEST(ReadProbe, ReadsExactlyTheRegionsWholeUnits) {
  ThreadPool pool(2);
  std::vector<uint8_t> memory(3 << 20, 1);
  // 1.5 MiB (two chunks), 1000 bytes (one 512-byte unit), 100 bytes (none).
  const std::span<const uint8_t> regions[] = {{memory.data(), 3u << 19},
                                              {memory.data() + (2 << 20), 1000},
                                              {memory.data() + (2 << 20) + 4096, 100}};
  ReadProbe probe(regions, pool);
  EXPECT_EQ(probe.bytes(), (3u << 19) + 512);
  EXPECT_GT(probe.pass(1), 0.0);
  EXPECT_GT(probe.pass(8), 0.0);
  const std::span<const uint8_t> tiny[] = {{memory.data(), 511}};
  ReadProbe empty(tiny, pool);
  EXPECT_EQ(empty.bytes(), 0u);
  EXPECT_EQ(empty.pass(1), 0.0);
}

TEST(ReadProbe, OwnBufferIsWholeChunks) {
  ThreadPool pool(2);
  ReadProbe probe((1 << 20) + 1, pool);
  EXPECT_EQ(probe.bytes(), 2u << 20);
  EXPECT_GT(probe.pass(8), 0.0);
  EXPECT_GT(measure_read_bandwidth(1 << 20, pool, 1), 0.0);
}

}  // namespace
}  // namespace reprise
