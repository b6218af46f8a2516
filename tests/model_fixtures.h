// Synthetic models written once per test process into a temp directory, so
// tests that need a model run without ../shared; and sequences prefilled
// twice, for differential tests.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/flat_memory.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/synthetic_model.h"
#include "tensor/thread_pool.h"

namespace reprise::test {

struct LoadedModel {
  std::string path;
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Model> model;
};

// Writes (once) and loads the synthetic model for `spec`, cached under `tag`.
LoadedModel& synthetic_model(const std::string& tag, const SyntheticModelSpec& spec);

// n_seq sequences, each prefilled with a random prompt of min_len..max_len
// tokens (ids 3..n_vocab-1) into two memories, for differential tests that
// run two paths side by side: `a` and `b` hold the same state, `pos` each
// sequence's next position.
struct PairedSequences {
  std::vector<std::unique_ptr<FlatMemory>> a, b;
  std::vector<int64_t> pos;
};
PairedSequences prefill_pairs(Model& model, std::mt19937_64& rng, int n_seq, int64_t min_len, int64_t max_len,
                              ThreadPool& pool);

}  // namespace reprise::test
