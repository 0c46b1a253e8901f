#pragma once
// Whether this build of _C has a kernel the current device can run: machine code for its compute capability,
// or PTX the driver can compile for it (setup.py: TORCH_CUDA_ARCH_LIST, by default 8.0;8.6;8.9;9.0+PTX).

namespace torch_reduce::cuda {

// Raises, the first time it is called on each device, an error naming the device's compute capability, the
// architectures built, and how to rebuild; cheap after that. Call it under the op's device guard, before the
// first launch (else the launch fails with CUDA's bare "no kernel image is available").
void check_kernel_image_for_current_device();

}  // namespace torch_reduce::cuda
