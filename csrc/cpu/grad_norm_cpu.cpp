// The global gradient norm on the CPU: every tensor cut into chunks, the chunks' folds in parallel (in double,
// so these kernels serve as a reference for every dtype), then each tensor's chunks and the tensors folded in
// list order: the same bits on every run, whatever the thread count.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/dispatch.h"
#include "grad_norm.h"

namespace torch_reduce::cpu {
namespace {

constexpr int64_t kChunk = 1 << 15;  // elements per task

int64_t chunks_of(const at::Tensor& t) { return (t.numel() + kChunk - 1) / kChunk; }

// Whether the CUDA kernels fold this list in float64 (cuda/grad_norm.cu: a float64 tensor or dtype= in it); else
// they fold in float32, as torch folds a float32 or 16-bit tensor.
bool folds_wide(const std::vector<at::Tensor>& tensors, std::optional<at::ScalarType> dtype) {
  const auto is_double = [](const at::Tensor& t) { return t.scalar_type() == at::kDouble; };
  return dtype == at::kDouble || std::any_of(tensors.begin(), tensors.end(), is_double);
}

// An accumulator as a float32 fold ends: inf beyond float32's range (then the norm is inf, or 0 for an order below
// 0). The folds here run in double, but a list the GPU folds in float32 gets the GPU's and torch's norm where that
// sum overflows (a float32 gradient of 1e20s: inf, so clipping zeroes it, as torch's), not a finite one.
double in_fold_range(double accumulator, bool wide) {
  const bool beyond = !wide && std::isinf(static_cast<float>(accumulator));  // rounds past float32's largest
  return beyond ? std::numeric_limits<double>::infinity() : accumulator;
}

// A norm as a 0-dim tensor of `options`, rounded as a cast rounds (at::scalar_tensor refuses a double beyond
// float32's range, where a cast, and a float32 kernel, give inf).
at::Tensor scalar_norm(double norm, const at::TensorOptions& options) {
  if (options.dtype() == at::kFloat && std::isfinite(norm) && std::fabs(norm) > std::numeric_limits<float>::max())
    return at::scalar_tensor(norm, options.dtype(at::kDouble)).to(at::kFloat);
  return at::scalar_tensor(norm, options);
}

// Each tensor's accumulator (unprojected) under `ops`, folded in order from its chunks. Each element's term
// (|x|^p) rounded to float32 unless the list folds wide: a term beyond float32's range is 0 or inf there, as in
// the GPU's and torch's float32 folds (1e-30 squared is 0: a norm of 1e-30s is 0; 1e30 to the power -2 is 0,
// so the norm of order -2 of 1e30s is inf), not the exact norm a double fold would give.
template <typename Ops>
std::vector<double> tensor_accumulators(const std::vector<at::Tensor>& dense, const Ops& ops, bool wide) {
  std::vector<int64_t> first_chunk(dense.size() + 1, 0);
  for (size_t i = 0; i < dense.size(); ++i) first_chunk[i + 1] = first_chunk[i] + chunks_of(dense[i]);
  std::vector<double> partials(first_chunk.back());
  at::parallel_for(0, first_chunk.back(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const size_t i = std::upper_bound(first_chunk.begin(), first_chunk.end(), c) - first_chunk.begin() - 1;
      const at::Tensor& t = dense[i];
      const int64_t offset = (c - first_chunk[i]) * kChunk, n = std::min(kChunk, t.numel() - offset);
      TORCH_REDUCE_DISPATCH_FLOATING(t.scalar_type(), "reduce::foreach_norm", [&] {
        const scalar_t* x = t.const_data_ptr<scalar_t>() + offset;
        double acc = Ops::identity();
        for (int64_t k = 0; k < n; ++k) {
          const double term = load_element<double>(ops, x[k]);
          acc = ops(acc, wide ? term : static_cast<double>(static_cast<float>(term)));
        }
        partials[c] = acc;
      });
    }
  });
  std::vector<double> accumulators(dense.size());
  for (size_t i = 0; i < dense.size(); ++i) {
    double acc = Ops::identity();
    for (int64_t c = first_chunk[i]; c < first_chunk[i + 1]; ++c) acc = ops(acc, partials[c]);
    accumulators[i] = acc;
  }
  return accumulators;
}

// The magnitude of t's one element (norm_is_magnitude), else the folded norm.
double one_element_or(const at::Tensor& t, double ord, double folded) {
  return norm_is_magnitude(t, ord) ? at::abs(t).to(at::kDouble).item<double>() : folded;
}

std::vector<at::Tensor> dense_list(at::TensorList tensors, const char* op) {
  std::vector<at::Tensor> dense;
  dense.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.device().is_cpu(), op, ": expected the CPU kernel's tensors on the CPU, got one on ", t.device());
    dense.push_back(dense_elements(t));
  }
  return dense;
}

}  // namespace

