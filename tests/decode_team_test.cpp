// Decode teams (tensor/decode_team.h): claims hand out every item of every
// work exactly once, barriers hold every member until all arrive, a member
// that throws releases the others, and a transformer's single-token steps
// run by a team give exactly (bit for bit) the logits and state of the
// dispatched path, for every attention layout the team takes.
#include <gtest/gtest.h>
#include <x86intrin.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/flat_memory.h"
#include "model_fixtures.h"
#include "test_support.h"
#include "tensor/decode_team.h"
#include "tensor/kernels.h"
#include "tensor/thread_pool.h"

using namespace reprise;

namespace {

// Restores DecodeTeam::enabled() at scope exit.
struct TeamSwitch {
  bool was = DecodeTeam::enabled();
  ~TeamSwitch() { DecodeTeam::set_enabled(was); }
};

// Each work's items, claimed by all members (halves or one at a time), are
// each taken exactly once; a barrier after each work means the counts a
// member reads after it are final. More threads than cores: members are
// descheduled mid-work and the others take their shares.
TEST(DecodeTeam, ClaimsCoverEveryItemOnceAndBarriersHold) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    DecodeTeam team(pool);
    std::mt19937_64 rng(threads);
    for (int run = 0; run < 6; ++run) {
      std::vector<int64_t> sizes(40);
      for (auto& n : sizes) n = std::uniform_int_distribution<int64_t>(0, 3000)(rng);
      std::vector<std::vector<std::atomic<int>>> taken(sizes.size());
      for (size_t w = 0; w < sizes.size(); ++w) taken[w] = std::vector<std::atomic<int>>(sizes[w]);
      std::atomic<int> bad{0};
      team.run([&](DecodeTeam::Member& m) {
        for (size_t w = 0; w < sizes.size(); ++w) {
          const bool halves = w % 2 == 0;
          int64_t i0, i1;
          while (m.claim(sizes[w], halves, i0, i1)) {
            if (i0 < 0 || i1 > sizes[w] || i0 >= i1 || (!halves && i1 != i0 + 1)) bad.fetch_add(1);
            for (int64_t i = i0; i < i1 && i < sizes[w]; ++i) taken[w][i].fetch_add(1);
          }
          m.barrier();
          // After the barrier every member has claimed its last item.
          int64_t total = 0;
          for (int64_t i = 0; i < sizes[w]; ++i) total += taken[w][i].load();
          if (total != sizes[w]) bad.fetch_add(1);
        }
      });
      ASSERT_EQ(bad.load(), 0) << threads << " threads, run " << run;
      for (size_t w = 0; w < sizes.size(); ++w)
        for (int64_t i = 0; i < sizes[w]; ++i) ASSERT_EQ(taken[w][i].load(), 1) << "work " << w << " item " << i;
    }
  }
}

// A member that throws releases the others at their next barrier; run()
// rethrows it, and the team works again afterwards.
TEST(DecodeTeam, AMemberThatThrowsReleasesTheOthers) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    DecodeTeam team(pool);
    for (int thrower = 0; thrower < threads; ++thrower) {
      EXPECT_THROW(team.run([&](DecodeTeam::Member& m) {
        for (int w = 0; w < 5; ++w) {
          if (w == 3 && m.index() == thrower) throw std::runtime_error("member failed");
          int64_t i0, i1;
          while (m.claim(100, true, i0, i1)) {
          }
          m.barrier();
        }
      }),
                   std::runtime_error);
      std::atomic<int64_t> items{0};
      team.run([&](DecodeTeam::Member& m) {
        for (int w = 0; w < 4; ++w) {
          int64_t i0, i1;
          while (m.claim(50, false, i0, i1)) items.fetch_add(i1 - i0);
          m.barrier();
        }
      });
      EXPECT_EQ(items.load(), 200) << threads << " threads, thrower " << thrower;
    }
  }
}

// The ticks members wait at barriers are counted (reprise bench reports
// them against the steps' ticks): while one member sleeps before the
// barrier, every other waits through most of the run; a run in which each
// member sleeps alike adds far less.
TEST(DecodeTeam, WaitsAtBarriersAreCounted) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    DecodeTeam team(pool);
    auto run_with_sleeps = [&](bool all_sleep) {
      const uint64_t waited0 = DecodeTeam::waited_ticks(), t0 = __rdtsc();
      team.run([&](DecodeTeam::Member& m) {
        if (all_sleep || m.index() == threads - 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        m.barrier();
      });
      const uint64_t ticks = __rdtsc() - t0;
      return static_cast<double>(DecodeTeam::waited_ticks() - waited0) / static_cast<double>(ticks);
    };
    // threads - 1 members wait ~30 ms of a ~30 ms run.
    const double one_late = run_with_sleeps(false);
    EXPECT_GT(one_late, 0.5 * (threads - 1)) << threads << " threads";
    EXPECT_LT(one_late, threads) << threads << " threads";
    // Nobody waits for long: the sleeps end within scheduling noise.
    const double all_late = run_with_sleeps(true);
    EXPECT_LT(all_late, 0.5 * one_late) << threads << " threads";
  }
}

