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

void output_logits(const float* x, std::span<const PassSegment> segments, int64_t n_embd,
                   const std::vector<float>& norm, float eps, const PackedMatrix& output, int64_t n_vocab,
                   float* scratch, ThreadPool& pool) {
  if (segments.size() == 1 && !segments[0].batch.hidden_states) {
    const PassSegment& s = segments[0];
    output_logits(x + s.row0 * n_embd, static_cast<int64_t>(s.batch.tokens.size()), n_embd, s.batch.logits_for, norm,
                  eps, output, n_vocab, scratch, *s.logits, pool);
    return;
  }
  // Rows that need logits, normalized into scratch in segment order; rows
  // asked for as hidden states go straight to their segment.
  int64_t rows = 0;
  for (const PassSegment& s : segments) {
    const int64_t len = static_cast<int64_t>(s.batch.tokens.size());
    const int64_t first = s.batch.logits_for == LogitsFor::All ? 0 : s.batch.logits_for == LogitsFor::Last ? len - 1 : len;
    if (s.batch.hidden_states) {
      s.logits->resize((len - first) * n_embd);
      for (int64_t t = first; t < len; ++t)
        rms_norm(x + (s.row0 + t) * n_embd, norm.data(), eps, n_embd, s.logits->data() + (t - first) * n_embd);
      continue;
    }
    for (int64_t t = first; t < len; ++t, ++rows)
      rms_norm(x + (s.row0 + t) * n_embd, norm.data(), eps, n_embd, scratch + rows * n_embd);
  }
  struct AllLogits {
    std::vector<float> v;
  };
  std::vector<float>& all = pool.caller_local<AllLogits>().v;
  all.resize(rows * n_vocab);
  if (rows > 0) matmul(output, scratch, rows, all.data(), pool);
  int64_t row = 0;
  for (const PassSegment& s : segments) {
    if (s.batch.logits_for == LogitsFor::None || s.batch.hidden_states) continue;
    const int64_t n = s.batch.logits_for == LogitsFor::All ? static_cast<int64_t>(s.batch.tokens.size()) : 1;
    s.logits->assign(all.begin() + row * n_vocab, all.begin() + (row + n) * n_vocab);
    row += n;
  }
}

}  // namespace reprise
