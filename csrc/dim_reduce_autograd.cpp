// Autograd for the dim reductions (every row of dim_reduce.h's table) in C++, like csrc/ladder_autograd.cpp:
// a Python autograd kernel would add microseconds to every call. The gradients are torch's:
//   sum, mean:   the incoming gradient with the reduced dims restored, expanded to the input (mean: divided
//                by the reduced count), in the input's dtype (dtype= may have changed the output's);
//   amax, amin:  shared evenly among the elements equal to the result, grad / count_of_ties * (x == result);
//   prod:        grad times the product of the other elements of the slice, from exclusive prefix and suffix
//                products (no division: exact with zeros in the slice, and no data-dependent branch, so the
//                backward traces under torch.compile);
//   vector_norm: torch's formulas by order (0, 1, 2, inf/-inf shared among ties, below 1, any other p), with
//                a zero subgradient where the norm (or, below 1, the element) is 0.
// All are written in differentiable ops, so double backward works; transforms and forward-mode AD take
// the composite path (torch's own ops).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "autograd_util.h"
#include "composite.h"
#include "dim_reduce.h"

namespace torch_reduce {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <Reduction R, typename Signature>
at::Tensor reduce_below_autograd(const at::Tensor& self, const ReduceCall& call) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return Signature::call(dim_reduction_op<R, Signature>(), self, call);
}

// The product of the other elements of each reduced slice: the reduced dims are moved last and flattened
// into one, whose exclusive prefix and suffix products multiply.
at::Tensor prod_of_others(const at::Tensor& x, const std::vector<int64_t>& dims) {
  const int64_t ndim = x.dim();
  if (ndim == 0) return at::ones_like(x);
  std::vector<int64_t> permutation, inverse(ndim);
  for (int64_t d = 0; d < ndim; ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) permutation.push_back(d);
  const auto kept = static_cast<int64_t>(permutation.size());
  permutation.insert(permutation.end(), dims.begin(), dims.end());
  for (int64_t i = 0; i < ndim; ++i) inverse[permutation[i]] = i;
  const at::Tensor permuted = x.permute(permutation);
  const at::Tensor rows = permuted.flatten(kept);
  const at::Tensor one = at::ones_like(rows.slice(-1, 0, 1));
  // torch's CUDA scan of a single row (numel == the row's length) is CUB's decoupled look-back, whose float
  // products group differently from run to run (the H200: a 2^22-element prod's gradient differed in 97% of
  // its elements between runs); a second row of ones sends it to the per-row scan, whose order is fixed.
  const auto scan = [](const at::Tensor& t) {
    if (!t.is_cuda() || t.sym_numel() != t.sym_size(-1)) return t.cumprod(-1);
    return at::cat({t.reshape({1, -1}), at::ones_like(t).reshape({1, -1})}, 0).cumprod(-1)[0].view_symint(
        t.sym_sizes());
  };
  const auto exclusive_prod = [&](const at::Tensor& t) { return scan(at::cat({one, t.slice(-1, 0, -1)}, -1)); };
  const at::Tensor before = exclusive_prod(rows), after = exclusive_prod(rows.flip(-1)).flip(-1);
  return (before * after).reshape_symint(permuted.sym_sizes()).permute(inverse);
}

// d norm / dx for g and norm with the reduced dims restored.
at::Tensor vector_norm_gradient(const at::Tensor& x, const at::Tensor& norm, const at::Tensor& g, double p,
                                const std::vector<int64_t>& dims) {
  if (p == 0) return at::zeros_like(x);
  if (p == 1) return x.sgn() * g;
  if (p == 2) return x * (g / norm).masked_fill(norm == 0, 0);
  if (std::isinf(p)) {  // amax/amin of |x|, NaN included
    const at::Tensor magnitude = x.abs();
    const at::Tensor ties = magnitude.eq(norm).logical_or(magnitude.isnan());
    return x.sgn() * (g / ties.sum(dims, /*keepdim=*/true)) * ties;
  }
  if (p < 1) return x.sgn() * x.abs().pow(p - 1).masked_fill(x == 0, 0) * g * norm.pow(1 - p);
  return x.sgn() * x.abs().pow(p - 1) * (g / norm.pow(p - 1)).masked_fill(norm == 0, 0);
}

template <Reduction R, typename Signature>
struct ReduceFunction : public torch::autograd::Function<ReduceFunction<R, Signature>> {
  static constexpr bool kSavesTensors = R != Reduction::Sum && R != Reduction::Mean;

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& self, const ReduceCall& call) {
    at::Tensor result = reduce_below_autograd<R, Signature>(self, call);
    save_dims(ctx, self, call.dim, call.keepdim);
    if constexpr (kSavesTensors) {
      ctx->save_for_backward({self, result});
      if constexpr (R == Reduction::VectorNorm) ctx->saved_data["ord"] = call.ord;
    } else {
      ctx->saved_data["sizes"] = self.sym_sizes();
      ctx->saved_data["dtype"] = static_cast<int64_t>(self.scalar_type());
    }
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> dims = saved_dims(ctx);
    const bool keepdim = ctx->saved_data["keepdim"].toBool();
    const at::Tensor g = restore_reduced_dims(grads[0], dims, keepdim);
    if constexpr (!kSavesTensors) {
      const std::vector<c10::SymInt> sizes = saved_sizes(ctx);
      at::Tensor grad = g;
      if constexpr (R == Reduction::Mean) {
        c10::SymInt count = 1;
        for (int64_t d : dims) count *= sizes[d];
        grad = grad / c10::Scalar(count);
      }
      const auto input_type = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
      if (grad.is_complex() && !at::isComplexType(input_type)) grad = at::real(grad);  // dtype=complex of a real input
      return {grad.expand_symint(sizes).to(input_type), at::Tensor()};
    } else {
      const variable_list saved = ctx->get_saved_variables();
      const at::Tensor& self = saved[0];
      const at::Tensor result = restore_reduced_dims(saved[1], dims, keepdim);
      const at::Tensor x = self.to(result.scalar_type());  // dtype= casts the input first
      at::Tensor grad;
      if constexpr (R == Reduction::Amax || R == Reduction::Amin) {
        const at::Tensor ties = x == result;
        grad = g / ties.sum(dims, /*keepdim=*/true) * ties;
      } else if constexpr (R == Reduction::Prod) {
        grad = g * prod_of_others(x, dims);
      } else {
        grad = vector_norm_gradient(x, result, g, ctx->saved_data["ord"].toDouble(), dims);
      }
      return {grad.to(self.scalar_type()), at::Tensor()};
    }
  }
};

template <Reduction R, typename Signature>
struct AutogradBody {
  static at::Tensor run(const at::Tensor& self, const ReduceCall& call) {
    if (needs_composite(self)) return composite::reduce(R, self, call);
    if (!records_grad(self)) return reduce_below_autograd<R, Signature>(self, call);
    return ReduceFunction<R, Signature>::apply(self, call);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(reduce, Autograd, m) {
#define TORCH_REDUCE_AUTOGRAD(name, reduction, Signature) \
  m.impl(#name, &Signature::template bind<AutogradBody<Reduction::reduction, Signature>>);
  TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_AUTOGRAD)
#undef TORCH_REDUCE_AUTOGRAD
}

}  // namespace torch_reduce
