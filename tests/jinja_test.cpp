// Tests for the Jinja2 interpreter (src/server/jinja) and the chat-template
// renderer (src/server/chat_template): real model templates against the
// llama.cpp-rendered fixtures, language features against hand-derived
// Jinja2 results, error reporting, resource limits and a fuzz pass.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "server/chat_template.h"
#include "server/jinja/template.h"
#include "test_support.h"
#include "util/error.h"

namespace reprise {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

// The fixtures were rendered on 2026-11-21; noon local time keeps the date
// right in every time zone the test might run in.
std::time_t fixture_now() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 21;
  tm.tm_hour = 12;
  tm.tm_isdst = -1;
  return std::mktime(&tm);
}

jinja::RenderOptions fixed_clock() {
  jinja::RenderOptions options;
  options.now = fixture_now;
  return options;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string render(std::string_view source, const json& context = json::object(),
                   const jinja::ParseOptions& parse_options = {}) {
  return jinja::Template::parse(source, parse_options).render(context, fixed_clock());
}

// Jinja2's own defaults (no trim/lstrip), for whitespace tests.
jinja::ParseOptions plain_jinja() {
  jinja::ParseOptions o;
  o.trim_blocks = false;
  o.lstrip_blocks = false;
  return o;
}

std::string error_of(std::string_view source, const json& context = json::object(),
                     const jinja::RenderOptions& options = fixed_clock()) {
  try {
    jinja::Template::parse(source).render(context, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::vector<fs::path> fixture_templates(const std::string& fixtures) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(fs::path(fixtures) / "templates")) {
    if (entry.path().extension() == ".jinja") out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ------------------------------------------------------------------ fixtures

TEST(ChatTemplateFixtures, RenderEveryConversationExactly) {
  REPRISE_REQUIRE_SHARED(fixtures);
  auto templates = fixture_templates(fixtures);
  ASSERT_FALSE(templates.empty());
  int cases = 0;
  for (const fs::path& path : templates) {
    fs::path expected_path = path;
    expected_path.replace_extension(".expected.json");
    json expected = json::parse(read_file(expected_path));
    ChatTemplate chat(read_file(path));
    for (const json& c : expected["cases"]) {
      ChatTemplateInputs inputs;
      inputs.messages = c["messages"];
      inputs.add_generation_prompt = expected["add_generation_prompt"].get<bool>();
      // llama.cpp rendered these with a Llama SPM vocab (<s>, </s>) and drops
      // the leading BOS its tokenizer adds anyway.
      inputs.bos_token = "<s>";
      inputs.eos_token = "</s>";
      inputs.tokenizer_adds_bos = true;
      std::string got;
      try {
        got = chat.apply(inputs, fixed_clock());
      } catch (const Error& e) {
        ADD_FAILURE() << path.filename() << " / " << c["name"] << ": " << e.what();
        continue;
      }
      EXPECT_EQ(got, c["prompt"].get<std::string>()) << path.filename() << " / " << c["name"];
      ++cases;
    }
  }
  std::cout << "[ fixtures ] " << templates.size() << " templates, " << cases << " conversations rendered\n";
}

TEST(ChatTemplateFixtures, ConversationFileMatchesExpectations) {
  REPRISE_REQUIRE_SHARED(fixtures);
  json convs = json::parse(read_file(fs::path(fixtures) / "templates" / "convs.json"));
  for (const fs::path& path : fixture_templates(fixtures)) {
    fs::path expected_path = path;
    expected_path.replace_extension(".expected.json");
    json expected = json::parse(read_file(expected_path));
    ASSERT_EQ(expected["cases"].size(), convs.size()) << path.filename();
    for (size_t i = 0; i < convs.size(); ++i) {
      EXPECT_EQ(expected["cases"][i]["messages"], convs[i]["messages"]) << path.filename();
    }
  }
}

}  // namespace
}  // namespace reprise
