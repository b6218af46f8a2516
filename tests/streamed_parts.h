// Streams a reply into a splitter (ReasoningSplitter, HarmonyStream: push
// returns and flush returns Parts{reasoning, content}) in random pieces,
// for the tests that check any cut gives the whole reply's parts.
#pragma once
#include <random>
#include <string_view>

namespace reprise::testing_support {

template <typename Splitter>
typename Splitter::Parts streamed_parts(Splitter& splitter, std::string_view reply, std::mt19937& rng,
                                        size_t max_piece) {
  typename Splitter::Parts all;
  auto add = [&](const typename Splitter::Parts& p) {
    all.reasoning += p.reasoning;
    all.content += p.content;
  };
  for (size_t at = 0; at < reply.size();) {
    const size_t n = 1 + rng() % max_piece;
    add(splitter.push(reply.substr(at, n)));
    at += n;
  }
  if constexpr (requires { splitter.flush(true); }) add(splitter.flush(true));
  else add(splitter.flush());
  return all;
}

}  // namespace reprise::testing_support
