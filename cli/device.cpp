#include "cli/device.h"

#include <CLI/CLI.hpp>

#include "core/error.h"

#ifdef MXSERVE_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/engine/cuda_runner.h"
#endif

namespace mx::cli {
namespace {

// Why not: the empty string means a GPU is usable.
std::string cuda_unavailable_reason() {
#ifdef MXSERVE_HAVE_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // leave no sticky error for the engine to trip over later
    return fmt::format("no usable CUDA GPU ({})", cudaGetErrorString(e));
  }
  return n > 0 ? "" : "no CUDA GPU is visible";
#else
  return "this build has no CUDA engine (configured with MXSERVE_CUDA off or without nvcc)";
#endif
}

}  // namespace

Device resolve_device(const std::string& flag) {
  if (flag == "cpu") return Device::kCpu;
  if (flag != "cuda" && flag != "auto") fail("--device {}: expected auto, cpu or cuda", flag);
  const std::string why = cuda_unavailable_reason();
  if (why.empty()) return Device::kCuda;
  if (flag == "cuda") fail("--device cuda: {}; use --device cpu", why);
  return Device::kCpu;
}

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

int default_max_num_seqs(Device d) {
#ifdef MXSERVE_HAVE_CUDA
  if (d == Device::kCuda) {
    int dev = 0;
    cudaDeviceProp prop{};
    // The 1k/1k load's throughput grows past 1,024 streams on an H200, peaks at 320-512 on an H100.
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      return prop.totalGlobalMem >= (size_t(120) << 30) ? 1024 : prop.totalGlobalMem >= (size_t(70) << 30) ? 512 : 256;
    (void)cudaGetLastError();
  }
#else
  (void)d;
#endif
  return 256;
}

void add_format_flags(CLI::App* cmd, FormatFlags* f) {
  cmd->add_option("--kv-cache-dtype", f->kv_cache_dtype, "auto|bf16|fp8 (fp8: E4M3 K and V, half the bytes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}));
  cmd->add_option("--mxfp4-layers", f->mxfp4_layers,
                  "none|all|list of qkv,o,lm_head: MXFP4 dense weights, quantized at load")
      ->capture_default_str();
  cmd->add_option("--fp8-layers", f->fp8_layers,
                  "none|all|list of qkv,o,lm_head: FP8 dense weights (per-row scales), quantized at load")
      ->capture_default_str();
}

void add_parallel_flags(CLI::App* cmd, TensorParallel* tp) {
  cmd->add_option("--tensor-parallel-size", tp->size, "GPUs the model is split over (1, 2, 4, 8): one rank a GPU")
      ->capture_default_str();
  cmd->add_option("--nnodes", tp->nnodes, "hosts the ranks are spread over")->capture_default_str();
  cmd->add_option("--node-rank", tp->node_rank, "this host's index among --nnodes")->capture_default_str();
  cmd->add_option("--master-addr", tp->master_addr, "node 0's address (the ranks' rendezvous)")->capture_default_str();
  cmd->add_option("--master-port", tp->master_port, "node 0's rendezvous port")->capture_default_str();
  cmd->add_flag_callback(
      "--enable-expert-parallel", [tp] { tp->moe = MoeSplit::kExperts; },
      "tensor parallel: each GPU holds whole experts (default: a slice of every expert's intermediate columns)");
}

void check_parallel(const TensorParallel& tp, Device dev) {
  if (dev == Device::kCpu && (tp.size != 1 || tp.nnodes != 1))
    fail("--tensor-parallel-size {}: the CPU runner runs on one device; tensor parallelism needs the CUDA engine",
         tp.size);
}

Formats resolve_formats(const FormatFlags& f) {
  return Formats{.kv_fp8 = f.kv_cache_dtype == "fp8", .dense = parse_dense_quant(f.mxfp4_layers, f.fp8_layers)};
}

std::unique_ptr<ModelRunner> make_cuda_model_runner(const CudaRunnerFlags& f) {
#ifdef MXSERVE_HAVE_CUDA
  CudaEngineOptions eo;
  eo.model_dir = f.model_dir;
  eo.gpu_memory_utilization = f.gpu_memory_utilization;
  eo.max_model_len = f.max_model_len;
  eo.max_num_seqs = f.max_num_seqs;
  eo.max_tokens_per_step = f.max_tokens_per_step;
  eo.block_size = kCudaBlockSize;
  eo.num_kv_blocks = f.num_kv_blocks;
  eo.vocab_limit = f.vocab_limit;
  eo.dummy_weights = !f.dummy_preset.empty();
  eo.preset = f.dummy_preset;
  eo.decode_ahead = f.decode_ahead;
  eo.kv_fp8 = f.kv_fp8;
  eo.dense = f.dense;
  eo.tp = f.tp;
  return make_cuda_runner(eo);
#else
  (void)f;
  fail("--device cuda: {}; use --device cpu", cuda_unavailable_reason());
#endif
}

void run_node_steps(ModelRunner& runner) {
#ifdef MXSERVE_HAVE_CUDA
  auto* r = dynamic_cast<CudaRunnerBase*>(&runner);
  if (!r) fail("--node-rank: needs the CUDA engine");
  run_remote_steps(*r);
#else
  (void)runner;
  fail("--node-rank: {}", cuda_unavailable_reason());
#endif
}

}  // namespace mx::cli
