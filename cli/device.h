// --device auto|cpu|cuda for the commands that run a model (generate, serve).
#pragma once
#include <memory>
#include <string>

#include "model/dense_quant.h"
#include "model/model_runner.h"
#include "model/tensor_parallel.h"

namespace CLI {
class App;
}

namespace mx::cli {

enum class Device { kCpu, kCuda };

// auto = cuda when this binary has the CUDA engine and a GPU is visible, else cpu. An explicit
// cuda that cannot run fails with one line saying why (no CUDA in this build, or no GPU).
Device resolve_device(const std::string& flag);
const char* device_name(Device d);
// serve's --max-num-seqs when not given, on the CUDA engine by the GPU's memory: 1024 from 120 GiB (H200),
// 512 from 70 GiB (H100), else 256 (docs/server.md has the load runs behind it); 256 on the CPU.
int default_max_num_seqs(Device d);

// What the CLI commands choose for the CUDA engine; kept free of CUDA headers.
struct CudaRunnerFlags {
  std::string model_dir;
  float gpu_memory_utilization = 0.9f;
  int max_model_len = 0;        // positions the KV cache must hold for one sequence
  int max_num_seqs = 1;
  int max_tokens_per_step = 2048;
  int num_kv_blocks = 0;        // 0 = as many as gpu_memory_utilization leaves room for
  int vocab_limit = 0;          // tokenizer size: ids past it are never sampled
  std::string dummy_preset;     // 20b | 120b: random weights made on the GPU, no checkpoint read
  bool decode_ahead = true;     // CudaEngineOptions::decode_ahead
  bool kv_fp8 = false;          // --kv-cache-dtype fp8
  DenseQuant dense;             // --mxfp4-layers / --fp8-layers
  TensorParallel tp;            // --tensor-parallel-size and the multi-node flags
};
constexpr int kCudaBlockSize = 16;

// The storage formats serve, generate and bench take alike, as given on the command line.
struct FormatFlags {
  std::string kv_cache_dtype = "auto";                     // auto | bf16 | fp8
  std::string mxfp4_layers = "none", fp8_layers = "none";  // none | all | list of qkv, o, lm_head
};
void add_format_flags(CLI::App* cmd, FormatFlags* f);

// The flags parsed once (one-line errors).
struct Formats {
  bool kv_fp8 = false;
  DenseQuant dense;
};
Formats resolve_formats(const FormatFlags& f);

// --tensor-parallel-size, --nnodes, --node-rank, --master-addr, --master-port (serve, generate, bench).
void add_parallel_flags(CLI::App* cmd, TensorParallel* tp);
// One line when `dev` cannot run the group: the CPU runner is one device.
void check_parallel(const TensorParallel& tp, Device dev);

// The CUDA engine's runner; its kv_shape() is what the runtime's block pool must use.
std::unique_ptr<ModelRunner> make_cuda_model_runner(const CudaRunnerFlags& f);
// --node-rank > 0: the runner runs the steps node 0 sends until node 0 ends the group.
void run_node_steps(ModelRunner& runner);

}  // namespace mx::cli
