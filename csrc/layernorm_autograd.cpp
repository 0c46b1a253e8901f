// Autograd for var_mean and the fused LayerNorm and RMSNorm, in C++ like the sums' (csrc/dim_reduce_autograd.cpp):
// a Python autograd kernel costs microseconds on every call, most of a small LayerNorm's time.
//   var_mean:       d var/dx = 2 (x - mean) / (N - correction), d mean/dx = 1 / N (N: elements per output),
//                   in differentiable ops (double backward through the saved mean, an output of the node),
//                   with torch's var_backward's edges (see VarMeanFunction::backward);
//   layer_norm_fwd: reduce::layer_norm_bwd from the saved input, mean and rstd; mean and rstd are statistics
//                   kept for the backward, not results to differentiate;
//   layer_norm_bwd: our kernel when its result is not differentiated (an ordinary backward); the composite
//                   formula when it is (create_graph=True, or a direct call on inputs that require grad).
//                   For a double backward through layer_norm_fwd, its backward passes mean and rstd
//                   recomputed as differentiable functions of the input;
//   rms_norm_fwd/bwd: the same, with rstd alone.
// Transforms and forward-mode AD take the composite path (composite.h).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <limits>

#include "autograd_util.h"
#include "composite.h"
#include "layernorm.h"

namespace torch_reduce {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Optional = std::optional<at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

std::tuple<at::Tensor, at::Tensor> var_mean_below_autograd(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                                            const std::optional<at::Scalar>& correction,
                                                            bool keepdim) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("reduce::var_mean", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, at::OptionalIntArrayRef,
                                                                       const std::optional<at::Scalar>&, bool)>();
  return call_below_autograd(op, input, dim, correction, keepdim);
}

using Tensor4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The handle of the op `name` of this signature, looked up once (each op below has a signature of its own).
template <typename Signature>
const c10::TypedOperatorHandle<Signature>& op_handle(const char* name) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
  return op;
}

using LayerNormFwd = Tensor3(const at::Tensor&, c10::SymIntArrayRef, const Optional&, const Optional&, double);
using AddLayerNormFwd = Tensor4(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, const Optional&,
                                const Optional&, double);
using LayerNormBwd = Tensor3(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, const at::Tensor&,
                             const at::Tensor&, const Optional&, const Optional&, std::array<bool, 3>, const Optional&);
using RmsNormFwd = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, c10::SymIntArrayRef, const Optional&,
                                                      std::optional<double>);
using AddRmsNormFwd = Tensor3(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, const Optional&,
                              std::optional<double>);
using RmsNormBwd = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef,
                                                      const at::Tensor&, const Optional&, std::array<bool, 2>,
                                                      const Optional&);

// The forward of a norm below autograd, fused with the residual add when one is given: NormForward's fields
// (sum undefined without a residual; mean for LayerNorm alone).
NormForward layer_norm_fwd_below_autograd(const at::Tensor& input, const Optional& residual,
                                          c10::SymIntArrayRef normalized_shape, const Optional& weight,
                                          const Optional& bias, double eps) {
  if (!defined(residual)) {
    auto [out, mean, rstd] = call_below_autograd(op_handle<LayerNormFwd>("reduce::layer_norm_fwd"), input,
                                                 normalized_shape, weight, bias, eps);
    return {out, at::Tensor(), mean, rstd};
  }
  auto [out, sum, mean, rstd] = call_below_autograd(op_handle<AddLayerNormFwd>("reduce::add_layer_norm_fwd"), input,
                                                    *residual, normalized_shape, weight, bias, eps);
  return {out, sum, mean, rstd};
}

NormForward rms_norm_fwd_below_autograd(const at::Tensor& input, const Optional& residual,
                                        c10::SymIntArrayRef normalized_shape, const Optional& weight,
                                        std::optional<double> eps) {
  if (!defined(residual)) {
    auto [out, rstd] = call_below_autograd(op_handle<RmsNormFwd>("reduce::rms_norm_fwd"), input, normalized_shape,
                                           weight, eps);
    return {out, at::Tensor(), at::Tensor(), rstd};
  }
  auto [out, sum, rstd] = call_below_autograd(op_handle<AddRmsNormFwd>("reduce::add_rms_norm_fwd"), input,
                                              *residual, normalized_shape, weight, eps);
  return {out, sum, at::Tensor(), rstd};
}

std::vector<c10::SymInt> saved_normalized_shape(AutogradContext* ctx) {
  std::vector<c10::SymInt> shape;
  for (const auto& size : ctx->saved_data["normalized_shape"].toList()) shape.push_back(size.get().toSymInt());
  return shape;
}

Optional optional(const at::Tensor& t) { return t.defined() ? Optional(t) : std::nullopt; }

