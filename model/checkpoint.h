// Safetensors checkpoint reader: single file or sharded through model.safetensors.index.json.
// Files are memory-mapped; every header is validated (length bound, JSON, dtype, shape x dtype
// size == byte range, ranges inside the file, no overlaps/gaps, no duplicates) before use.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "model/tensor_specs.h"

namespace mx {

struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapped file, 1-byte aligned only
  size_t nbytes = 0;
  std::string file;               // shard path, for error messages
};

// Parses and validates one safetensors header. `data`/`size` is the whole file. Returns the
// tensors in file order. Throws mx::Error (one line, names the file) on any problem; never
// reads outside [data, data+size). Exposed for fuzzing.
std::vector<TensorView> parse_safetensors(const uint8_t* data, size_t size, const std::string& file);

class Checkpoint {
 public:
  // DIR holds model.safetensors.index.json + shards, or a single model.safetensors.
  static Checkpoint open(const std::string& dir);

  const TensorView* find(const std::string& name) const;
  // Throws "tensor NAME not found in checkpoint DIR".
  const TensorView& get(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::string& dir() const { return dir_; }

  // Every expected tensor must exist with dtype and shape as the config implies; the first
  // mismatch throws one line naming tensor, expected shape, actual shape and file.
  void validate(const ModelConfig& cfg) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace mx
