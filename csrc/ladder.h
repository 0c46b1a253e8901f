#pragma once
// The reduction ladder: every variant's name, in order, and what its CPU and CUDA kernels share.
#include <ATen/ATen.h>

#include "model_gpu.h"

namespace torch_reduce {

// X(op name, enum name): the one list the schemas (ops.cpp) and both backends' registrations expand.
#define TORCH_REDUCE_LADDER(X)          \
  X(sum_interleaved, Interleaved)       \
  X(sum_strided, Strided)               \
  X(sum_seq, Sequential)                \
  X(sum_first_add, FirstAdd)            \
  X(sum_warp_unrolled, WarpUnrolled)    \
  X(sum_unrolled, Unrolled)             \
  X(sum_multi, Multi)                   \
  X(sum_vec, Vec)                       \
  X(sum_single_pass, SinglePass)

enum class Ladder {
#define TORCH_REDUCE_ENUM(name, variant) variant,
  TORCH_REDUCE_LADDER(TORCH_REDUCE_ENUM)
#undef TORCH_REDUCE_ENUM
};

// "reduce::sum_seq" and so on, for messages and dispatcher look-ups.
inline const char* ladder_op_name(Ladder v) {
  static const char* const kNames[] = {
#define TORCH_REDUCE_NAME(name, variant) "reduce::" #name,
      TORCH_REDUCE_LADDER(TORCH_REDUCE_NAME)
#undef TORCH_REDUCE_NAME
  };
  return kNames[static_cast<int>(v)];
}

// Elements each thread loads in the first pass of the shared-memory variants (REDUCE-3 on: two).
inline int64_t loads_per_thread(Ladder v) {
  return (v == Ladder::Interleaved || v == Ladder::Strided || v == Ladder::Sequential) ? 1 : 2;
}

// REDUCE-6's grid: as many blocks as the multiprocessors hold at once, no more than the input needs. The GPU
// passes its own shape (launch.cuh: current_gpu_shape), the CPU model kModelGpu's, so it replays that GPU's
// order.
inline int64_t ladder_grid(Ladder v, int64_t n, int64_t block_size, const GpuShape& gpu) {
  const int64_t per_block = block_size * loads_per_thread(v);
  const int64_t wanted = (n + per_block - 1) / per_block;
  return v == Ladder::Multi ? std::min(wanted, gpu.multiprocessors * (gpu.threads_per_multiprocessor / block_size))
                            : wanted;
}

// Argument checks shared by the CPU and CUDA kernels; returns the elements as one contiguous 1-D run.
at::Tensor ladder_input(const at::Tensor& t, int64_t block_size, const char* op);

}  // namespace torch_reduce
