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

// Whether torch folds each tensor's norm in float32, so that ours keeps its terms and its sum in float32's range
// (Float32RangeTerms, in_torch_range): a float32 or 16-bit tensor without dtype=float64, but for a one-element tensor
// whose norm is its element's magnitude (norm_is_magnitude) in a total folded in float64 (`wide_total`), which that
// |x| enters as its dtype holds it.
std::vector<char> float32_folds(at::TensorList tensors, const std::vector<at::Tensor>& dense, double ord,
                                std::optional<at::ScalarType> dtype, bool wide_total) {
  std::vector<char> float32_fold(dense.size());
  for (size_t i = 0; i < dense.size(); ++i)
    float32_fold[i] = dtype != at::kDouble && dense[i].scalar_type() != at::kDouble &&
                      !(wide_total && norm_is_magnitude(tensors[i], ord));
  return float32_fold;
}

// A norm as a 0-dim tensor of `options`, rounded as a cast rounds (at::scalar_tensor refuses a double beyond
// float32's range, where a cast, and a float32 kernel, give inf).
at::Tensor scalar_norm(double norm, const at::TensorOptions& options) {
  if (options.dtype() == at::kFloat && std::isfinite(norm) && std::fabs(norm) > std::numeric_limits<float>::max())
    return at::scalar_tensor(norm, options.dtype(at::kDouble)).to(at::kFloat);
  return at::scalar_tensor(norm, options);
}

