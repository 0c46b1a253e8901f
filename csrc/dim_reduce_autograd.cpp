// Autograd for sum/mean/amax/amin in C++, like csrc/ladder_autograd.cpp: a Python autograd kernel would
// add microseconds to every call. The gradients are torch's:
//   sum, mean:  the incoming gradient with the reduced dims restored, expanded to the input (mean: divided
//               by the reduced count), in the input's dtype (dtype= may have changed the output's);
//   amax, amin: shared evenly among the elements equal to the result, grad / count_of_ties * (x == result).
// Both are written in differentiable ops, so double backward works; transforms and forward-mode AD take
// the composite path (torch's own ops).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "autograd_util.h"
#include "composite.h"

namespace torch_reduce {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <bool kMean>
at::Tensor sum_below_autograd(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                              std::optional<at::ScalarType> dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(kMean ? "reduce::mean" : "reduce::sum", "")
                             .typed<at::Tensor(const at::Tensor&, at::OptionalIntArrayRef, bool,
                                               std::optional<at::ScalarType>)>();
  return call_below_autograd(op, self, dim, keepdim, dtype);
}

template <bool kMax>
at::Tensor extremum_below_autograd(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(kMax ? "reduce::amax" : "reduce::amin", "")
                             .typed<at::Tensor(const at::Tensor&, at::IntArrayRef, bool)>();
  return call_below_autograd(op, self, dim, keepdim);
}

template <bool kMean>
struct SumFunction : public torch::autograd::Function<SumFunction<kMean>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype) {
    at::Tensor result = sum_below_autograd<kMean>(self, dim, keepdim, dtype);
    save_dims(ctx, self, dim, keepdim);
    ctx->saved_data["sizes"] = self.sym_sizes();
    ctx->saved_data["dtype"] = static_cast<int64_t>(self.scalar_type());
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> dims = saved_dims(ctx);
    const std::vector<c10::SymInt> sizes = saved_sizes(ctx);
    at::Tensor g = restore_reduced_dims(grads[0], dims, ctx->saved_data["keepdim"].toBool());
    if constexpr (kMean) {
      c10::SymInt count = 1;
      for (int64_t d : dims) count *= sizes[d];
      g = g / c10::Scalar(count);
    }
    g = g.expand_symint(sizes).to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt()));
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

template <bool kMax>
struct ExtremumFunction : public torch::autograd::Function<ExtremumFunction<kMax>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    at::Tensor result = extremum_below_autograd<kMax>(self, dim, keepdim);
    save_dims(ctx, self, dim, keepdim);
    ctx->save_for_backward({self, result});
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> dims = saved_dims(ctx);
    const bool keepdim = ctx->saved_data["keepdim"].toBool();
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor ties = saved[0] == restore_reduced_dims(saved[1], dims, keepdim);
    const at::Tensor g = restore_reduced_dims(grads[0], dims, keepdim);
    return {g / ties.sum(dims, /*keepdim=*/true) * ties, at::Tensor(), at::Tensor()};
  }
};

template <bool kMean>
at::Tensor sum_autograd(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                        std::optional<at::ScalarType> dtype) {
  if (needs_composite(self)) {
    return kMean ? composite::mean(self, dim, keepdim, dtype) : composite::sum(self, dim, keepdim, dtype);
  }
  if (!records_grad(self)) return sum_below_autograd<kMean>(self, dim, keepdim, dtype);
  return SumFunction<kMean>::apply(self, dim, keepdim, dtype);
}

template <bool kMax>
at::Tensor extremum_autograd(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  if (needs_composite(self)) return kMax ? composite::amax(self, dim, keepdim) : composite::amin(self, dim, keepdim);
  if (!records_grad(self)) return extremum_below_autograd<kMax>(self, dim, keepdim);
  return ExtremumFunction<kMax>::apply(self, dim, keepdim);
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, Autograd, m) {
  m.impl("sum", &sum_autograd<false>);
  m.impl("mean", &sum_autograd<true>);
  m.impl("amax", &extremum_autograd<true>);
  m.impl("amin", &extremum_autograd<false>);
}

}  // namespace torch_reduce
