// Embeddings (POST /v1/embeddings): the request, the pooling a GGUF
// declares, pooling and its encodings, and the endpoint on synthetic models
// — including the differential that an embedding computed after a cached
// prefix is bit for bit the one a cold server computes.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "server/embeddings.h"
#include "server/openai_request.h"
#include "test_server.h"
#include "test_support.h"

using namespace reprise;
using nlohmann::json;
using test::Server;

namespace {

std::vector<float> decode_base64_floats(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::vector<uint8_t> bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int v = value(c);
    if (v < 0) break;  // '='
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  std::vector<float> out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint32_t u = bytes[4 * i] | (bytes[4 * i + 1] << 8) | (bytes[4 * i + 2] << 16) |
                       (static_cast<uint32_t>(bytes[4 * i + 3]) << 24);
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

double norm_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

}  // namespace

TEST(EmbeddingsRequest, InputsAndOptions) {
  auto ok = [](const json& body) {
    Parsed<EmbeddingsRequest> r = parse_embeddings_request(body.dump());
    EXPECT_TRUE(r.ok()) << body.dump() << ": " << r.error().message;
    return r.ok() ? r.value() : EmbeddingsRequest{};
  };
  EXPECT_EQ(ok({{"input", "hi"}}).inputs.size(), 1u);
  const EmbeddingsRequest batch = ok({{"input", {"a", "b", "c"}}, {"encoding_format", "base64"}, {"dimensions", 8}});
  ASSERT_EQ(batch.inputs.size(), 3u);
  EXPECT_EQ(batch.inputs[2].text, "c");
  EXPECT_TRUE(batch.base64);
  EXPECT_EQ(batch.dimensions, 8);
  const EmbeddingsRequest ids = ok({{"input", {{1, 2}, {3}}}, {"cache_salt", "t"}});
  ASSERT_EQ(ids.inputs.size(), 2u);
  EXPECT_TRUE(ids.inputs[0].is_tokens);
  EXPECT_EQ(ids.inputs[1].tokens, std::vector<int32_t>{3});
  EXPECT_EQ(ids.cache_salt, "t");
  EXPECT_EQ(ok({{"input", {5, 6, 7}}}).inputs[0].tokens.size(), 3u);

  auto param_of = [](const json& body) {
    Parsed<EmbeddingsRequest> r = parse_embeddings_request(body.dump());
    EXPECT_FALSE(r.ok()) << body.dump();
    return r.ok() ? std::string("<ok>") : r.error().param;
  };
  EXPECT_EQ(param_of(json::object()), "input");
  EXPECT_EQ(param_of({{"input", ""}}), "input");
  EXPECT_EQ(param_of({{"input", {"a", ""}}}), "input[1]");
  EXPECT_EQ(param_of({{"input", json::array()}}), "input");
  EXPECT_EQ(param_of({{"input", {"a", {1}}}}), "input[1]");
  EXPECT_EQ(param_of({{"input", {-1}}}), "input[0]");
  EXPECT_EQ(param_of({{"input", {{1, 2}, {3, "a"}}}}), "input[1][1]");
  EXPECT_EQ(param_of({{"input", "x"}, {"encoding_format", "int8"}}), "encoding_format");
  EXPECT_EQ(param_of({{"input", "x"}, {"dimensions", 0}}), "dimensions");
  EXPECT_EQ(param_of({{"input", json(std::vector<std::string>(RequestLimits{}.max_embedding_inputs + 1, "x"))}}),
            "input");
}

TEST(Embeddings, PoolingNormalisesAndEncodes) {
  const std::vector<float> rows = {3, 0, 0, 0,   // position 0
                                   0, 4, 0, 0,   // position 1
                                   0, 0, 0, 5};  // position 2
  // Rows come a chunk at a time: the pooler keeps a sum (or the last row).
  auto pool = [&](Pooling pooling, std::optional<int64_t> dimensions) {
    EmbeddingPooler pooler(4, pooling);
    pooler.add(std::span<const float>(rows).subspan(0, 8));
    pooler.add(std::span<const float>(rows).subspan(8));
    return pooler.result(dimensions);
  };
  EXPECT_EQ(pool(Pooling::Last, std::nullopt), (std::vector<float>{0, 0, 0, 1}));
  const std::vector<float> mean = pool(Pooling::Mean, std::nullopt);
  EXPECT_NEAR(mean[0], 3 / std::sqrt(50.0), 1e-6);
  EXPECT_NEAR(mean[1], 4 / std::sqrt(50.0), 1e-6);
  EXPECT_NEAR(mean[3], 5 / std::sqrt(50.0), 1e-6);
  // Cut to the first dimensions, then unit length again.
  const std::vector<float> cut = pool(Pooling::Mean, 2);
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_NEAR(cut[0], 0.6, 1e-6);
  EXPECT_NEAR(cut[1], 0.8, 1e-6);
  EmbeddingPooler zero(4, Pooling::Last);
  zero.add(std::vector<float>(4, 0.0f));
  EXPECT_EQ(zero.result(std::nullopt), std::vector<float>(4, 0.0f));

  const std::vector<float> values = {1.5f, -0.0f, 3.25e-7f, -1e30f, 0.1f};
  for (size_t n = 0; n <= values.size(); ++n) {
    const std::vector<float> part(values.begin(), values.begin() + n);
    const std::string text = base64_floats(part);
    EXPECT_EQ(text.size() % 4, 0u);
    const std::vector<float> back = decode_base64_floats(text);
    ASSERT_EQ(back.size(), part.size());
    EXPECT_EQ(0, std::memcmp(back.data(), part.data(), part.size() * sizeof(float)));
  }
  EXPECT_EQ(base64_floats(std::vector<float>{1.0f}), "AACAPw==");  // 00 00 80 3f
}

TEST(Embeddings, PoolingTheGgufDeclares) {
  auto file_with = [](std::optional<int32_t> pooling_type) {
    gguf::Writer w;
    w.set_string("general.architecture", "qwen3");
    if (pooling_type) w.set_u32("qwen3.pooling_type", static_cast<uint32_t>(*pooling_type));
    const std::vector<uint8_t> bytes = w.to_bytes();
    return gguf::File::from_bytes(bytes, "pooling.gguf");
  };
  EXPECT_EQ(model_pooling(*file_with(std::nullopt), "qwen3", Pooling::Last).value(), Pooling::Last);
  EXPECT_EQ(model_pooling(*file_with(0), "qwen3", Pooling::Mean).value(), Pooling::Mean);  // none: the fallback
  EXPECT_EQ(model_pooling(*file_with(1), "qwen3", Pooling::Last).value(), Pooling::Mean);
  // cls: a causal model's first state is the same for every input.
  EXPECT_FALSE(model_pooling(*file_with(2), "qwen3", Pooling::Last).ok());
  EXPECT_EQ(model_pooling(*file_with(3), "qwen3", Pooling::Mean).value(), Pooling::Last);
  const Parsed<Pooling> rank = model_pooling(*file_with(4), "qwen3", Pooling::Last);
  ASSERT_FALSE(rank.ok());
  EXPECT_EQ(rank.error().status, 400);
  EXPECT_EQ(pooling_from_name("mean"), Pooling::Mean);
  EXPECT_FALSE(pooling_from_name("max"));
  EXPECT_FALSE(pooling_from_name("cls"));
}

namespace {

ServeOptions embedding_server(const std::string& pooling = "") {
  ServeOptions options;
  options.model_path = test::synthetic_model("embeddings-qwen3", synthetic_preset("tiny-qwen3")).path;
  options.pooling = pooling;
  return options;
}

std::vector<float> vector_of(const json& item) { return item["embedding"].get<std::vector<float>>(); }

}  // namespace

// The cache differential: an input whose prefix another request left in
// the cache embeds to exactly the vector a cold server computes (last
// pooling reuses the prefix; mean pooling computes every position, warm or
// cold). A batch's vectors are each input's alone, in input order.
TEST(EmbeddingsApi, CachedPrefixesEmbedAsColdRunsDo) {
  for (const std::string pooling : {"", "mean"}) {
    SCOPED_TRACE("pooling " + (pooling.empty() ? std::string("(model's: last)") : pooling));
    Server warm(embedding_server(pooling));
    std::mt19937_64 rng(pooling.size() + 5);
    const std::vector<std::string> words = {"alpha", "beta", "gamma", "delta", "river", "stone", "light"};
    auto sentence = [&](size_t n) {
      std::string s;
      for (size_t i = 0; i < n; ++i) s += (i ? " " : "") + words[rng() % words.size()];
      return s;
    };
    for (int round = 0; round < 3; ++round) {
      const std::string prefix = sentence(30), input = prefix + " " + sentence(4);
      ASSERT_EQ(warm.post("/v1/embeddings", {{"input", prefix}}).first, 200);
      auto [st, r] = warm.post("/v1/embeddings", {{"input", input}});
      ASSERT_EQ(st, 200) << r.dump();
      const int cached = r["usage"]["prompt_tokens_details"]["cached_tokens"];
      if (pooling.empty()) EXPECT_GT(cached, 0);
      else EXPECT_EQ(cached, 0);
      Server cold(embedding_server(pooling));
      auto [stc, rc] = cold.post("/v1/embeddings", {{"input", input}});
      ASSERT_EQ(stc, 200);
      EXPECT_EQ(rc["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
      EXPECT_EQ(rc["usage"]["prompt_tokens"], r["usage"]["prompt_tokens"]);
      const std::vector<float> a = vector_of(r["data"][0]), b = vector_of(rc["data"][0]);
      ASSERT_EQ(a.size(), 64u);  // tiny-qwen3's width
      EXPECT_EQ(a, b) << "round " << round;
      EXPECT_NEAR(norm_of(a), 1.0, 1e-5);

      // A batch: each vector is its input's alone; base64 holds the same floats.
      auto [stb, rb] = cold.post("/v1/embeddings",
                                 {{"input", {prefix, input, "light"}}, {"encoding_format", "base64"}});
      ASSERT_EQ(stb, 200) << rb.dump();
      ASSERT_EQ(rb["data"].size(), 3u);
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rb["data"][i]["index"], i);
      EXPECT_EQ(decode_base64_floats(rb["data"][1]["embedding"]), b);
      auto [sts, rs] = cold.post("/v1/embeddings", {{"input", "light"}});
      EXPECT_EQ(decode_base64_floats(rb["data"][2]["embedding"]), vector_of(rs["data"][0]));
    }
    // Mean and last pooling give different vectors for the same input.
    if (!pooling.empty()) {
      Server last(embedding_server("last"));
      EXPECT_NE(vector_of(last.post("/v1/embeddings", {{"input", "alpha beta"}}).second["data"][0]),
                vector_of(warm.post("/v1/embeddings", {{"input", "alpha beta"}}).second["data"][0]));
    }
  }
}

TEST(EmbeddingsApi, DimensionsSaltsAndErrors) {
  Server s(embedding_server());
  auto [st, full] = s.post("/v1/embeddings", {{"input", "alpha beta gamma"}});
  ASSERT_EQ(st, 200) << full.dump();
  auto [std_, cut] = s.post("/v1/embeddings", {{"input", "alpha beta gamma"}, {"dimensions", 16}});
  ASSERT_EQ(std_, 200);
  const std::vector<float> a = vector_of(full["data"][0]), b = vector_of(cut["data"][0]);
  ASSERT_EQ(b.size(), 16u);
  const double head = norm_of(std::vector<float>(a.begin(), a.begin() + 16));
  for (size_t i = 0; i < 16; ++i) EXPECT_NEAR(b[i], a[i] / head, 1e-5);
  EXPECT_EQ(full["object"], "list");
  EXPECT_EQ(full["data"][0]["object"], "embedding");
  EXPECT_EQ(full["usage"]["total_tokens"], full["usage"]["prompt_tokens"]);

  // Another tenant's salt reuses nothing; the same salt does.
  auto [st1, salted] = s.post("/v1/embeddings", {{"input", "alpha beta gamma"}, {"cache_salt", "t1"}});
  EXPECT_EQ(salted["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(vector_of(salted["data"][0]), a);
  auto [st2, again] = s.post("/v1/embeddings", {{"input", "alpha beta gamma"}, {"cache_salt", "t1"}});
  EXPECT_GT(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);

  auto error_param = [&](const json& body) {
    auto [code, r] = s.post("/v1/embeddings", body);
    EXPECT_EQ(code, 400) << r.dump();
    return r["error"]["param"];
  };
  EXPECT_EQ(error_param({{"input", "x"}, {"dimensions", 65}}), "dimensions");
  EXPECT_EQ(error_param({{"input", {{1, 2}, {999999}}}}), "input[1]");
  EXPECT_EQ(error_param({{"input", std::string(100000, 'a')}}), "input");  // beyond the context
  auto [stm, rm] = s.post("/v1/embeddings", {{"input", "x"}, {"model", "nope"}});
  EXPECT_EQ(stm, 404);
  // The inputs of one request are bounded in all (each is a job of its own).
  const json long_ids(std::vector<int32_t>(520, 7));
  EXPECT_EQ(error_param({{"input", json(std::vector<json>(256, long_ids))}}), "input");
  // The response's id, as OpenAI's x-request-id.
  httplib::Client c("127.0.0.1", s.port);
  auto with_id = c.Post("/v1/embeddings", json{{"input", "x"}}.dump(), "application/json");
  EXPECT_EQ(with_id->get_header_value("x-request-id").rfind("req_", 0), 0u);

  // Nothing is generated, so an input may fill the whole context.
  ServeOptions small = embedding_server();
  small.ctx_size = 64;
  Server s64(small);
  EXPECT_EQ(s64.post("/v1/embeddings", {{"input", std::vector<int32_t>(64, 9)}}).first, 200);
  auto [st65, r65] = s64.post("/v1/embeddings", {{"input", std::vector<int32_t>(65, 9)}});
  EXPECT_EQ(st65, 400);
  EXPECT_EQ(r65["error"]["code"], "context_length_exceeded");
  // cls pooling is refused: a causal model's first state ignores the input.
  ServeOptions cls = embedding_server("cls");
  EXPECT_NE(cls.validate(), "");
}

// A request of many jobs does not hold the others back: with one slot, a
// chat sent while a 120-input embeddings request is queued is answered
// after one of the inputs, long before the batch ends (requests take free
// slots in turn).
TEST(EmbeddingsApi, ABigBatchDoesNotHoldOtherRequestsBack) {
  ServeOptions options = embedding_server();
  options.parallel = 1;
  Server s(options);
  std::vector<json> inputs(120, json(std::vector<int32_t>(1000, 11)));
  for (size_t i = 0; i < inputs.size(); ++i) inputs[i][0] = static_cast<int32_t>(i);  // distinct: no reuse
  std::atomic<bool> batch_done{false};
  std::thread batch([&] {
    auto [st, r] = s.post("/v1/embeddings", {{"input", inputs}});
    EXPECT_EQ(st, 200) << r.dump().substr(0, 300);
    batch_done = true;
  });
  ASSERT_TRUE(test::eventually([&] { return s.metric("reprise_queue_depth") > 10; }, std::chrono::seconds(20)));
  auto [st, r] = s.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                 {"max_tokens", 2}});
  EXPECT_EQ(st, 200) << r.dump();
  EXPECT_FALSE(batch_done.load());
  EXPECT_GT(s.metric("reprise_queue_depth"), 0);
  batch.join();
}
