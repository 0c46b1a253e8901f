#include "ladder.h"

#include "common/dispatch.h"

namespace torch_reduce {

at::Tensor ladder_input(const at::Tensor& t, int64_t block_size, const char* op) {
  check_reducible_dtype(t, op);
  TORCH_CHECK(block_size >= 32 && block_size <= 1024 && (block_size & (block_size - 1)) == 0, op,
              ": block_size must be a power of two in [32, 1024] (the trees halve it down to one), got ", block_size);
  // A dense tensor (x, x.t(), a permutation) is summed straight from memory: the same elements, no copy.
  // Anything with gaps (x[::3]) is copied into one run first.
  if (t.is_non_overlapping_and_dense()) return t.as_strided({t.numel()}, {1});
  return t.contiguous().view(-1);
}

}  // namespace torch_reduce
