#include "layernorm.h"

#include <ATen/WrapDimUtilsMulti.h>

namespace torch_reduce {

namespace {
bool is_float_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

void check_device(const at::Tensor& t, const char* name, const at::Tensor& input, const char* op) {
  TORCH_CHECK(t.device() == input.device(), op, ": ", name, " must be on the input's device ", input.device(),
              ", got ", t.device());
}
}  // namespace

double correction_value(const std::optional<at::Scalar>& correction) {
  return correction.has_value() ? correction->toDouble() : 1.0;
}

void check_var_mean_dtype(const at::Tensor& input, const char* op) {
  const at::ScalarType type = input.scalar_type();
  // A floating dtype without kernels (float8) is NotImplementedError, as torch's ("std_cpu" not implemented);
  // an integer one torch's RuntimeError.
  const bool supported = is_float_type(type) || at::isComplexType(type);
  TORCH_CHECK_NOT_IMPLEMENTED(supported || !at::isFloatingType(type), op, ": var_mean has no kernel for ", type,
                              " (float32, float64, float16, bfloat16, complex32, complex64, complex128)");
  TORCH_CHECK(supported, op,
              ": var_mean only support floating point and complex dtypes (float32, float64, float16, bfloat16, "
              "complex32, complex64, complex128), got ", type);
}

std::tuple<at::Tensor, at::Tensor> complex_var_mean(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                                    const std::optional<at::Scalar>& correction, bool keepdim,
                                                    VarMeanKernel real_var_mean, const char* op) {
  check_var_mean_dtype(input, op);
  if (input.scalar_type() == at::kComplexHalf) {
    // Computed in complex64 and rounded once to float16 and complex32 (the two float16 variances added in
    // float16 would round twice).
    auto [var, mean] = complex_var_mean(input.to(at::kComplexFloat), dim, correction, keepdim, real_var_mean, op);
    return {var.to(at::kHalf), mean.to(at::kComplexHalf)};
  }
  // A 0-dim input is one element: given a dim of 1 to reduce, so that no call reads the pairs' dim as its own.
  const at::Tensor x = input.dim() == 0 ? input.reshape({1}) : input;
  std::vector<int64_t> dims;
  if (!dim.has_value() || dim->empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
  } else {
    for (int64_t d : *dim) dims.push_back(at::maybe_wrap_dim(d, input.dim()));  // repeats raise in the call below
  }
  auto [var, mean] = real_var_mean(at::view_as_real(x.resolve_conj()), dims, correction, keepdim);
  // |x - mean|^2 = (re - mean(re))^2 + (im - mean(im))^2, over the same divisor.
  var = var.select(-1, 0) + var.select(-1, 1);
  mean = at::view_as_complex(mean);
  if (input.dim() == 0) return {var.reshape({}), mean.reshape({})};
  return {var, mean};
}

VarMeanProblem var_mean_problem(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                const std::optional<at::Scalar>& correction, bool keepdim, const char* op) {
  check_var_mean_dtype(input, op);
  const int64_t ndim = input.dim();
  // Empty or absent dim reduces everything, as torch.var does; wrap_dim checks range and repeats.
  const std::bitset<at::dim_bitset_size> reduced =
      (!dim.has_value() || dim->empty()) ? std::bitset<at::dim_bitset_size>().set()
                                         : at::dim_list_to_bitset(*dim, ndim);
  // Expanded dims (stride 0) hold one slice repeated: it is read once. A repeated reduced dim leaves the mean
  // as it is and multiplies m2 and the count by its size (divisor below); a repeated kept dim gives equal rows,
  // computed once and expanded (results()).
  at::Tensor x = input;
  int64_t repeats = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    if (input.size(d) <= 1 || input.stride(d) != 0) continue;
    if (reduced[d]) repeats *= input.size(d);
    x = x.narrow(d, 0, 1);
  }
  std::vector<int64_t> order, out_shape, computed_shape;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!reduced[d]) {
      order.push_back(d);
      outer *= x.size(d);
      out_shape.push_back(input.size(d));
      computed_shape.push_back(x.size(d));
    } else if (keepdim) {
      out_shape.push_back(1);
      computed_shape.push_back(1);
    }
  }
  for (int64_t d = 0; d < ndim; ++d) {
    if (reduced[d]) {
      order.push_back(d);
      inner *= x.size(d);
    }
  }
  const double degrees_of_freedom = static_cast<double>(inner) * static_cast<double>(repeats) -
                                    correction_value(correction);
  if (degrees_of_freedom <= 0) {  // torch.var_mean's warning, on its condition (the variance is inf or NaN)
    TORCH_WARN("var_mean(): degrees of freedom is <= 0. Correction should be strictly less than the reduction "
               "factor (input numel divided by output numel).");
  }
  VarMeanProblem p;
  p.rows = x.permute(order).contiguous().view({outer, inner});
  p.var = at::empty(computed_shape, input.options().memory_format(at::MemoryFormat::Contiguous));
  p.mean = at::empty(computed_shape, input.options().memory_format(at::MemoryFormat::Contiguous));
  p.shape = out_shape;
  p.inner = inner;
  // m2 of the rows read once over this is the full m2 over max(0, N - correction), N = inner * repeats.
  p.divisor = std::max(0.0, degrees_of_freedom) / static_cast<double>(repeats);
  return p;
}

std::tuple<at::Tensor, at::Tensor> VarMeanProblem::results() const {
  if (var.sizes().equals(shape)) return {var, mean};
  return {var.expand(shape).contiguous(), mean.expand(shape).contiguous()};
}

