#include "ladder.h"

#include <torch/library.h>

#include "common/dispatch.h"

namespace torch_reduce {

at::Tensor ladder_input(const at::Tensor& t, int64_t block_size, const char* op) {
  TORCH_CHECK(t.layout() == at::kStrided, op, ": expected a dense (strided) tensor, got layout ", t.layout(),
              "; call .to_dense() first");
  check_reducible_dtype(t, op);
  TORCH_CHECK(block_size >= 32 && block_size <= 1024 && (block_size & (block_size - 1)) == 0, op,
              ": block_size must be a power of two in [32, 1024] (the trees halve it down to one), got ", block_size);
  // A dense tensor (x, x.t(), a permutation) is summed straight from memory: the same elements, no copy.
  // Anything with gaps (x[::3]) is copied into one run first; an expanded (stride-0) one too, since each variant
  // replays one kernel's order over n elements in memory (the drop-ins read repeats once: dim_reduce.cpp).
  if (t.is_non_overlapping_and_dense()) return t.as_strided({t.numel()}, {1});
  return t.contiguous().view(-1);
}

namespace {

// Sparse tensors get the same clear message from every version of torch (without a kernel of ours,
// the dispatcher's answer varies between torch releases).
at::Tensor reject_sparse(const at::Tensor& t, int64_t) {
  TORCH_CHECK(false, "torch_reduce: expected a dense (strided) tensor, got layout ", t.layout(),
              "; call .to_dense() first");
}

}  // namespace

#define TORCH_REDUCE_REJECT(name, variant) m.impl(#name, &reject_sparse);
TORCH_LIBRARY_IMPL(reduce, SparseCPU, m) { TORCH_REDUCE_LADDER(TORCH_REDUCE_REJECT) }
TORCH_LIBRARY_IMPL(reduce, SparseCUDA, m) { TORCH_REDUCE_LADDER(TORCH_REDUCE_REJECT) }
TORCH_LIBRARY_IMPL(reduce, SparseCsrCPU, m) { TORCH_REDUCE_LADDER(TORCH_REDUCE_REJECT) }
TORCH_LIBRARY_IMPL(reduce, SparseCsrCUDA, m) { TORCH_REDUCE_LADDER(TORCH_REDUCE_REJECT) }
#undef TORCH_REDUCE_REJECT

}  // namespace torch_reduce
