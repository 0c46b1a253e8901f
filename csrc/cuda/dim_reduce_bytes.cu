// launch_dim_reduction for int8, uint8 and bool (dim_reduce_launch.h).
#include "cuda/dim_reduce_kernels.cuh"

namespace torch_reduce::cuda::dim {

TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(int8_t)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(uint8_t)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(bool)

}  // namespace torch_reduce::cuda::dim
