// launch_dim_reduction for int16, int32, int64, uint16, uint32 and uint64 (dim_reduce_launch.h).
#include "cuda/dim_reduce_kernels.cuh"

namespace torch_reduce::cuda::dim {

TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(int16_t)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(int32_t)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(int64_t)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(uint16_t)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(uint32_t)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(uint64_t)

}  // namespace torch_reduce::cuda::dim