LayerNormShape layer_norm_shape(RowNorm norm, const at::Tensor& input, c10::SymIntArrayRef normalized_shape_sym,
                                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                const char* op) {
  const at::IntArrayRef normalized_shape = C10_AS_INTARRAYREF_SLOW(normalized_shape_sym);
  TORCH_CHECK_NOT_IMPLEMENTED(is_float_type(input.scalar_type()), op,
                              ": expected a float32, float64, float16 or bfloat16 input, got ", input.scalar_type());
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(k >= 1, op, ": normalized_shape must name at least one dim, got []");
  const int64_t axis = input.dim() - k;
  if (axis < 0 || !input.sizes().slice(axis).equals(normalized_shape)) {
    const std::string message = c10::str(op, ": normalized_shape ", normalized_shape,
                                         " does not match the input's trailing dims (input shape ", input.sizes(), ")");
    // Fewer input dims than normalized_shape: torch's rms_norm raises ValueError, its layer_norm RuntimeError.
    TORCH_CHECK_VALUE(axis >= 0 || norm == RowNorm::Layer, message);
    TORCH_CHECK(false, message);
  }
  const bool half_input = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  std::optional<at::ScalarType> param_type;
  for (const auto& [param, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!defined(*param)) continue;
    const at::Tensor& p = **param;
    check_device(p, name, input, op);
    TORCH_CHECK(p.sizes().equals(normalized_shape), op, ": ", name, " must have shape normalized_shape ",
                normalized_shape, ", got ", p.sizes());
    TORCH_CHECK(p.scalar_type() == input.scalar_type() || (half_input && p.scalar_type() == at::kFloat), op, ": ",
                name, " must have the input's dtype ", input.scalar_type(),
                half_input ? " (or float32: mixed precision)" : "", ", got ", p.scalar_type());
    TORCH_CHECK(!param_type || *param_type == p.scalar_type(), op, ": weight and bias must have one dtype, got ",
                *param_type, " and ", p.scalar_type());
    param_type = p.scalar_type();
  }
  LayerNormShape s;
  s.param_type = param_type.value_or(input.scalar_type());
  s.cols = c10::multiply_integers(normalized_shape);
  s.rows = c10::multiply_integers(input.sizes().slice(0, axis));
  s.stat_shape = input.sizes().slice(0, axis).vec();
  s.stat_shape.resize(input.dim(), 1);
  return s;
}

void check_norm_bwd(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                    const at::Tensor& rstd, const LayerNormShape& s, const char* op) {
  check_device(grad_out, "grad_out", input, op);
  if (mean.defined()) check_device(mean, "mean", input, op);
  check_device(rstd, "rstd", input, op);
  TORCH_CHECK(grad_out.sizes().equals(input.sizes()) && grad_out.scalar_type() == input.scalar_type(), op,
              ": grad_out must have the input's shape ", input.sizes(), " and dtype ", input.scalar_type(), ", got ",
              grad_out.sizes(), " and ", grad_out.scalar_type());
  const auto stat_type = stat_scalar_type(input.scalar_type());
  if (mean.defined()) {
    TORCH_CHECK(mean.sym_numel() == s.rows && rstd.sym_numel() == s.rows && mean.scalar_type() == stat_type &&
                    rstd.scalar_type() == stat_type,
                op, ": mean and rstd must be layer_norm_fwd's (", s.rows, " elements of ", stat_type, ")");
  } else {
    TORCH_CHECK(rstd.sym_numel() == s.rows && rstd.scalar_type() == stat_type, op, ": rstd must be rms_norm_fwd's (",
                s.rows, " elements of ", stat_type, ")");
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_grads(const at::Tensor& input,
                                                                const std::optional<at::Tensor>& weight,
                                                                const std::optional<at::Tensor>& bias,
                                                                std::array<bool, 3> output_mask,
                                                                const LayerNormShape& s) {
  const auto dense = input.options().memory_format(at::MemoryFormat::Contiguous);
  const auto param_dense = dense.dtype(s.param_type);
  return {output_mask[0] ? at::empty(input.sizes(), dense) : not_requested(input),
          output_mask[1] && defined(weight) ? at::empty(weight->sizes(), param_dense) : not_requested(input),
          output_mask[2] && defined(bias) ? at::empty(bias->sizes(), param_dense) : not_requested(input)};
}

void check_residual(const at::Tensor& input, const at::Tensor& residual, const char* op) {
  check_device(residual, "residual", input, op);
  TORCH_CHECK(residual.sizes().equals(input.sizes()) && residual.scalar_type() == input.scalar_type(), op,
              ": residual must have the input's shape ", input.sizes(), " and dtype ", input.scalar_type(), ", got ",
              residual.sizes(), " and ", residual.scalar_type());
}

void check_grad_sum(const at::Tensor& grad_sum, const at::Tensor& input, const char* op) {
  if (!grad_sum.defined()) return;
  check_device(grad_sum, "grad_sum", input, op);
  TORCH_CHECK(grad_sum.sizes().equals(input.sizes()) && grad_sum.scalar_type() == input.scalar_type(), op,
              ": grad_sum must have the input's shape ", input.sizes(), " and dtype ", input.scalar_type(), ", got ",
              grad_sum.sizes(), " and ", grad_sum.scalar_type());
}

void check_eps(double eps, const char* op) {
  TORCH_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
}

}  // namespace torch_reduce