// The node's outputs: out, then sum (fused add only), then the statistics.
variable_list norm_outputs(const NormForward& f) {
  variable_list outputs = {f.out};
  if (f.sum.defined()) outputs.push_back(f.sum);
  if (f.mean.defined()) outputs.push_back(f.mean);
  outputs.push_back(f.rstd);
  return outputs;
}

// The edges of a norm's node, in needs_input_grad's numbering (tensor inputs only: input, then residual, weight
// and bias where given).
struct NormEdges {
  size_t input = 0, residual, weight, bias;
  NormEdges(bool residual_given, bool weight_given) {
    residual = residual_given ? 1 : 0;
    weight = residual + 1;
    bias = weight + (weight_given ? 1 : 0);
  }
};

// The gradients a norm node returns, one per forward argument (input, residual, normalized_shape, weight, bias
// for LayerNorm, eps): input and residual get the same gradient.
variable_list norm_input_grads(bool add, const at::Tensor& grad_input, const at::Tensor& grad_weight,
                               const std::optional<at::Tensor>& grad_bias) {
  variable_list grads = {grad_input, add ? grad_input : at::Tensor(), at::Tensor(), grad_weight};
  if (grad_bias.has_value()) grads.push_back(*grad_bias);
  grads.push_back(at::Tensor());
  return grads;
}

// LayerNorm of input, or of input + residual (the fused add: add_layer_norm_fwd).
struct LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const Optional& residual,
                               c10::SymIntArrayRef normalized_shape, const Optional& weight, const Optional& bias,
                               double eps) {
    const NormForward f = layer_norm_fwd_below_autograd(input, residual, normalized_shape, weight, bias, eps);
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["add"] = defined(residual);
    ctx->save_for_backward({f.sum.defined() ? f.sum : input, f.mean, f.rstd, weight.value_or(at::Tensor()),
                            bias.value_or(at::Tensor())});
    ctx->mark_non_differentiable({f.mean, f.rstd});
    ctx->set_materialize_grads(false);  // no zero gradients made for the outputs not used
    return norm_outputs(f);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool add = ctx->saved_data["add"].toBool();
    const at::Tensor& grad_sum = add ? grads[1] : at::Tensor();
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &normalized = saved[0], &weight = saved[3], &bias = saved[4];
    if (!grads[0].defined()) return norm_input_grads(add, grad_sum, at::Tensor(), at::Tensor());
    at::Tensor mean = saved[1], rstd = saved[2];
    const NormEdges edge(add, weight.defined());
    const std::array<bool, 3> mask = {
        ctx->needs_input_grad(edge.input) || (add && ctx->needs_input_grad(edge.residual)),
        weight.defined() && ctx->needs_input_grad(edge.weight), bias.defined() && ctx->needs_input_grad(edge.bias)};
    const std::vector<c10::SymInt> normalized_shape = saved_normalized_shape(ctx);
    if (at::GradMode::is_enabled()) {
      // create_graph=True: the gradient will be differentiated, and it depends on x through mean and rstd too.
      std::tie(mean, rstd) = composite::layer_norm_stats(normalized, static_cast<int64_t>(normalized_shape.size()),
                                                         ctx->saved_data["eps"].toDouble());
    }
    auto [grad_input, grad_weight, grad_bias] =
        op_handle<LayerNormBwd>("reduce::layer_norm_bwd")
            .call(grads[0].contiguous(), normalized, normalized_shape, mean, rstd, optional(weight), optional(bias),
                  mask, optional(grad_sum));
    return norm_input_grads(add, mask[0] ? grad_input : at::Tensor(), mask[1] ? grad_weight : at::Tensor(),
                            mask[2] ? grad_bias : at::Tensor());
  }
};

