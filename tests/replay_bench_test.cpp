// `reprise bench --replay chat` on a model whose context is shorter than the
// script: it must run the turns that fit and say so, not fail halfway; and a
// script whose first turn does not fit is refused up front.
#include "cli/replay_bench.h"

#include <gtest/gtest.h>

#include "model/synthetic_model.h"
#include "engine/model_bundle.h"
#include "model_fixtures.h"
#include "util/error.h"

namespace reprise {
namespace {

ModelBundle& short_context_model() {
  static std::unique_ptr<ModelBundle> bundle = [] {
    SyntheticModelSpec spec;
    spec.n_ctx = 256;
    const std::string path = test::synthetic_model("replay-short-ctx", spec).path;
    return load_model_bundle(path);
  }();
  return *bundle;
}

TEST(ReplayChat, RunsTheTurnsThatFitTheContext) {
  cli::ReplayOptions o;
  o.turns = 8;
  o.system_tokens = 100;
  o.turn_tokens = 40;
  o.answer_tokens = 8;
  // Turn t's prompt: 100 + 40 t + 8 (t - 1); with its answer it fits 256 up to t = 3.
  testing::internal::CaptureStdout();
  ASSERT_NO_THROW(cli::replay_chat(o, short_context_model()));
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("holds 3 of the 8 turns asked for; running 3"), std::string::npos) << out;
  EXPECT_NE(out.find("|    3 |"), std::string::npos) << out;
  EXPECT_EQ(out.find("|    4 |"), std::string::npos) << out;
}

TEST(ReplayChat, RefusesAScriptWhoseFirstTurnDoesNotFit) {
  cli::ReplayOptions o;
  o.system_tokens = 300;
  testing::internal::CaptureStdout();
  try {
    cli::replay_chat(o, short_context_model());
    testing::internal::GetCapturedStdout();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    testing::internal::GetCapturedStdout();
    EXPECT_NE(std::string(e.what()).find("does not hold one turn"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace reprise
