#include "model/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/log.h"

namespace mx {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A header larger than this is not a gpt-oss checkpoint (the 120b's largest is ~40 KB); the
// bound keeps a corrupt length from making us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

// Header text is untrusted: names may hold newlines or be megabytes long, and dumping a deeply
// nested value recurses. Error lines quote at most 120 printable characters.
std::string quote(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 120)) {
    if (uint8_t(c) < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", uint8_t(c));
    else out += c;
  }
  if (s.size() > 120) out += "...";
  return out;
}

std::string describe(const json& v) {
  if (v.is_structured()) return fmt::format("a JSON {}", v.type_name());
  return quote(v.dump());
}

uint64_t get_u64(const json& v, const std::string& file, const std::string& what) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    fail("{}: {} must be a non-negative integer, got {}", file, what, describe(v));
  return v.get<uint64_t>();
}

}  // namespace

std::vector<TensorView> parse_safetensors(const uint8_t* data, size_t size, const std::string& file) {
  if (size < 8) fail("{}: file is {} bytes, too small for a safetensors header", file, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxHeaderBytes) fail("{}: header length {} exceeds the {} byte limit", file, n, kMaxHeaderBytes);
  if (n > size - 8) fail("{}: header length {} runs past the end of the {} byte file (truncated?)", file, n, size);

  // nlohmann keeps the last of duplicate keys silently; the callback sees every key first.
  // Duplicates are rejected at every level (serde, behind the reference reader, does too).
  std::vector<std::set<std::string>> seen;
  std::string duplicate;
  int duplicate_depth = 0;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) seen.emplace_back();
    else if (event == json::parse_event_t::object_end && !seen.empty()) seen.pop_back();
    else if (event == json::parse_event_t::key && !seen.empty()) {
      std::string k = parsed.get<std::string>();
      if (!seen.back().insert(k).second && duplicate.empty()) {
        duplicate = k;
        duplicate_depth = depth;
      }
    }
    return true;
  };
  json header;
  try {
    header = json::parse(data + 8, data + 8 + n, cb);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", file, e.what());
  }
  if (!duplicate.empty()) {
    if (duplicate_depth == 1) fail("{}: duplicate tensor name '{}' in header", file, quote(duplicate));
    fail("{}: duplicate key '{}' in header", file, quote(duplicate));
  }
  if (!header.is_object()) fail("{}: header must be a JSON object", file);

  const uint64_t data_size = size - 8 - n;
  const uint8_t* base = data + 8 + n;
  std::vector<TensorView> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    const std::string qn = quote(name);
    if (name == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ must be an object of strings", file);
      for (auto m = v.begin(); m != v.end(); ++m)
        if (!m.value().is_string()) fail("{}: __metadata__ value for '{}' is not a string", file, quote(m.key()));
      continue;
    }
    if (name.empty()) fail("{}: empty tensor name", file);
    if (!v.is_object()) fail("{}: entry '{}' must be an object", file, qn);
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        fail("{}: tensor '{}' has unknown field '{}'", file, qn, quote(f.key()));
    if (!v.contains("dtype") || !v["dtype"].is_string()) fail("{}: tensor '{}' has no dtype string", file, qn);
    TensorView t;
    t.name = name;
    t.file = file;
    if (!parse_dtype(v["dtype"].get<std::string>(), &t.dtype))
      fail("{}: tensor '{}' has unknown dtype '{}'", file, qn, quote(v["dtype"].get<std::string>()));
    if (!v.contains("shape") || !v["shape"].is_array()) fail("{}: tensor '{}' has no shape array", file, qn);
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      uint64_t dim = get_u64(d, file, fmt::format("a dimension of '{}'", qn));
      if (dim > INT64_MAX || !checked_mul(numel, dim, &numel))
        fail("{}: tensor '{}' shape overflows 64 bits", file, qn);
      t.shape.push_back(int64_t(dim));
    }
    uint64_t nbytes = 0;
    if (!checked_mul(numel, uint64_t(dtype_size(t.dtype)), &nbytes))
      fail("{}: tensor '{}' byte size overflows", file, qn);
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      fail("{}: tensor '{}' needs data_offsets [begin, end]", file, qn);
    uint64_t b = get_u64(v["data_offsets"][0], file, fmt::format("data_offsets of '{}'", qn));
    uint64_t e = get_u64(v["data_offsets"][1], file, fmt::format("data_offsets of '{}'", qn));
    if (b > e) fail("{}: tensor '{}' data_offsets [{}, {}] are reversed", file, qn, b, e);
    if (e > data_size)
      fail("{}: tensor '{}' data_offsets [{}, {}] run past the data section ({} bytes; truncated file?)", file, qn,
           b, e, data_size);
    if (e - b != nbytes)
      fail("{}: tensor '{}' is {} {} = {} bytes but data_offsets span {} bytes", file, qn, dtype_name(t.dtype),
           shape_str(t.shape), nbytes, e - b);
    t.data = base + b;
    t.nbytes = nbytes;
    ranges.emplace_back(b, e);
    out.push_back(std::move(t));
  }
  // The data section must be tiled exactly: no overlaps, no gaps, nothing left over.
  std::sort(ranges.begin(), ranges.end());
  uint64_t pos = 0;
  for (auto [b, e] : ranges) {
    if (b < pos) fail("{}: tensor data ranges overlap at byte {}", file, b);
    if (b > pos) fail("{}: gap in tensor data between bytes {} and {}", file, pos, b);
    pos = e;
  }
  if (pos != data_size) fail("{}: {} bytes after the last tensor are not described by the header", file, data_size - pos);
  return out;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  if (!fs::is_directory(dir)) fail("model directory {} does not exist", dir);
  fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  fs::path single_path = fs::path(dir) / "model.safetensors";

  auto add_file = [&](const std::string& fname) -> const std::vector<TensorView> {
    auto mf = std::make_unique<MappedFile>((fs::path(dir) / fname).string());
    auto views = parse_safetensors(mf->data(), mf->size(), mf->path());
    ck.files_.push_back(std::move(mf));
    return views;
  };

  if (fs::exists(index_path)) {
    json idx;
    try {
      idx = json::parse(read_text_file(index_path.string()));
    } catch (const json::exception& e) {
      fail("{}: invalid JSON: {}", index_path.string(), e.what());
    }
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail("{}: missing object 'weight_map'", index_path.string());
    std::map<std::string, std::string> weight_map;
    std::set<std::string> shard_names;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail("{}: weight_map['{}'] is not a file name", index_path.string(), quote(it.key()));
      std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        fail("{}: weight_map['{}'] = '{}' is not a plain file name", index_path.string(), quote(it.key()), quote(f));
      weight_map[it.key()] = f;
      shard_names.insert(f);
    }
    uint64_t total = 0;
    for (const auto& shard : shard_names) {
      if (!fs::exists(fs::path(dir) / shard))
        fail("{}: shard {} named in the index does not exist", index_path.string(), quote(shard));
      for (auto& t : add_file(shard)) {
        auto w = weight_map.find(t.name);
        if (w == weight_map.end() || w->second != shard)
          fail("{}: tensor '{}' is in shard {} but the index {}", index_path.string(), quote(t.name), shard,
               w == weight_map.end() ? std::string("does not list it") : "puts it in " + quote(w->second));
        total += t.nbytes;
        std::string name = t.name;
        ck.tensors_.emplace(name, std::move(t));
      }
    }
    for (const auto& [name, shard] : weight_map)
      if (!ck.tensors_.count(name))
        fail("{}: the index lists tensor '{}' in {} but that shard does not hold it", index_path.string(), quote(name), quote(shard));
    if (idx.contains("metadata") && idx["metadata"].is_object() && idx["metadata"].contains("total_size")) {
      const auto& ts = idx["metadata"]["total_size"];
      if (!ts.is_number_integer() || ts.get<uint64_t>() != total)
        fail("{}: metadata.total_size {} does not match the shards' {} tensor bytes", index_path.string(), describe(ts),
             total);
    }
  } else if (fs::exists(single_path)) {
    for (auto& t : add_file("model.safetensors")) {
      std::string name = t.name;
      ck.tensors_.emplace(name, std::move(t));
    }
  } else {
    fail("no model.safetensors.index.json or model.safetensors in {}", dir);
  }
  return ck;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  const TensorView* t = find(name);
  if (!t) fail("tensor {} not found in checkpoint {}", name, dir_);
  return *t;
}

void Checkpoint::validate(const ModelConfig& cfg) const {
  auto specs = expected_tensors(cfg);
  std::set<std::string> expected;
  for (const auto& s : specs) {
    expected.insert(s.name);
    const TensorView* t = find(s.name);
    if (!t)
      fail("tensor {} is missing from checkpoint {} (expected {} {})", s.name, dir_, dtype_name(s.dtype),
           shape_str(s.shape));
    if (t->dtype != s.dtype || t->shape != s.shape)
      fail("tensor {}: expected {} {}, found {} {} in {}", s.name, dtype_name(s.dtype), shape_str(s.shape),
           dtype_name(t->dtype), shape_str(t->shape), t->file);
  }
  int extra = 0;
  for (const auto& [name, t] : tensors_)
    if (!expected.count(name) && extra++ < 3) log::warn("checkpoint tensor {} is not used by gpt-oss", name);
  if (extra > 3) log::warn("{} more unused checkpoint tensors", extra - 3);
}

}  // namespace mx
