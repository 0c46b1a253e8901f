// The ladder's full-tensor sums on the GPU: a load strategy + an in-block tree (block_reduce.cuh), one
// partial per block, the partials folded by the same variant until one value is left; and the two
// vector-load variants (full_reduce.cuh).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/dispatch.h"
#include "cuda/arch_check.cuh"
#include "cuda/block_reduce.cuh"
#include "cuda/full_reduce.cuh"
#include "ladder.h"

namespace torch_reduce::cuda {
namespace {

// How a thread of a shared-memory variant gets its first value.
enum class Load {
  One,         // REDUCE-0..2: one element
  FirstAdd,    // REDUCE-3..5: two elements blockDim.x apart, added while loading (half the blocks)
  GridStride,  // REDUCE-6: pairs of elements, a grid's width apart, until the input ends
};

template <Load kLoad, typename acc_t, typename in_t>
__device__ __forceinline__ acc_t load_thread_value(const in_t* __restrict__ in, int64_t n) {
  const int64_t block = blockDim.x, tid = threadIdx.x;
  if constexpr (kLoad == Load::One) {
    const int64_t i = blockIdx.x * block + tid;
    return i < n ? static_cast<acc_t>(in[i]) : acc_t(0);
  } else {
    int64_t i = blockIdx.x * (2 * block) + tid;
    const int64_t step = kLoad == Load::GridStride ? 2 * block * gridDim.x : n;
    acc_t sum = 0;
    for (; i < n; i += step) {
      sum += static_cast<acc_t>(in[i]);
      if (i + block < n) sum += static_cast<acc_t>(in[i + block]);
    }
    return sum;
  }
}

// The trees as types, so the kernel below is one template. run() returns the block's sum in thread 0.
struct InterleavedTree {
  template <unsigned BLOCK, typename T>
  __device__ static T run(T* sdata, unsigned tid) { tree_interleaved(sdata, tid); return sdata[0]; }
};
struct StridedTree {
  template <unsigned BLOCK, typename T>
  __device__ static T run(T* sdata, unsigned tid) { tree_strided(sdata, tid); return sdata[0]; }
};
struct SequentialTree {
  template <unsigned BLOCK, typename T>
  __device__ static T run(T* sdata, unsigned tid) { tree_sequential(sdata, tid); return sdata[0]; }
};
struct LastWarpShuffledTree {
  template <unsigned BLOCK, typename T>
  __device__ static T run(T* sdata, unsigned tid) { return tree_last_warp_shuffled<BLOCK>(sdata, tid); }
};

// One pass of a shared-memory variant: each thread stores its value, the block runs its tree, thread 0
// writes the block's partial. BLOCK == 0: the block size is read at run time.
template <typename Tree, Load kLoad, unsigned BLOCK, typename in_t, typename acc_t>
__global__ void ladder_pass_kernel(const in_t* __restrict__ in, int64_t n, acc_t* __restrict__ partials) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  acc_t* sdata = reinterpret_cast<acc_t*>(shared_bytes);
  const unsigned tid = threadIdx.x;
  sdata[tid] = load_thread_value<kLoad, acc_t>(in, n);
  __syncthreads();
  const acc_t block_sum = Tree::template run<BLOCK>(sdata, tid);
  if (tid == 0) partials[blockIdx.x] = block_sum;
}

template <typename Tree, Load kLoad, bool kTemplatedBlock, typename in_t, typename acc_t>
void launch_tree_pass(const in_t* in, int64_t n, acc_t* partials, int64_t grid, int64_t block_size,
                        cudaStream_t stream) {
  const size_t shared_bytes = block_size * sizeof(acc_t);
  if constexpr (kTemplatedBlock) {
    with_power_of_two<32, 1024>(block_size, [&](auto block) {
      ladder_pass_kernel<Tree, kLoad, decltype(block)::value, in_t, acc_t>
          <<<grid, block_size, shared_bytes, stream>>>(in, n, partials);
    });
  } else {
    ladder_pass_kernel<Tree, kLoad, 0, in_t, acc_t><<<grid, block_size, shared_bytes, stream>>>(in, n, partials);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename in_t, typename acc_t>
void launch_ladder_pass(Ladder variant, const in_t* in, int64_t n, acc_t* partials, int64_t grid, int64_t block_size,
                        cudaStream_t stream) {
  switch (variant) {
    case Ladder::Interleaved:
      return launch_tree_pass<InterleavedTree, Load::One, false>(in, n, partials, grid, block_size, stream);
    case Ladder::Strided:
      return launch_tree_pass<StridedTree, Load::One, false>(in, n, partials, grid, block_size, stream);
    case Ladder::Sequential:
      return launch_tree_pass<SequentialTree, Load::One, false>(in, n, partials, grid, block_size, stream);
    case Ladder::FirstAdd:
      return launch_tree_pass<SequentialTree, Load::FirstAdd, false>(in, n, partials, grid, block_size, stream);
    case Ladder::WarpUnrolled:
      return launch_tree_pass<LastWarpShuffledTree, Load::FirstAdd, false>(in, n, partials, grid, block_size,
                                                                             stream);
    case Ladder::Unrolled:
      return launch_tree_pass<LastWarpShuffledTree, Load::FirstAdd, true>(in, n, partials, grid, block_size,
                                                                            stream);
    case Ladder::Multi:
      return launch_tree_pass<LastWarpShuffledTree, Load::GridStride, true>(in, n, partials, grid,
                                                                              block_size, stream);
    default:
      TORCH_CHECK(false, "torch_reduce: not a shared-memory ladder variant");
  }
}

template <Ladder kVariant>
at::Tensor ladder_sum_cuda(const at::Tensor& t, int64_t block_size) {
  const char* op = ladder_op_name(kVariant);
  TORCH_CHECK(t.is_cuda(), op, ": expected a CUDA tensor, got one on ", t.device());
  const c10::cuda::CUDAGuard guard(t.device());
  check_kernel_image_for_current_device();
  const at::Tensor x = ladder_input(t, block_size, op);
  const int64_t n = x.numel();
  const auto out_type = sum_result_type(t.scalar_type());
  if (n == 0) return at::zeros(at::IntArrayRef{}, t.options().dtype(out_type));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const GpuShape gpu = current_gpu_shape();

  at::Tensor result;
  TORCH_REDUCE_DISPATCH(t.scalar_type(), "reduce ladder", [&] {
    using acc_t = acc_type<scalar_t>;
    const auto acc_options = t.options().dtype(c10::CppTypeToScalarType<acc_t>::value);
    if constexpr (kVariant == Ladder::Vec || kVariant == Ladder::SinglePass) {
      auto out = at::empty(at::IntArrayRef{}, t.options().dtype(out_type));
      using out_t = std::conditional_t<std::is_floating_point_v<acc_t>, scalar_t, int64_t>;
      with_power_of_two<32, 1024>(block_size, [&](auto block) {
        launch_device_reduce<decltype(block)::value, scalar_t, acc_t>(
            x.const_data_ptr<scalar_t>(), n, out.mutable_data_ptr<out_t>(), SumOp<acc_t>(), KeepValue(),
            kVariant == Ladder::SinglePass);
      });
      result = out;
    } else {
      // First pass from the input, then the same variant over the partials until one value is left.
      int64_t grid = ladder_grid(kVariant, n, block_size, gpu);
      at::Tensor partials = at::empty({grid}, acc_options);
      launch_ladder_pass<scalar_t, acc_t>(kVariant, x.const_data_ptr<scalar_t>(), n, partials.mutable_data_ptr<acc_t>(),
                                          grid, block_size, stream);
      while (partials.numel() > 1) {
        const int64_t len = partials.numel();
        grid = ladder_grid(kVariant, len, block_size, gpu);
        at::Tensor next = at::empty({grid}, acc_options);
        launch_ladder_pass<acc_t, acc_t>(kVariant, partials.const_data_ptr<acc_t>(), len,
                                         next.mutable_data_ptr<acc_t>(), grid, block_size, stream);
        partials = next;
      }
      result = partials.view(at::IntArrayRef{}).to(out_type);  // a bare {} could pick view(ScalarType)
    }
  });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) {
#define TORCH_REDUCE_IMPL(name, variant) m.impl(#name, &ladder_sum_cuda<Ladder::variant>);
  TORCH_REDUCE_LADDER(TORCH_REDUCE_IMPL)
#undef TORCH_REDUCE_IMPL
}

}  // namespace torch_reduce::cuda
