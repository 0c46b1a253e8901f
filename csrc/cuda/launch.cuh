#pragma once
// Launch state, all of it keyed by device: resident blocks (and clusters) per (device, kernel, block size,
// dynamic shared bytes) and the tickets of single-launch folds per (device, stream) or captured graph. Two GPUs
// share stream handles (each device's default stream is handle 0) and may differ in SM count and occupancy, so
// nothing is keyed by a stream or a kernel alone. Every function reads the current device: call it under the
// op's device guard.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

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

// How many clusters of `cluster` blocks of `kernel` the current device runs at once (0: none fit), cached as
// resident_blocks_per_sm is. sm_90 and newer.
template <typename Kernel>
int64_t resident_clusters(Kernel kernel, int block, size_t shared_bytes, int cluster) {
  using Key = std::tuple<c10::DeviceIndex, const void*, int, size_t, int>;
  static std::mutex mutex;
  static std::map<Key, int64_t> cache;
  const Key key{c10::cuda::current_device(), reinterpret_cast<const void*>(kernel), block, shared_bytes, cluster};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(cluster * at::cuda::getCurrentDeviceProperties()->multiProcessorCount));
    config.blockDim = dim3(static_cast<unsigned>(block));
    config.dynamicSmemBytes = shared_bytes;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    it = cache.emplace(key, clusters).first;
  }
  return it->second;
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) with one launch attribute (cudaLaunchKernelEx).
template <typename... Params, typename... Args>
void launch_with(cudaLaunchAttribute attribute, void (*kernel)(Params...), int64_t grid, unsigned block,
                 size_t shared_bytes, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(block);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) in clusters of `cluster` blocks (grid a multiple of it).
template <typename... Params, typename... Args>
void launch_in_clusters(void (*kernel)(Params...), int64_t grid, unsigned block, size_t shared_bytes,
                        cudaStream_t stream, int cluster, Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
  launch_with(attribute, kernel, grid, block, shared_bytes, stream, args...);
}

// kernel<<<grid, block, 0, stream>>>(args...) as a programmatic dependent launch where the GPU has them (sm_90 and
// newer): its blocks may start while the kernel before it on the stream finishes, once every block of that one has
// called allow_dependent_launch(), and must call wait_for_previous_grid() before reading what that one wrote.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), int64_t grid, unsigned block, cudaStream_t stream, Args... args) {
  if (at::cuda::getCurrentDeviceProperties()->major < 9) {
    kernel<<<static_cast<unsigned>(grid), block, 0, stream>>>(args...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  launch_with(attribute, kernel, grid, block, 0, stream, args...);
}

// The two sides of launch_dependent, in device code: no-ops where the launch was an ordinary one, or before sm_90.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// compute(the attributes of `kernel`) on the current device, once per device and kernel (and call site: each
// lambda type has its own cache).
template <typename Kernel, typename Compute>
size_t once_per_kernel(Kernel kernel, Compute compute) {
  static std::mutex mutex;
  static std::map<std::pair<c10::DeviceIndex, const void*>, size_t> cache;
  const auto key = std::make_pair(c10::cuda::current_device(), reinterpret_cast<const void*>(kernel));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    cudaFuncAttributes attributes;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    it = cache.emplace(key, compute(attributes)).first;
  }
  return it->second;
}

// Local memory a thread of `kernel` uses on the current device, in bytes: registers ptxas spilled, or a stack.
template <typename Kernel>
size_t local_bytes_per_thread(Kernel kernel) {
  return once_per_kernel(kernel, [](const cudaFuncAttributes& attributes) { return attributes.localSizeBytes; });
}

// Lets `kernel` take as much dynamic shared memory as a block of the current device may have beside the
// kernel's static shared memory (beyond 48 KiB in all needs this, once per device and kernel); returns that
// many bytes, the most a launch of it may ask for.
template <typename Kernel>
size_t allow_max_dynamic_shared(Kernel kernel) {
  return once_per_kernel(kernel, [kernel](const cudaFuncAttributes& attributes) {
    const size_t limit = at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin - attributes.sharedSizeBytes;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(limit)));
    return limit;
  });
}

// Scratch of a launch whose last block of each group folds what the group's blocks wrote: `partial_bytes` for the
// blocks' partials and `ticket_count` zeroed ticket counters (that block resets its counter to zero). Launches on one
// stream run in order, so eager ones share one pair of buffers per (device, stream), grown as needed; the counters are
// never cleared again (a memset would be a second launch), and a caching-allocator call per launch is saved (H200, sum
// of 2^14 floats, one eager call: 14.1 us against torch.sum's 11.4 with a tensor per call, 8.2 against 8.9 now).
// Partials larger than kSharedPartialBytes get a tensor of their own (their kernels run long), so a stream keeps
// little. A launch captured into a CUDA graph gets buffers of its own: counters zeroed by the graph and kept for the
// life of the process, partials from the graph's pool (held by `owned` until the launch is issued), since graphs
// captured on one stream may replay at once on different streams.
struct FoldScratch {
  void* partials = nullptr;
  unsigned* tickets = nullptr;
  at::Tensor owned;
};

inline FoldScratch fold_scratch(int64_t partial_bytes, int64_t ticket_count) {
  constexpr int64_t kSharedPartialBytes = int64_t{1} << 20;
  struct StreamBuffers {
    at::Tensor partials, tickets;
  };
  static std::mutex mutex;
  static std::map<std::pair<c10::DeviceIndex, cudaStream_t>, StreamBuffers> per_stream;
  static std::vector<at::Tensor> per_graph, outgrown;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto device = at::TensorOptions().device(at::kCUDA, stream.device_index());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &capture));
  const bool captured = capture != cudaStreamCaptureStatusNone;
  FoldScratch scratch;
  if (captured || partial_bytes > kSharedPartialBytes) {
    scratch.owned = at::empty({partial_bytes}, device.dtype(at::kByte));
    scratch.partials = scratch.owned.mutable_data_ptr();
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (captured) {
    if (ticket_count > 0) {
      scratch.tickets = reinterpret_cast<unsigned*>(
          per_graph.emplace_back(at::zeros({ticket_count}, device.dtype(at::kInt))).data_ptr());
    }
    return scratch;
  }
  StreamBuffers& buffers = per_stream[std::make_pair(stream.device_index(), stream.stream())];
  // An outgrown buffer is kept, not freed: another host thread launching on this stream may hold its pointer
  // and not have launched yet. Each buffer at least doubles, so they add up to twice the last at most.
  const auto grown = [&](at::Tensor& buffer, int64_t size, int64_t least, auto make) {
    if (!buffer.defined() || buffer.numel() < size) {
      if (buffer.defined()) outgrown.push_back(buffer);
      buffer = make(std::max<int64_t>(size, buffer.defined() ? 2 * buffer.numel() : least));
    }
    return buffer.data_ptr();
  };
  if (ticket_count > 0) {
    scratch.tickets = reinterpret_cast<unsigned*>(
        grown(buffers.tickets, ticket_count, 64, [&](int64_t n) { return at::zeros({n}, device.dtype(at::kInt)); }));
  }
  if (scratch.partials == nullptr && partial_bytes > 0) {
    scratch.partials = grown(buffers.partials, partial_bytes, 16384,
                             [&](int64_t n) { return at::empty({n}, device.dtype(at::kByte)); });
  }
  return scratch;
}

}  // namespace torch_reduce::cuda
