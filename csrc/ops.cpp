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
}
