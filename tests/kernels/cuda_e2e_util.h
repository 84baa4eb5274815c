// Helpers shared by the CUDA engine tests (test_cuda_engine.cpp, test_cuda_sampling.cpp): the random-weight
// fixtures and the engine options of the small-model runs.
#pragma once
#include <filesystem>
#include <string>

#include "kernels/engine/cuda_runner.h"
#include "model/fixture.h"

namespace mx::test {

inline std::string e2e_fixture(const char* preset) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / (std::string("mx_cuda_e2e_") + preset)).string();
  if (!fs::exists(dir + "/config.json")) {
    mx::FixtureOptions fo;
    fo.preset = preset;
    fo.seed = 7;
    fo.out_dir = dir;
    mx::write_fixture(fo);
  }
  return dir;
}

// Engine options of the small-model runs below: nseq sequences of up to `len` positions in blocks of bs.
inline mx::CudaEngineOptions small_options(const std::string& dir, int nseq, int len, int bs, int tokens, int blocks) {
  mx::CudaEngineOptions opt;
  opt.model_dir = dir;
  opt.max_model_len = len;
  opt.max_num_seqs = nseq;
  opt.max_tokens_per_step = tokens;
  opt.num_kv_blocks = blocks;
  opt.block_size = bs;
  return opt;
}

}  // namespace mx::test
