// The dim reductions on the GPU: dtype dispatch to launch_dim_reduction (dim_reduce_kernels.cuh, compiled
// per group of dtypes in dim_reduce_<dtypes>.cu) and the CUDA registration of every row of the table.
#include <torch/library.h>

#include "common/dispatch.h"
#include "cuda/arch_check.cuh"
#include "cuda/dim_reduce_launch.h"
#include "dim_reduce.h"

namespace torch_reduce::cuda {
namespace {

void launch_cuda(const ReduceKind& kind, const ReduceProblem& p, const at::Tensor& out) {
  check_kernel_image_for_current_device();
  TORCH_REDUCE_DISPATCH_DIM(p.input.scalar_type(), "torch_reduce dim reduction",
                        [&] { dim::launch_dim_reduction<scalar_t>(kind, p, out); });
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) { impl_dim_reductions<&launch_cuda>(m); }

}  // namespace torch_reduce::cuda
