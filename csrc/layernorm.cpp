#include "layernorm.h"

#include <ATen/WrapDimUtilsMulti.h>

namespace torch_reduce {

namespace {
bool is_float_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}
}  // namespace

VarMeanProblem var_mean_problem(const at::Tensor& input, at::OptionalIntArrayRef dim, int64_t correction,
                                bool keepdim, const char* op) {
  TORCH_CHECK(is_float_type(input.scalar_type()), op,
              ": std and var only support floating point dtypes (float32, float64, float16, bfloat16), got ",
              input.scalar_type());
  const int64_t ndim = input.dim();
  // Empty or absent dim reduces everything, as torch.var does; wrap_dim checks range and repeats.
  const std::bitset<at::dim_bitset_size> reduced =
      (!dim.has_value() || dim->empty()) ? std::bitset<at::dim_bitset_size>().set()
                                         : at::dim_list_to_bitset(*dim, ndim);
  std::vector<int64_t> order, out_shape;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!reduced[d]) {
      order.push_back(d);
      outer *= input.size(d);
      out_shape.push_back(input.size(d));
    } else if (keepdim) {
      out_shape.push_back(1);
    }
  }
  for (int64_t d = 0; d < ndim; ++d) {
    if (reduced[d]) {
      order.push_back(d);
      inner *= input.size(d);
    }
  }
  VarMeanProblem p;
  p.rows = input.permute(order).contiguous().view({outer, inner});
  p.var = at::empty(out_shape, input.options().memory_format(at::MemoryFormat::Contiguous));
  p.mean = at::empty(out_shape, input.options().memory_format(at::MemoryFormat::Contiguous));
  p.inner = inner;
  p.divisor = static_cast<double>(std::max<int64_t>(0, inner - correction));
  return p;
}

LayerNormShape layer_norm_shape(const at::Tensor& input, c10::SymIntArrayRef normalized_shape_sym,
                                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                const char* op) {
  const at::IntArrayRef normalized_shape = C10_AS_INTARRAYREF_SLOW(normalized_shape_sym);
  TORCH_CHECK(is_float_type(input.scalar_type()), op,
              ": expected a float32, float64, float16 or bfloat16 input, got ", input.scalar_type());
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(k >= 1, op, ": normalized_shape must name at least one dim, got []");
  const int64_t axis = input.dim() - k;
  TORCH_CHECK(axis >= 0 && input.sizes().slice(axis).equals(normalized_shape), op, ": normalized_shape ",
              normalized_shape, " does not match the input's trailing dims (input shape ", input.sizes(), ")");
  for (const auto& [param, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!param->has_value() || !(*param)->defined()) continue;
    const at::Tensor& p = **param;
    TORCH_CHECK(p.sizes().equals(normalized_shape), op, ": ", name, " must have shape normalized_shape ",
                normalized_shape, ", got ", p.sizes());
    TORCH_CHECK(p.scalar_type() == input.scalar_type(), op, ": ", name, " must have the input's dtype ",
                input.scalar_type(), ", got ", p.scalar_type());
    TORCH_CHECK(p.device() == input.device(), op, ": ", name, " must be on the input's device ", input.device(),
                ", got ", p.device());
  }
  LayerNormShape s;
  s.cols = c10::multiply_integers(normalized_shape);
  s.rows = c10::multiply_integers(input.sizes().slice(0, axis));
  s.stat_shape = input.sizes().slice(0, axis).vec();
  s.stat_shape.resize(input.dim(), 1);
  return s;
}

void check_eps(double eps, const char* op) {
  TORCH_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
}

}  // namespace torch_reduce
