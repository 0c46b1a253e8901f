#pragma once
// What the C++ autograd kernels (ladder, dim reductions, var_mean, LayerNorm) share: when to record at all,
// the reduced dims, and the input's symbolic sizes, saved in the forward and read back in the backward.
#include <ATen/ATen.h>
#include <ATen/WrapDimUtilsMulti.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <vector>

namespace torch_reduce {

inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) { return t.has_value() && requires_grad(*t); }

// Whether autograd records this call: grad mode on and a tensor argument requiring grad. When it does not,
// the autograd kernels call the op below autograd directly: Function::apply would build a graph node and
// run the forward's bookkeeping all the same (1-2 microseconds a call, for nothing).
template <typename... Tensors>
bool records_grad(const Tensors&... tensors) {
  return at::GradMode::is_enabled() && (requires_grad(tensors) || ...);
}

// Whether this call takes the composite path (composite.h) instead of a C++ autograd node (a Function, or the
// norms' NormBackward): a functorch transform is active (torch.func.grad, vjp, jvp, vmap: they refuse C++
// Functions; functorch includes its dynamic-layer keys while its layer stack is not empty), or an input carries a
// forward-mode tangent (our nodes have no forward derivative). Forward-mode AD has one level at a time in eager torch, level 0;
// functorch's jvp is a transform and is caught by the first test.
// A tangent lives in the autograd metadata: a tensor without any (most gradients and activations) skips the
// virtual call to autograd's hooks.
inline bool has_tangent(const at::Tensor& t) {
  return t.defined() && t.unsafeGetTensorImpl()->autograd_meta() != nullptr && t._fw_grad(/*level=*/0).defined();
}
inline bool has_tangent(const std::optional<at::Tensor>& t) { return t.has_value() && has_tangent(*t); }

template <typename... Tensors>
bool needs_composite(const Tensors&... tensors) {
  return c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
         (has_tangent(tensors) || ...);
}

// A new node of the autograd graph, owned as torch owns its nodes: by std::shared_ptr with torch's deleteNode (which
// frees a long chain without recursing) up to torch 2.13, by c10::intrusive_ptr from 2.14. deleteNode is found by
// argument-dependent lookup, so the branch a torch does not take still compiles against it.
template <typename T>
auto make_node() {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>) {
    return c10::make_intrusive<T>();
  } else {
    return std::shared_ptr<T>(new T(), [](T* node) { deleteNode(node); });
  }
}

// An op called below autograd (inside an autograd kernel, or instead of it).
template <typename Signature, typename... Args>
auto call_below_autograd(const c10::TypedOperatorHandle<Signature>& op, Args&&... args) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(std::forward<Args>(args)...);
}

// The reduced dims, ascending: every dim for None or () (a 0-dim input has none to restore).
inline std::vector<int64_t> reduced_dims(at::OptionalIntArrayRef dim, int64_t ndim) {
  const bool all_dims = !dim.has_value() || dim->empty();
  const auto mask = all_dims ? std::bitset<at::dim_bitset_size>().set() : at::dim_list_to_bitset(*dim, ndim);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < ndim; ++d)
    if (mask[d]) dims.push_back(d);
  return dims;
}

// A reduction's gradient with the reduced dims back (as size 1), so it broadcasts against the input.
inline at::Tensor restore_reduced_dims(at::Tensor g, const std::vector<int64_t>& dims, bool keepdim) {
  if (!keepdim)
    for (int64_t d : dims) g = g.unsqueeze(d);
  return g;
}

// Call after the op, which has raised torch's errors for bad dims in torch's order.
inline void save_dims(torch::autograd::AutogradContext* ctx, const at::Tensor& self, at::OptionalIntArrayRef dim,
                      bool keepdim) {
  ctx->saved_data["dims"] = reduced_dims(dim, self.dim());
  ctx->saved_data["keepdim"] = keepdim;
}

inline std::vector<int64_t> saved_dims(torch::autograd::AutogradContext* ctx) {
  return ctx->saved_data["dims"].toIntVector();
}

inline std::vector<c10::SymInt> saved_sizes(torch::autograd::AutogradContext* ctx) {
  std::vector<c10::SymInt> sizes;
  for (const auto& size : ctx->saved_data["sizes"].toList()) sizes.push_back(size.get().toSymInt());
  return sizes;
}

}  // namespace torch_reduce