// RMSNorm of input, or of input + residual (add_rms_norm_fwd); as LayerNormFunction, with rstd alone.
struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const Optional& residual,
                               c10::SymIntArrayRef normalized_shape, const Optional& weight,
                               std::optional<double> eps) {
    const NormForward f = rms_norm_fwd_below_autograd(input, residual, normalized_shape, weight, eps);
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->saved_data["eps"] = norm_eps<RowNorm::Rms>(eps, input.scalar_type(), "reduce::rms_norm_fwd");
    ctx->saved_data["add"] = defined(residual);
    ctx->save_for_backward({f.sum.defined() ? f.sum : input, f.rstd, weight.value_or(at::Tensor())});
    ctx->mark_non_differentiable({f.rstd});
    ctx->set_materialize_grads(false);
    return norm_outputs(f);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool add = ctx->saved_data["add"].toBool();
    const at::Tensor& grad_sum = add ? grads[1] : at::Tensor();
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &normalized = saved[0], &weight = saved[2];
    if (!grads[0].defined()) return norm_input_grads(add, grad_sum, at::Tensor(), std::nullopt);
    at::Tensor rstd = saved[1];
    const NormEdges edge(add, weight.defined());
    const std::array<bool, 2> mask = {
        ctx->needs_input_grad(edge.input) || (add && ctx->needs_input_grad(edge.residual)),
        weight.defined() && ctx->needs_input_grad(edge.weight)};
    const std::vector<c10::SymInt> normalized_shape = saved_normalized_shape(ctx);
    if (at::GradMode::is_enabled()) {  // create_graph=True: rstd as a function of x (see LayerNormFunction)
      rstd = composite::rms_norm_rstd(normalized, static_cast<int64_t>(normalized_shape.size()),
                                      ctx->saved_data["eps"].toDouble());
    }
    auto [grad_input, grad_weight] = op_handle<RmsNormBwd>("reduce::rms_norm_bwd")
                                         .call(grads[0].contiguous(), normalized, normalized_shape, rstd,
                                               optional(weight), mask, optional(grad_sum));
    return norm_input_grads(add, mask[0] ? grad_input : at::Tensor(), mask[1] ? grad_weight : at::Tensor(),
                            std::nullopt);
  }
};

struct VarMeanFunction : public torch::autograd::Function<VarMeanFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, at::OptionalIntArrayRef dim,
                               const std::optional<at::Scalar>& correction, bool keepdim) {
    auto [var, mean] = var_mean_below_autograd(input, dim, correction, keepdim);
    save_dims(ctx, input, dim, keepdim);
    ctx->saved_data["all_dims"] = input.dim() == 0 || !dim.has_value() || dim->empty();
    ctx->saved_data["correction"] = correction_value(correction);
    ctx->save_for_backward({input, mean});
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: no zeros to add
    return {var, mean};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> dims = saved_dims(ctx);
    const bool keepdim = ctx->saved_data["keepdim"].toBool();
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    c10::SymInt count = 1;
    for (int64_t d : dims) count = count * input.sym_size(d);
    at::Tensor grad;
    if (grads[0].defined()) {
      // torch's var_backward, term for term: 2 / (N - correction), unclamped (the forward's max(0, ...) is not
      // differentiated), so a correction above N gives a finite gradient; but over every dim (dim None or
      // empty, or a 0-dim input) N - correction <= 0 gives inf, NaN where x equals torch's mean (recomputed,
      // as torch does, so the same elements tie). torch takes dim=[] as N = 1 here, not the N its forward
      // divides by; we keep the forward's.
      const at::Tensor grad_var = restore_reduced_dims(grads[0], dims, keepdim);
      const c10::SymFloat dof = c10::SymFloat(count) - c10::SymFloat(ctx->saved_data["correction"].toDouble());
      if (ctx->saved_data["all_dims"].toBool() && dof <= c10::SymFloat(0.0)) {
        grad = grad_var * at::where(input == input.mean(), std::numeric_limits<double>::quiet_NaN(),
                                    std::numeric_limits<double>::infinity());
      } else {
        // With dof <= 0 the coefficient is infinite and an exact tie x == mean gives NaN: that mean is torch's
        // (at::mean, recomputed as its backward does), so the same elements tie; else ours, saved.
        const at::Tensor mean = dof <= c10::SymFloat(0.0) ? input.mean(dims, /*keepdim=*/true)
                                                          : restore_reduced_dims(saved[1], dims, keepdim);
        grad = c10::Scalar(c10::SymFloat(2.0) / dof) * grad_var * (input - mean);
      }
    }
    if (grads[1].defined()) {
      const at::Tensor from_mean = (restore_reduced_dims(grads[1], dims, keepdim) / c10::Scalar(count))
                                       .expand_symint(input.sym_sizes());
      grad = grad.defined() ? grad + from_mean : from_mean;
    }
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> var_mean_autograd(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                                     const std::optional<at::Scalar>& correction, bool keepdim) {
  if (needs_composite(input)) return composite::var_mean(input, dim, correction, keepdim);
  if (!records_grad(input)) return var_mean_below_autograd(input, dim, correction, keepdim);
  const variable_list out = VarMeanFunction::apply(input, dim, correction, keepdim);
  return {out[0], out[1]};
}

Tensor3 layer_norm_fwd_autograd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape, const Optional& weight,
                                const Optional& bias, double eps) {
  if (needs_composite(input, weight, bias)) return composite::layer_norm_fwd(input, normalized_shape, weight, bias, eps);
  if (!records_grad(input, weight, bias)) {
    const NormForward f = layer_norm_fwd_below_autograd(input, std::nullopt, normalized_shape, weight, bias, eps);
    return {f.out, f.mean, f.rstd};
  }
  const variable_list out = LayerNormFunction::apply(input, std::nullopt, normalized_shape, weight, bias, eps);
  return {out[0], out[1], out[2]};
}

