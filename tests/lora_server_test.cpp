// LoRA adapters through the HTTP API: selected as a model of their own
// (vLLM's convention) or with llama.cpp's `lora` field, listed, refused
// with a 400 when a request names one the model does not have, and never
// sharing cached state with the base model or another adapter or scale
// (a randomized differential against a cold server).
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "model/synthetic_lora.h"
#include "test_server.h"
#include "util/error.h"
#include "util/scratch_dir.h"

using namespace reprise;
using reprise::test::json;
using reprise::test::Server;

namespace {

SyntheticModelSpec base_spec() {
  SyntheticModelSpec s = synthetic_preset("tiny-qwen3");
  s.n_vocab = 512;
  return s;
}

const char* kTemplate =
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

// Two adapters of the base model, written once: "style" (every matrix) and
// "terse" (three matrices of one layer, no alpha).
struct Adapters {
  std::string style, terse;
};
const Adapters& adapters() {
  static const Adapters made = [] {
    const std::string base = test::synthetic_model("lora-server", base_spec()).path;
    const ScratchDir& dir = process_scratch_dir("reprise-lora-server-");
    Adapters a{dir.file("style.gguf"), dir.file("terse.gguf")};
    SyntheticLoraSpec style;
    style.seed = 31;
    style.strength = 1.0f;
    make_synthetic_lora(base, style, a.style);
    SyntheticLoraSpec terse;
    terse.seed = 32;
    terse.alpha = 0;
    terse.rank = 4;
    terse.strength = 1.0f;
    terse.layers = {1};
    terse.targets = {"attn_v", "ffn_up", "ffn_down"};
    make_synthetic_lora(base, terse, a.terse);
    return a;
  }();
  return made;
}

ServeOptions options(double cache_ram_mib = 256) {
  ServeOptions o = test::serve_with_template("lora-server", base_spec(), kTemplate);
  o.loras = {"style=" + adapters().style, adapters().terse};  // the second is named after its file: "terse"
  o.cache_ram_mib = cache_ram_mib;
  return o;
}

json completion(const std::string& prompt, int max_tokens = 8) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"logprobs", 2}};
}

std::string text_of(const json& r) { return r["choices"][0]["text"].get<std::string>(); }

