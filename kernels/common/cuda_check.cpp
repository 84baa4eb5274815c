#include "kernels/common/cuda_check.h"

#include "core/error.h"

namespace mx::cuda {

void throw_error(const std::string& msg) { throw Error(msg); }

}  // namespace mx::cuda
