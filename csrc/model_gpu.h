#pragma once
// The GPU the CPU models replay: the launch geometry a grid rule needs of a GPU, and the one GPU whose order
// of operations the CPU kernels reproduce bit for bit (an H200). torch_reduce/analysis/model_gpu.py holds
// the same description for the Python models; tests/test_trace.py checks that the two agree.
#include <cstdint>

namespace torch_reduce {

struct GpuShape {
  int64_t multiprocessors;
  int64_t threads_per_multiprocessor;  // resident threads per multiprocessor, at most
};

inline constexpr GpuShape kModelGpu{132, 2048};  // NVIDIA H200

// The whole-tensor kernel's 16-byte loads in flight per thread and iteration (full_reduce.cuh): part of its
// order of operations (accumulator k takes every kVectorUnroll-th vector), which the CPU model reproduces
// (cpu/model.h), so one value on every GPU rather than a per-architecture tuning.
inline constexpr int kVectorUnroll = 4;

}  // namespace torch_reduce
