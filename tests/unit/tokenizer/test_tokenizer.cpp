// Tokenizer tests against the real gpt-oss tokenizer.json (fetched by scripts/setup.sh) and goldens
// made by Hugging Face tokenizers (tools/node/make_tokenizer_goldens.mjs).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using Ids = std::vector<int32_t>;
const std::string kSrc = MX_SOURCE_DIR;
const std::string kTokPath = kSrc + "/.assets/tokenizer/tokenizer.json";

std::shared_ptr<const mx::Tokenizer> real_tokenizer() {
  static std::shared_ptr<const mx::Tokenizer> tok =
      std::filesystem::exists(kTokPath) ? mx::Tokenizer::load(kTokPath) : nullptr;
  return tok;
}

#define REQUIRE_REAL_TOKENIZER()                                                \
  auto tok = real_tokenizer();                                                  \
  if (!tok) {                                                                   \
    GTEST_SKIP() << kTokPath << " is absent: run scripts/setup.sh to fetch it"; \
  }

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Tokenizer, MatchesHuggingFaceGoldens) {
  REQUIRE_REAL_TOKENIZER();
  const auto corpus = read_jsonl(kSrc + "/tests/data/tokenizer/corpus.jsonl");
  const auto goldens = read_jsonl(kSrc + "/tests/data/tokenizer/goldens.jsonl");
  ASSERT_GE(corpus.size(), 60u);
  ASSERT_EQ(corpus.size(), goldens.size()) << "regenerate goldens.jsonl after editing corpus.jsonl";
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string name = corpus[i]["name"];
    const std::string text = corpus[i]["text"];
    ASSERT_EQ(goldens[i]["name"], name);
    EXPECT_EQ(tok->encode(text, false), goldens[i]["ordinary"].get<Ids>()) << name;
    EXPECT_EQ(tok->encode(text, true), goldens[i]["special"].get<Ids>()) << name;
    EXPECT_EQ(tok->decode(goldens[i]["special"].get<Ids>()), goldens[i]["decoded"].get<std::string>())
        << name;
    EXPECT_EQ(tok->decode(goldens[i]["ordinary"].get<Ids>()), text) << name;
  }
}

// A token's bytes as the vocabulary spells them (what /tokenize's return_token_strs gives).
TEST(Tokenizer, ByteLevelTextSpellsBytesAsTheVocabulary) {
  EXPECT_EQ(mx::tok::byte_level_text(" world"), "\u0120world");
  EXPECT_EQ(mx::tok::byte_level_text("a\nb"), "a\u010ab");
  EXPECT_EQ(mx::tok::byte_level_text("\xc3\xa9"), "\u00c3\u00a9");  // 'é' as its two bytes' stand-ins
  EXPECT_EQ(mx::tok::byte_level_text(""), "");
}

// The PCRE2 split (with Oniguruma's \s) gives HF's pre-tokens, compared in byte-level form.
TEST(Tokenizer, PretokenizerMatchesHuggingFacePieces) {
  REQUIRE_REAL_TOKENIZER();
  const auto& pre = static_cast<const mx::tok::BpeTokenizer&>(*tok).pretokenizer();
  const auto& alpha = mx::tok::byte_level_alphabet();
  const auto corpus = read_jsonl(kSrc + "/tests/data/tokenizer/corpus.jsonl");
  const auto goldens = read_jsonl(kSrc + "/tests/data/tokenizer/goldens.jsonl");
  ASSERT_EQ(corpus.size(), goldens.size());
  for (size_t i = 0; i < corpus.size(); ++i) {
    std::vector<std::string> pieces;
    pre.split(
        corpus[i]["text"].get<std::string>(),
        [](void* c, std::string_view p) { static_cast<std::vector<std::string>*>(c)->emplace_back(p); },
        &pieces);
    for (auto& p : pieces) {
      std::string mapped;
      for (unsigned char b : p) mx::utf8::append_code_point(mapped, alpha.byte_to_cp[b]);
      p = mapped;
    }
    EXPECT_EQ(pieces, goldens[i]["pieces"].get<std::vector<std::string>>()) << corpus[i]["name"];
  }
}

