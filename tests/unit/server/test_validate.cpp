// Request validation (reliability.md table A, the sampling rows) and the metrics text.
#include <gtest/gtest.h>

#include "core/error.h"
#include "server/metrics.h"
#include "server/validate.h"

namespace mx::server {
namespace {

using json = nlohmann::json;

std::string bad_param(const std::string& body_text, bool chat = true) {
  try {
    parse_common(json::parse(body_text), chat, Limits{});
  } catch (const InvalidRequest& e) {
    return e.param();
  }
  return "<accepted>";
}

TEST(Validate, TableA) {
  EXPECT_EQ(bad_param("[1,2]"), "");
  EXPECT_EQ(bad_param("42"), "");
  EXPECT_EQ(bad_param(R"({"max_tokens":0})"), "max_tokens");
  EXPECT_EQ(bad_param(R"({"max_tokens":-5})"), "max_tokens");
  EXPECT_EQ(bad_param(R"({"max_completion_tokens":0})"), "max_completion_tokens");
  EXPECT_EQ(bad_param(R"({"temperature":-1})"), "temperature");
  EXPECT_EQ(bad_param(R"({"temperature":3.0})"), "temperature");
  EXPECT_EQ(bad_param(R"({"temperature":"1"})"), "temperature");
  EXPECT_EQ(bad_param(R"({"top_p":0})"), "top_p");
  EXPECT_EQ(bad_param(R"({"top_p":1.5})"), "top_p");
  EXPECT_EQ(bad_param(R"({"top_k":-2})"), "top_k");
  EXPECT_EQ(bad_param(R"({"top_k":2.5})"), "top_k");
  EXPECT_EQ(bad_param(R"({"min_p":1.5})"), "min_p");
  EXPECT_EQ(bad_param(R"({"presence_penalty":3})"), "presence_penalty");  // row 18
  EXPECT_EQ(bad_param(R"({"frequency_penalty":-2.5})"), "frequency_penalty");
  EXPECT_EQ(bad_param(R"({"repetition_penalty":0})"), "repetition_penalty");
  EXPECT_EQ(bad_param(R"({"repetition_penalty":-1})"), "repetition_penalty");
  EXPECT_EQ(bad_param(R"({"repetition_penalty":"1.1"})"), "repetition_penalty");
  EXPECT_EQ(bad_param(R"({"n":0})"), "n");
  EXPECT_EQ(bad_param(R"({"n":"2"})"), "n");
  EXPECT_EQ(bad_param(R"({"n":1000000})"), "n");
  EXPECT_EQ(bad_param(R"({"best_of":1000})"), "best_of");
  EXPECT_EQ(bad_param(R"({"logprobs":true,"top_logprobs":1000000})"), "top_logprobs");
  EXPECT_EQ(bad_param(R"({"logprobs":-1})", false), "logprobs");
  EXPECT_EQ(bad_param(R"({"stop":[""]})"), "stop");
  EXPECT_EQ(bad_param(R"({"stop":[1]})"), "stop");
  EXPECT_EQ(bad_param(R"({"seed":1180591620717411303424})"), "seed");
  EXPECT_EQ(bad_param(R"({"logit_bias":{"abc":5}})"), "logit_bias");
  EXPECT_EQ(bad_param(R"({"stream":"yes"})"), "stream");
  EXPECT_EQ(bad_param(R"({"stop_token_ids":["a"]})"), "stop_token_ids");  // row 24
  EXPECT_EQ(bad_param(R"({"stop_token_ids":[-1]})"), "stop_token_ids");
  EXPECT_EQ(bad_param(R"({"stop_token_ids":7})"), "stop_token_ids");
  EXPECT_EQ(bad_param(R"({"stop_token_ids":[7,9]})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"min_tokens":50,"max_tokens":10})"), "min_tokens");  // row 25
  EXPECT_EQ(bad_param(R"({"min_tokens":-1})"), "min_tokens");
  EXPECT_EQ(bad_param(R"({"min_tokens":0})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"min_tokens":10,"max_tokens":10})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"ignore_eos":1})"), "ignore_eos");
  EXPECT_EQ(bad_param(R"({"ignore_eos":"true"})"), "ignore_eos");
  EXPECT_EQ(bad_param(R"({"ignore_eos":true})", false), "<accepted>");
  EXPECT_EQ(bad_param(R"({"response_format":{"type":"text"}})"), "<accepted>");  // the default, sent by some SDKs
  EXPECT_EQ(bad_param(R"({"response_format":{"type":"json_object"}})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x-1_Y","schema":{},"strict":true}}})"),
            "<accepted>");
  EXPECT_EQ(bad_param(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x"}}})"),
            "response_format.json_schema.schema");  // row 28
  EXPECT_EQ(bad_param(R"({"response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}})"),
            "response_format.json_schema.name");
  EXPECT_EQ(bad_param(R"({"response_format":{"type":"json_schema","json_schema":{"schema":{}}}})"),
            "response_format.json_schema.name");
  EXPECT_EQ(bad_param(R"({"response_format":{"type":"json_schema"}})"), "response_format.json_schema");
  EXPECT_EQ(bad_param(R"({"response_format":{"type":"xml"}})"), "response_format");
  EXPECT_EQ(bad_param(R"({"response_format":"text"})"), "response_format");
  EXPECT_EQ(bad_param(R"({"response_format":{}})"), "response_format");
  EXPECT_FALSE(parse_common(json::parse(R"({"response_format":{"type":"text"}})"), true, Limits{}).json_schema);
  EXPECT_TRUE(parse_common(json::parse(R"({"response_format":{"type":"json_object"}})"), true, Limits{}).json_schema);
  for (const char* schema : {R"({"type":"strin"})", R"({"$ref":"#/$defs/none"})", R"({"type":"array","minItems":3,"maxItems":2})",
                             R"({"properties":{"a":{}},"required":["b"]})", R"({"enum":[]})", R"(false)", R"({"allOf":[{},{}]})"})
    EXPECT_EQ(bad_param(std::string(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)") +
                        schema + "}}}"),
              "response_format.json_schema.schema")
        << schema;
  // vLLM's extensions: guided_json (a schema or its text), guided_choice, structured_outputs; one at most.
  EXPECT_EQ(bad_param(R"({"guided_json":{"type":"object"}})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"guided_json":"{\"type\":\"integer\"}"})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"guided_choice":["yes","no"]})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"structured_outputs":{"choice":["a"]}})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"structured_outputs":{"json_object":true}})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"guided_json":"{not json"})"), "guided_json");
  EXPECT_EQ(bad_param(R"({"guided_json":{"type":"nope"}})"), "guided_json");
  EXPECT_EQ(bad_param(R"({"guided_choice":[]})"), "guided_choice");
  EXPECT_EQ(bad_param(R"({"guided_choice":["a",1]})"), "guided_choice");
  EXPECT_EQ(bad_param(R"({"guided_choice":[""]})"), "guided_choice");
  EXPECT_EQ(bad_param(R"({"guided_regex":"a+"})"), "<accepted>");
  EXPECT_EQ(bad_param(R"({"structured_outputs":{"regex":"a+"}})"), "<accepted>");
  EXPECT_EQ(bad_param(R"j({"guided_regex":"(?=a)"})j"), "guided_regex");
  EXPECT_EQ(bad_param(R"({"guided_regex":""})"), "guided_regex");
  EXPECT_EQ(bad_param(R"({"guided_grammar":"root ::= x"})"), "guided_grammar");
  EXPECT_EQ(bad_param(R"j({"structured_outputs":{"regex":"(a"}})j"), "structured_outputs.regex");
  EXPECT_EQ(bad_param(R"({"structured_outputs":{"grammar":"root ::= x"}})"), "structured_outputs.grammar");
  EXPECT_EQ(bad_param(R"({"guided_json":{"type":"string","pattern":"\\1"}})"), "guided_json");
  EXPECT_EQ(bad_param(R"({"structured_outputs":{}})"), "structured_outputs");
  EXPECT_EQ(bad_param(R"({"structured_outputs":{"json":{},"choice":["a"]}})"), "structured_outputs");
  EXPECT_EQ(bad_param(R"({"structured_outputs":{"json":{"type":"nope"}}})"), "structured_outputs.json");
  EXPECT_EQ(bad_param(R"({"response_format":{"type":"json_object"},"guided_choice":["a"]})"), "guided_choice");
  EXPECT_FALSE(parse_common(json::parse(R"({"response_format":{"type":"text"},"guided_choice":["a"]})"), true, Limits{})
                   .json_schema->literals(0)
                   .empty());
  json many = {{"stop", json::array()}};
  for (int i = 0; i < 1000; ++i) many["stop"].push_back("x");
  EXPECT_EQ(bad_param(many.dump()), "stop");
}

