#pragma once
// The registered LayerNorm and RMSNorm ops, plain and fused with the residual add, over a backend's two kernel
// templates, so each backend writes its kernels once and its entry points not at all:
//   Backend::forward<kNorm>(input, residual, normalized_shape, weight, bias, eps) -> NormForward
//   Backend::backward<kNorm>(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask, grad_sum)
//       -> (grad_input, grad_weight, grad_bias)
// An undefined tensor (residual, mean, grad_sum) or std::nullopt (bias) stands for an absent one. A backend may
// bring one of the two (the CUDA forward and backward live in separate files): each registers what it has.
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>

#include "layernorm.h"

namespace torch_reduce {

template <typename Backend>
struct NormOps {
  using Optional = std::optional<at::Tensor>;
  using Tensor2 = std::tuple<at::Tensor, at::Tensor>;
  using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
  using Tensor4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

  static Tensor3 layer_norm_fwd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape, const Optional& weight,
                                const Optional& bias, double eps) {
    const NormForward f =
        Backend::template forward<RowNorm::Layer>(input, at::Tensor(), normalized_shape, weight, bias, eps);
    return {f.out, f.mean, f.rstd};
  }

  static Tensor2 rms_norm_fwd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape, const Optional& weight,
                              std::optional<double> eps) {
    const NormForward f =
        Backend::template forward<RowNorm::Rms>(input, at::Tensor(), normalized_shape, weight, std::nullopt, eps);
    return {f.out, f.rstd};
  }

  static Tensor4 add_layer_norm_fwd(const at::Tensor& input, const at::Tensor& residual,
                                    c10::SymIntArrayRef normalized_shape, const Optional& weight, const Optional& bias,
                                    double eps) {
    const NormForward f =
        Backend::template forward<RowNorm::Layer>(input, residual, normalized_shape, weight, bias, eps);
    return {f.out, f.sum, f.mean, f.rstd};
  }

  static Tensor3 add_rms_norm_fwd(const at::Tensor& input, const at::Tensor& residual,
                                  c10::SymIntArrayRef normalized_shape, const Optional& weight,
                                  std::optional<double> eps) {
    const NormForward f =
        Backend::template forward<RowNorm::Rms>(input, residual, normalized_shape, weight, std::nullopt, eps);
    return {f.out, f.sum, f.rstd};
  }

  static Tensor3 layer_norm_bwd(const at::Tensor& grad_out, const at::Tensor& input,
                                c10::SymIntArrayRef normalized_shape, const at::Tensor& mean, const at::Tensor& rstd,
                                const Optional& weight, const Optional& bias, std::array<bool, 3> output_mask,
                                const Optional& grad_sum) {
    return Backend::template backward<RowNorm::Layer>(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                                                      output_mask, grad_sum.value_or(at::Tensor()));
  }

  static Tensor2 rms_norm_bwd(const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                              const at::Tensor& rstd, const Optional& weight, std::array<bool, 2> output_mask,
                              const Optional& grad_sum) {
    auto [grad_input, grad_weight, unused] = Backend::template backward<RowNorm::Rms>(
        grad_out, input, normalized_shape, at::Tensor(), rstd, weight, std::nullopt,
        std::array<bool, 3>{output_mask[0], output_mask[1], false}, grad_sum.value_or(at::Tensor()));
    return {grad_input, grad_weight};
  }

  static void register_forwards(torch::Library& m) {
    m.impl("layer_norm_fwd", &layer_norm_fwd);
    m.impl("rms_norm_fwd", &rms_norm_fwd);
    m.impl("add_layer_norm_fwd", &add_layer_norm_fwd);
    m.impl("add_rms_norm_fwd", &add_rms_norm_fwd);
  }

  static void register_backwards(torch::Library& m) {
    m.impl("layer_norm_bwd", &layer_norm_bwd);
    m.impl("rms_norm_bwd", &rms_norm_bwd);
  }
};

}  // namespace torch_reduce
