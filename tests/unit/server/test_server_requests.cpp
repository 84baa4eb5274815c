// Request options end to end through the HTTP server on the fake runner (tokens count up by one):
// ignore_eos, the vLLM extension load benchmarks use, keeps generating through the model's eos ids.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "harmony/json_constraint.h"
#include "tests/unit/server/fake_server.h"

namespace mx::server {
namespace {

using json = nlohmann::json;

TEST(ServerRequests, IgnoreEosGeneratesThroughTheEosIds) {
  if (tokenizer_path().empty()) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  FakeServer fs(ServerOptions{}, {10});  // eos id 10: the prompt [5, 6, 7] reaches it third
  const int port = fs.port();

  const std::string stops = http(port, "POST", "/v1/completions", R"({"prompt": [5, 6, 7], "max_tokens": 8})");
  EXPECT_NE(stops.find(R"("completion_tokens":3)"), std::string::npos) << stops;
  EXPECT_NE(stops.find(R"("finish_reason":"stop")"), std::string::npos) << stops;
  for (const char* stream : {"false", "true"}) {
    SCOPED_TRACE(stream);
    const std::string body = std::string(R"({"prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": true, "stream": )") +
                             stream + R"(, "stream_options": {"include_usage": true}})";
    const std::string r = http(port, "POST", "/v1/completions", body);
    EXPECT_NE(r.find(R"("completion_tokens":8)"), std::string::npos) << r;
    EXPECT_NE(r.find(R"("finish_reason":"length")"), std::string::npos) << r;
  }
  // A request's own stop_token_ids still stop it.
  const std::string own = http(port, "POST", "/v1/completions",
                               R"({"prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": true, "stop_token_ids": [12]})");
  EXPECT_NE(own.find(R"("completion_tokens":5)"), std::string::npos) << own;
  EXPECT_NE(own.find(R"("finish_reason":"stop")"), std::string::npos) << own;
  const std::string bad = http(port, "POST", "/v1/completions", R"({"prompt": [5], "ignore_eos": "yes"})");
  EXPECT_NE(bad.find("400"), std::string::npos) << bad;
  EXPECT_NE(bad.find("ignore_eos"), std::string::npos) << bad;
}

// The body of a raw HTTP/1.1 response, its chunks joined.
std::string body_of(const std::string& raw) {
  size_t at = raw.find("\r\n\r\n");
  if (at == std::string::npos) return "";
  at += 4;
  if (raw.find("Transfer-Encoding: chunked") == std::string::npos) return raw.substr(at);
  std::string out;
  for (;;) {
    const size_t eol = raw.find("\r\n", at);
    if (eol == std::string::npos) break;
    const size_t n = std::stoul(raw.substr(at, eol - at), nullptr, 16);
    if (n == 0) break;
    out += raw.substr(eol + 2, n);
    at = eol + 2 + n + 2;
  }
  return out;
}

// response_format json_object on a raw completion: the text is held to JSON from its first token (the fake
// runner takes the first allowed id from its count: "{}", whitespace, then the eos id once it is complete),
// so it is a valid prefix of one object, and a complete one when it stops; json_schema to its schema; the plain
// request is not held.
TEST(ServerRequests, JsonObjectHoldsACompletionToJson) {
  if (tokenizer_path().empty()) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  FakeServer fs(ServerOptions{}, {200002});
  const int port = fs.port();
  const char* kSchema = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"enum":["x","y"]}},"required":["a","b"]})";
  for (const std::string& rf : {std::string(R"({"type":"json_object"})"),
                               std::string(R"({"type":"json_schema","json_schema":{"name":"n","schema":)") + kSchema + "}}"}) {
    SCOPED_TRACE(rf);
    const auto sc = rf.find("json_schema") == std::string::npos
                        ? harmony::JsonSchema::any_object()
                        : harmony::JsonSchema::compile(json::parse(kSchema), "schema");
    const std::string raw = http(port, "POST", "/v1/completions",
                                 std::string(R"({"prompt": [5, 6, 7], "max_tokens": 60, "response_format": )") + rf + "}");
    const json r = json::parse(body_of(raw), nullptr, false);
    ASSERT_TRUE(r.is_object() && r.contains("choices")) << raw;
    const std::string text = r["choices"][0]["text"];
    harmony::JsonState st = harmony::json_start(*sc);
    size_t ok = 0;
    while (ok < text.size() && harmony::json_feed(*sc, st, uint8_t(text[ok]))) ++ok;
    EXPECT_EQ(ok, text.size()) << text;
    EXPECT_FALSE(text.empty());
    if (r["choices"][0]["finish_reason"] == "stop") {
      EXPECT_TRUE(harmony::json_done(*sc, st)) << text;
    }
  }
  const json plain = json::parse(body_of(http(port, "POST", "/v1/completions", R"({"prompt": [5, 6, 7], "max_tokens": 4})")));
  EXPECT_EQ(plain["usage"]["completion_tokens"], 4);  // tokens 8 to 11, none of them '{'
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace mx::server