TEST(LoraServer, AdaptersAreSelectedByModelNameOrByTheLoraField) {
  Server s(options());
  const std::string prompt = "the quick brown fox jumps over the lazy dog";
  auto [st0, base] = s.post("/v1/completions", completion(prompt));
  ASSERT_EQ(st0, 200) << base.dump();
  auto [st1, by_name] = s.post("/v1/completions", [&] {
    json b = completion(prompt);
    b["model"] = "style";
    return b;
  }());
  ASSERT_EQ(st1, 200) << by_name.dump();
  EXPECT_EQ(by_name["model"], "style");
  EXPECT_NE(text_of(by_name), text_of(base)) << "the adapter changes nothing";
  // The same adapter through the field, by index and by name, replies alike
  // (and from the cache the first request filled: the same computation).
  for (const json& lora : {json::parse(R"([{"id": 0}])"), json::parse(R"([{"id": "style", "scale": 1.0}])")}) {
    json b = completion(prompt);
    b["lora"] = lora;
    auto [st, r] = s.post("/v1/completions", b);
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_EQ(text_of(r), text_of(by_name));
    EXPECT_EQ(r["choices"][0]["logprobs"], by_name["choices"][0]["logprobs"]);
    EXPECT_GT(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  }
  // Scale 0 is the base model, and shares the base model's cache.
  json zero = completion(prompt);
  zero["model"] = "style";
  zero["lora"] = json::parse(R"([{"id": "style", "scale": 0}])");
  auto [st2, off] = s.post("/v1/completions", zero);
  ASSERT_EQ(st2, 200) << off.dump();
  EXPECT_EQ(text_of(off), text_of(base));
  EXPECT_EQ(off["choices"][0]["logprobs"], base["choices"][0]["logprobs"]);
  // Both adapters, in either order, are one computation.
  json both = completion(prompt);
  both["lora"] = json::parse(R"([{"id": "terse", "scale": 0.5}, {"id": 0, "scale": 1}])");
  auto [st3, ab] = s.post("/v1/completions", both);
  both["lora"] = json::parse(R"([{"id": 0, "scale": 1}, {"id": "terse", "scale": 0.5}])");
  auto [st4, ba] = s.post("/v1/completions", both);
  ASSERT_EQ(st3, 200);
  ASSERT_EQ(st4, 200);
  EXPECT_EQ(ab["choices"][0]["logprobs"], ba["choices"][0]["logprobs"]);
  EXPECT_NE(ab["choices"][0]["logprobs"], by_name["choices"][0]["logprobs"]);
  EXPECT_GT(ba["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  // Chat and embeddings take the adapter's name as their model too.
  const json chat = {{"model", "terse"},
                     {"messages", {{{"role", "user"}, {"content", prompt}}}},
                     {"max_tokens", 6},
                     {"temperature", 0}};
  auto [st5, c1] = s.post("/v1/chat/completions", chat);
  ASSERT_EQ(st5, 200) << c1.dump();
  EXPECT_EQ(c1["model"], "terse");
  json plain_chat = chat;
  plain_chat.erase("model");
  auto [st6, c0] = s.post("/v1/chat/completions", plain_chat);
  ASSERT_EQ(st6, 200);
  EXPECT_NE(c1["choices"][0]["message"]["content"], c0["choices"][0]["message"]["content"]);
  auto [st7, e1] = s.post("/v1/embeddings", {{"model", "style"}, {"input", prompt}});
  auto [st8, e0] = s.post("/v1/embeddings", {{"input", prompt}});
  ASSERT_EQ(st7, 200) << e1.dump();
  ASSERT_EQ(st8, 200);
  EXPECT_NE(e1["data"][0]["embedding"], e0["data"][0]["embedding"]);
  // The lora field works on every endpoint that takes a model, as the name does.
  auto [st9, e2] = s.post("/v1/embeddings", {{"input", prompt}, {"lora", {{{"id", "style"}}}}});
  ASSERT_EQ(st9, 200) << e2.dump();
  EXPECT_EQ(e2["data"][0]["embedding"], e1["data"][0]["embedding"]);
  const json responses = {{"input", prompt}, {"max_output_tokens", 6}, {"temperature", 0}, {"store", false}};
  json by_field = responses;
  by_field["lora"] = {{{"id", "terse"}}};
  json by_model = responses;
  by_model["model"] = "terse";
  auto [st10, r1] = s.post("/v1/responses", by_field);
  auto [st11, r2] = s.post("/v1/responses", by_model);
  auto [st12, r0] = s.post("/v1/responses", responses);
  ASSERT_EQ(st10, 200) << r1.dump();
  EXPECT_EQ(r1["output"][0]["content"], r2["output"][0]["content"]);
  EXPECT_NE(r1["output"][0]["content"], r0["output"][0]["content"]);
  const json messages = {{"max_tokens", 6}, {"temperature", 0},
                         {"messages", {{{"role", "user"}, {"content", prompt}}}}};
  json m_field = messages;
  m_field["lora"] = {{{"id", 1}}};
  json m_model = messages;
  m_model["model"] = "terse";
  auto [st13, m1] = s.post("/v1/messages", m_field);
  auto [st14, m2] = s.post("/v1/messages", m_model);
  ASSERT_EQ(st13, 200) << m1.dump();
  EXPECT_EQ(m1["content"], m2["content"]);
  // system_fingerprint names the computation: the adapters' differs from the base model's.
  EXPECT_NE(c1["system_fingerprint"], c0["system_fingerprint"]);
  auto [st15, c2] = s.post("/v1/chat/completions", chat);
  EXPECT_EQ(c2["system_fingerprint"], c1["system_fingerprint"]);
}

TEST(LoraServer, AdaptersAreListedAndUnknownOnesRefused) {
  Server s(options());
  httplib::Client c("127.0.0.1", s.port);
  const json models = json::parse(c.Get("/v1/models")->body);
  ASSERT_EQ(models["data"].size(), 3u);
  EXPECT_EQ(models["data"][1]["id"], "style");
  EXPECT_EQ(models["data"][1]["parent"], "lora-server");
  EXPECT_EQ(models["data"][2]["id"], "terse");
  const json one = json::parse(c.Get("/v1/models/terse")->body);
  EXPECT_EQ(one["parent"], "lora-server");
  const json listed = json::parse(c.Get("/lora-adapters")->body);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0]["id"], 0);
  EXPECT_EQ(listed[0]["name"], "style");
  EXPECT_EQ(listed[1]["path"], adapters().terse);

  auto refused = [&](const json& lora, const std::string& param, const std::string& says) {
    json b = completion("hello", 2);
    b["lora"] = lora;
    auto [st, r] = s.post("/v1/completions", b);
    EXPECT_EQ(st, 400) << lora.dump() << " " << r.dump();
    EXPECT_EQ(r["error"]["param"], param) << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find(says), std::string::npos) << r.dump();
  };
  refused(json::parse(R"([{"id": 2}])"), "lora[0].id", "no LoRA adapter index 2");
  refused(json::parse(R"([{"id": 0}, {"id": "nope"}])"), "lora[1].id", "it has 0 'style', 1 'terse'");
  refused(json::parse(R"([{"id": 0}, {"id": "style"}])"), "lora[1].id", "twice");
  refused(json::parse(R"({"id": 0})"), "lora", "must be an array");
  refused(json::parse(R"([{"scale": 1}])"), "lora[0].id", "required");
  refused(json::parse(R"([{"id": 0, "scale": "big"}])"), "lora[0].scale", "");
  refused(json::parse(R"([{"id": 0, "scale": 1e9}])"), "lora[0].scale", "");
  refused(json::parse(R"([{"id": -1}])"), "lora[0].id", "");
  auto [st, r] = s.post("/v1/completions", {{"model", "stylish"}, {"prompt", "x"}});
  EXPECT_EQ(st, 404) << r.dump();
  // llama.cpp sets adapter scales for every request with a POST; here they
  // are per request, which the 405 says.
  auto [stp, rp] = s.post("/lora-adapters", json::array({{{"id", 0}, {"scale", 1}}}));
  EXPECT_EQ(stp, 405) << rp.dump();
  EXPECT_NE(rp["error"]["message"].get<std::string>().find("lora field"), std::string::npos);
}

