// Autograd for var_mean and the fused LayerNorm and RMSNorm, in C++ like the sums' (csrc/dim_reduce_autograd.cpp):
// a Python autograd kernel costs microseconds on every call, most of a small LayerNorm's time.
//   var_mean:       d var/dx = 2 (x - mean) / (N - correction), d mean/dx = 1 / N (N: elements per output),
//                   in differentiable ops (a double backward recomputes the mean from the input, as torch does),
//                   with torch's var_backward's edges (see VarMeanFunction::backward);
//   layer_norm_fwd: reduce::layer_norm_bwd from the saved input, mean and rstd; mean and rstd are statistics
//                   kept for the backward, not results to differentiate;
//   layer_norm_bwd: our kernel when its result is not differentiated (an ordinary backward); the composite
//                   formula when it is (create_graph=True, or a direct call on inputs that require grad).
//                   For a double backward through layer_norm_fwd, its backward passes mean and rstd
//                   recomputed as differentiable functions of the input;
//   rms_norm_fwd/bwd: the same, with rstd alone.
// Transforms and forward-mode AD take the composite path (composite.h). The norms record a node written as torch's
// generated ones are (NormBackward); var_mean's is a torch::autograd::Function.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
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

Optional optional(const at::Tensor& t) { return t.defined() ? Optional(t) : std::nullopt; }

// The backward node of a norm's forward (LayerNorm or RMSNorm, with or without the fused add), written as torch's
// generated nodes are (NativeLayerNormBackward0): typed fields and the outputs' history set directly. A
// torch::autograd::Function keeps its values in a string-keyed map and wraps its outputs one by one: on the CPU
// (2 x 8 floats, weight and bias; the host section's rows) torch us / ours us was 0.83 for a forward that records
// and 0.95 with autograd.grad; with this node, 1.52-1.59 and 1.09-1.11.
// Edges: input, residual, weight and (LayerNorm) bias, an empty edge for each one not given.
template <RowNorm kNorm>
struct NormBackward : public torch::autograd::Node {
  static constexpr size_t kInput = 0, kResidual = 1, kWeight = 2, kBias = 3;
  std::vector<c10::SymInt> normalized_shape;
  double eps = 0;  // RMSNorm: the eps its forward used, resolved from None
  bool add = false, has_weight = false, has_bias = false;
  // normalized: the input, or the fused add's sum (an output of this node); mean: LayerNorm's.
  torch::autograd::SavedVariable normalized, mean, rstd, weight, bias;

  std::string name() const override { return kNorm == RowNorm::Layer ? "LayerNormBackward" : "RmsNormBackward"; }

  void release_variables() override {
    for (torch::autograd::SavedVariable* v : {&normalized, &mean, &rstd, &weight, &bias}) v->reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    const at::Tensor grad_sum = add ? grads[1] : at::Tensor();
    variable_list result(num_outputs());
    const auto input_grads = [&](const at::Tensor& grad_input) {
      result[kInput] = grad_input;
      if (add) result[kResidual] = grad_input;  // input and residual get the same gradient
    };
    if (!grads[0].defined()) {  // only the fused add's sum was used
      input_grads(grad_sum);
      return result;
    }
    const bool input_grad = should_compute_output(kInput) || (add && should_compute_output(kResidual));
    const bool weight_grad = has_weight && should_compute_output(kWeight);
    const at::Tensor x = normalized.unpack(getptr()), w = weight.unpack();
    at::Tensor stats_rstd = rstd.unpack();
    const int64_t normalized_dims = static_cast<int64_t>(normalized_shape.size());
    if constexpr (kNorm == RowNorm::Layer) {
      const bool bias_grad = has_bias && should_compute_output(kBias);
      at::Tensor stats_mean = mean.unpack();
      if (at::GradMode::is_enabled()) {
        // create_graph=True: the gradient will be differentiated, and it depends on x through mean and rstd too.
        std::tie(stats_mean, stats_rstd) = composite::layer_norm_stats(x, normalized_dims, eps);
      }
      auto [grad_input, grad_weight, grad_bias] =
          op_handle<LayerNormBwd>("reduce::layer_norm_bwd")
              .call(grads[0].contiguous(), x, normalized_shape, stats_mean, stats_rstd, optional(w),
                    optional(bias.unpack()), {input_grad, weight_grad, bias_grad}, optional(grad_sum));
      if (bias_grad) result[kBias] = grad_bias;
      if (weight_grad) result[kWeight] = grad_weight;
      if (input_grad) input_grads(grad_input);
    } else {
      if (at::GradMode::is_enabled()) stats_rstd = composite::rms_norm_rstd(x, normalized_dims, eps);
      auto [grad_input, grad_weight] = op_handle<RmsNormBwd>("reduce::rms_norm_bwd")
                                           .call(grads[0].contiguous(), x, normalized_shape, stats_rstd, optional(w),
                                                 {input_grad, weight_grad}, optional(grad_sum));
      if (weight_grad) result[kWeight] = grad_weight;
      if (input_grad) input_grads(grad_input);
    }
    return result;
  }
};

