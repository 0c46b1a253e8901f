// var_mean and LayerNorm on the CPU: rows in parallel, statistics in double (two passes over the row, or
// Welford-combined chunks of a long row), so they serve as a reference for every dtype.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/dispatch.h"
#include "common/reduce_ops.h"
#include "layernorm.h"

namespace torch_reduce::cpu {
namespace {

constexpr int64_t kChunk = 1 << 15;  // elements per task when one long row is split over threads

// Two passes over x[0, n): the mean, then the squared deviations from it.
template <typename scalar_t>
Welford<double> run_stats(const scalar_t* x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]);
  const double mean = n > 0 ? sum / n : 0.0;
  double m2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - mean;
    m2 += d * d;
  }
  return Welford<double>(mean, m2, static_cast<double>(n));
}

// A row's statistics; a long row in chunks, computed in parallel and combined in order.
template <typename scalar_t>
Welford<double> row_stats(const scalar_t* x, int64_t n, bool parallel) {
  if (!parallel || n <= kChunk) return run_stats(x, n);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<Welford<double>> parts(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) parts[c] = run_stats(x + c * kChunk, std::min(kChunk, n - c * kChunk));
  });
  Welford<double> w = WelfordOp<double>::identity();
  for (const auto& p : parts) w = WelfordOp<double>()(w, p);
  return w;
}

