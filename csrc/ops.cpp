// Every schema of the `reduce` namespace, and nothing else. Kernels register in csrc/cpu and csrc/cuda,
// autograd in csrc/*_autograd.cpp, autocast in csrc/autocast.cpp, fake (meta) kernels in torch_reduce/ops.py.
#include <torch/library.h>

#include <string>

#include "dim_reduce.h"
#include "ladder.h"

TORCH_LIBRARY(reduce, m) {
  // The ladder: full sums, 0-dim result with torch.sum's dtype (see torch_reduce/ladder.py for each).
#define TORCH_REDUCE_SCHEMA(name, variant) m.def(#name "(Tensor t, int block_size=256) -> Tensor");
  TORCH_REDUCE_LADDER(TORCH_REDUCE_SCHEMA)
#undef TORCH_REDUCE_SCHEMA

  // Drop-in dim reductions with torch's semantics (torch_reduce/reductions.py): one per row of the table in
  // dim_reduce.h, the arguments its signature names.
#define TORCH_REDUCE_SCHEMA(name, reduction, Signature) \
  m.def(torch::schema((std::string(#name) + torch_reduce::Signature::kSchema).c_str()));
  TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_SCHEMA)
#undef TORCH_REDUCE_SCHEMA

  // torch.var_mean: dim None or [] reduces every dim; correction None means 1 (any real number: torch divides
  // by max(0, N - correction)); results in the input's dtype. `unbiased=` lives in the Python wrapper.
  m.def("var_mean(Tensor input, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)");
  // LayerNorm over the trailing normalized_shape dims: out, and per-row mean and 1/sqrt(var + eps) (float32
  // for 16-bit inputs) for the backward. layer_norm_bwd returns (grad_input, grad_weight, grad_bias); a
  // gradient not in output_mask, or of an absent weight/bias, is an empty tensor.
  m.def("layer_norm_fwd(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) "
        "-> (Tensor, Tensor, Tensor)");
  // grad_sum (the fused add's backward, below): added to grad_input.
  m.def("layer_norm_bwd(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, "
        "Tensor? weight, Tensor? bias, bool[3] output_mask, Tensor? grad_sum=None) -> (Tensor, Tensor, Tensor)");
  // RMSNorm (F.rms_norm) over the trailing normalized_shape dims: out and per-row 1/sqrt(mean(x^2) + eps), in
  // the statistics' dtype as LayerNorm's; eps None is the accumulate type's machine epsilon, as torch's.
  // rms_norm_bwd returns (grad_input, grad_weight), empty where not in output_mask or without a weight.
  m.def("rms_norm_fwd(Tensor input, SymInt[] normalized_shape, Tensor? weight, float? eps) -> (Tensor, Tensor)");
  m.def("rms_norm_bwd(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor rstd, Tensor? weight, "
        "bool[2] output_mask, Tensor? grad_sum=None) -> (Tensor, Tensor)");
  // Residual add fused into the norm: (out, sum = input + residual, statistics), one read of each input. Their
  // backward is the norm's backward of sum, with grad_sum, the gradient of sum's other uses, added to
  // grad_input: the gradient of input and of residual alike.
  m.def("add_layer_norm_fwd(Tensor input, Tensor residual, SymInt[] normalized_shape, Tensor? weight, "
        "Tensor? bias, float eps) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("add_rms_norm_fwd(Tensor input, Tensor residual, SymInt[] normalized_shape, Tensor? weight, float? eps) "
        "-> (Tensor, Tensor, Tensor)");

  // The global gradient norm (csrc/grad_norm.h). foreach_norm: torch._foreach_norm, a 0-dim norm per tensor (in
  // dtype, else the tensor's); total_norm: the norm of every element of the list, in the tensors' promoted dtype on
  // the first tensor's device (torch.nn.utils.get_total_norm's value); clip_grads_: each gradient times
  // clamp(max_norm / (total_norm + 1e-6), max=1), computed on the device (torch.nn.utils.clip_grads_with_norm_);
  // clip_grad_norm_: total_norm then clip_grads_ in one call (one list to convert), returning the total. foreach:
  // each tensor's norm as torch's foreach route takes it (_foreach_norm per dtype), else as its per-tensor route
  // (linalg.vector_norm, torch's foreach=False); they differ only on CUDA (norm_is_magnitude).
  m.def("foreach_norm(Tensor[] tensors, float ord=2, ScalarType? dtype=None) -> Tensor[]");
  m.def("total_norm(Tensor[] tensors, float ord=2, bool foreach=True) -> Tensor");
  m.def("clip_grads_(Tensor(a!)[] grads, Tensor total_norm, float max_norm) -> ()");
  m.def("clip_grad_norm_(Tensor(a!)[] grads, float max_norm, float norm_type=2, bool foreach=True) -> Tensor");
}
