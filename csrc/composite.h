#pragma once
// Every op written in aten ops: the exact path for what the fast C++ autograd kernels do not cover.
// torch differentiates aten ops in every mode (double backward, forward-mode AD, functorch's grad, vjp,
// jvp, vmap), so an op that takes this path inherits all of them. The autograd kernels take it when a
// functorch transform is active, when an input carries a forward-mode tangent, and (layer_norm_bwd) when
// its own result will be differentiated (create_graph=True). Slower than our kernels; never a different
// answer: the same checks run first, and the formulas are torch's.
#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <tuple>

#include "dim_reduce.h"

namespace torch_reduce::composite {

at::Tensor ladder_sum(const at::Tensor& t, int64_t block_size, const char* op);
// Every row of dim_reduce.h's table: torch's op of the same name.
at::Tensor reduce(Reduction r, const at::Tensor& self, const ReduceCall& call);
std::tuple<at::Tensor, at::Tensor> var_mean(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                            const std::optional<at::Scalar>& correction, bool keepdim);

// LayerNorm's row statistics as differentiable functions of the input: mean and 1/sqrt(var + eps) over the
// trailing `normalized_dims` dims, kept as size-1 dims, in the statistics' dtype (float32 for 16-bit inputs).
std::tuple<at::Tensor, at::Tensor> layer_norm_stats(const at::Tensor& input, int64_t normalized_dims, double eps);

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd(const at::Tensor& input,
                                                              c10::SymIntArrayRef normalized_shape,
                                                              const std::optional<at::Tensor>& weight,
                                                              const std::optional<at::Tensor>& bias, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> output_mask, const std::optional<at::Tensor>& grad_sum);

// RMSNorm's 1/sqrt(mean(x^2) + eps) as a differentiable function of the input, kept as size-1 dims, in the
// statistics' dtype.
at::Tensor rms_norm_rstd(const at::Tensor& input, int64_t normalized_dims, double eps);
std::tuple<at::Tensor, at::Tensor> rms_norm_fwd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                                                const std::optional<at::Tensor>& weight, std::optional<double> eps);
std::tuple<at::Tensor, at::Tensor> rms_norm_bwd(const at::Tensor& grad_out, const at::Tensor& input,
                                                c10::SymIntArrayRef normalized_shape, const at::Tensor& rstd,
                                                const std::optional<at::Tensor>& weight,
                                                std::array<bool, 2> output_mask,
                                                const std::optional<at::Tensor>& grad_sum);
// The fused residual adds: input + residual (torch's add), then the norm above; (out, sum, statistics).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_fwd(
    const at::Tensor& input, const at::Tensor& residual, c10::SymIntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_fwd(const at::Tensor& input, const at::Tensor& residual,
                                                                c10::SymIntArrayRef normalized_shape,
                                                                const std::optional<at::Tensor>& weight,
                                                                std::optional<double> eps);

// The global gradient norm in torch's own ops: torch._foreach_norm's norms (its CUDA fast route's fold of a
// one-element tensor's square included: norm_folds_square), get_total_norm's stack and norm of them on either of
// its routes (`foreach`), clip_grads_with_norm_'s multiply.
std::vector<at::Tensor> foreach_norm(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype);
at::Tensor total_norm(at::TensorList tensors, double ord, bool foreach);
void clip_grads_(at::TensorList grads, const at::Tensor& total_norm, double max_norm);

}  // namespace torch_reduce::composite
