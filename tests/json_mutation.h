// Random mutations of JSON request bodies, for the request parsers'
// mutation fuzz tests: a random node is replaced by one of `values`, loses
// a key, gains one of `keys`, grows an element, or is wrapped in an array.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace reprise::test {

class JsonMutator {
 public:
  JsonMutator(std::mt19937_64& rng, std::vector<nlohmann::json> values, std::vector<std::string> keys)
      : rng_(rng), values_(std::move(values)), keys_(std::move(keys)) {}

  size_t pick(size_t n) { return static_cast<size_t>(rng_() % n); }

  // Mutates one random node of `node` (descending at most 6 levels).
  void mutate(nlohmann::json& node, int depth = 0) {
    if ((node.is_object() || node.is_array()) && !node.empty() && depth < 6 && pick(3) != 0) {
      if (node.is_object()) {
        auto it = node.begin();
        std::advance(it, pick(node.size()));
        mutate(it.value(), depth + 1);
      } else {
        mutate(node[pick(node.size())], depth + 1);
      }
      return;
    }
    switch (pick(5)) {
      case 0: node = values_[pick(values_.size())]; break;
      case 1:
        if (node.is_object() && !node.empty()) {
          auto it = node.begin();
          std::advance(it, pick(node.size()));
          node.erase(it);
        }
        break;
      case 2:
        if (node.is_object()) node[keys_[pick(keys_.size())]] = values_[pick(values_.size())];
        break;
      case 3:
        if (node.is_array()) node.push_back(values_[pick(values_.size())]);
        break;
      default: node = nlohmann::json::array({node}); break;
    }
  }

 private:
  std::mt19937_64& rng_;
  std::vector<nlohmann::json> values_;
  std::vector<std::string> keys_;
};

}  // namespace reprise::test