TEST(LoraServer, AdaptersThatDoNotFitTheModelFailItsLoad) {
  // An adapter of another architecture's model.
  const std::string other = test::synthetic_model("lora-server-llama", synthetic_preset("tiny")).path;
  const std::string path = process_scratch_dir("reprise-lora-server-").file("llama-adapter.gguf");
  make_synthetic_lora(other, SyntheticLoraSpec{}, path);
  ServeOptions o = options();
  o.loras = {"wrong=" + path};
  RegistryOptions ro = make_registry_options(o);
  ModelRegistry registry(resolve_model_sources(o), ro);
  Parsed<ModelLease> lease = registry.acquire("lora-server");
  ASSERT_FALSE(lease.ok());
  EXPECT_NE(lease.error().message.find("the adapter is for 'llama' models"), std::string::npos) << lease.error().message;
  // Adapter names are model names to clients: no two may be alike.
  o.loras = {"lora-server=" + adapters().style};
  EXPECT_THROW(ModelRegistry(resolve_model_sources(o), make_registry_options(o)), Error);
  o.loras = {"a=" + adapters().style, "a=" + adapters().terse};
  EXPECT_THROW(ModelRegistry(resolve_model_sources(o), make_registry_options(o)), Error);
  o.loras = {"=" + adapters().style};
  EXPECT_THROW(make_registry_options(o), Error);
  o.loras = {"two words=" + adapters().style};
  EXPECT_THROW(ModelRegistry(resolve_model_sources(o), make_registry_options(o)), Error);
}