// Two stalled runs in a row (a member waited milliseconds at a barrier)
// stand teams down: 50 ms at first, twice as long each time the stalls
// come back soon after, and the short stand-down again once they have
// stayed away for a second. One stalled run alone is forgiven.
TEST(DecodeTeam, StandsDownBrieflyAtFirstAndLongerWhileStallsRecur) {
  ThreadPool pool(2);
  DecodeTeam team(pool);
  auto stalled_run = [&] {
    team.run([](DecodeTeam::Member& m) {
      if (m.index() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(8));
      m.barrier();
    });
  };
  EXPECT_TRUE(team.ready());
  EXPECT_EQ(team.last_stand_down_seconds(), 0.0);
  stalled_run();
  EXPECT_TRUE(team.ready());
  for (double expected : {0.05, 0.1, 0.2}) {
    stalled_run();
    if (expected > 0.05) stalled_run();  // the count restarts after a stand-down
    EXPECT_FALSE(team.ready()) << expected;
    EXPECT_DOUBLE_EQ(team.last_stand_down_seconds(), expected);
    ASSERT_TRUE(test::eventually([&] { return team.ready(); }, std::chrono::seconds(5)));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  stalled_run();
  stalled_run();
  EXPECT_FALSE(team.ready());
  EXPECT_DOUBLE_EQ(team.last_stand_down_seconds(), 0.05);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A prompt, then single-token steps of random tokens, on two memories: one
// with teams off, one with them on; the logits of every step match exactly.
void check_team_steps_match(Model& model, uint64_t seed, int threads, int64_t prompt_len, int steps) {
  TeamSwitch restore;
  std::mt19937_64 rng(seed);
  const int64_t n_vocab = model.info().n_vocab;
  auto token = [&] { return static_cast<int32_t>(std::uniform_int_distribution<int64_t>(3, n_vocab - 1)(rng)); };
  ThreadPool pool(threads);
  FlatMemory off(model.state_spec()), on(model.state_spec());
  std::vector<int32_t> prompt(prompt_len);
  for (auto& t : prompt) t = token();
  ForwardBatch b;
  b.tokens = prompt;
  std::vector<float> a, c;
  model.forward(b, off, a, pool);
  model.forward(b, on, c, pool);
  ASSERT_TRUE(same_bits(a, c));
  const uint64_t runs_before = DecodeTeam::runs();
  for (int i = 0; i < steps; ++i) {
    const int32_t tok = token();
    ForwardBatch step;
    step.tokens = std::span<const int32_t>(&tok, 1);
    step.pos0 = prompt_len + i;
    DecodeTeam::set_enabled(false);
    model.forward(step, off, a, pool);
    DecodeTeam::set_enabled(true);
    // A step that finds a worker asleep runs dispatched
    // (TeamSteps.AStepWithAWorkerAsleepRunsDispatched), and on a loaded
    // machine a worker descheduled past its spin sleeps between any two steps.
    pool.wake_workers(2e6);
    model.forward(step, on, c, pool);
    ASSERT_TRUE(same_bits(a, c)) << model.info().arch << " " << threads << " threads, step " << i << " at position "
                                 << step.pos0;
  }
  // Teams run on pools that fit the CPUs (at least the first step: a stall
  // stands them down for a while); larger pools keep the dispatched path.
  if (threads > 1 && DecodeTeam::fits_cpus(threads)) {
    EXPECT_GT(DecodeTeam::runs(), runs_before) << "no team ran";
  }
  if (!DecodeTeam::fits_cpus(threads)) {
    EXPECT_EQ(DecodeTeam::runs(), runs_before) << "a team ran on too many threads";
  }
}

// The same for passes of several sequences (one token each): sequences
// with prompts of different lengths (min_prompt to min_prompt + 40) step
// together; on AVX2 the team runs once every sequence is past position 64.
void check_team_multi_steps_match(Model& model, uint64_t seed, int threads, int n_seq, int64_t min_prompt,
                                  int rounds) {
  TeamSwitch restore;
  std::mt19937_64 rng(seed);
  const int64_t n_vocab = model.info().n_vocab;
  auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  ThreadPool pool(threads);
  auto [off, on, pos] = test::prefill_pairs(model, rng, n_seq, min_prompt, min_prompt + 40, pool);
  std::vector<float> a, c;
  const uint64_t runs_before = DecodeTeam::runs();
  for (int r = 0; r < rounds; ++r) {
    std::vector<SequenceStep> steps_off, steps_on;
    for (int s = 0; s < n_seq; ++s) {
      const auto tok = static_cast<int32_t>(rnd(3, n_vocab - 1));
      steps_off.push_back({tok, pos[s], off[s].get()});
      steps_on.push_back({tok, pos[s], on[s].get()});
      ++pos[s];
    }
    DecodeTeam::set_enabled(false);
    model.forward_steps(steps_off, a, pool);
    DecodeTeam::set_enabled(true);
    pool.wake_workers(2e6);  // as in check_team_steps_match
    model.forward_steps(steps_on, c, pool);
    ASSERT_EQ(a.size(), static_cast<size_t>(n_seq * n_vocab));
    ASSERT_TRUE(same_bits(a, c)) << model.info().arch << " " << threads << " threads, " << n_seq << " sequences, round "
                                 << r;
  }
  if (DecodeTeam::fits_cpus(threads)) {
    EXPECT_GT(DecodeTeam::runs(), runs_before) << "no team ran";
  }
}

// Runs fn() under each instruction set this CPU has, then restores the
// native one.
template <typename Fn>
void on_each_isa(Fn&& fn) {
  const KernelIsa native = kernel_isa();
  for (KernelIsa isa : {KernelIsa::Avx2, KernelIsa::Avx2Vnni, KernelIsa::Avx512}) {
    if (!kernel_isa_supported(isa)) continue;
    set_kernel_isa(isa);
    SCOPED_TRACE(kernel_isa_name(isa));
    fn();
  }
  set_kernel_isa(native);
}

struct Shape {
  const char* arch;
  DType dtype;
  int64_t n_head, n_head_kv, head_dim;
};

void PrintTo(const Shape& p, std::ostream* os) {
  *os << p.arch << " " << dtype_name(static_cast<uint32_t>(p.dtype)) << " " << p.n_head << "x" << p.n_head_kv << " d"
      << p.head_dim;
}

class TeamSteps : public ::testing::TestWithParam<Shape> {};

// Per-key (positions up to 64) and tiled (beyond) decode attention, one and
// several query heads per KV head, on each instruction set this CPU has
// (AVX2 has no per-key decode kernel: its teams start at position 64).
TEST_P(TeamSteps, BitIdenticalToDispatchedSteps) {
  const Shape& p = GetParam();
  SyntheticModelSpec s = synthetic_preset(std::string(p.arch) == "llama" ? "tiny" : std::string("tiny-") + p.arch);
  s.dtype = p.dtype;
  s.n_vocab = 320;
  s.n_head = p.n_head;
  s.n_head_kv = p.n_head_kv;
  s.head_dim = p.head_dim;
  s.n_embd = 256;
  s.n_ff = 512;
  if (std::string(p.arch) == "gemma3") {
    s.sliding_window = 40;
    s.sliding_window_pattern = 2;
  }
  const std::string tag = std::string("team-") + p.arch + "-" + dtype_name(static_cast<uint32_t>(p.dtype)) + "-" +
                          std::to_string(p.n_head) + "-" + std::to_string(p.n_head_kv) + "-" +
                          std::to_string(p.head_dim);
  Model& model = *test::synthetic_model(tag, s).model;
  on_each_isa([&] {
    for (int threads : {2, 3}) check_team_steps_match(model, 11 + threads, threads, 50, 30);
    check_team_multi_steps_match(model, 5, 2, 3, 30, 40);
    check_team_multi_steps_match(model, 6, 2, 5, 60, 12);
  });
}

// The recurrent models' steps (mamba, mamba2: no attention, so from every
// position), with d_inner and the head count such that the members'
// channel blocks and heads split unevenly, Mamba-2 heads that end inside a
// 64-channel conv block (head_dim 40) and several B/C groups; up to 11
// sequences a step. (No team runs on more threads than CPUs, which
// check_team_steps_match checks: the 3-thread runs exercise teams only on
// hosts with 3 or more CPUs.)
TEST(TeamSteps, RecurrentModelsBitIdenticalToDispatchedSteps) {
  struct Case {
    const char* preset;
    DType dtype;
    int64_t d_inner, heads, groups;  // heads, groups: mamba2's (ssm.time_step_rank, ssm.group_count)
  };
  for (const Case& c : {Case{"tiny-mamba", DType::Q8_0, 400, 0, 0}, Case{"tiny-mamba", DType::F16, 272, 0, 0},
                        Case{"tiny-mamba2", DType::Q8_0, 320, 5, 1}, Case{"tiny-mamba2", DType::F32, 192, 3, 1},
                        Case{"tiny-mamba2", DType::F16, 200, 5, 1}, Case{"tiny-mamba2", DType::Q8_0, 240, 6, 2}}) {
    SyntheticModelSpec s = synthetic_preset(c.preset);
    s.dtype = c.dtype;
    s.n_vocab = 320;
    s.d_inner = c.d_inner;
    if (c.heads) s.ssm_n_head = c.heads;
    if (c.groups) s.n_group = c.groups;
    const std::string tag = std::string("team-") + c.preset + "-" + dtype_name(static_cast<uint32_t>(c.dtype)) + "-" +
                            std::to_string(c.d_inner) + "-" + std::to_string(c.heads) + "-" +
                            std::to_string(c.groups);
    Model& model = *test::synthetic_model(tag, s).model;
    SCOPED_TRACE(tag);
    on_each_isa([&] {
      for (int threads : {2, 3}) check_team_steps_match(model, 21 + threads, threads, 9, 20);
      check_team_multi_steps_match(model, 7, 2, 3, 5, 10);
      check_team_multi_steps_match(model, 8, 2, 11, 1, 4);
    });
  }
}

// Jamba's steps: recurrent and attention layers (per-key and tiled decode
// attention: positions from below to beyond 64), dense and mixture-of-
// experts feed-forwards, one and several sequences (so an expert takes one
// row, several, or none in a step).
TEST(TeamSteps, JambaBitIdenticalToDispatchedSteps) {
  for (DType dtype : {DType::Q8_0, DType::F16}) {
    SyntheticModelSpec s = synthetic_preset("tiny-jamba");
    s.dtype = dtype;
    s.n_vocab = 320;
    s.n_embd = 128;
    s.head_dim = 32;
    s.d_inner = 272;
    const std::string tag = std::string("team-jamba-") + dtype_name(static_cast<uint32_t>(dtype));
    Model& model = *test::synthetic_model(tag, s).model;
    SCOPED_TRACE(tag);
    on_each_isa([&] {
      check_team_steps_match(model, 31, 2, 50, 30);
      check_team_multi_steps_match(model, 9, 2, 3, 30, 40);
      check_team_multi_steps_match(model, 10, 2, 11, 70, 4);
    });
  }
}

// A team's first barrier waits for every member, so a step that finds a
// pool worker asleep (after an idle spell) runs dispatched, and wakes it;
// with the workers awake the next step is a team's. Same bits either way.
TEST(TeamSteps, AStepWithAWorkerAsleepRunsDispatched) {
  if (!DecodeTeam::fits_cpus(2)) GTEST_SKIP() << "fewer than 2 CPUs: no teams";
  TeamSwitch restore;
  DecodeTeam::set_enabled(true);
  SyntheticModelSpec s = synthetic_preset("tiny");
  s.n_vocab = 320;
  Model& model = *test::synthetic_model("team-asleep", s).model;
  ThreadPool pool(2);
  FlatMemory memory(model.state_spec()), reference(model.state_spec());
  ThreadPool single(1);
  // Past position 64, where AVX2's teams start too.
  std::vector<int32_t> prompt(70);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 37) % 300);
  ForwardBatch b;
  b.tokens = prompt;
  std::vector<float> logits, expected;
  model.forward(b, memory, logits, pool);
  model.forward(b, reference, expected, single);
  ASSERT_TRUE(test::eventually([&] { return !pool.workers_awake(); })) << "the idle worker never slept";

  for (int i = 0; i < 2; ++i) {
    const int32_t tok = 11 + i;
    ForwardBatch step;
    step.tokens = std::span<const int32_t>(&tok, 1);
    step.pos0 = static_cast<int64_t>(prompt.size()) + i;
    const uint64_t runs = DecodeTeam::runs();
    model.forward(step, memory, logits, pool);
    model.forward(step, reference, expected, single);
    ASSERT_TRUE(same_bits(logits, expected)) << "step " << i;
    if (i == 0) {
      EXPECT_EQ(DecodeTeam::runs(), runs) << "a team ran with its worker asleep";
      ASSERT_TRUE(pool.wake_workers(2e6));
    } else {
      EXPECT_GT(DecodeTeam::runs(), runs) << "no team ran with the workers awake";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TeamSteps,
                         ::testing::Values(Shape{"llama", DType::F16, 4, 4, 64}, Shape{"llama", DType::Q8_0, 8, 2, 32},
                                           Shape{"llama", DType::Q4_0, 2, 1, 128}, Shape{"qwen2", DType::F32, 4, 4, 64},
                                           Shape{"qwen3", DType::Q8_0, 4, 2, 64},
                                           Shape{"gemma3", DType::BF16, 4, 1, 64}),
                         [](const auto& info) {
                           return std::string(info.param.arch) + "_" +
                                  dtype_name(static_cast<uint32_t>(info.param.dtype)) + "_" +
                                  std::to_string(info.param.n_head) + "x" + std::to_string(info.param.n_head_kv) +
                                  "_d" + std::to_string(info.param.head_dim);
                         });

}  // namespace
