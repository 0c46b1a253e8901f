// Autograd for the dim reductions (every row of dim_reduce.h's table) in C++, like csrc/ladder_autograd.cpp:
// a Python autograd kernel would add microseconds to every call. The gradients are torch's:
//   sum, mean:   the incoming gradient with the reduced dims restored, expanded to the input (mean: divided
//                by the reduced count), in the input's dtype (dtype= may have changed the output's);
//   amax, amin:  shared evenly among the elements equal to the result, grad / count_of_ties * (x == result);
//   prod:        grad times the product of the other elements of the slice (its conjugate for complex inputs),
//                from exclusive prefix and suffix products (no division: exact with zeros in the slice, and no
//                data-dependent branch, so the backward traces under torch.compile);
//   vector_norm: torch's formulas by order (0: none, 1, 2, inf/-inf shared among ties, below 1, any other p), with
//                a zero subgradient where the norm (or, below 1, the element) is 0; complex inputs through sgn;
//                its double backward is torch's too, NaN where torch's is.
// All are written in differentiable ops, so double backward works; transforms and forward-mode AD take
// the composite path (torch's own ops).
#include <ATen/OpMathType.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "autograd_util.h"
#include "composite.h"
#include "dim_reduce.h"

namespace torch_reduce {
namespace {

using torch::autograd::variable_list;

template <Reduction R, typename Signature>
at::Tensor reduce_below_autograd(const at::Tensor& self, const ReduceCall& call) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return Signature::call(dim_reduction_op<R, Signature>(), self, call);
}

// The product of the other elements of each reduced slice: the reduced dims are moved last and flattened
// into one, whose exclusive prefix and suffix products multiply, in float32 for 16-bit inputs (a float16
// scan rounds at every step: 300 elements' gradient came out 1.05% off, torch's result / x 0.08%), rounded
// to x's dtype at the end.
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
  const at::Tensor rows = permuted.flatten(kept).to(at::toOpMathType(x.scalar_type()));
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
  return (before * after).to(x.scalar_type()).reshape_symint(permuted.sym_sizes()).permute(inverse);
}

// d norm / dx for g and norm with the reduced dims restored.
at::Tensor vector_norm_gradient(const at::Tensor& x, const at::Tensor& norm, const at::Tensor& g, double p,
                                const std::vector<int64_t>& dims) {
  if (p == 1) return x.sgn() * g;
  // Each order's product in torch's order and grouping (x / norm, not g / norm, at order 2; x·|x|^(p-2) above 2):
  // the same first gradient, and a double backward with torch's NaN where the norm is 0 (between orders 2 and 3,
  // also where the element is).
  if (p == 2) return g * (x / norm).masked_fill(norm == 0, 0);
  if (std::isinf(p)) {  // amax/amin of |x|, NaN included
    const at::Tensor magnitude = x.abs();
    const at::Tensor ties = magnitude.eq(norm).logical_or(magnitude.isnan());
    return x.sgn() * (g / ties.sum(dims, /*keepdim=*/true)) * ties;
  }
  if (p < 1) return x.sgn() * x.abs().pow(p - 1).masked_fill(x == 0, 0) * g * norm.pow(1 - p);
  const at::Tensor scale = (g / norm.pow(p - 1)).masked_fill(norm == 0, 0);
  return (p < 2 ? x.sgn() * x.abs().pow(p - 1) : x * x.abs().pow(p - 2)) * scale;
}

// The backward node of a dim reduction, written as torch's generated nodes are (as the norms' NormBackward,
// csrc/layernorm_autograd.cpp): typed fields and the result's history set directly, not a
// torch::autograd::Function's string-keyed context.
template <Reduction R>
struct ReduceBackward : public torch::autograd::Node {
  static constexpr bool kSavesTensors = R != Reduction::Sum && R != Reduction::Mean;
  std::vector<int64_t> dims;  // the reduced dims, ascending
  bool keepdim = false;
  std::vector<c10::SymInt> sizes;  // the input's
  at::ScalarType input_type = at::kFloat;
  double ord = 2;  // vector_norm's
  torch::autograd::SavedVariable self, result;  // amax, amin, prod, vector_norm: the input and the result

  std::string name() const override { return std::string(reduction_name(R)) + "Backward"; }

  void release_variables() override {
    self.reset_data();
    result.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined() || !should_compute_output(0)) return {at::Tensor()};
    if (R == Reduction::VectorNorm && ord == 0) return {at::Tensor()};  // no gradient, as torch's (not zeros)
    const at::Tensor g = restore_reduced_dims(grads[0], dims, keepdim);
    if constexpr (!kSavesTensors) {
      at::Tensor grad = g;
      if constexpr (R == Reduction::Mean) {
        c10::SymInt count = 1;
        for (int64_t d : dims) count *= sizes[d];
        grad = grad / c10::Scalar(count);
      }
      if (grad.is_complex() && !at::isComplexType(input_type)) grad = at::real(grad);  // dtype=complex of a real input
      return {grad.expand_symint(sizes).to(input_type)};
    } else {
      const at::Tensor input = self.unpack();
      const at::Tensor reduced = restore_reduced_dims(result.unpack(getptr()), dims, keepdim);
      // dtype= casts the input first; a complex input's norm is real, its cast the complex type of that.
      const at::ScalarType reduced_type = reduced.scalar_type();
      const at::Tensor x = input.to(input.is_complex() ? c10::toComplexType(reduced_type) : reduced_type);
      at::Tensor grad;
      if constexpr (R == Reduction::Amax || R == Reduction::Amin) {
        const at::Tensor ties = x == reduced;
        grad = g / ties.sum(dims, /*keepdim=*/true) * ties;
      } else if constexpr (R == Reduction::Prod) {
        grad = g * (x.is_complex() ? prod_of_others(x, dims).conj() : prod_of_others(x, dims));
      } else {
        grad = vector_norm_gradient(x, reduced, g, ord, dims);
      }
      return {grad.to(input_type)};
    }
  }
};

// The reduction, recorded for autograd. Called after the op, which has raised torch's errors for bad dims in
// torch's order; torch raises its autograd errors after them too.
template <Reduction R>
void record_reduction(const at::Tensor& result, const at::Tensor& self, const ReduceCall& call) {
  using torch::autograd::SavedVariable;
  // Reached by a complex amax/amin only where its result is empty (otherwise the op raised): torch's error.
  TORCH_CHECK(!complex_extremum(R, self.scalar_type()), reduction_name(R),
              " does not support automatic differentiation for outputs with complex dtype.");
  const auto node = make_node<ReduceBackward<R>>();
  node->set_next_edges(torch::autograd::collect_next_edges(self));
  node->dims = reduced_dims(call.dim, self.dim());
  node->keepdim = call.keepdim;
  node->sizes = self.sym_sizes().vec();
  node->input_type = self.scalar_type();
  node->ord = call.ord;
  torch::autograd::set_history(result, node);
  if constexpr (ReduceBackward<R>::kSavesTensors) {
    node->self = SavedVariable(self, /*is_output=*/false);
    node->result = SavedVariable(result, /*is_output=*/true);  // after its history: it refers to the node
  }
}

template <Reduction R, typename Signature>
struct AutogradBody {
  static at::Tensor run(const at::Tensor& self, const ReduceCall& call) {
    if (needs_composite(self)) return composite::reduce(R, self, call);
    at::Tensor result = reduce_below_autograd<R, Signature>(self, call);
    if (records_grad(self)) record_reduction<R>(result, self, call);
    return result;
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
