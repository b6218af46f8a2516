// The final RMS norm and vocabulary projection shared by every architecture.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"
#include "tensor/kernels.h"
#include "tensor/thread_pool.h"

namespace reprise {

// Writes logits for the rows of `x` (n hidden states of n_embd floats) that
// `logits_for` asks for: none, the last, or all in order. `scratch` holds at
// least n * n_embd floats.
void output_logits(const float* x, int64_t n, int64_t n_embd, LogitsFor logits_for, const std::vector<float>& norm,
                   float eps, const PackedMatrix& output, int64_t n_vocab, float* scratch,
                   std::vector<float>& logits, ThreadPool& pool);

}  // namespace reprise
