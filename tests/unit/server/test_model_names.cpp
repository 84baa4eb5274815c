// The served model's default names (server/model_names.h).
#include <gtest/gtest.h>

#include "server/model_names.h"

namespace mx::server {
namespace {

TEST(ModelNames, DirectoryName) {
  const ModelNames n = default_model_names("/models/my-finetune");
  EXPECT_EQ(n.primary, "my-finetune");
  EXPECT_TRUE(n.aliases.empty());
  EXPECT_EQ(default_model_names("/models/my-finetune/").primary, "my-finetune");
  EXPECT_EQ(default_model_names("relative").primary, "relative");
}

TEST(ModelNames, OfficialCheckpointAnswersToItsHubId) {
  const ModelNames n = default_model_names("/data/gpt-oss-120b");
  EXPECT_EQ(n.primary, "gpt-oss-120b");
  ASSERT_EQ(n.aliases.size(), 1u);
  EXPECT_EQ(n.aliases[0], "openai/gpt-oss-120b");
  EXPECT_TRUE(n.contains("gpt-oss-120b"));
  EXPECT_TRUE(n.contains("openai/gpt-oss-120b"));
  EXPECT_FALSE(n.contains("openai/gpt-oss-20b"));
  EXPECT_EQ(n.all(), (std::vector<std::string>{"gpt-oss-120b", "openai/gpt-oss-120b"}));
  EXPECT_EQ(default_model_names("gpt-oss-20b").aliases, std::vector<std::string>{"openai/gpt-oss-20b"});
}

TEST(ModelNames, HuggingFaceCacheSnapshotIsItsHubId) {
  const std::string snap = "/root/.cache/huggingface/hub/models--openai--gpt-oss-20b/snapshots/6cee5e81ee83917806bbde320786a8fb61efebee";
  const ModelNames n = default_model_names(snap);
  EXPECT_EQ(n.primary, "openai/gpt-oss-20b");
  EXPECT_TRUE(n.aliases.empty());
  EXPECT_EQ(default_model_names(snap + "/").primary, "openai/gpt-oss-20b");
  // Not a cache layout: the directory's own name.
  EXPECT_EQ(default_model_names("/x/models--broken/snapshots/abc").primary, "abc");
  EXPECT_EQ(default_model_names("/x/models--a--b/other/abc").primary, "abc");
}

}  // namespace
}  // namespace mx::server
