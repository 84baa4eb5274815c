// Tokenizer encode throughput on a few MB of deterministic mixed text: English-like prose, rare
// words, code, and the multilingual/emoji test corpus entries up to 512 bytes.
// tools/node/bench_tokenizer.mjs runs Hugging Face tokenizers on the same text (--dump-text) and
// checks our ids against theirs (--dump-ids).
//   tokenizer_bench [--tokenizer FILE] [--mb 4] [--reps 3] [--threads 2] [--dump-text F] [--dump-ids F]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

const char* kWords[] = {"the",
                        "of",
                        "and",
                        "to",
                        "a",
                        "in",
                        "is",
                        "that",
                        "for",
                        "it",
                        "as",
                        "was",
                        "with",
                        "be",
                        "by",
                        "on",
                        "not",
                        "he",
                        "this",
                        "are",
                        "or",
                        "his",
                        "from",
                        "at",
                        "which",
                        "but",
                        "have",
                        "an",
                        "had",
                        "they",
                        "you",
                        "were",
                        "their",
                        "one",
                        "all",
                        "we",
                        "can",
                        "her",
                        "has",
                        "there",
                        "been",
                        "if",
                        "more",
                        "when",
                        "will",
                        "would",
                        "who",
                        "so",
                        "no",
                        "model",
                        "token",
                        "server",
                        "request",
                        "memory",
                        "expert",
                        "attention",
                        "kernel",
                        "latency",
                        "throughput",
                        "weather",
                        "function",
                        "example",
                        "important",
                        "development",
                        "international",
                        "understanding",
                        "responsibility",
                        "characteristics",
                        "it's",
                        "don't",
                        "we're",
                        "they'll",
                        "I'm",
                        "you've",
                        "He'd",
                        "government",
                        "information",
                        "system",
                        "number",
                        "people",
                        "history",
                        "between",
                        "through",
                        "during",
                        "without",
                        "however",
                        "another"};
const char* kSyllables[] = {"ka",  "lo", "mi", "tra", "ve", "zun", "pho", "qui", "str", "ex", "ion", "ble",
                            "ght", "oo", "ae", "rk",  "ny", "sch", "wa",  "ze",  "pt",  "ul", "ick", "ous"};

