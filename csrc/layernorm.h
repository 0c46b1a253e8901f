#pragma once
// var_mean, LayerNorm and RMSNorm: argument checks and shapes shared by the CPU and CUDA kernels. All reduce
// rows of a contiguous (rows, cols) matrix: var_mean moves the reduced dims last, the norms flatten
// normalized_shape into cols.
#include <ATen/ATen.h>

#include <array>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace torch_reduce {

struct VarMeanProblem {
  at::Tensor rows;             // contiguous (outer, inner): the kept dims first, the reduced dims last
  at::Tensor var, mean;        // contiguous, one element per row: the caller's shape but expanded dims as 1
  std::vector<int64_t> shape;  // the caller's shape
  int64_t inner;               // elements reduced per row
  double divisor;              // what m2 is divided by: max(0, N - correction) / (N / inner), as torch.var divides
  // var and mean in the caller's shape.
  std::tuple<at::Tensor, at::Tensor> results() const;
};

// torch.var_mean's checks and shapes. dim: None or empty reduces every dim; correction: None means 1,
// and may be any real number (torch divides by max(0, N - correction)).
VarMeanProblem var_mean_problem(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                const std::optional<at::Scalar>& correction, bool keepdim, const char* op);
double correction_value(const std::optional<at::Scalar>& correction);
// float32, float64, float16, bfloat16, complex32, complex64 and complex128, as torch.var_mean takes them.
void check_var_mean_dtype(const at::Tensor& input, const char* op);

// torch.var_mean of a complex input, backend-neutral (complex32 computed in complex64): a backend's var_mean over
// view_as_real's (real, imaginary) pairs, a kept trailing dim of 2; var is the two parts' variances added, mean the
// two means.
using VarMeanKernel = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&, at::OptionalIntArrayRef,
                                                             const std::optional<at::Scalar>&, bool);
std::tuple<at::Tensor, at::Tensor> complex_var_mean(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                                    const std::optional<at::Scalar>& correction, bool keepdim,
                                                    VarMeanKernel real_var_mean, const char* op);

// The normalization a row kernel computes (one template for both, as their loops are the same):
//   Layer: y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)    (F.layer_norm)
//   Rms:   y = x * rstd * weight,                  rstd = 1 / sqrt(mean(x^2) + eps) (F.rms_norm: no mean, no bias)
enum class RowNorm { Layer, Rms };

// The ops' names, as their errors say them; `add`: the fused residual add's forward (add_layer_norm_fwd, ...).
template <RowNorm kNorm>
constexpr const char* forward_name(bool add) {
  if (kNorm == RowNorm::Layer) return add ? "reduce::add_layer_norm_fwd" : "reduce::layer_norm_fwd";
  return add ? "reduce::add_rms_norm_fwd" : "reduce::rms_norm_fwd";
}
template <RowNorm kNorm>
constexpr const char* kBackwardName = kNorm == RowNorm::Layer ? "reduce::layer_norm_bwd" : "reduce::rms_norm_bwd";

// What a norm's forward kernel returns: the output; with a residual, the sum input + residual it normalized
// (else undefined); the statistics (mean undefined for RMSNorm).
struct NormForward {
  at::Tensor out, sum, mean, rstd;
};

// Column sums the backward keeps per normalized element: weight's and bias's (LayerNorm), weight's (RMSNorm).
constexpr int param_sums(RowNorm norm) { return norm == RowNorm::Layer ? 2 : 1; }

struct LayerNormShape {
  int64_t rows, cols;
  std::vector<int64_t> stat_shape;  // mean/rstd: the batch dims, then a 1 per normalized dim (as torch)
  at::ScalarType param_type;        // weight/bias (and their gradients): the input's dtype, or float32
};

// Checks input, normalized_shape, weight, bias like F.layer_norm, with clear messages: shapes, devices, and
// dtypes. weight and bias have the input's dtype, or float32 with a 16-bit input: the mixed-precision layout
// of Apex, Megatron and FSDP (statistics and parameter gradients in float32), which torch's CPU kernel
// accepts too. Every tensor must be on the input's device, so a meta weight never reaches a real kernel.
// `norm` picks torch's error class where the two differ: an input of fewer dims than normalized_shape is
// rms_norm's ValueError and layer_norm's RuntimeError.
LayerNormShape layer_norm_shape(RowNorm norm, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                const char* op);
void check_eps(double eps, const char* op);
// The residual of a fused add + norm: the input's shape, dtype and device (no broadcasting, no promotion).
void check_residual(const at::Tensor& input, const at::Tensor& residual, const char* op);
// A backward's grad_sum (the gradient reaching the fused add's sum from its other uses; undefined: none):
// the input's shape, dtype and device.
void check_grad_sum(const at::Tensor& grad_sum, const at::Tensor& input, const char* op);
// The eps a norm uses, checked: LayerNorm's as given; RMSNorm's as given, or for None (F.rms_norm's default)
// the machine epsilon of the accumulate type (float32's for 16-bit inputs).
template <RowNorm kNorm>
double norm_eps(std::optional<double> eps, at::ScalarType input_type, const char* op) {
  if (kNorm == RowNorm::Rms && !eps.has_value()) {
    return input_type == at::kDouble ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
  }
  TORCH_CHECK(eps.has_value(), op, ": eps is required");
  check_eps(*eps, op);
  return *eps;
}
// The backward's checks beyond layer_norm_shape: grad_out like the input; mean (LayerNorm; undefined for
// RMSNorm) and rstd the forward's.
void check_norm_bwd(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                    const at::Tensor& rstd, const LayerNormShape& s, const char* op);
// layer_norm_bwd's results, allocated: each requested gradient dense, weight's and bias's in the parameters'
// dtype; an empty tensor for the others (output_mask false, or no weight/bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_grads(const at::Tensor& input,
                                                                const std::optional<at::Tensor>& weight,
                                                                const std::optional<at::Tensor>& bias,
                                                                std::array<bool, 3> output_mask,
                                                                const LayerNormShape& s);

// mean and rstd are kept in the accumulate type: float32 for 16-bit inputs.
inline at::ScalarType stat_scalar_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// What layer_norm_bwd returns for a gradient it was not asked for (output_mask false, or no weight/bias).
inline at::Tensor not_requested(const at::Tensor& like) { return at::empty({0}, like.options()); }

inline bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

}  // namespace torch_reduce
