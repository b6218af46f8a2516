// Streams generated text to stdout at most every few milliseconds instead of
// after every token.
//
// Why: a write and flush per token is a system call on the thread that runs
// the model's steps, ~13 us a token on the 2-vCPU VM (1-2 % of a small
// model's decode); a reader cannot tell 5 ms batches from single tokens.
#pragma once
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

namespace reprise::cli {

class PacedOutput {
 public:
  explicit PacedOutput(std::FILE* out = stdout) : out_(out) {}
  PacedOutput(const PacedOutput&) = delete;
  PacedOutput& operator=(const PacedOutput&) = delete;
  ~PacedOutput() { flush(); }

  // Queues text; writes what is queued once the pace has passed since the
  // last write.
  void write(std::string_view text) {
    pending_ += text;
    if (std::chrono::steady_clock::now() - last_ >= kPace) flush();
  }
  // Writes what is queued now.
  void flush() {
    if (!pending_.empty()) std::fwrite(pending_.data(), 1, pending_.size(), out_);
    std::fflush(out_);
    pending_.clear();
    last_ = std::chrono::steady_clock::now();
  }

 private:
  static constexpr std::chrono::milliseconds kPace{5};
  std::FILE* out_;
  std::string pending_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace reprise::cli
