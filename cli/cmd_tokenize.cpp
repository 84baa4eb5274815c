// mxserve tokenize: text on stdin -> JSON array of token ids (or, with --decode, the reverse).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace mx::cli {
namespace {

struct TokenizeOptions {
  std::string model_dir;
  std::string tokenizer_file;
  bool special = false;
  bool decode = false;
};

std::string read_stdin() {
  std::string s{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  if (std::cin.bad()) fail("cannot read standard input");
  return s;
}

void run_tokenize(const TokenizeOptions& o) {
  std::string path = o.tokenizer_file;
  if (path.empty() && !o.model_dir.empty()) path = o.model_dir + "/tokenizer.json";
  if (path.empty()) path = std::string(MXSERVE_ASSET_DIR) + "/tokenizer/tokenizer.json";
  const auto tok = Tokenizer::load(path);
  const std::string in = read_stdin();

  if (o.decode) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail("--decode expects a JSON array of token ids on stdin: {}", e.what());
    }
    if (!j.is_array()) fail("--decode expects a JSON array of token ids on stdin");
    std::vector<int32_t> ids;
    for (const auto& v : j) {
      if (!v.is_number_integer()) fail("--decode: {} is not an integer token id", v.dump());
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= tok->vocab_size())
        fail("--decode: token id {} is out of range [0, {})", id, tok->vocab_size());
      ids.push_back(int32_t(id));
    }
    const std::string text = tok->decode(ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }

  // The library encodes invalid bytes as byte tokens; at the command line it is almost always a
  // wrong encoding, so say so instead.
  const size_t bad = utf8::first_invalid(in);
  if (bad != in.size()) fail("standard input is not valid UTF-8 (first invalid byte at offset {})", bad);
  const std::vector<int32_t> ids = tok->encode(in, o.special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize standard input (read verbatim, trailing newline included) and print the ids as a JSON array");
  auto* model = cmd->add_option("--model", opts->model_dir, "model directory holding tokenizer.json");
  cmd->add_option("--tokenizer", opts->tokenizer_file,
                  "tokenizer.json file (default: the one scripts/setup.sh fetches)")
      ->excludes(model);
  cmd->add_flag("--special", opts->special, "match special tokens such as <|start|> as single ids");
  cmd->add_flag("--decode", opts->decode, "read a JSON array of ids and print the decoded text");
  cmd->callback([opts] { run_tokenize(*opts); });
}

}  // namespace mx::cli
