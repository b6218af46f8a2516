// Finds stop strings in streamed text that arrives in arbitrary pieces (one
// token's text at a time), so a stop string split across tokens is still
// caught and never reaches the client.
//
// Text that could be the start of a stop string is held back until later
// text rules the match in or out. Stop strings and input are UTF-8; held-back
// text always starts at a character boundary, so what is released is valid
// UTF-8 whenever the input is.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace reprise {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stop_strings);

  // Adds text; returns the text that is now safe to emit. Once a stop string
  // is found, returns the text before it, and stopped() becomes true; later
  // input is ignored.
  std::string push(std::string_view text);
  // End of generation without a match: releases the held-back text.
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace reprise
