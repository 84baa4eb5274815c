// mxserve render: an OpenAI chat request body on stdin -> the harmony prompt text (and, with
// --tokens, its token ids as a JSON array on a second line).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "harmony/harmony.h"
#include "tokenizer/tokenizer.h"

namespace mx::cli {
namespace {

struct RenderOptions {
  std::string model_dir;
  std::string date;
  bool tokens = false;
};

void run_render(const RenderOptions& o) {
  if (!o.date.empty() && !std::regex_match(o.date, std::regex(R"(\d{4}-\d{2}-\d{2})")))
    fail("--date must be YYYY-MM-DD, got '{}'", o.date);
  std::string path = o.model_dir.empty() ? std::string(MXSERVE_ASSET_DIR) + "/tokenizer/tokenizer.json"
                                         : o.model_dir + "/tokenizer.json";
  std::string in{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  if (std::cin.bad()) fail("cannot read standard input");
  nlohmann::ordered_json body;
  try {
    body = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("request body is not valid JSON: {}", e.what());
  }
  harmony::ChatRequest req;
  try {
    req = harmony::chat_request_from_json(body);
  } catch (const InvalidRequest& e) {
    fail("invalid request ({}): {}", e.param().empty() ? "body" : e.param(), e.what());
  }
  req.current_date = o.date;
  const auto tok = Tokenizer::load(path);
  const harmony::Rendered r = harmony::render_chat(req, *tok);
  std::fwrite(r.text.data(), 1, r.text.size(), stdout);
  std::fputc('\n', stdout);
  if (o.tokens) std::printf("%s\n", nlohmann::json(r.tokens).dump().c_str());
}

}  // namespace

void add_render_command(CLI::App& app) {
  auto opts = std::make_shared<RenderOptions>();
  auto* cmd = app.add_subcommand("render", "Render an OpenAI chat request (stdin) into the harmony prompt");
  cmd->add_option("--model", opts->model_dir, "model directory holding tokenizer.json (default: .assets/tokenizer)");
  cmd->add_option("--date", opts->date, "current date YYYY-MM-DD for the system message (default: omitted)");
  cmd->add_flag("--tokens", opts->tokens, "also print the token ids as a JSON array");
  cmd->callback([opts] { run_render(*opts); });
}

}  // namespace mx::cli
