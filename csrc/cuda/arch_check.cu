#include "cuda/arch_check.cuh"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>

// setup.py passes the architectures nvcc emits, e.g. sm_80/sm_86/sm_89/sm_90/compute_90.
#define TORCH_REDUCE_STRINGIFY(...) #__VA_ARGS__
#define TORCH_REDUCE_STRING(...) TORCH_REDUCE_STRINGIFY(__VA_ARGS__)

namespace torch_reduce::cuda {
namespace {

// Built for the same architectures as every kernel of _C: a device that can load it can load them all.
__global__ void probe_kernel() {}

}  // namespace

void check_kernel_image_for_current_device() {
  static std::array<std::atomic<bool>, C10_COMPILE_TIME_MAX_GPUS> checked{};
  const c10::DeviceIndex device = c10::cuda::current_device();
  if (checked[device].load(std::memory_order_acquire)) return;
  cudaFuncAttributes attributes;
  const cudaError_t error = cudaFuncGetAttributes(&attributes, probe_kernel);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so that torch's next launch check does not report it again
    const cudaDeviceProp* properties = at::cuda::getCurrentDeviceProperties();
    TORCH_CHECK(false, "torch_reduce has no CUDA kernel for ", properties->name, " (cuda:", static_cast<int>(device),
                ", compute capability ", properties->major, ".", properties->minor, "): it was built for ",
                TORCH_REDUCE_STRING(TORCH_REDUCE_CUDA_ARCHS), " (", cudaGetErrorString(error),
                "). Rebuild it for this GPU from its source: TORCH_CUDA_ARCH_LIST=\"", properties->major, ".",
                properties->minor, "\" pip install --no-build-isolation . (or TORCH_CUDA_ARCH_LIST=\"",
                properties->major, ".", properties->minor, "\" make build).");
  }
  checked[device].store(true, std::memory_order_release);
}

}  // namespace torch_reduce::cuda