std::vector<at::Tensor> foreach_norm(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype) {
  const char* op = "reduce::foreach_norm";
  check_norm_list(tensors, ord, dtype);
  const NormOperands real = real_operands(tensors, ord, dtype);
  const std::vector<at::Tensor> dense = dense_list(real.tensors, op);
  std::vector<at::Tensor> norms;
  norms.reserve(tensors.size());
  const bool wide = folds_wide(dense, real.dtype);
  with_norm_ops<double>(ord, [&](auto ops) {
    const std::vector<double> accumulators = tensor_accumulators(dense, ops, wide);
    for (size_t i = 0; i < dense.size(); ++i) {
      const double folded = project_result(ops, in_fold_range(accumulators[i], wide));
      const double norm = one_element_or(tensors[i], ord, folded);
      norms.push_back(scalar_norm(norm, dense[i].options().dtype(real.dtype.value_or(dense[i].scalar_type()))));
    }
  });
  return norms;
}

at::Tensor total_norm(at::TensorList tensors, double ord) {
  const char* op = "reduce::total_norm";
  check_norm_list(tensors, ord, std::nullopt);
  const std::vector<at::Tensor> dense = dense_list(real_operands(tensors, ord, std::nullopt).tensors, op);
  const bool wide = folds_wide(dense, std::nullopt);
  double total = 0;
  with_norm_ops<double>(ord, [&](auto ops) {
    double acc = decltype(ops)::identity();
    for (double a : tensor_accumulators(dense, ops, wide)) acc = ops(acc, tensor_contribution(ops, in_fold_range(a, wide)));
    total = project_result(ops, in_fold_range(acc, wide));
  });
  if (tensors.size() == 1) total = one_element_or(tensors[0], ord, total);
  return scalar_norm(total, tensors[0].options().dtype(total_norm_dtype(tensors)));
}

void clip_grads_(at::TensorList grads, const at::Tensor& total_norm, double max_norm) {
  const char* op = "reduce::clip_grads_";
  check_clip_grads(grads, total_norm, op);
  const at::Tensor coefficient = clip_coefficient(total_norm.to(at::kCPU), max_norm);
  for (const at::Tensor& g : grads)
    TORCH_CHECK(g.device().is_cpu(), op, ": expected the CPU kernel's tensors on the CPU, got one on ", g.device());
  // x * 1 is x, bit for bit: a norm within max_norm leaves the gradients untouched (as the CUDA kernel does).
  if (coefficient.item<double>() == 1.0) return;
  for (const at::Tensor& g : grads) g.mul_(coefficient);
}

TORCH_LIBRARY_IMPL(reduce, CPU, m) {
  m.impl("foreach_norm", &foreach_norm);
  m.impl("total_norm", &total_norm);
  m.impl("clip_grads_", &clip_grads_);
  m.impl("clip_grad_norm_", &clip_grad_norm<&total_norm, &clip_grads_>);
}

}  // namespace torch_reduce::cpu
