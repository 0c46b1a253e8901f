// launch_dim_reduction for float16 and bfloat16 (dim_reduce_launch.h).
#include "cuda/dim_reduce_kernels.cuh"

namespace torch_reduce::cuda::dim {

TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(c10::Half)
TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(c10::BFloat16)

}  // namespace torch_reduce::cuda::dim
