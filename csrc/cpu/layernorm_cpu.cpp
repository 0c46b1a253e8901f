// var_mean, LayerNorm and RMSNorm on the CPU: rows in parallel, statistics in double (two passes over the row, or
// Welford-combined chunks of a long row), so they serve as a reference for every dtype.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/dispatch.h"
#include "common/reduce_ops.h"
#include "layernorm.h"
#include "norm_ops.h"

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
                                                const std::optional<at::Scalar>& correction, bool keepdim) {
  const char* op = "reduce::var_mean";
  TORCH_CHECK(input.device().is_cpu(), op, ": expected every tensor on one CPU device, got the input on ", input.device());
  VarMeanProblem p = var_mean_problem(input, dim, correction, keepdim, op);
  const int64_t rows = p.rows.size(0), inner = p.inner;
  TORCH_REDUCE_DISPATCH_FLOATING(input.scalar_type(), "reduce::var_mean", [&] {
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
  return p.results();
}

template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return defined(t) ? t->contiguous() : at::Tensor();
}

// Squares summed in double, one pass (RMSNorm's statistic).
template <typename scalar_t>
double run_sum_squares(const scalar_t* x, int64_t n) {
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) squares += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return squares;
}

// The forward of either norm (csrc/layernorm.h, RowNorm) of input, or of input + residual (residual defined):
// mean undefined for RMSNorm, sum for no residual.
template <RowNorm kNorm>
NormForward row_norm_fwd(const at::Tensor& input, const at::Tensor& residual, c10::SymIntArrayRef normalized_shape,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         std::optional<double> eps_arg) {
  const char* op = forward_name<kNorm>(residual.defined());
  TORCH_CHECK(input.device().is_cpu(), op, ": expected every tensor on one CPU device, got the input on ",
              input.device());
  const LayerNormShape s = layer_norm_shape(input, normalized_shape, weight, bias, op);
  if (residual.defined()) check_residual(input, residual, op);
  const double eps = norm_eps<kNorm>(eps_arg, input.scalar_type(), op);
  // The sum is torch's own add (the CPU kernels are the reference: its rounding, exactly).
  const at::Tensor sum = residual.defined() ? at::add(input, residual).contiguous() : at::Tensor();
  const at::Tensor x = sum.defined() ? sum : input.contiguous();
  const at::Tensor w = contiguous_or_undefined(weight), b = contiguous_or_undefined(bias);
  at::Tensor out = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  const auto stat_options = input.options().dtype(stat_scalar_type(input.scalar_type()));
  at::Tensor rstd = at::empty(s.stat_shape, stat_options);
  at::Tensor mean = kNorm == RowNorm::Layer ? at::empty(s.stat_shape, stat_options) : at::Tensor();
  const int64_t cols = s.cols;
  TORCH_REDUCE_DISPATCH_FLOATING(input.scalar_type(), "reduce::row_norm_fwd", [&] {
    with_param_type<scalar_t>(s.param_type, [&](auto param) {
      using param_t = decltype(param);
      using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const param_t *wp = data_or_null<param_t>(w), *bp = data_or_null<param_t>(b);
      scalar_t* yp = out.mutable_data_ptr<scalar_t>();
      stat_t* mp = mean.defined() ? mean.mutable_data_ptr<stat_t>() : nullptr;
      stat_t* rp = rstd.mutable_data_ptr<stat_t>();
      at::parallel_for(0, s.rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t* row = xp + r * cols;
          double mu = 0, rs;
          if constexpr (kNorm == RowNorm::Layer) {
            const Welford<double> st = run_stats(row, cols);
            mu = st.mean;
            rs = 1.0 / std::sqrt(st.m2 / cols + eps);
            mp[r] = static_cast<stat_t>(mu);
          } else {
            rs = 1.0 / std::sqrt(run_sum_squares(row, cols) / cols + eps);
          }
          rp[r] = static_cast<stat_t>(rs);
          for (int64_t j = 0; j < cols; ++j) {
            double y = (static_cast<double>(row[j]) - mu) * rs;
            if (wp) y *= static_cast<double>(wp[j]);
            if (bp) y += static_cast<double>(bp[j]);
            yp[r * cols + j] = static_cast<scalar_t>(y);
          }
        }
      });
    });
  });
  return {out, sum, mean, rstd};
}