// Prefixes of id sequences that cut characters: decode() == HF's lossy decode.
TEST(Tokenizer, LossyDecodeMatchesHuggingFace) {
  REQUIRE_REAL_TOKENIZER();
  const auto cases = read_jsonl(kSrc + "/tests/data/tokenizer/decode_goldens.jsonl");
  ASSERT_GT(cases.size(), 50u);
  int lossy = 0;
  for (const auto& c : cases) {
    const Ids ids = c["ids"].get<Ids>();
    const std::string expect = c["text"];
    EXPECT_EQ(tok->decode(ids), expect) << c["ids"].dump();
    lossy += expect.find("\xEF\xBF\xBD") != std::string::npos;
  }
  EXPECT_GT(lossy, 10) << "the decode goldens should exercise U+FFFD replacement";
}

TEST(Tokenizer, SpecFacts) {
  REQUIRE_REAL_TOKENIZER();
  EXPECT_EQ(tok->encode("<|start|>assistant<|channel|>final<|message|>", true),
            (Ids{200006, 173781, 200005, 17196, 200008}));
  EXPECT_EQ(tok->encode(" to=lookup_weather", false), (Ids{316, 28, 29712, 170154}));
  EXPECT_EQ(tok->vocab_size(), 200019);
  EXPECT_EQ(tok->token_id("<|start|>"), 200006);
  EXPECT_EQ(tok->token_id("<|message|>"), 200008);
  EXPECT_EQ(tok->token_id("<|return|>"), 200002);
  EXPECT_EQ(tok->token_id("<|call|>"), 200012);
  EXPECT_EQ(tok->token_id("assistant"), 173781);
  EXPECT_EQ(tok->token_id("no such token here!"), std::nullopt);
  EXPECT_EQ(tok->token_bytes(200007), "<|end|>");
  EXPECT_EQ(tok->token_bytes(220), " ");
  EXPECT_TRUE(tok->is_special(200006));
  EXPECT_FALSE(tok->is_special(173781));
  EXPECT_FALSE(tok->is_special(-1));
  EXPECT_FALSE(tok->is_special(tok->vocab_size()));
  // Without allow_special the marker is ordinary text: several ids, none special.
  const Ids plain = tok->encode("<|start|>", false);
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_FALSE(tok->is_special(id));
  EXPECT_EQ(tok->decode(plain), "<|start|>");
}

TEST(Tokenizer, RoundTripsValidUtf8) {
  REQUIRE_REAL_TOKENIZER();
  for (const auto& c : read_jsonl(kSrc + "/tests/data/tokenizer/corpus.jsonl")) {
    const std::string text = c["text"];
    EXPECT_EQ(tok->decode(tok->encode(text, false)), text) << c["name"];
    EXPECT_EQ(tok->decode(tok->encode(text, true)), text) << c["name"];
    EXPECT_EQ(tok->decode_bytes(tok->encode(text, true)), text) << c["name"];
  }
  // Random valid UTF-8 over a mix of ranges.
  std::mt19937 rng(7);
  const uint32_t ranges[][2] = {{0x20, 0x7E},       {0x09, 0x0D},     {0xA0, 0x24F},    {0x400, 0x4FF},
                                {0x600, 0x6FF},     {0x900, 0x97F},   {0x3040, 0x30FF}, {0x4E00, 0x4FFF},
                                {0x1F300, 0x1F6FF}, {0x2000, 0x206F}, {0xAC00, 0xAD00}, {0x10000, 0x10FFFF}};
  for (int t = 0; t < 200; ++t) {
    std::string s;
    const int len = int(rng() % 60);
    for (int k = 0; k < len; ++k) {
      const auto& r = ranges[rng() % std::size(ranges)];
      uint32_t cp = r[0] + rng() % (r[1] - r[0] + 1);
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
      mx::utf8::append_code_point(s, cp);
    }
    EXPECT_EQ(tok->decode(tok->encode(s, false)), s);
  }
}

