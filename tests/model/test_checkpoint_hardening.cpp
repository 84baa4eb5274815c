// Hostile header text: error lines stay one short line, and nothing recurses on nesting depth.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/checkpoint.h"
#include "safetensors_builder.h"

namespace {
std::string error_of(const std::string& header, uint64_t data = 0) {
  std::string f = mx::test::build_safetensors(header, data);
  try {
    mx::parse_safetensors(reinterpret_cast<const uint8_t*>(f.data()), f.size(), "h.safetensors");
  } catch (const mx::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(SafetensorsHardening, NewlineInNameStaysOneLine) {
  std::string m = error_of(R"({"a\nb":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_NE(m.find("a\\x0ab"), std::string::npos) << m;
}

TEST(SafetensorsHardening, LongNameIsCut) {
  std::string name(100000, 'n');
  std::string m = error_of("{\"" + name + R"(":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_LT(m.size(), 400u);
  EXPECT_NE(m.find("..."), std::string::npos);
}

TEST(SafetensorsHardening, DeepNestingIsNotRecursedOn) {
  std::string deep = std::string(200000, '[') + std::string(200000, ']');
  std::string m = error_of(R"({"a":{"dtype":"U8","shape":)" + deep + R"(,"data_offsets":[0,1]}})", 1);
  EXPECT_NE(m.find("a JSON array"), std::string::npos) << m.substr(0, 200);
}

TEST(SafetensorsHardening, NestedDuplicateKey) {
  std::string m = error_of(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_NE(m.find("duplicate key 'dtype'"), std::string::npos) << m;
}
