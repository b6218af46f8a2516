#include "model/output_head.h"

namespace reprise {

void output_logits(const float* x, int64_t n, int64_t n_embd, LogitsFor logits_for, const std::vector<float>& norm,
                   float eps, const PackedMatrix& output, int64_t n_vocab, float* scratch,
                   std::vector<float>& logits, ThreadPool& pool) {
  if (logits_for == LogitsFor::None) return;
  const int64_t first = logits_for == LogitsFor::All ? 0 : n - 1;
  const int64_t rows = n - first;
  for (int64_t t = 0; t < rows; ++t) rms_norm(x + (first + t) * n_embd, norm.data(), eps, n_embd, scratch + t * n_embd);
  logits.resize(rows * n_vocab);
  matmul(output, scratch, rows, logits.data(), pool);
}

}  // namespace reprise
