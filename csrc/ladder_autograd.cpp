// Autograd for the ladder ops, in C++: a Python autograd kernel would add microseconds to every call,
// which at launch-bound sizes is most of the op's time. d(sum t)/dt = 1 for every element, so the
// gradient is the incoming one expanded to the input's shape (itself differentiable: double backward).
// Transforms and forward-mode AD take the composite path, torch.sum.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "autograd_util.h"
#include "composite.h"
#include "ladder.h"

namespace torch_reduce {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <Ladder kVariant>
at::Tensor ladder_sum_below_autograd(const at::Tensor& t, int64_t block_size) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(ladder_op_name(kVariant), "")
                             .template typed<at::Tensor(const at::Tensor&, int64_t)>();
  return call_below_autograd(op, t, block_size);
}

template <Ladder kVariant>
struct LadderSumFunction : public torch::autograd::Function<LadderSumFunction<kVariant>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, int64_t block_size) {
    ctx->saved_data["sizes"] = t.sym_sizes();
    return ladder_sum_below_autograd<kVariant>(t, block_size);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0].expand_symint(saved_sizes(ctx)), at::Tensor()};
  }
};

template <Ladder kVariant>
at::Tensor ladder_sum_autograd(const at::Tensor& t, int64_t block_size) {
  if (needs_composite(t)) return composite::ladder_sum(t, block_size, ladder_op_name(kVariant));
  if (!records_grad(t)) return ladder_sum_below_autograd<kVariant>(t, block_size);
  return LadderSumFunction<kVariant>::apply(t, block_size);
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, Autograd, m) {
#define TORCH_REDUCE_IMPL(name, variant) m.impl(#name, &ladder_sum_autograd<Ladder::variant>);
  TORCH_REDUCE_LADDER(TORCH_REDUCE_IMPL)
#undef TORCH_REDUCE_IMPL
}

}  // namespace torch_reduce