// The forward's outputs, recorded for autograd: out (and the fused add's sum) get a NormBackward as their
// grad_fn; mean and rstd are statistics kept for the backward, not results to differentiate, and get none.
template <RowNorm kNorm>
void record_norm(const NormForward& f, const at::Tensor& input, const Optional& residual,
                 c10::SymIntArrayRef normalized_shape, const Optional& weight, const Optional& bias, double eps) {
  using torch::autograd::SavedVariable;
  const auto node = make_node<NormBackward<kNorm>>();
  if constexpr (kNorm == RowNorm::Layer) {
    node->set_next_edges(torch::autograd::collect_next_edges(input, residual, weight, bias));
  } else {
    node->set_next_edges(torch::autograd::collect_next_edges(input, residual, weight));
  }
  node->normalized_shape = normalized_shape.vec();
  node->eps = eps;
  node->add = defined(residual);
  node->has_weight = defined(weight);
  node->has_bias = defined(bias);
  node->mean = SavedVariable(f.mean, /*is_output=*/false);
  node->rstd = SavedVariable(f.rstd, /*is_output=*/false);
  node->weight = SavedVariable(weight.value_or(at::Tensor()), /*is_output=*/false);
  node->bias = SavedVariable(bias.value_or(at::Tensor()), /*is_output=*/false);
  torch::autograd::set_history(f.out, node);
  if (f.sum.defined()) {
    torch::autograd::set_history(f.sum, node);
    node->normalized = SavedVariable(f.sum, /*is_output=*/true);  // after its history: it refers to the node
  } else {
    node->normalized = SavedVariable(input, /*is_output=*/false);
  }
}

struct VarMeanFunction : public torch::autograd::Function<VarMeanFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, at::OptionalIntArrayRef dim,
                               const std::optional<at::Scalar>& correction, bool keepdim) {
    auto [var, mean] = var_mean_below_autograd(input, dim, correction, keepdim);
    save_dims(ctx, input, dim, keepdim);
    ctx->saved_data["all_dims"] = input.dim() == 0 || !dim.has_value() || dim->empty();
    ctx->saved_data["correction"] = correction_value(correction);
    ctx->save_for_backward({input});
    // The mean is kept by value for an ordinary backward, not as a saved output: torch's backward saves the input
    // alone, so a mean changed in place after the call (m.sub_(1)) must not stop it. detach() shares the output's
    // version counter, so such a change is seen and the mean recomputed from the input.
    ctx->saved_data["mean"] = mean.detach();
    ctx->saved_data["mean_version"] = static_cast<int64_t>(mean._version());
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
        // The mean recomputed as torch's backward does (at::mean of the input) where dof <= 0 (the coefficient is
        // infinite and an exact tie x == mean gives NaN: torch's mean, so the same elements tie), where the
        // gradient is differentiated (create_graph: the mean as a function of the input), and where the output
        // was changed in place; else ours, kept by value.
        const at::Tensor kept = ctx->saved_data["mean"].toTensor();
        const bool recompute = dof <= c10::SymFloat(0.0) || at::GradMode::is_enabled() ||
                               static_cast<int64_t>(kept._version()) != ctx->saved_data["mean_version"].toInt();
        const at::Tensor mean =
            recompute ? input.mean(dims, /*keepdim=*/true) : restore_reduced_dims(kept, dims, keepdim);
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
  const NormForward f = layer_norm_fwd_below_autograd(input, std::nullopt, normalized_shape, weight, bias, eps);
  record_norm<RowNorm::Layer>(f, input, std::nullopt, normalized_shape, weight, bias, eps);
  return {f.out, f.mean, f.rstd};
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
  const NormForward f = layer_norm_fwd_below_autograd(input, residual, normalized_shape, weight, bias, eps);
  record_norm<RowNorm::Layer>(f, input, residual, normalized_shape, weight, bias, eps);
  return {f.out, f.sum, f.mean, f.rstd};
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
  const NormForward f = rms_norm_fwd_below_autograd(input, std::nullopt, normalized_shape, weight, eps);
  record_norm<RowNorm::Rms>(f, input, std::nullopt, normalized_shape, weight, std::nullopt,
                            norm_eps<RowNorm::Rms>(eps, input.scalar_type(), "reduce::rms_norm_fwd"));
  return {f.out, f.rstd};
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
  const NormForward f = rms_norm_fwd_below_autograd(input, residual, normalized_shape, weight, eps);
  record_norm<RowNorm::Rms>(f, input, residual, normalized_shape, weight, std::nullopt,
                            norm_eps<RowNorm::Rms>(eps, input.scalar_type(), "reduce::rms_norm_fwd"));
  return {f.out, f.sum, f.rstd};
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