TEST(Validate, AcceptsGoodValues) {
  auto p = parse_common(json::parse(R"({"temperature":1e-9,"top_p":1,"top_k":-1,"seed":-1,"n":2,"stop":"END",
    "logprobs":true,"top_logprobs":5,"max_completion_tokens":7,"stream":true,"stream_options":{"include_usage":true}})"),
                        true, Limits{});
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.01f);
  EXPECT_EQ(p.sampling.top_k, 0);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(p.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(p.stream && p.include_usage && p.sampling.logprobs);
  EXPECT_EQ(p.sampling.top_logprobs, 5);
  EXPECT_FALSE(p.sampling.penalized());
  const auto q = parse_common(json::parse(R"({"presence_penalty":-2,"frequency_penalty":0.5,"repetition_penalty":1.2})"),
                              false, Limits{});
  EXPECT_EQ(q.sampling.presence_penalty, -2.f);
  EXPECT_EQ(q.sampling.frequency_penalty, 0.5f);
  EXPECT_EQ(q.sampling.repetition_penalty, 1.2f);
  EXPECT_TRUE(q.sampling.penalized());
}

// logit_bias (row 26): an object of decimal token ids; biases clamped to [-100, 100], sorted by id.
TEST(Validate, LogitBias) {
  for (const char* b : {R"({"logit_bias":{"-1":5}})", R"({"logit_bias":{"1.5":5}})", R"({"logit_bias":{"":5}})",
                        R"({"logit_bias":{"7x":5}})", R"({"logit_bias":{"99999999999":5}})", R"({"logit_bias":{"1":"5"}})",
                        R"({"logit_bias":{"1":5,"01":3}})", R"({"logit_bias":[1,5]})", R"({"logit_bias":5})"})
    EXPECT_EQ(bad_param(b), "logit_bias") << b;
  json many = {{"logit_bias", json::object()}};
  for (int i = 0; i < 301; ++i) many["logit_bias"][std::to_string(i)] = 1;
  EXPECT_EQ(bad_param(many.dump()), "logit_bias");
  EXPECT_EQ(bad_param(R"({"logit_bias":null})"), "<accepted>");
  const auto p = parse_common(json::parse(R"({"logit_bias":{"200002":-1e9,"5":2.5,"17":100}})"), false, Limits{});
  ASSERT_EQ(p.logit_bias.size(), 3u);
  EXPECT_EQ(p.logit_bias[0].id, 5);
  EXPECT_EQ(p.logit_bias[0].bias, 2.5f);
  EXPECT_EQ(p.logit_bias[1].id, 17);
  EXPECT_EQ(p.logit_bias[1].bias, 100.f);
  EXPECT_EQ(p.logit_bias[2].id, 200002);
  EXPECT_EQ(p.logit_bias[2].bias, -100.f);
}

TEST(Metrics, PrometheusText) {
  Metrics m;
  m.ttft(0.02);
  runtime::EngineStats st;
  st.running = 3;
  st.preemptions = 2;
  st.prefix_cache_queries = 40;
  st.prefix_cache_hits = 16;
  std::string t = m.text("demo", st);
  EXPECT_NE(t.find("# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{model_name=\"demo\"} 40\n"),
            std::string::npos);
  EXPECT_NE(t.find("vllm:prefix_cache_hits_total{model_name=\"demo\"} 16\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:num_requests_running{model_name=\"demo\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:num_preemptions_total{model_name=\"demo\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_bucket{model_name=\"demo\",le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_count{model_name=\"demo\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:e2e_request_latency_seconds_count{model_name=\"demo\"} 0\n"), std::string::npos);
}

}  // namespace
}  // namespace mx::server
