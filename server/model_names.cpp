#include "server/model_names.h"

#include <algorithm>
#include <filesystem>

namespace mx::server {

bool ModelNames::contains(const std::string& name) const {
  return name == primary || std::find(aliases.begin(), aliases.end(), name) != aliases.end();
}

std::vector<std::string> ModelNames::all() const {
  std::vector<std::string> v{primary};
  v.insert(v.end(), aliases.begin(), aliases.end());
  return v;
}

ModelNames default_model_names(const std::string& model_dir) {
  std::filesystem::path p(model_dir);
  if (!p.has_filename()) p = p.parent_path();  // a trailing '/'
  ModelNames n;
  const std::filesystem::path snapshots = p.parent_path();
  const std::string repo = snapshots.parent_path().filename().string();
  const std::string prefix = "models--";
  if (snapshots.filename() == "snapshots" && repo.rfind(prefix, 0) == 0) {
    const std::string id = repo.substr(prefix.size());  // ORG--NAME; '--' never occurs in a Hub name's parts
    const size_t sep = id.find("--");
    if (sep != std::string::npos && sep > 0 && sep + 2 < id.size()) {
      n.primary = id.substr(0, sep) + "/" + id.substr(sep + 2);
      return n;
    }
  }
  n.primary = p.filename().string();
  if (n.primary.empty()) n.primary = model_dir;
  if (n.primary == "gpt-oss-120b" || n.primary == "gpt-oss-20b") n.aliases.push_back("openai/" + n.primary);
  return n;
}

}  // namespace mx::server
