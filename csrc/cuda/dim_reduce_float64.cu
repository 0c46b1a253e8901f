// launch_dim_reduction for float64 (dim_reduce_launch.h).
#include "cuda/dim_reduce_kernels.cuh"

namespace torch_reduce::cuda::dim {

TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(double)

}  // namespace torch_reduce::cuda::dim
