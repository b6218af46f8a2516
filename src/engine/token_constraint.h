// Restricts which tokens a generation may produce next (structured output).
// The engine asks for the allowed set before each sampled token, masks the
// other tokens' logits, samples, and reports the token it chose; the
// model's logits themselves (and so the prefix cache) are untouched.
#pragma once
#include <cstdint>
#include <vector>

namespace reprise {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // allowed[id] = 1 for each token id that may come next (resized to the
  // vocabulary); may_end: whether the output is complete here, so that
  // end-of-generation tokens are allowed too.
  virtual void allowed_tokens(std::vector<uint8_t>& allowed, bool& may_end) = 0;
  // The token chosen (one allowed_tokens allowed); false if it was not.
  virtual bool accept(int32_t token) = 0;
};

}  // namespace reprise