// Policy (tokenizer.h): each byte of an invalid UTF-8 sequence is encoded as its own byte token
// and acts as a pre-token boundary; decode() shows U+FFFD, decode_bytes() gives the bytes back.
TEST(Tokenizer, InvalidUtf8IsEncodedAsByteTokens) {
  REQUIRE_REAL_TOKENIZER();
  const std::string bad =
      "ab\xff"
      "cd\xe4\xb8"
      " \x80\xc0\xaf";
  const Ids ids = tok->encode(bad, false);
  EXPECT_EQ(tok->decode_bytes(ids), bad);
  Ids expect;
  for (const char* piece : {"ab", "\xff", "cd", "\xe4", "\xb8", " ", "\x80", "\xc0", "\xaf"}) {
    const Ids p = tok->encode(piece, false);
    expect.insert(expect.end(), p.begin(), p.end());
    if (std::string_view(piece).size() == 1) {
      EXPECT_EQ(p.size(), 1u) << "byte token for " << piece;
    }
  }
  EXPECT_EQ(ids, expect);
  // The truncated CJK prefix E4 B8 is one maximal subpart: one U+FFFD, like Rust's lossy decode.
  EXPECT_EQ(tok->decode(ids),
            "ab\xEF\xBF\xBD"
            "cd\xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok->encode(bad, true), ids);
}

// Any byte string survives encode -> decode_bytes, with or without specials.
TEST(Tokenizer, ArbitraryBytesRoundTrip) {
  REQUIRE_REAL_TOKENIZER();
  std::mt19937 rng(3);
  const std::string pool[] = {"a", " ", "\n", "\xff", "\x80", "\xe4", "\xb8\xad", "\xf0\x9f", "<|", "end|>",
                              "<|end|>", "'s", "1", "\xc3", "\xa9", "\t", "Z"};
  for (int t = 0; t < 500; ++t) {
    std::string s;
    for (int k = int(rng() % 40); k > 0; --k) s += pool[rng() % std::size(pool)];
    EXPECT_EQ(tok->decode_bytes(tok->encode(s, false)), s);
    EXPECT_EQ(tok->decode_bytes(tok->encode(s, true)), s);
    std::string lossy;
    mx::utf8::append_lossy(lossy, s);
    EXPECT_EQ(tok->decode(tok->encode(s, true)), lossy);
  }
}

TEST(Tokenizer, DecodeRejectsOutOfRangeIds) {
  REQUIRE_REAL_TOKENIZER();
  EXPECT_THROW(tok->decode({1, -1}), mx::Error);
  EXPECT_THROW(tok->decode_bytes({tok->vocab_size()}), mx::Error);
  EXPECT_THROW(tok->token_bytes(1 << 30), mx::Error);
}

TEST(Tokenizer, IncrementalDecoderNeverSplitsCharacters) {
  REQUIRE_REAL_TOKENIZER();
  const std::string texts[] = {
      "🧑🏽‍💻 writes 𝟘𝟙𝟚 and 👨‍👩‍👧‍👦 then 鑫龘 — ok", "Ⅻ🜁🝖 ꙮ 𓀀𓁐 ½",
      "人工智能是计算机科学的一个分支", "<|start|>assistant<|message|>🦜🦩<|end|>"};
  bool saw_partial = false;
  for (const std::string& text : texts) {
    const Ids ids = tok->encode(text, true);
    mx::IncrementalDecoder dec(tok);
    std::string all;
    for (int32_t id : ids) {
      if (!mx::utf8::is_valid(tok->token_bytes(id))) saw_partial = true;
      const std::string piece = dec.push(id);
      EXPECT_TRUE(mx::utf8::is_valid(piece)) << text;
      all += piece;
    }
    all += dec.flush();
    EXPECT_EQ(all, text);
  }
  EXPECT_TRUE(saw_partial) << "the corpus should contain tokens that cut a character";

  // A cut-off character is held back, then flushed as U+FFFD.
  mx::IncrementalDecoder dec(tok);
  const Ids e4 = tok->encode("\xe4", false);
  ASSERT_EQ(e4.size(), 1u);
  EXPECT_EQ(dec.push(e4[0]), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
  // A held-back lead byte followed by ASCII becomes U+FFFD, then the ASCII.
  EXPECT_EQ(dec.push(e4[0]), "");
  EXPECT_EQ(dec.push(tok->encode("a", false)[0]),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(dec.flush(), "");
}

TEST(Tokenizer, SmallAndHeapMergesAgree) {
  REQUIRE_REAL_TOKENIZER();
  const auto& bpe = static_cast<const mx::tok::BpeTokenizer&>(*tok).bpe();
  std::mt19937 rng(11);
  const std::string alphabet[] = {"a", "e", "t", "h", "in", "er", " ", "\xc3\xa9", "\xe4\xb8\xad", "0", "'"};
  for (int t = 0; t < 300; ++t) {
    std::string s;
    while (s.size() < 1 + rng() % 48) s += alphabet[rng() % std::size(alphabet)];
    if (s.size() > mx::tok::BpeModel::kSmallPiece) s.resize(mx::tok::BpeModel::kSmallPiece);
    Ids a, b;
    bpe.merge_small(s, a);
    bpe.merge_heap(s, b);
    EXPECT_EQ(a, b) << s;
  }
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  REQUIRE_REAL_TOKENIZER();
  const auto corpus = read_jsonl(kSrc + "/tests/data/tokenizer/corpus.jsonl");
  std::vector<Ids> expect;
  for (const auto& c : corpus) expect.push_back(tok->encode(c["text"].get<std::string>(), true));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = 0; i < corpus.size(); ++i)
          if (tok->encode(corpus[i]["text"].get<std::string>(), true) != expect[i]) ++mismatches;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// ---- load errors -------------------------------------------------------------------------------

std::string write_temp(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "mx_tokenizer_test";
  std::filesystem::create_directories(dir);
  const auto p = dir / name;
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// A tiny valid byte-level BPE tokenizer.json: 256 byte tokens, a few merges, chosen specials.
nlohmann::json tiny_tokenizer(bool gpt_oss_specials) {
  // GPT-2 byte alphabet, as in tokenizer/byte_level.h.
  nlohmann::json vocab = nlohmann::json::object();
  uint32_t next = 256;
  std::string space_char;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    std::string s;
    mx::utf8::append_code_point(s, printable ? b : next++);
    if (b == ' ') space_char = s;
    vocab[s] = b;
  }
  vocab["he"] = 256;
  vocab[space_char + "he"] = 257;
  nlohmann::json j = {{"version", "1.0"},
                      {"added_tokens", nlohmann::json::array()},
                      {"normalizer", nullptr},
                      {"pre_tokenizer",
                       {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", " ?\\p{L}+|\\s+"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"model",
                       {{"type", "BPE"},
                        {"ignore_merges", true},
                        {"vocab", vocab},
                        {"merges", nlohmann::json::array({nlohmann::json::array({"h", "e"}),
                                                          nlohmann::json::array({space_char, "he"})})}}}};
  if (gpt_oss_specials) {
    const std::pair<const char*, int> specials[] = {
        {"<|endoftext|>", 199999}, {"<|return|>", 200002}, {"<|constrain|>", 200003}, {"<|channel|>", 200005},
        {"<|start|>", 200006},     {"<|end|>", 200007},    {"<|message|>", 200008},   {"<|call|>", 200012}};
    for (auto [t, id] : specials)
      j["added_tokens"].push_back({{"id", id},
                                   {"content", t},
                                   {"special", true},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", false},
                                   {"normalized", false}});
  }
  return j;
}

void expect_load_error(const std::string& path, const std::string& needle) {
  try {
    mx::Tokenizer::load(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const mx::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(TokenizerLoad, TinyTokenizerWorks) {
  auto tok = mx::Tokenizer::load(write_temp("tiny.json", tiny_tokenizer(true).dump()));
  EXPECT_EQ(tok->encode("he hehe", false), (Ids{256, 257, 256}));  // "he" " he"+"he"
  EXPECT_EQ(tok->encode("<|end|>he", true), (Ids{200007, 256}));
  EXPECT_EQ(tok->vocab_size(), 200013);
  EXPECT_EQ(tok->token_bytes(500), "");  // a hole between the vocab and the specials

  // Older layout: merges as "a b" strings; ByteLevel doing the GPT-2 regex split itself.
  auto j = tiny_tokenizer(true);
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : j["model"]["merges"])
    merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  j["model"]["merges"] = merges;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  tok = mx::Tokenizer::load(write_temp("tiny_old.json", j.dump()));
  EXPECT_EQ(tok->encode("he hehe", false), (Ids{256, 257, 256}));
  EXPECT_EQ(tok->decode(tok->encode("he's 42 \xc3\xa9t\xc3\xa9", false)), "he's 42 \xc3\xa9t\xc3\xa9");
}

TEST(TokenizerLoad, ErrorsAreOneClearLine) {
  expect_load_error("/nonexistent/dir/tokenizer.json", "/nonexistent/dir/tokenizer.json");
  expect_load_error(write_temp("empty.json", ""), "invalid JSON");
  expect_load_error(write_temp("truncated.json", tiny_tokenizer(true).dump().substr(0, 3000)),
                    "invalid JSON");
  expect_load_error(write_temp("array.json", "[1, 2]"), "expected a JSON object");
  expect_load_error(write_temp("trailing.json", tiny_tokenizer(true).dump() + " x"), "after the JSON");
  expect_load_error(write_temp("nomodel.json", "{\"version\": \"1.0\"}"), "no \"model\"");

  auto j = tiny_tokenizer(false);
  expect_load_error(write_temp("nospecials.json", j.dump()),
                    "not the gpt-oss (o200k_harmony) tokenizer: special token <|start|> is missing");
  j = tiny_tokenizer(true);
  j["added_tokens"][4]["id"] = 5;  // <|start|>
  expect_load_error(write_temp("wrongid.json", j.dump()), "<|start|> has id 5, expected 200006");
  j = tiny_tokenizer(true);
  j["model"]["type"] = "WordPiece";
  expect_load_error(write_temp("wordpiece.json", j.dump()), "expected \"BPE\"");
  j = tiny_tokenizer(true);
  j["model"]["merges"].push_back(nlohmann::json::array({"x", "\xc3\xa9"}));
  expect_load_error(write_temp("badmerge.json", j.dump()), "not in model.vocab");
  j = tiny_tokenizer(true);
  j["model"]["vocab"]["\xe2\x96\x81hello"] = 300;  // SentencePiece-style token: not byte-level
  expect_load_error(write_temp("notbytelevel.json", j.dump()), "not byte-level");
  j = tiny_tokenizer(true);
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_load_error(write_temp("metaspace.json", j.dump()), "not supported");
  j = tiny_tokenizer(true);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_load_error(write_temp("badregex.json", j.dump()), "does not compile");
  j = tiny_tokenizer(true);
  j["decoder"] = {{"type", "Metaspace"}};
  expect_load_error(write_temp("decoder.json", j.dump()), "decoder is not ByteLevel");
}

TEST(TokenizerLoad, SplitBehaviours) {
  auto j = tiny_tokenizer(false);
  auto& split = j["pre_tokenizer"]["pretokenizers"][0];
  split["pattern"] = {{"String", "e"}};
  const auto pieces = [&](const char* behavior, bool invert) {
    split["behavior"] = behavior;
    split["invert"] = invert;
    auto tok = mx::tok::parse_tokenizer_json(j.dump(), "tiny", false);
    std::vector<std::string> out;
    tok->pretokenizer().split(
        "hexeye",
        [](void* c, std::string_view p) { static_cast<std::vector<std::string>*>(c)->emplace_back(p); },
        &out);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Isolated", false), (V{"h", "e", "x", "e", "y", "e"}));
  EXPECT_EQ(pieces("Removed", false), (V{"h", "x", "y"}));
  EXPECT_EQ(pieces("MergedWithPrevious", false), (V{"he", "xe", "ye"}));
  EXPECT_EQ(pieces("MergedWithNext", false), (V{"h", "ex", "ey", "e"}));
  EXPECT_EQ(pieces("Contiguous", false), (V{"h", "e", "x", "e", "y", "e"}));
  EXPECT_EQ(pieces("Removed", true), (V{"e", "e", "e"}));
}

TEST(TokenizerLoad, OnigurumaSpaceClassTranslation) {
  using P = mx::tok::Pretokenizer;
  EXPECT_EQ(P::translate_pattern("\\s+"), "[\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}]+");
  EXPECT_EQ(P::translate_pattern("[^\\s\\p{L}]"), "[^\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}\\p{L}]");
  EXPECT_EQ(P::translate_pattern("(?!\\S)"), "(?![^\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}])");
  EXPECT_EQ(P::translate_pattern("[\\]s]\\\\s"), "[\\]s]\\\\s");
}

}  // namespace
