// var_mean, LayerNorm and RMSNorm on the CPU: rows in parallel, statistics in double (two passes over the row, or
// Welford-combined chunks of a long row), so they serve as a reference for every dtype.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/dispatch.h"
#include "common/reduce_ops.h"
#include "cpu/isa.h"
#include "cpu/lanes.h"
#include "layernorm.h"
#include "norm_ops.h"

namespace torch_reduce::cpu {
namespace {

constexpr int64_t kChunk = 1 << 15;  // elements per task when one long row is split over threads

// Rows a task takes at least: about at::internal::GRAIN_SIZE elements, so that a small input (8 rows of 1024)
// runs on the calling thread instead of waking the pool for microseconds of work.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(cols, 1)); }

// A row's sums in lanes (cpu/lanes.h): a chain of 1024 dependent adds took most of a small LayerNorm's time; a long
// row's in runs folded pairwise (a float64 mean of rows of 5e6 normals was 6e-11 off in 8 lanes, torch's 9e-14).
template <typename Term>
double lane_sum(int64_t n, Term term) {
  return pairwise_lane_fold<double>(n, SumOp<double>(), term);
}

// The statistics of x[0, n). Elements of up to 32 bits: one pass over d = x - x0 (x0: the first element, 0 if
// it is not finite), summing d and d^2 in double: a float's 24 bits squared fit double's 53, and the
// cancellation in m2 = sum(d^2) - sum(d) * (mean - x0) costs at most n units of 2^-53 relative to m2 (x0 is an
// element, so (mean - x0)^2 <= n var); a constant row gives exactly 0. float64: two passes, the mean (as x0 plus
// the mean of x - x0: a row of 1e308s has its mean, where a plain sum overflows to inf), then the squared
// deviations from it.
template <typename scalar_t>
Welford<double> run_stats(const scalar_t* x, int64_t n) {
  if constexpr (sizeof(scalar_t) <= 4) {
    if (n == 0) return Welford<double>(0.0, 0.0, 0.0);
    const double first = static_cast<double>(x[0]), x0 = std::isfinite(first) ? first : 0.0;
    double s1[kLanes] = {}, s2[kLanes] = {};  // d and d^2, element j in lane j % kLanes
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      for (int64_t k = 0; k < kLanes; ++k) {
        const double d = static_cast<double>(x[j + k]) - x0;
        s1[k] += d;
        s2[k] += d * d;
      }
    }
    for (; j < n; ++j) {
      const double d = static_cast<double>(x[j]) - x0;
      s1[j % kLanes] += d;
      s2[j % kLanes] += d * d;
    }
    for (int64_t width = kLanes / 2; width > 0; width /= 2) {
      for (int64_t k = 0; k < width; ++k) {
        s1[k] += s1[k + width];
        s2[k] += s2[k + width];
      }
    }
    const double shift = s1[0] / n;  // mean - x0
    // Rounding can leave m2 a hair below 0; a row holding an infinity gives inf - inf, NaN, which stays.
    double m2 = s2[0] - s1[0] * shift;
    if (m2 < 0) m2 = 0;
    return Welford<double>(x0 + shift, m2, static_cast<double>(n));
  }
  const double first = n > 0 ? static_cast<double>(x[0]) : 0.0, x0 = std::isfinite(first) ? first : 0.0;
  const double shifted = lane_sum(n, [&](int64_t j) { return static_cast<double>(x[j]) - x0; });
  const double mean = n > 0 ? x0 + shifted / n : 0.0;
  const double m2 = lane_sum(n, [&](int64_t j) {
    const double d = static_cast<double>(x[j]) - mean;
    return d * d;
  });
  return Welford<double>(mean, m2, static_cast<double>(n));
}

// A row's statistics; a long row in chunks, computed in parallel and combined in order.
template <typename scalar_t>
Welford<double> row_stats(const scalar_t* x, int64_t n, bool parallel) {
  if (!parallel || n <= kChunk) return run_stats(x, n);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<Welford<double>> parts(chunks);
  parallel_for_best_vectors(0, chunks, 1, [&](int64_t begin, int64_t end) {
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
  if (input.is_complex()) return complex_var_mean(input, dim, correction, keepdim, &var_mean_cpu, op);
  VarMeanProblem p = var_mean_problem(input, dim, correction, keepdim, op);
  const int64_t rows = p.rows.size(0), inner = p.inner;
  TORCH_REDUCE_DISPATCH_FLOATING(input.scalar_type(), "reduce::var_mean", [&] {
    const scalar_t* x = p.rows.const_data_ptr<scalar_t>();
    scalar_t* var = p.var.mutable_data_ptr<scalar_t>();
    scalar_t* mean = p.mean.mutable_data_ptr<scalar_t>();
    const bool one_row = rows == 1;
    parallel_for_best_vectors(0, rows, row_grain(inner), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const Welford<double> w = row_stats(x + r * inner, inner, one_row);
        // An empty row: mean and variance NaN, as torch gives (a negative correction makes the divisor positive).
        mean[r] = static_cast<scalar_t>(inner > 0 ? w.mean : std::nan(""));
        var[r] = static_cast<scalar_t>(inner > 0 ? w.m2 / p.divisor : std::nan(""));
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
  return lane_sum(n, [&](int64_t j) { return static_cast<double>(x[j]) * static_cast<double>(x[j]); });
}

// f(std::bool_constant<p != nullptr>()) for each pointer p: loops specialized on which parameters are given,
// without a branch per element.
template <typename F>
decltype(auto) with_given(const void* a, const void* b, F&& f) {
  const auto second = [&](auto first) {
    return b != nullptr ? f(first, std::true_type()) : f(first, std::false_type());
  };
  return a != nullptr ? second(std::true_type()) : second(std::false_type());
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
  const LayerNormShape s = layer_norm_shape(kNorm, input, normalized_shape, weight, bias, op);
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
      using acc_t = acc_type<scalar_t>;
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const param_t *wp = data_or_null<param_t>(w), *bp = data_or_null<param_t>(b);
      scalar_t* yp = out.mutable_data_ptr<scalar_t>();
      stat_t* mp = mean.defined() ? mean.mutable_data_ptr<stat_t>() : nullptr;
      stat_t* rp = rstd.mutable_data_ptr<stat_t>();
      parallel_for_best_vectors(0, s.rows, row_grain(cols), [&](int64_t begin, int64_t end) {
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
          // The output in the accumulate type from the statistics as stored, as the GPU computes it (float32
          // vectors twice as wide as double's: half the time of a double loop at 8 x 1024).
          const acc_t mean_a = static_cast<acc_t>(static_cast<stat_t>(mu)), rstd_a = static_cast<acc_t>(rp[r]);
          scalar_t* y = yp + r * cols;
          with_given(wp, bp, [&](auto has_weight, auto has_bias) {
            for (int64_t j = 0; j < cols; ++j) {
              acc_t v = (static_cast<acc_t>(row[j]) - mean_a) * rstd_a;
              if constexpr (decltype(has_weight)::value) v *= static_cast<acc_t>(wp[j]);
              if constexpr (decltype(has_bias)::value) v += static_cast<acc_t>(bp[j]);
              y[j] = static_cast<scalar_t>(v);
            }
          });
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
  const LayerNormShape s = layer_norm_shape(kNorm, input, normalized_shape, weight, bias, op);
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
      using acc_t = acc_type<scalar_t>;
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
        parallel_for_best_vectors(0, rows, row_grain(cols), [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const double mu = row_mean(r), rstd_r = rp[r];
            const scalar_t *x = xp + r * cols, *d = dyp + r * cols;
            with_given(wp, gsp, [&](auto has_weight, auto has_grad_sum) {
              constexpr bool kWeight = decltype(has_weight)::value, kGradSum = decltype(has_grad_sum)::value;
              // sum(g) and sum(g * xhat) in double, element j in lane j % kLanes.
              double sum_g[kLanes] = {}, sum_gx[kLanes] = {};
              const auto add = [&](int64_t j, int64_t lane) {
                const double dj = static_cast<double>(d[j]);
                const double gj = kWeight ? dj * static_cast<double>(wp[j]) : dj;
                sum_g[lane] += gj;
                sum_gx[lane] += gj * ((static_cast<double>(x[j]) - mu) * rstd_r);
              };
              int64_t j = 0;
              for (; j + kLanes <= cols; j += kLanes) {
                for (int64_t k = 0; k < kLanes; ++k) add(j + k, k);
              }
              for (; j < cols; ++j) add(j, j % kLanes);
              for (int64_t width = kLanes / 2; width > 0; width /= 2) {
                for (int64_t k = 0; k < width; ++k) {
                  sum_g[k] += sum_g[k + width];
                  sum_gx[k] += sum_gx[k + width];
                }
              }
              // dx in the accumulate type, as the forward's output.
              const acc_t mean_g = kLayer ? static_cast<acc_t>(sum_g[0] / cols) : acc_t(0);
              const acc_t mean_gx = static_cast<acc_t>(sum_gx[0] / cols);
              const acc_t mean_a = static_cast<acc_t>(mu), rstd_a = static_cast<acc_t>(rstd_r);
              scalar_t* dx = dxp + r * cols;
              for (int64_t j = 0; j < cols; ++j) {
                const acc_t dj = static_cast<acc_t>(d[j]);
                const acc_t gj = kWeight ? dj * static_cast<acc_t>(wp[j]) : dj;
                acc_t v = rstd_a * (gj - mean_g - (static_cast<acc_t>(x[j]) - mean_a) * rstd_a * mean_gx);
                if constexpr (kGradSum) v += static_cast<acc_t>(gsp[r * cols + j]);
                dx[j] = static_cast<scalar_t>(v);
              }
            });
          }
        });
      }
      if (grad_weight.numel() > 0 || grad_bias.numel() > 0) {
        param_t* dwp = grad_weight.numel() > 0 ? grad_weight.mutable_data_ptr<param_t>() : nullptr;
        param_t* dbp = grad_bias.numel() > 0 ? grad_bias.mutable_data_ptr<param_t>() : nullptr;
        // Column sums over the rows; each task owns a range of columns, so no two tasks share an output.
        // Columns a task takes: 64 at least, and about GRAIN_SIZE elements of x and dy.
        const int64_t column_grain = std::max<int64_t>(64, at::internal::GRAIN_SIZE / std::max<int64_t>(rows, 1));
        parallel_for_best_vectors(0, cols, column_grain, [&](int64_t begin, int64_t end) {
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
