// The names a served model answers to, as vLLM's --served-model-name takes several: the first is the one
// listed first and carried by every response, the others are accepted in a request's `model` too.
#pragma once
#include <string>
#include <vector>

namespace mx::server {

struct ModelNames {
  std::string primary;
  std::vector<std::string> aliases;
  bool contains(const std::string& name) const;
  std::vector<std::string> all() const;  // primary first
};

// The names of a checkpoint directory served without --served-model-name: a Hugging Face cache snapshot
// (.../models--ORG--NAME/snapshots/REV) is ORG/NAME, the Hub id a client written for vLLM sends; another
// directory is its own name, and one named as an official checkpoint (gpt-oss-120b, gpt-oss-20b) answers to
// its Hub id (openai/NAME) too.
ModelNames default_model_names(const std::string& model_dir);

}  // namespace mx::server
