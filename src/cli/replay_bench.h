// Scripted replays for `reprise bench --replay ...`: what the caches save.
#pragma once
#include <string>

#include "engine/model_bundle.h"

namespace reprise::cli {

struct ReplayOptions {
  int threads = 1;
  int turns = 8;
  int system_tokens = 1000;
  int turn_tokens = 200;
  int answer_tokens = 32;
  int gen_tokens = 128;  // speculative: tokens generated per run
  int draft_max = 8;
  int clients = 4;  // parallel: concurrent requests
};

// An agent-style chat: a long system prompt, then turns that each add the
// previous answer and a new user message. Prints per-turn time-to-first-token
// with the cache on (and, for recurrent models, with snapshots off), cache
// off, and the ideal (prefilling only the new tokens on a computed prefix),
// plus cache efficiency against the script's ideal.
void replay_chat(const ReplayOptions& o, ModelBundle& bundle);

// Tokens/s with and without the draft model (greedy, so outputs are equal),
// the acceptance rate, and the overhead when nothing is accepted (an
// adversarial draft whose proposals are always rejected). With clients > 1,
// also that many concurrent speculative requests, sharing draft and verify
// passes against each running alone (outputs must be identical).
void replay_speculative(const ReplayOptions& o, ModelBundle& target, const std::string& draft_path);

// Continuous batching: `clients` concurrent requests (a shared system prompt
// plus their own user tokens, greedy) through one engine, with decode steps
// batched and with every request decoding alone. Prints generated tokens/s of
// both, the mean decode batch, and whether the outputs are identical.
void replay_parallel(const ReplayOptions& o, ModelBundle& bundle);

}  // namespace reprise::cli
