// Every schema of the `reduce` namespace, and nothing else. Kernels register in csrc/cpu and csrc/cuda,
// fake (meta) kernels and autograd in torch_reduce/ops.py.
#include <torch/library.h>

#include "ladder.h"

TORCH_LIBRARY(reduce, m) {
  // The ladder: full sums, 0-dim result with torch.sum's dtype (see torch_reduce/ladder.py for each).
#define TORCH_REDUCE_SCHEMA(name, variant) m.def(#name "(Tensor t, int block_size=256) -> Tensor");
  TORCH_REDUCE_LADDER(TORCH_REDUCE_SCHEMA)
#undef TORCH_REDUCE_SCHEMA

  // Drop-in reductions with torch's semantics (torch_reduce/reductions.py): dims, keepdim, dtype=.
  m.def("sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor");
  m.def("mean(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor");
  m.def("amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor");
  m.def("amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor");

  // torch.var_mean: dim None or [] reduces every dim; correction None means 1 (any real number: torch divides
  // by max(0, N - correction)); results in the input's dtype. `unbiased=` lives in the Python wrapper.
  m.def("var_mean(Tensor input, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)");
  // LayerNorm over the trailing normalized_shape dims: out, and per-row mean and 1/sqrt(var + eps) (float32
  // for 16-bit inputs) for the backward. layer_norm_bwd returns (grad_input, grad_weight, grad_bias); a
  // gradient not in output_mask, or of an absent weight/bias, is an empty tensor.
  m.def("layer_norm_fwd(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_bwd(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, "
        "Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
}