// The backward of either norm; mean (and bias) undefined for RMSNorm, whose xhat is x * rstd; grad_sum (may be
// undefined) added to grad_input.
template <RowNorm kNorm>
std::tuple<at::Tensor, at::Tensor, at::Tensor> row_norm_bwd(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask, const at::Tensor& grad_sum) {
  constexpr const char* op = kBackwardName<kNorm>;
  TORCH_CHECK(input.device().is_cpu(), op, ": expected every tensor on one CPU device, got the input on ",
              input.device());
  const LayerNormShape s = layer_norm_shape(input, normalized_shape, weight, bias, op);
  check_norm_bwd(grad_out, input, mean, rstd, s, op);
  check_grad_sum(grad_sum, input, op);
  const at::Tensor x = input.contiguous(), dy = grad_out.contiguous(), w = contiguous_or_undefined(weight);
  const at::Tensor gsum = grad_sum.defined() ? grad_sum.contiguous() : at::Tensor();
  const at::Tensor m = mean.defined() ? mean.contiguous() : at::Tensor(), rs = rstd.contiguous();
  auto [grad_input, grad_weight, grad_bias] = layer_norm_grads(input, weight, bias, output_mask, s);
  const int64_t rows = s.rows, cols = s.cols;
  constexpr bool kLayer = kNorm == RowNorm::Layer;
  TORCH_REDUCE_DISPATCH_FLOATING(input.scalar_type(), op, [&] {
    with_param_type<scalar_t>(s.param_type, [&](auto param) {
      using param_t = decltype(param);
      using stat_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
      const param_t* wp = data_or_null<param_t>(w);
      const stat_t* mp = m.defined() ? m.const_data_ptr<stat_t>() : nullptr;
      const stat_t* rp = rs.const_data_ptr<stat_t>();
      const scalar_t* gsp = gsum.defined() ? gsum.const_data_ptr<scalar_t>() : nullptr;
      const auto row_mean = [&](int64_t r) { return kLayer ? static_cast<double>(mp[r]) : 0.0; };
      if (grad_input.numel() > 0) {
        scalar_t* dxp = grad_input.mutable_data_ptr<scalar_t>();
        // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight (RMSNorm: no mean(g) term).
        at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const double mu = row_mean(r), rstd_r = rp[r];
            double sum_g = 0, sum_gx = 0;
            for (int64_t j = 0; j < cols; ++j) {
              const double g = static_cast<double>(dyp[r * cols + j]) * (wp ? static_cast<double>(wp[j]) : 1.0);
              sum_g += g;
              sum_gx += g * (static_cast<double>(xp[r * cols + j]) - mu) * rstd_r;
            }
            const double mean_g = kLayer ? sum_g / cols : 0.0;
            for (int64_t j = 0; j < cols; ++j) {
              const double g = static_cast<double>(dyp[r * cols + j]) * (wp ? static_cast<double>(wp[j]) : 1.0);
              const double xhat = (static_cast<double>(xp[r * cols + j]) - mu) * rstd_r;
              const double extra = gsp ? static_cast<double>(gsp[r * cols + j]) : 0.0;
              dxp[r * cols + j] = static_cast<scalar_t>(rstd_r * (g - mean_g - xhat * sum_gx / cols) + extra);
            }
          }
        });
      }
      if (grad_weight.numel() > 0 || grad_bias.numel() > 0) {
        param_t* dwp = grad_weight.numel() > 0 ? grad_weight.mutable_data_ptr<param_t>() : nullptr;
        param_t* dbp = grad_bias.numel() > 0 ? grad_bias.mutable_data_ptr<param_t>() : nullptr;
        // Column sums over the rows; each task owns a range of columns, so no two tasks share an output.
        at::parallel_for(0, cols, 64, [&](int64_t begin, int64_t end) {
          std::vector<double> dw(end - begin, 0.0), db(end - begin, 0.0);
          for (int64_t r = 0; r < rows; ++r) {
            const double mu = row_mean(r), rstd_r = rp[r];
            for (int64_t j = begin; j < end; ++j) {
              const double d = static_cast<double>(dyp[r * cols + j]);
              dw[j - begin] += d * (static_cast<double>(xp[r * cols + j]) - mu) * rstd_r;
              db[j - begin] += d;
            }
          }
          for (int64_t j = begin; j < end; ++j) {
            if (dwp) dwp[j] = static_cast<param_t>(dw[j - begin]);
            if (dbp) dbp[j] = static_cast<param_t>(db[j - begin]);
          }
        });
      }
    });
  });
  return {grad_input, grad_weight, grad_bias};
}

// The norm kernels above as norm_ops.h's backend.
struct CpuNorms {
  template <RowNorm kNorm, typename... Args>
  static NormForward forward(const Args&... args) {
    return row_norm_fwd<kNorm>(args...);
  }
  template <RowNorm kNorm, typename... Args>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const Args&... args) {
    return row_norm_bwd<kNorm>(args...);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CPU, m) {
  m.impl("var_mean", &var_mean_cpu);
  NormOps<CpuNorms>::register_forwards(m);
  NormOps<CpuNorms>::register_backwards(m);
}

}  // namespace torch_reduce::cpu
