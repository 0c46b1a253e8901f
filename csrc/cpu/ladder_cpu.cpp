// The ladder on the CPU: each variant's GPU kernel replayed block by block (cpu/model.h), so the float32
// result is the GPU's, bit for bit, wherever the launch geometry is the same.
#include <torch/library.h>

#include <vector>

#include "common/dispatch.h"
#include "cpu/model.h"
#include "ladder.h"

namespace torch_reduce::cpu {
namespace {

// What thread `tid` of block `b` stores into shared memory before the tree (ladder.cu: load_thread_value).
template <typename acc_t, typename in_t>
acc_t load_thread_value(Ladder v, const in_t* in, int64_t n, int64_t b, int64_t tid, int64_t block, int64_t grid) {
  if (loads_per_thread(v) == 1) {
    const int64_t i = b * block + tid;
    return i < n ? static_cast<acc_t>(in[i]) : acc_t(0);
  }
  const int64_t step = v == Ladder::Multi ? 2 * block * grid : n;
  acc_t sum = 0;
  for (int64_t i = b * 2 * block + tid; i < n; i += step) {
    sum += static_cast<acc_t>(in[i]);
    if (i + block < n) sum += static_cast<acc_t>(in[i + block]);
  }
  return sum;
}

// One pass of a shared-memory variant: every block's tree, one partial per block.
template <typename acc_t, typename in_t>
std::vector<acc_t> ladder_pass(Ladder v, const in_t* in, int64_t n, int64_t block) {
  const int64_t grid = ladder_grid(v, n, block, kModelGpu);
  std::vector<acc_t> partials(grid), sdata(block);
  for (int64_t b = 0; b < grid; ++b) {
    for (int64_t tid = 0; tid < block; ++tid) sdata[tid] = load_thread_value<acc_t>(v, in, n, b, tid, block, grid);
    switch (v) {
      case Ladder::Interleaved: tree_interleaved(sdata.data(), block); break;
      case Ladder::Strided: tree_strided(sdata.data(), block); break;
      default: tree_sequential(sdata.data(), block); break;  // REDUCE-2..6 share its order
    }
    partials[b] = sdata[0];
  }
  return partials;
}

template <Ladder kVariant>
at::Tensor ladder_sum_cpu(const at::Tensor& t, int64_t block_size) {
  const char* op = ladder_op_name(kVariant);
  TORCH_CHECK(t.device().is_cpu(), op, ": expected a CPU tensor, got one on ", t.device());
  const at::Tensor x = ladder_input(t, block_size, op);
  const int64_t n = x.numel();
  const auto out_type = sum_result_type(t.scalar_type());
  if (n == 0) return at::zeros(at::IntArrayRef{}, t.options().dtype(out_type));
  at::Tensor result;
  TORCH_REDUCE_DISPATCH(t.scalar_type(), "reduce ladder", [&] {
    using acc_t = acc_type<scalar_t>;
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    acc_t sum;
    if constexpr (kVariant == Ladder::Vec || kVariant == Ladder::SinglePass) {
      sum = device_reduce<acc_t>(in, n, block_size, kModelGpu, kVariant == Ladder::SinglePass,
                                 SumOp<acc_t>());
    } else {
      std::vector<acc_t> partials = ladder_pass<acc_t>(kVariant, in, n, block_size);
      while (partials.size() > 1) partials = ladder_pass<acc_t>(kVariant, partials.data(), partials.size(), block_size);
      sum = partials[0];
    }
    result = at::scalar_tensor(sum, t.options().dtype(c10::CppTypeToScalarType<acc_t>::value)).to(out_type);
  });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CPU, m) {
#define TORCH_REDUCE_IMPL(name, variant) m.impl(#name, &ladder_sum_cpu<Ladder::variant>);
  TORCH_REDUCE_LADDER(TORCH_REDUCE_IMPL)
#undef TORCH_REDUCE_IMPL
}

}  // namespace torch_reduce::cpu
