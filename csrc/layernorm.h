#pragma once
// var_mean and LayerNorm: argument checks and shapes shared by the CPU and CUDA kernels. Both reduce rows
// of a contiguous (rows, cols) matrix: var_mean moves the reduced dims last, LayerNorm flattens
// normalized_shape into cols.
#include <ATen/ATen.h>

#include <array>
#include <optional>

namespace torch_reduce {

struct VarMeanProblem {
  at::Tensor rows;       // contiguous (outer, inner): the kept dims first, the reduced dims last
  at::Tensor var, mean;  // contiguous results in the caller's shape, one element per row
  int64_t inner;         // elements reduced per row
  double divisor;        // max(0, inner - correction), as torch.var divides
};

// torch.var_mean's checks and shapes. dim: None or empty reduces every dim.
VarMeanProblem var_mean_problem(const at::Tensor& input, at::OptionalIntArrayRef dim, int64_t correction,
                                bool keepdim, const char* op);

struct LayerNormShape {
  int64_t rows, cols;
  std::vector<int64_t> stat_shape;  // mean/rstd: the batch dims, then a 1 per normalized dim (as torch)
};

// Checks input, normalized_shape, weight, bias (and eps when given) like F.layer_norm, with clear messages.
LayerNormShape layer_norm_shape(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                const char* op);
void check_eps(double eps, const char* op);

// mean and rstd are kept in the accumulate type: float32 for 16-bit inputs.
inline at::ScalarType stat_scalar_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// What layer_norm_bwd returns for a gradient it was not asked for (output_mask false, or no weight/bias).
inline at::Tensor not_requested(const at::Tensor& like) { return at::empty({0}, like.options()); }

}  // namespace torch_reduce
