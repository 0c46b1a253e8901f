// launch_dim_reduction for int16, int32 and int64 (dim_reduce_launch.h).
#include "cuda/dim_reduce_kernels.cuh"

namespace torch_reduce::cuda::dim {

TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(int16_t)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(int32_t)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(int64_t)

}  // namespace torch_reduce::cuda::dim
