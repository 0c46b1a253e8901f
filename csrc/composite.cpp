#include "composite.h"

#include <algorithm>

#include "autograd_util.h"
#include "common/dispatch.h"
#include "grad_norm.h"
#include "ladder.h"
#include "layernorm.h"

namespace torch_reduce::composite {
namespace {

// The trailing `count` dims of a `ndim`-dim tensor: LayerNorm's normalized dims.
std::vector<int64_t> trailing_dims(int64_t ndim, int64_t count) {
  std::vector<int64_t> dims;
  for (int64_t d = ndim - count; d < ndim; ++d) dims.push_back(d);
  return dims;
}

// A parameter's gradient: t summed over the batch dims, those before the trailing `count` (none: the input is
// one row; sum(dim=[]) would sum everything).
at::Tensor column_sum(const at::Tensor& t, int64_t count, at::ScalarType type) {
  std::vector<int64_t> batch;
  for (int64_t d = 0; d < t.dim() - count; ++d) batch.push_back(d);
  return (batch.empty() ? t : t.sum(batch)).to(type);
}

}  // namespace

at::Tensor ladder_sum(const at::Tensor& t, int64_t block_size, const char* op) {
  ladder_input(t, block_size, op);  // the ladder's checks and errors
  return at::sum(t);
}

at::Tensor reduce(Reduction r, const at::Tensor& self, const ReduceCall& call) {
  check_reduction_input(r, self.scalar_type(), call.dtype);  // before at::amax's own
  const auto& [dim, keepdim, dtype, ord] = call;
  switch (r) {
    case Reduction::Sum: return at::sum(self, dim, keepdim, dtype);
    case Reduction::Mean: return at::mean(self, dim, keepdim, dtype);
    case Reduction::Amax: return at::amax(self, dim.value_or(at::IntArrayRef()), keepdim);
    case Reduction::Amin: return at::amin(self, dim.value_or(at::IntArrayRef()), keepdim);
    case Reduction::VectorNorm: return at::linalg_vector_norm(self, ord, dim, keepdim, dtype);
    case Reduction::Prod: {
      // torch.prod takes one dim or all: several are moved last and flattened into one.
      const int64_t ndim = self.dim();
      if (ndim == 0) return at::prod(self, dtype);
      const std::vector<int64_t> dims = reduced_dims(dim, ndim);
      std::vector<int64_t> permutation;
      for (int64_t d = 0; d < ndim; ++d)
        if (std::find(dims.begin(), dims.end(), d) == dims.end()) permutation.push_back(d);
      const auto kept = static_cast<int64_t>(permutation.size());
      permutation.insert(permutation.end(), dims.begin(), dims.end());
      at::Tensor result = at::prod(self.permute(permutation).flatten(kept), -1, /*keepdim=*/false, dtype);
      if (keepdim)
        for (int64_t d : dims) result = result.unsqueeze(d);
      return result;
    }
  }
  TORCH_CHECK(false, "torch_reduce: unknown reduction");
}

std::tuple<at::Tensor, at::Tensor> var_mean(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                            const std::optional<at::Scalar>& correction, bool keepdim) {
  check_var_mean_dtype(input, "reduce::var_mean");
  const bool all_dims = !dim.has_value() || dim->empty();
  return at::var_mean(input, all_dims ? at::OptionalIntArrayRef() : dim, at::Scalar(correction_value(correction)),
                      keepdim);
}

std::tuple<at::Tensor, at::Tensor> layer_norm_stats(const at::Tensor& input, int64_t normalized_dims, double eps) {
  const at::Tensor x = input.to(stat_scalar_type(input.scalar_type()));
  auto [var, mean] = at::var_mean(x, trailing_dims(x.dim(), normalized_dims), /*correction=*/0, /*keepdim=*/true);
  return {mean, (var + eps).rsqrt()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd(const at::Tensor& input,
                                                              c10::SymIntArrayRef normalized_shape,
                                                              const std::optional<at::Tensor>& weight,
                                                              const std::optional<at::Tensor>& bias, double eps) {
  layer_norm_shape(RowNorm::Layer, input, normalized_shape, weight, bias, "reduce::layer_norm_fwd");
  check_eps(eps, "reduce::layer_norm_fwd");
  const auto [mean, rstd] = layer_norm_stats(input, static_cast<int64_t>(normalized_shape.size()), eps);
  at::Tensor y = (input.to(mean.scalar_type()) - mean) * rstd;
  if (defined(weight)) y = y * *weight;
  if (defined(bias)) y = y + *bias;
  // mean and rstd are statistics for the backward, not results to differentiate (as torch's native_layer_norm).
  return {y.to(input.scalar_type()), mean.detach(), rstd.detach()};
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight, xhat = (x - mean) * rstd, with mean and
// rstd as given (differentiable when they are functions of x); dw, db = column sums of dy * xhat and dy.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> output_mask, const std::optional<at::Tensor>& grad_sum) {
  const char* op = "reduce::layer_norm_bwd";
  const LayerNormShape s = layer_norm_shape(RowNorm::Layer, input, normalized_shape, weight, bias, op);
  check_norm_bwd(grad_out, input, mean, rstd, s, op);
  if (defined(grad_sum)) check_grad_sum(*grad_sum, input, op);
  const auto k = static_cast<int64_t>(normalized_shape.size());
  const auto stat_type = mean.scalar_type();
  std::vector<c10::SymInt> stat_shape(input.sym_sizes().begin(), input.sym_sizes().end() - k);
  stat_shape.resize(input.dim(), 1);
  const at::Tensor m = mean.reshape_symint(stat_shape), r = rstd.reshape_symint(stat_shape);
  const at::Tensor dy = grad_out.to(stat_type);
  const at::Tensor xhat = (input.to(stat_type) - m) * r;
  at::Tensor grad_input = not_requested(input), grad_weight = not_requested(input), grad_bias = not_requested(input);
  if (output_mask[0]) {
    const at::Tensor g = defined(weight) ? dy * *weight : dy;
    const auto dims = trailing_dims(input.dim(), k);
    grad_input = (r * (g - g.mean(dims, true) - xhat * (g * xhat).mean(dims, true))).to(input.scalar_type());
    if (defined(grad_sum)) grad_input = grad_input + *grad_sum;
  }
  if (output_mask[1] && defined(weight)) grad_weight = column_sum(dy * xhat, k, s.param_type);
  if (output_mask[2] && defined(bias)) grad_bias = column_sum(dy, k, s.param_type);
  return {grad_input, grad_weight, grad_bias};
}

at::Tensor rms_norm_rstd(const at::Tensor& input, int64_t normalized_dims, double eps) {
  const at::Tensor x = input.to(stat_scalar_type(input.scalar_type()));
  return (x * x).mean(trailing_dims(x.dim(), normalized_dims), /*keepdim=*/true).add(eps).rsqrt();
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fwd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                                                const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  const char* op = "reduce::rms_norm_fwd";
  layer_norm_shape(RowNorm::Rms, input, normalized_shape, weight, std::nullopt, op);
  const double e = norm_eps<RowNorm::Rms>(eps, input.scalar_type(), op);
  const at::Tensor rstd = rms_norm_rstd(input, static_cast<int64_t>(normalized_shape.size()), e);
  at::Tensor y = input.to(rstd.scalar_type()) * rstd;
  if (defined(weight)) y = y * *weight;
  return {y.to(input.scalar_type()), rstd.detach()};
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * weight, xhat = x * rstd (rstd differentiable when it is a
// function of x); dw = column sums of dy * xhat.
std::tuple<at::Tensor, at::Tensor> rms_norm_bwd(const at::Tensor& grad_out, const at::Tensor& input,
                                                c10::SymIntArrayRef normalized_shape, const at::Tensor& rstd,
                                                const std::optional<at::Tensor>& weight,
                                                std::array<bool, 2> output_mask,
                                                const std::optional<at::Tensor>& grad_sum) {
  const char* op = "reduce::rms_norm_bwd";
  const LayerNormShape s = layer_norm_shape(RowNorm::Rms, input, normalized_shape, weight, std::nullopt, op);
  check_norm_bwd(grad_out, input, at::Tensor(), rstd, s, op);
  if (defined(grad_sum)) check_grad_sum(*grad_sum, input, op);
  const auto k = static_cast<int64_t>(normalized_shape.size());
  const auto stat_type = rstd.scalar_type();
  std::vector<c10::SymInt> stat_shape(input.sym_sizes().begin(), input.sym_sizes().end() - k);
  stat_shape.resize(input.dim(), 1);
  const at::Tensor r = rstd.reshape_symint(stat_shape);
  const at::Tensor dy = grad_out.to(stat_type);
  const at::Tensor xhat = input.to(stat_type) * r;
  at::Tensor grad_input = not_requested(input), grad_weight = not_requested(input);
  if (output_mask[0]) {
    const at::Tensor g = defined(weight) ? dy * *weight : dy;
    grad_input = (r * (g - xhat * (g * xhat).mean(trailing_dims(input.dim(), k), true))).to(input.scalar_type());
    if (defined(grad_sum)) grad_input = grad_input + *grad_sum;
  }
  if (output_mask[1] && defined(weight)) grad_weight = column_sum(dy * xhat, k, s.param_type);
  return {grad_input, grad_weight};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_fwd(
    const at::Tensor& input, const at::Tensor& residual, c10::SymIntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  check_residual(input, residual, "reduce::add_layer_norm_fwd");
  const at::Tensor sum = input + residual;
  auto [out, mean, rstd] = layer_norm_fwd(sum, normalized_shape, weight, bias, eps);
  return {out, sum, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_fwd(const at::Tensor& input, const at::Tensor& residual,
                                                                c10::SymIntArrayRef normalized_shape,
                                                                const std::optional<at::Tensor>& weight,
                                                                std::optional<double> eps) {
  check_residual(input, residual, "reduce::add_rms_norm_fwd");
  const at::Tensor sum = input + residual;
  auto [out, rstd] = rms_norm_fwd(sum, normalized_shape, weight, eps);
  return {out, sum, rstd};
}

namespace {

// A tensor's norm as torch's _foreach_norm gives it: linalg.vector_norm's, but where it folds the one element's
// square (norm_folds_square): the root of that square, with torch's norm backward's gradient, x / norm, 0 where the
// square is 0 (sqrt's own would be NaN there, so the branch not taken sees 1 instead) and where it is inf.
at::Tensor foreach_tensor_norm(const at::Tensor& t, double ord, std::optional<at::ScalarType> dtype, bool fast_route) {
  if (!norm_folds_square(t, ord, fast_route))
    return at::linalg_vector_norm(t, ord, at::OptionalIntArrayRef(), /*keepdim=*/false, dtype);
  const at::ScalarType type = dtype.value_or(t.scalar_type());
  const bool wide = t.scalar_type() == at::kDouble || type == at::kDouble;
  const at::Tensor x = t.reshape({}).to(wide ? at::kDouble : at::kFloat);
  const at::Tensor zero = (x * x).detach() == 0;
  const at::Tensor nonzero = at::where(zero, at::ones_like(x), x);
  return at::where(zero, x * 0, at::sqrt(nonzero * nonzero)).to(type);
}

}  // namespace

std::vector<at::Tensor> foreach_norm(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype) {
  check_norm_list(tensors, ord, dtype);
  const bool fast_route = ord == 2 && torch_fast_route(tensors);
  std::vector<at::Tensor> norms;
  for (const at::Tensor& t : tensors) norms.push_back(foreach_tensor_norm(t, ord, dtype, fast_route));
  return norms;
}

at::Tensor total_norm(at::TensorList tensors, double ord, bool foreach) {
  check_norm_list(tensors, ord, std::nullopt);
  const std::vector<char> fast = ord == 2 ? total_fast_routes(tensors, foreach) : std::vector<char>(tensors.size());
  std::vector<at::Tensor> norms;
  for (size_t k = 0; k < tensors.size(); ++k)
    norms.push_back(foreach_tensor_norm(tensors[k], ord, std::nullopt, fast[k]).to(tensors[0].device()));
  return at::linalg_vector_norm(at::stack(norms), ord);
}

void clip_grads_(at::TensorList grads, const at::Tensor& total_norm, double max_norm) {
  check_clip_grads(grads, total_norm, "reduce::clip_grads_");
  const at::Tensor coefficient = clip_coefficient(total_norm, max_norm);
  for (const at::Tensor& g : grads) g.mul_(coefficient.to(g.device()));
}

}  // namespace torch_reduce::composite
