#pragma once
// Launch state, all of it keyed by device: resident blocks per (device, kernel, block size, dynamic shared
// bytes) and the single-pass tickets per (device, stream). Two GPUs share stream handles (each device's
// default stream is handle 0) and may differ in SM count and occupancy, so nothing is keyed by a stream or
// a kernel alone. Every function reads the current device: call it under the op's device guard.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "model_gpu.h"

namespace torch_reduce::cuda {

inline int64_t multiprocessors() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

// The current device's launch geometry, from its properties (ATen caches them per device).
inline GpuShape current_gpu_shape() {
  const cudaDeviceProp* properties = at::cuda::getCurrentDeviceProperties();
  return {properties->multiProcessorCount, properties->maxThreadsPerMultiProcessor};
}

// How many blocks of `kernel` one multiprocessor of the current device holds at once (at least one).
template <typename Kernel>
int resident_blocks_per_sm(Kernel kernel, int block, size_t shared_bytes = 0) {
  using Key = std::tuple<c10::DeviceIndex, const void*, int, size_t>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{c10::cuda::current_device(), reinterpret_cast<const void*>(kernel), block, shared_bytes};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, block, shared_bytes));
    it = cache.emplace(key, std::max(blocks, 1)).first;
  }
  return it->second;
}

// Lets `kernel` take as much dynamic shared memory as a block of the current device may have beside the
// kernel's static shared memory (beyond 48 KiB in all needs this, once per device and kernel); returns that
// many bytes, the most a launch of it may ask for.
template <typename Kernel>
size_t allow_max_dynamic_shared(Kernel kernel) {
  static std::mutex mutex;
  static std::map<std::pair<c10::DeviceIndex, const void*>, size_t> allowed;
  const auto key = std::make_pair(c10::cuda::current_device(), reinterpret_cast<const void*>(kernel));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = allowed.find(key);
  if (it == allowed.end()) {
    cudaFuncAttributes attributes;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    const size_t limit = at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin - attributes.sharedSizeBytes;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(limit)));
    it = allowed.emplace(key, limit).first;
  }
  return it->second;
}

// A zeroed ticket counter per (device, stream), reset by the last block of each single-pass launch:
// launches on one stream run in order, so they never share it, and no memset is needed per call (that
// would be a second launch).
inline unsigned* ticket_for_current_stream() {
  static std::mutex mutex;
  static std::map<std::pair<c10::DeviceIndex, cudaStream_t>, at::Tensor> tickets;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto key = std::make_pair(stream.device_index(), stream.stream());
  std::lock_guard<std::mutex> lock(mutex);
  auto it = tickets.find(key);
  if (it == tickets.end()) {
    auto ticket = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, stream.device_index()));
    it = tickets.emplace(key, ticket).first;
  }
  return reinterpret_cast<unsigned*>(it->second.data_ptr<int32_t>());
}

}  // namespace torch_reduce::cuda
