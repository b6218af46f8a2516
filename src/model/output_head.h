// The final RMS norm and vocabulary projection shared by every architecture.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"
#include "model/pass_segments.h"
#include "tensor/kernels.h"
#include "tensor/thread_pool.h"

namespace reprise {

// Writes logits for the rows of `x` (n hidden states of n_embd floats) that
// `logits_for` asks for: none, the last, or all in order. `scratch` holds at
// least n * n_embd floats.
void output_logits(const float* x, int64_t n, int64_t n_embd, LogitsFor logits_for, const std::vector<float>& norm,
                   float eps, const PackedMatrix& output, int64_t n_vocab, float* scratch,
                   std::vector<float>& logits, ThreadPool& pool);

// output_logits for every segment of a pass (x holds all the pass's rows):
// each segment's logits vector receives what its batch.logits_for asks, with
// one vocabulary product over all the rows that need logits. A segment whose
// batch asks for hidden_states receives its rows' normed hidden states
// instead (n_embd floats each), outside the product.
void output_logits(const float* x, std::span<const PassSegment> segments, int64_t n_embd,
                   const std::vector<float>& norm, float eps, const PackedMatrix& output, int64_t n_vocab,
                   float* scratch, ThreadPool& pool);

}  // namespace reprise