// Adapters of a model other than the default (--lora-of MODEL NAME=PATH):
// selected by name, listed under their model, indexed among their model's
// adapters; another model's adapter in a lora field is a 400.
TEST(LoraServer, AdaptersOfAnotherModel) {
  const test::LoadedModel& other = test::synthetic_model("lora-server-other", synthetic_preset("tiny"));
  const std::string path = process_scratch_dir("reprise-lora-server-").file("other-adapter.gguf");
  SyntheticLoraSpec spec;
  spec.strength = 1.0f;
  make_synthetic_lora(other.path, spec, path);
  ServeOptions o = options();
  o.model_specs = {"other=" + other.path};
  o.model_loras = {"other", "other-style=" + path};
  Server s(o);
  const json listed = json::parse(httplib::Client("127.0.0.1", s.port).Get("/lora-adapters")->body);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[2]["name"], "other-style");
  EXPECT_EQ(listed[2]["model"], "other");
  EXPECT_EQ(listed[2]["id"], 0);  // its index among its model's adapters
  const json one = json::parse(httplib::Client("127.0.0.1", s.port).Get("/v1/models/other-style")->body);
  EXPECT_EQ(one["parent"], "other");
  json body = completion("the old lighthouse", 6);
  body["model"] = "other";
  auto [st0, base] = s.post("/v1/completions", body);
  body["model"] = "other-style";
  auto [st1, adapted] = s.post("/v1/completions", body);
  body["model"] = "other";
  body["lora"] = {{{"id", 0}}};
  auto [st2, by_field] = s.post("/v1/completions", body);
  ASSERT_EQ(st0, 200) << base.dump();
  ASSERT_EQ(st1, 200) << adapted.dump();
  ASSERT_EQ(st2, 200) << by_field.dump();
  EXPECT_EQ(adapted["model"], "other-style");
  EXPECT_NE(adapted["choices"][0]["logprobs"], base["choices"][0]["logprobs"]);
  EXPECT_EQ(by_field["choices"][0]["logprobs"], adapted["choices"][0]["logprobs"]);
  // The default model has no adapter of that name.
  json wrong = completion("x", 2);
  wrong["lora"] = {{{"id", "other-style"}}};
  auto [st3, r3] = s.post("/v1/completions", wrong);
  EXPECT_EQ(st3, 400) << r3.dump();
  // An adapter for a model that is not served is refused at start-up.
  o.model_loras = {"nowhere", "x=" + path};
  EXPECT_THROW(ModelRegistry(resolve_model_sources(o), make_registry_options(o)), Error);
}