Tensor4 add_layer_norm_fwd_autograd(const at::Tensor& input, const at::Tensor& residual,
                                    c10::SymIntArrayRef normalized_shape, const Optional& weight, const Optional& bias,
                                    double eps) {
  if (needs_composite(input, residual, weight, bias)) {
    return composite::add_layer_norm_fwd(input, residual, normalized_shape, weight, bias, eps);
  }
  if (!records_grad(input, residual, weight, bias)) {
    const NormForward f = layer_norm_fwd_below_autograd(input, residual, normalized_shape, weight, bias, eps);
    return {f.out, f.sum, f.mean, f.rstd};
  }
  const variable_list out = LayerNormFunction::apply(input, residual, normalized_shape, weight, bias, eps);
  return {out[0], out[1], out[2], out[3]};
}

Tensor3 layer_norm_bwd_autograd(const at::Tensor& grad_out, const at::Tensor& input,
                                c10::SymIntArrayRef normalized_shape, const at::Tensor& mean, const at::Tensor& rstd,
                                const Optional& weight, const Optional& bias, std::array<bool, 3> output_mask,
                                const Optional& grad_sum) {
  if (needs_composite(grad_out, input, mean, rstd, weight, bias, grad_sum) ||
      records_grad(grad_out, input, mean, rstd, weight, bias, grad_sum)) {
    return composite::layer_norm_bwd(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask,
                                     grad_sum);
  }
  return call_below_autograd(op_handle<LayerNormBwd>("reduce::layer_norm_bwd"), grad_out, input, normalized_shape,
                             mean, rstd, weight, bias, output_mask, grad_sum);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fwd_autograd(const at::Tensor& input,
                                                         c10::SymIntArrayRef normalized_shape, const Optional& weight,
                                                         std::optional<double> eps) {
  if (needs_composite(input, weight)) return composite::rms_norm_fwd(input, normalized_shape, weight, eps);
  if (!records_grad(input, weight)) {
    const NormForward f = rms_norm_fwd_below_autograd(input, std::nullopt, normalized_shape, weight, eps);
    return {f.out, f.rstd};
  }
  const variable_list out = RmsNormFunction::apply(input, std::nullopt, normalized_shape, weight, eps);
  return {out[0], out[1]};
}

Tensor3 add_rms_norm_fwd_autograd(const at::Tensor& input, const at::Tensor& residual,
                                  c10::SymIntArrayRef normalized_shape, const Optional& weight,
                                  std::optional<double> eps) {
  if (needs_composite(input, residual, weight)) {
    return composite::add_rms_norm_fwd(input, residual, normalized_shape, weight, eps);
  }
  if (!records_grad(input, residual, weight)) {
    const NormForward f = rms_norm_fwd_below_autograd(input, residual, normalized_shape, weight, eps);
    return {f.out, f.sum, f.rstd};
  }
  const variable_list out = RmsNormFunction::apply(input, residual, normalized_shape, weight, eps);
  return {out[0], out[1], out[2]};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_bwd_autograd(const at::Tensor& grad_out, const at::Tensor& input,
                                                         c10::SymIntArrayRef normalized_shape, const at::Tensor& rstd,
                                                         const Optional& weight, std::array<bool, 2> output_mask,
                                                         const Optional& grad_sum) {
  if (needs_composite(grad_out, input, rstd, weight, grad_sum) ||
      records_grad(grad_out, input, rstd, weight, grad_sum)) {
    return composite::rms_norm_bwd(grad_out, input, normalized_shape, rstd, weight, output_mask, grad_sum);
  }
  return call_below_autograd(op_handle<RmsNormBwd>("reduce::rms_norm_bwd"), grad_out, input, normalized_shape, rstd,
                             weight, output_mask, grad_sum);
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, Autograd, m) {
  m.impl("rms_norm_fwd", &rms_norm_fwd_autograd);
  m.impl("rms_norm_bwd", &rms_norm_bwd_autograd);
  m.impl("add_layer_norm_fwd", &add_layer_norm_fwd_autograd);
  m.impl("add_rms_norm_fwd", &add_rms_norm_fwd_autograd);
  m.impl("var_mean", &var_mean_autograd);
  m.impl("layer_norm_fwd", &layer_norm_fwd_autograd);
  m.impl("layer_norm_bwd", &layer_norm_bwd_autograd);
}

}  // namespace torch_reduce
