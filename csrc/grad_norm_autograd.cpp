// Autograd for the global gradient norm. A call that autograd records (grad mode on and a tensor requiring grad),
// or that a functorch transform or forward-mode AD sees, takes the composite path (composite.h): torch's own ops,
// so it gets torch's gradients in every mode. clip_grad_norm_ runs under no_grad, as torch's does, and never
// takes it. clip_grads_ and clip_grad_norm_ bump each gradient's version, as an in-place op must.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include "autograd_util.h"
#include "composite.h"

namespace torch_reduce {
namespace {

bool any_records_grad(at::TensorList tensors) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor& t : tensors)
    if (requires_grad(t)) return true;
  return false;
}

bool any_needs_composite(at::TensorList tensors) {
  if (needs_composite()) return true;  // a functorch transform
  for (const at::Tensor& t : tensors)
    if (has_tangent(t)) return true;
  return false;
}

std::vector<at::Tensor> foreach_norm_autograd(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype) {
  if (any_records_grad(tensors) || any_needs_composite(tensors)) return composite::foreach_norm(tensors, ord, dtype);
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("reduce::foreach_norm", "")
          .typed<std::vector<at::Tensor>(at::TensorList, double, std::optional<at::ScalarType>)>();
  return call_below_autograd(op, tensors, ord, dtype);
}

at::Tensor total_norm_autograd(at::TensorList tensors, double ord, bool foreach) {
  if (any_records_grad(tensors) || any_needs_composite(tensors)) return composite::total_norm(tensors, ord, foreach);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("reduce::total_norm", "")
                             .typed<at::Tensor(at::TensorList, double, bool)>();
  return call_below_autograd(op, tensors, ord, foreach);
}

void clip_grads_autograd(at::TensorList grads, const at::Tensor& total_norm, double max_norm) {
  std::vector<at::Tensor> all(grads.begin(), grads.end());
  all.push_back(total_norm);
  if (any_records_grad(all) || any_needs_composite(all)) return composite::clip_grads_(grads, total_norm, max_norm);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("reduce::clip_grads_", "")
                             .typed<void(at::TensorList, const at::Tensor&, double)>();
  call_below_autograd(op, grads, total_norm, max_norm);
  for (const at::Tensor& g : grads) torch::autograd::increment_version(g);
}

at::Tensor clip_grad_norm_autograd(at::TensorList grads, double max_norm, double norm_type, bool foreach) {
  if (any_records_grad(grads) || any_needs_composite(grads)) {
    at::Tensor total = composite::total_norm(grads, norm_type, foreach);
    composite::clip_grads_(grads, total, max_norm);
    return total;
  }
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("reduce::clip_grad_norm_", "")
                             .typed<at::Tensor(at::TensorList, double, double, bool)>();
  at::Tensor total = call_below_autograd(op, grads, max_norm, norm_type, foreach);
  for (const at::Tensor& g : grads) torch::autograd::increment_version(g);
  return total;
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, Autograd, m) {
  m.impl("foreach_norm", &foreach_norm_autograd);
  m.impl("total_norm", &total_norm_autograd);
  m.impl("clip_grads_", &clip_grads_autograd);
  m.impl("clip_grad_norm_", &clip_grad_norm_autograd);
}

}  // namespace torch_reduce