// vLLM's runtime loading (--allow-lora-loading): an adapter added while
// the server runs is served by its name, and one removed is not; the cache
// knows adapters by their contents, so the same file under another name
// shares cached prompts, and a changed file under an old name shares none.
TEST(LoraServer, AdaptersLoadAndUnloadAtRunTime) {
  {
    Server off(options());
    auto [st, r] = off.post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", adapters().style}});
    EXPECT_EQ(st, 403) << r.dump();
    EXPECT_EQ(r["error"]["code"], "lora_loading_disabled");
  }
  ServeOptions o = options();
  o.allow_lora_loading = true;
  Server s(o);
  httplib::Client c("127.0.0.1", s.port);
  auto load = [&](const json& body) {
    auto r = c.Post("/v1/load_lora_adapter", body.dump(), "application/json");
    return std::make_pair(r ? r->status : -1, r ? r->body : "");
  };
  auto unload = [&](const std::string& name) {
    auto r = c.Post("/v1/unload_lora_adapter", json{{"lora_name", name}}.dump(), "application/json");
    return r ? r->status : -1;
  };
  const std::string prompt = "the river runs past the old stone mill and the light";
  auto complete = [&](const std::string& model) {
    json b = completion(prompt, 6);
    b["model"] = model;
    return s.post("/v1/completions", b);
  };
  auto [st0, style] = complete("style");
  ASSERT_EQ(st0, 200) << style.dump();
  EXPECT_EQ(complete("fresh").first, 404);
  const auto [st1, said] = load({{"lora_name", "fresh"}, {"lora_path", adapters().style}});
  ASSERT_EQ(st1, 200) << said;
  EXPECT_NE(said.find("fresh"), std::string::npos);
  auto [st2, fresh] = complete("fresh");
  ASSERT_EQ(st2, 200) << fresh.dump();
  EXPECT_EQ(fresh["choices"][0]["logprobs"], style["choices"][0]["logprobs"]);
  EXPECT_GT(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << "the same adapter's cached prompt";
  EXPECT_EQ(json::parse(c.Get("/v1/models/fresh")->body)["parent"], "lora-server");
  EXPECT_EQ(json::parse(c.Get("/lora-adapters")->body).size(), 3u);
  // The lora field indexes it after the model's others.
  json by_field = completion(prompt, 6);
  by_field["lora"] = {{{"id", 2}}};
  EXPECT_EQ(s.post("/v1/completions", by_field).second["choices"][0]["logprobs"], style["choices"][0]["logprobs"]);

  EXPECT_EQ(unload("fresh"), 200);
  EXPECT_EQ(unload("fresh"), 404);
  EXPECT_EQ(complete("fresh").first, 404);
  EXPECT_EQ(complete("style").first, 200);

  // Another file under the old name: its own computation, nothing reused.
  const std::string changed = process_scratch_dir("reprise-lora-server-").file("changed.gguf");
  SyntheticLoraSpec spec;
  spec.seed = 99;
  spec.strength = 1.0f;
  make_synthetic_lora(test::synthetic_model("lora-server", base_spec()).path, spec, changed);
  ASSERT_EQ(load({{"lora_name", "fresh"}, {"lora_path", changed}}).first, 200);
  auto [st3, other] = complete("fresh");
  ASSERT_EQ(st3, 200) << other.dump();
  EXPECT_EQ(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_NE(other["choices"][0]["logprobs"], style["choices"][0]["logprobs"]);

  // A loaded adapter is kept as read: its model reloads with it after the
  // file is gone (review: every later load of the model failed).
  {
    const std::string copy = process_scratch_dir("reprise-lora-server-").file("copy.gguf");
    std::filesystem::copy_file(adapters().terse, copy, std::filesystem::copy_options::overwrite_existing);
    ServeOptions two = options();
    two.allow_lora_loading = true;
    two.model_specs = {"other=" + test::synthetic_model("lora-server-llama", synthetic_preset("tiny")).path};
    two.models_max_ram_mib = 1;  // loading one model unloads the other
    Server t(two);
    httplib::Client tc("127.0.0.1", t.port);
    ASSERT_EQ(tc.Post("/v1/load_lora_adapter", json{{"lora_name", "copied"}, {"lora_path", copy}}.dump(),
                      "application/json")->status,
              200);
    json b = completion(prompt, 6);
    b["model"] = "copied";
    auto [sa, before] = t.post("/v1/completions", b);
    ASSERT_EQ(sa, 200) << before.dump();
    std::filesystem::remove(copy);
    json other_model = completion("x", 2);
    other_model["model"] = "other";
    ASSERT_EQ(t.post("/v1/completions", other_model).first, 200);  // unloads the adapter's model
    auto [sb, after] = t.post("/v1/completions", b);               // reloads it, with the adapter
    ASSERT_EQ(sb, 200) << after.dump();
    EXPECT_EQ(after["choices"][0]["logprobs"], before["choices"][0]["logprobs"]);
  }

  // Refusals.
  const std::string llama_adapter = process_scratch_dir("reprise-lora-server-").file("llama-runtime.gguf");
  make_synthetic_lora(test::synthetic_model("lora-server-llama", synthetic_preset("tiny")).path, SyntheticLoraSpec{},
                      llama_adapter);
  EXPECT_EQ(load({{"lora_name", "wrong"}, {"lora_path", llama_adapter}}).first, 400);  // another architecture
  EXPECT_EQ(load({{"lora_name", "gone"}, {"lora_path", "/nonexistent/adapter.gguf"}}).first, 400);
  EXPECT_EQ(load({{"lora_name", "style"}, {"lora_path", adapters().style}}).first, 400);  // name in use
  EXPECT_EQ(load({{"lora_name", "lora-server"}, {"lora_path", adapters().style}}).first, 400);  // a model's name
  EXPECT_EQ(load({{"lora_name", "m"}, {"lora_path", adapters().style}, {"model", "nope"}}).first, 404);
  EXPECT_EQ(load({{"lora_path", adapters().style}}).first, 400);
  EXPECT_EQ(load({{"lora_name", "wrong"}}).first, 400);
  EXPECT_EQ(complete("wrong").first, 404);
}

// Randomized: conversations under five configurations (none, each adapter,
// one at another scale, both) that share system prompts. Each reply's text
// and log-probabilities equal a cold server's, and a configuration's first
// turn reuses nothing, though others cached its system prompt.
TEST(LoraServer, CachedTurnsReplyAsColdRunsAndConfigurationsNeverShare) {
  Server warm(options());
  Server cold(options(0));
  const std::vector<json> configs = {json(nullptr), json::parse(R"([{"id": "style"}])"),
                                     json::parse(R"([{"id": "style", "scale": 0.5}])"),
                                     json::parse(R"([{"id": "terse"}])"),
                                     json::parse(R"([{"id": "terse"}, {"id": "style", "scale": 0.25}])")};
  const std::vector<std::string> systems = {
      "You are a careful assistant who answers in full sentences about rivers and stones and light.",
      "You are a poet. Every answer is a short verse about the sea, the wind and the old lighthouse."};
  std::mt19937 rng(17);
  std::vector<bool> started(configs.size(), false);
  std::vector<std::pair<size_t, json>> conversations;  // config, messages
  int hits = 0;
  for (int turn = 0; turn < 24; ++turn) {
    size_t config, system;
    json messages;
    if (conversations.empty() || rng() % 3 == 0) {
      config = rng() % configs.size();
      system = rng() % systems.size();
      messages = json::array({{{"role", "system"}, {"content", systems[system]}}});
    } else {
      const auto& [c, m] = conversations[rng() % conversations.size()];
      config = c;
      messages = m;
      system = messages[0]["content"] == systems[0] ? 0 : 1;
    }
    messages.push_back({{"role", "user"}, {"content", "question " + std::to_string(rng() % 1000)}});
    json body = {{"messages", messages}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", true},
                 {"top_logprobs", 2}};
    if (!configs[config].is_null()) body["lora"] = configs[config];
    auto [sw, w] = warm.post("/v1/chat/completions", body);
    auto [sc, c] = cold.post("/v1/chat/completions", body);
    ASSERT_EQ(sw, 200) << w.dump();
    ASSERT_EQ(sc, 200) << c.dump();
    EXPECT_EQ(w["choices"][0]["message"], c["choices"][0]["message"]) << "turn " << turn;
    EXPECT_EQ(w["choices"][0]["logprobs"], c["choices"][0]["logprobs"]) << "turn " << turn;
    const int cached = w["usage"]["prompt_tokens_details"]["cached_tokens"];
    if (!started[config]) {
      EXPECT_EQ(cached, 0) << "turn " << turn << ": configuration " << config << " reused another's state";
    }
    started[config] = true;
    hits += cached > 0;
    messages.push_back({{"role", "assistant"}, {"content", w["choices"][0]["message"]["content"]}});
    conversations.emplace_back(config, messages);
  }
  EXPECT_GT(hits, 6) << "too few cache hits to exercise reuse";
}

}  // namespace