// Each tensor's accumulator (unprojected) under `ops`, folded in order from its chunks, in double; the terms of one
// that torch folds in float32 in float32's range (Float32RangeTerms).
template <typename Ops>
std::vector<double> tensor_accumulators(const std::vector<at::Tensor>& dense, const Ops& ops,
                                        const std::vector<char>& float32_fold) {
  std::vector<int64_t> first_chunk(dense.size() + 1, 0);
  for (size_t i = 0; i < dense.size(); ++i) first_chunk[i + 1] = first_chunk[i] + chunks_of(dense[i]);
  std::vector<double> partials(first_chunk.back());
  const auto fold = [&](const auto& chunk_ops, const auto* x, int64_t n) {
    double acc = Ops::identity();
    for (int64_t k = 0; k < n; ++k) acc = chunk_ops(acc, load_element<double>(chunk_ops, x[k]));
    return acc;
  };
  at::parallel_for(0, first_chunk.back(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const size_t i = std::upper_bound(first_chunk.begin(), first_chunk.end(), c) - first_chunk.begin() - 1;
      const at::Tensor& t = dense[i];
      const int64_t offset = (c - first_chunk[i]) * kChunk, n = std::min(kChunk, t.numel() - offset);
      TORCH_REDUCE_DISPATCH_FLOATING(t.scalar_type(), "reduce::foreach_norm", [&] {
        const scalar_t* x = t.const_data_ptr<scalar_t>() + offset;
        partials[c] = float32_fold[i] ? fold(Float32RangeTerms<Ops>{ops}, x, n) : fold(ops, x, n);
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

// A tensor's accumulator in torch's range for a norm of dtype `norm_type` (in_torch_range).
template <typename Ops>
double in_torch_range_of(at::ScalarType norm_type, const Ops& ops, double accumulator, bool float32_fold) {
  double in_range = accumulator;
  TORCH_REDUCE_DISPATCH_FLOATING(norm_type, "reduce::foreach_norm", [&] {
    in_range = in_torch_range<scalar_t>(ops, accumulator, float32_fold);
  });
  return in_range;
}

// The term of a tensor's norm of dtype `norm_type` in torch's fold of the rounded norms (rounded_norm_term).
template <typename Ops>
float rounded_term_of(at::ScalarType norm_type, const Ops& ops, double accumulator) {
  float term = 0;
  TORCH_REDUCE_DISPATCH_FLOATING(norm_type, "reduce::total_norm", [&] {
    term = rounded_norm_term<scalar_t>(ops, accumulator);
  });
  return term;
}

// The magnitude of t's one element (norm_is_magnitude), else the folded norm.
double one_element_or(const at::Tensor& t, double ord, std::optional<at::ScalarType> dtype, double folded) {
  return norm_is_magnitude(t, ord) ? magnitudes(t, dtype).to(at::kDouble).item<double>() : folded;
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

// A list's total accumulator (unprojected) in a total of `total_type`, and the float32 sum of its norms' rounded
// terms (in_rounded_range).
std::pair<double, float> fold_total(at::TensorList tensors, double ord, at::ScalarType total_type, bool only_tensor) {
  const NormOperands real = real_operands(tensors, ord, std::nullopt);
  const std::vector<at::Tensor> dense = dense_list(real.tensors, "reduce::total_norm");
  double acc = 0;
  float rounded_sum = 0;
  with_norm_ops<double>(ord, [&](auto ops) {
    const std::vector<char> float32_fold = float32_folds(tensors, dense, ord, std::nullopt, total_type == at::kDouble);
    const std::vector<double> accumulators = tensor_accumulators(dense, ops, float32_fold);
    acc = decltype(ops)::identity();
    for (size_t i = 0; i < dense.size(); ++i) {
      const double in_range = in_torch_range_of(real.norm_types[i], ops, accumulators[i], float32_fold[i]);
      acc = ops(acc, tensor_contribution(ops, in_range, only_tensor));
      rounded_sum += rounded_term_of(real.norm_types[i], ops, in_range);
    }
  });
  return {acc, rounded_sum};
}

}  // namespace

std::vector<at::Tensor> foreach_norm(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype) {
  const char* op = "reduce::foreach_norm";
  check_norm_list(tensors, ord, dtype);
  const NormOperands real = real_operands(tensors, ord, dtype);
  const std::vector<at::Tensor> dense = dense_list(real.tensors, op);
  std::vector<at::Tensor> norms;
  norms.reserve(tensors.size());
  with_norm_ops<double>(ord, [&](auto ops) {
    const std::vector<char> float32_fold = float32_folds(tensors, dense, ord, real.dtype, false);
    const std::vector<double> accumulators = tensor_accumulators(dense, ops, float32_fold);
    for (size_t i = 0; i < dense.size(); ++i) {
      const at::ScalarType norm_type = real.norm_types[i];
      const double folded = project_result(ops, in_torch_range_of(norm_type, ops, accumulators[i], float32_fold[i]));
      const double norm = one_element_or(tensors[i], ord, dtype, folded);
      norms.push_back(scalar_norm(norm, dense[i].options().dtype(norm_type)));
    }
  });
  return norms;
}

at::Tensor total_sums(at::TensorList tensors, double ord, at::ScalarType total_type, bool only_tensor) {
  const auto [acc, rounded_sum] = fold_total(tensors, ord, total_type, only_tensor);
  return at::tensor({acc, static_cast<double>(rounded_sum)}, at::kDouble).view({1, 2});
}

// Either route's: torch's CPU _foreach_norm takes every tensor per tensor.
at::Tensor total_norm(at::TensorList tensors, double ord, bool /*foreach*/) {
  check_norm_list(tensors, ord, std::nullopt);
  const at::ScalarType total_type = total_norm_dtype(tensors);
  const std::pair<double, float> sums = fold_total(tensors, ord, total_type, tensors.size() == 1);
  double acc = sums.first, total = 0;
  with_norm_ops<double>(ord, [&](auto ops) {
    // The norm of the tensors' norms in total_type, as torch's: in float32, in the range of its rounded norms'
    // fold (the norm of one norm is its magnitude), but for a float64 total.
    if (total_type != at::kDouble && tensors.size() > 1) acc = in_rounded_range(ops, acc, sums.second);
    total = project_result(ops, total_type == at::kDouble ? acc : in_torch_range<float>(ops, acc, true));
  });
  if (tensors.size() == 1) total = one_element_or(tensors[0], ord, std::nullopt, total);
  return scalar_norm(total, tensors[0].options().dtype(total_type));
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