std::tuple<at::Tensor, at::Tensor> var_mean_cpu(const at::Tensor& input, at::OptionalIntArrayRef dim,
                                                int64_t correction, bool keepdim) {
  const char* op = "reduce::var_mean";
  TORCH_CHECK(input.device().is_cpu(), op, ": expected a CPU tensor, got one on ", input.device());
  VarMeanProblem p = var_mean_problem(input, dim, correction, keepdim, op);
  const int64_t rows = p.rows.size(0), inner = p.inner;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "reduce::var_mean", [&] {
    const scalar_t* x = p.rows.const_data_ptr<scalar_t>();
    scalar_t* var = p.var.mutable_data_ptr<scalar_t>();
    scalar_t* mean = p.mean.mutable_data_ptr<scalar_t>();
    const bool one_row = rows == 1;
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const Welford<double> w = row_stats(x + r * inner, inner, one_row);
        // An empty row: mean NaN (0/0) as torch gives.
        mean[r] = static_cast<scalar_t>(inner > 0 ? w.mean : std::nan(""));
        var[r] = static_cast<scalar_t>(w.m2 / p.divisor);
      }
    });
  });
  return {p.var, p.mean};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_cpu(const at::Tensor& input,
                                                                  c10::SymIntArrayRef normalized_shape,
                                                                  const std::optional<at::Tensor>& weight,
                                                                  const std::optional<at::Tensor>& bias, double eps) {
  const char* op = "reduce::layer_norm_fwd";
  TORCH_CHECK(input.device().is_cpu(), op, ": expected a CPU tensor, got one on ", input.device());
  const LayerNormShape s = layer_norm_shape(input, normalized_shape, weight, bias, op);
  check_eps(eps, op);
  const at::Tensor x = input.contiguous();
  at::Tensor out = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  const auto stat_options = input.options().dtype(stat_scalar_type(input.scalar_type()));
  at::Tensor mean = at::empty(s.stat_shape, stat_options), rstd = at::empty(s.stat_shape, stat_options);
  const at::Tensor w = weight.has_value() && weight->defined() ? weight->contiguous() : at::Tensor();
  const at::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
  const int64_t cols = s.cols;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "reduce::layer_norm_fwd", [&] {
    using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.defined() ? w.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* bp = b.defined() ? b.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* yp = out.mutable_data_ptr<scalar_t>();
    stat_t* mp = mean.mutable_data_ptr<stat_t>();
    stat_t* rp = rstd.mutable_data_ptr<stat_t>();
    at::parallel_for(0, s.rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* row = xp + r * cols;
        const Welford<double> st = run_stats(row, cols);
        const double rs = 1.0 / std::sqrt(st.m2 / cols + eps);
        mp[r] = static_cast<stat_t>(st.mean);
        rp[r] = static_cast<stat_t>(rs);
        for (int64_t j = 0; j < cols; ++j) {
          double y = (static_cast<double>(row[j]) - st.mean) * rs;
          if (wp) y *= static_cast<double>(wp[j]);
          if (bp) y += static_cast<double>(bp[j]);
          yp[r * cols + j] = static_cast<scalar_t>(y);
        }
      }
    });
  });
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd_cpu(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  const char* op = "reduce::layer_norm_bwd";
  TORCH_CHECK(input.device().is_cpu(), op, ": expected a CPU tensor, got one on ", input.device());
  const LayerNormShape s = layer_norm_shape(input, normalized_shape, weight, bias, op);
  TORCH_CHECK(grad_out.sizes().equals(input.sizes()) && grad_out.scalar_type() == input.scalar_type(), op,
              ": grad_out must have the input's shape and dtype");
  const auto stat_type = stat_scalar_type(input.scalar_type());
  TORCH_CHECK(mean.numel() == s.rows && rstd.numel() == s.rows && mean.scalar_type() == stat_type &&
                  rstd.scalar_type() == stat_type, op, ": mean and rstd must be layer_norm_fwd's (", s.rows,
              " elements of ", stat_type, ")");
  const bool has_weight = weight.has_value() && weight->defined(), has_bias = bias.has_value() && bias->defined();
  const at::Tensor x = input.contiguous(), dy = grad_out.contiguous();
  const at::Tensor m = mean.contiguous(), rs = rstd.contiguous();
  const at::Tensor w = has_weight ? weight->contiguous() : at::Tensor();
  const auto dense = input.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_input = output_mask[0] ? at::empty(input.sizes(), dense) : not_requested(input);
  at::Tensor grad_weight = output_mask[1] && has_weight ? at::empty(weight->sizes(), dense) : not_requested(input);
  at::Tensor grad_bias = output_mask[2] && has_bias ? at::empty(bias->sizes(), dense) : not_requested(input);
  const int64_t rows = s.rows, cols = s.cols;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "reduce::layer_norm_bwd", [&] {
    using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    const scalar_t* wp = has_weight ? w.const_data_ptr<scalar_t>() : nullptr;
    const stat_t* mp = m.const_data_ptr<stat_t>();
    const stat_t* rp = rs.const_data_ptr<stat_t>();
    if (grad_input.numel() > 0) {
      scalar_t* dxp = grad_input.mutable_data_ptr<scalar_t>();
      // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight.
      at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const double mu = mp[r], rstd_r = rp[r];
          double sum_g = 0, sum_gx = 0;
          for (int64_t j = 0; j < cols; ++j) {
            const double g = static_cast<double>(dyp[r * cols + j]) * (wp ? static_cast<double>(wp[j]) : 1.0);
            sum_g += g;
            sum_gx += g * (static_cast<double>(xp[r * cols + j]) - mu) * rstd_r;
          }
          for (int64_t j = 0; j < cols; ++j) {
            const double g = static_cast<double>(dyp[r * cols + j]) * (wp ? static_cast<double>(wp[j]) : 1.0);
            const double xhat = (static_cast<double>(xp[r * cols + j]) - mu) * rstd_r;
            dxp[r * cols + j] = static_cast<scalar_t>(rstd_r * (g - sum_g / cols - xhat * sum_gx / cols));
          }
        }
      });
    }
    if (grad_weight.numel() > 0 || grad_bias.numel() > 0) {
      scalar_t* dwp = grad_weight.numel() > 0 ? grad_weight.mutable_data_ptr<scalar_t>() : nullptr;
      scalar_t* dbp = grad_bias.numel() > 0 ? grad_bias.mutable_data_ptr<scalar_t>() : nullptr;
      // Column sums over the rows; each task owns a range of columns, so no two tasks share an output.
      at::parallel_for(0, cols, 64, [&](int64_t begin, int64_t end) {
        std::vector<double> dw(end - begin, 0.0), db(end - begin, 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          const double mu = mp[r], rstd_r = rp[r];
          for (int64_t j = begin; j < end; ++j) {
            const double d = static_cast<double>(dyp[r * cols + j]);
            dw[j - begin] += d * (static_cast<double>(xp[r * cols + j]) - mu) * rstd_r;
            db[j - begin] += d;
          }
        }
        for (int64_t j = begin; j < end; ++j) {
          if (dwp) dwp[j] = static_cast<scalar_t>(dw[j - begin]);
          if (dbp) dbp[j] = static_cast<scalar_t>(db[j - begin]);
        }
      });
    }
  });
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CPU, m) {
  m.impl("var_mean", &var_mean_cpu);
  m.impl("layer_norm_fwd", &layer_norm_fwd_cpu);
  m.impl("layer_norm_bwd", &layer_norm_bwd_cpu);
}

}  // namespace torch_reduce::cpu
