#pragma once
// The CUDA launch of the dim reductions for one dtype. dim_reduce_kernels.cuh defines it; the files
// dim_reduce_<dtypes>.cu instantiate it, a few dtypes each, so that a build compiles them in parallel (their
// kernels are most of the extension's compile time); dim_reduce.cu dispatches to them.
#include <ATen/ATen.h>

#include "dim_reduce.h"

namespace torch_reduce::cuda::dim {

// Writes the reduction `kind` of `p` into `out`, on the current device and stream.
template <typename scalar_t>
void launch_dim_reduction(const ReduceKind& kind, const ReduceProblem& p, const at::Tensor& out);

}  // namespace torch_reduce::cuda::dim