std::string make_text(size_t bytes, const std::vector<std::string>& corpus) {
  std::mt19937 rng(20240601);  // the engine's output is fixed by the standard; no distributions used
  auto pick = [&](size_t n) { return size_t(rng() % n); };
  constexpr size_t nw = std::size(kWords);
  std::string s;
  s.reserve(bytes + 4096);
  while (s.size() < bytes) {
    const size_t kind = pick(10);
    if (kind <= 4) {  // prose, Zipf-like word choice
      const size_t n = 6 + pick(18);
      for (size_t i = 0; i < n; ++i) {
        std::string w = kWords[std::min(nw - 1, pick(nw) * pick(nw) / nw)];
        if (i == 0) w[0] = char(std::toupper(static_cast<unsigned char>(w[0])));
        if (pick(25) == 0) w = std::to_string(rng() % 100000);
        s += (i ? " " : "") + w;
        if (i + 1 < n && pick(12) == 0) s += ",";
      }
      s += pick(6) == 0 ? "?" : ".";
    } else if (kind == 5) {  // rare words: many merges
      const size_t n = 4 + pick(10);
      for (size_t i = 0; i < n; ++i) {
        s += ' ';
        for (size_t k = 0, m = 2 + pick(5); k < m; ++k) s += kSyllables[pick(std::size(kSyllables))];
      }
      s += '.';
    } else if (kind <= 8) {
      s += corpus[pick(corpus.size())];
    } else {  // code-like
      s += "\n    if (request_" + std::to_string(pick(100)) +
           ".max_tokens > limit) {\n        return "
           "Status::kInvalid;  // " +
           kWords[pick(nw)] + "\n    }\n";
    }
    s += pick(4) == 0 ? "\n\n" : " ";
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_path = std::string(MXSERVE_ASSET_DIR) + "/tokenizer/tokenizer.json";
  std::string corpus_path = std::string(MX_SOURCE_DIR) + "/tests/data/tokenizer/corpus.jsonl";
  std::string dump_text, dump_ids;
  double mb = 4;
  int reps = 3, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--tokenizer")
      tok_path = v;
    else if (a == "--mb")
      mb = std::stod(v);
    else if (a == "--reps")
      reps = std::max(1, std::stoi(v));
    else if (a == "--threads")
      threads = std::max(1, std::stoi(v));
    else if (a == "--dump-text")
      dump_text = v;
    else if (a == "--dump-ids")
      dump_ids = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    double load_best = 1e9;
    std::shared_ptr<const mx::Tokenizer> tok;
    for (int r = 0; r < 3; ++r) {
      const auto t = Clock::now();
      tok = mx::Tokenizer::load(tok_path);
      load_best = std::min(load_best, seconds_since(t));
    }
    std::vector<std::string> corpus;
    std::ifstream cf(corpus_path);
    for (std::string line; std::getline(cf, line);)
      if (!line.empty()) {
        // The corpus's pathological entries (2000-letter words...) would dominate the mix.
        auto t = nlohmann::json::parse(line)["text"].get<std::string>();
        if (t.size() <= 512) corpus.push_back(std::move(t));
      }
    if (corpus.empty()) mx::fail("no corpus at {}", corpus_path);
    const std::string text = make_text(size_t(mb * 1024 * 1024), corpus);
    if (!dump_text.empty()) std::ofstream(dump_text, std::ios::binary) << text;

    std::printf("tokenizer: %s\ntext: %.2f MB (%zu bytes) mixed, seed fixed\n", tok_path.c_str(),
                double(text.size()) / 1e6, text.size());
    std::printf("load: %.3f s (best of 3)\n", load_best);

    std::vector<int32_t> ids;
    double best = 1e9;
    for (int r = 0; r < reps; ++r) {
      const auto t = Clock::now();
      ids = tok->encode(text, false);
      best = std::min(best, seconds_since(t));
    }
    std::printf("encode 1 thread : %7.2f MB/s %7.3f M tokens/s (%zu tokens, %.3f s, best of %d)\n",
                double(text.size()) / 1e6 / best, double(ids.size()) / 1e6 / best, ids.size(), best, reps);
    if (!dump_ids.empty()) {
      std::ofstream f(dump_ids);
      f << "[";
      for (size_t i = 0; i < ids.size(); ++i) f << (i ? "," : "") << ids[i];
      f << "]\n";
    }

    if (threads > 1) {  // the same text cut at newlines into one chunk per thread
      std::vector<std::string_view> chunks;
      size_t start = 0;
      for (int k = 1; k <= threads; ++k) {
        size_t end = k == threads ? text.size() : text.find('\n', text.size() * size_t(k) / size_t(threads));
        if (end == std::string::npos) end = text.size();
        chunks.push_back(std::string_view(text).substr(start, end - start));
        start = end;
      }
      double best_mt = 1e9;
      size_t ntok = 0;
      for (int r = 0; r < reps; ++r) {
        std::vector<size_t> counts(chunks.size());
        const auto t = Clock::now();
        std::vector<std::thread> th;
        for (size_t k = 0; k < chunks.size(); ++k)
          th.emplace_back([&, k] { counts[k] = tok->encode(chunks[k], false).size(); });
        for (auto& x : th) x.join();
        best_mt = std::min(best_mt, seconds_since(t));
        ntok = 0;
        for (size_t c : counts) ntok += c;
      }
      std::printf("encode %d threads: %7.2f MB/s %7.3f M tokens/s (best of %d)\n", threads,
                  double(text.size()) / 1e6 / best_mt, double(ntok) / 1e6 / best_mt, reps);
    }
  } catch (const mx::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
