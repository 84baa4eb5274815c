// Fuzzes the safetensors header parser: mutated headers (bit flips, truncation, byte splices,
// random JSON edits, random length prefixes) must only ever produce mx::Error, never a crash,
// another exception type, or a read outside the buffer (run under ASan to check the latter:
// see docs/checkpoint.md). The count is fixed and the seed deterministic so CI is repeatable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>

#include "core/error.h"
#include "model/checkpoint.h"
#include "safetensors_builder.h"

namespace {

std::string seed_file() {
  return mx::test::build_safetensors(
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[4,8],"data_offsets":[0,64]},)"
      R"("b":{"dtype":"U8","shape":[2,5,16],"data_offsets":[64,224]},"s":{"dtype":"F32","shape":[3],"data_offsets":[224,236]}})",
      236);
}

}  // namespace

TEST(SafetensorsFuzz, OnlyCleanErrors) {
  // CI runs 20k; the sanitizer run in docs/checkpoint.md sets MX_FUZZ_ITERATIONS higher.
  const char* env = std::getenv("MX_FUZZ_ITERATIONS");
  const int kIterations = env ? std::atoi(env) : 20000;
  std::mt19937_64 rng(20261123);
  const std::string base = seed_file();
  const char* tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "0", "-1", "1e309", "18446744073709551615",
                          "\"BF16\"", "\"dtype\"", "\"shape\"", "\"data_offsets\"", "null", "true", "\\u0000", "\xff"};
  int accepted = 0, rejected = 0;
  std::map<std::string, int> kinds;
  for (int it = 0; it < kIterations; ++it) {
    std::string f = base;
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !f.empty(); ++e) {
      size_t pos = rng() % f.size();
      switch (rng() % 6) {
        case 0: f[pos] ^= char(1 << (rng() % 8)); break;                         // bit flip
        case 1: f.resize(pos); break;                                            // truncation
        case 2: f[pos] = char(rng()); break;                                     // random byte
        case 3: f.insert(pos, tokens[rng() % std::size(tokens)]); break;         // JSON token splice
        case 4: f.erase(pos, 1 + rng() % 8); break;                              // deletion
        case 5:                                                                  // random length prefix
          if (f.size() >= 8) for (int i = 0; i < 8; ++i) f[i] = char(rng() % 3 ? 0 : rng());
          break;
      }
    }
    try {
      mx::parse_safetensors(reinterpret_cast<const uint8_t*>(f.data()), f.size(), "fuzz.safetensors");
      ++accepted;
    } catch (const mx::Error& e) {
      ++rejected;
      std::string m = e.what();
      ASSERT_EQ(m.find('\n'), std::string::npos) << m;
      kinds[m.substr(0, std::min<size_t>(m.size(), 48))]++;
    } catch (const std::exception& e) {
      FAIL() << "non-mx exception on input " << it << ": " << e.what();
    }
  }
  std::printf("[fuzz] %d inputs: %d accepted, %d rejected with mx::Error, %zu distinct message prefixes\n", kIterations,
              accepted, rejected, kinds.size());
  EXPECT_EQ(accepted + rejected, kIterations);
}
