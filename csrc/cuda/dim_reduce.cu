// The dim reductions (dim_reduce.h's table) on the GPU, over the normal form (B, K, N), every one through the
// same kernels, driven by its ops object (common/reduce_ops.h):
//   B * N == 1: the whole tensor, launch_device_reduce (full_reduce.cuh), single pass;
//   N == 1:     rows of K contiguous elements. Short rows: G lanes per row (G = 1..32, from K), several
//               rows per warp, warp_reduce<G>; long rows: one block per row, block_reduce; long rows
//               but few of them: each row split over several blocks, partials folded by a second kernel;
//   N > 1:      columns: each thread owns 1 or 4 adjacent columns and walks K; the block's threadIdx.y
//               slices are folded through shared memory; K split over blockIdx.y when B * N cannot fill
//               the GPU.
// Split partials (rows or columns) are folded by a second launch: the column kernel over (splits, outputs).
// Every fold has a fixed order and no atomics: the same input gives the same bits on every run.
#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "common/dispatch.h"
#include "cuda/arch_check.cuh"
#include "cuda/block_reduce.cuh"
#include "cuda/full_reduce.cuh"
#include "cuda/tuning.h"
#include "dim_reduce.h"

namespace torch_reduce::cuda {
namespace {

constexpr unsigned kBlock = UndispatchedTuning::kDimBlock;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How many blocks of `kernel` (kBlock threads) the GPU runs at once: one wave.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel) {
  return resident_blocks_per_sm(kernel, kBlock) * multiprocessors();
}

// Into how many splits to cut the reduced extent when `blocks` blocks cover the outputs once. Equal
// blocks finish in waves of `resident`: the time goes as ceil(blocks * s / resident) / s, so (8192, 1024)
// over dim 0, 8 blocks, gets a whole wave's worth of splits, and 1.2 waves of blocks get 5 splits (1.2
// waves, not 2). The fewest splits within 2% of the best; at most max_splits (work per thread).
int64_t choose_splits(int64_t blocks, int64_t resident, int64_t max_splits) {
  const int64_t limit = std::min<int64_t>({max_splits, 65535, std::max<int64_t>(64, 4 * ceil_div(resident, blocks))});
  const auto time = [&](int64_t s) { return static_cast<double>(ceil_div(blocks * s, resident)) / static_cast<double>(s); };
  double best_time = time(1);
  for (int64_t s = 2; s <= limit; ++s) best_time = std::min(best_time, time(s));
  int64_t s = 1;
  while (time(s) > 1.02 * best_time) ++s;
  return s;
}

int64_t next_power_of_two(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// ------------------------------------------------------------------------------------------ rows ----

// G lanes per row, 32 / G rows per warp; each lane folds its share of the row with thread_reduce (16-byte
// loads on the row's aligned body, single loads for the few elements around it). Whole warps iterate
// together, so every lane reaches the shuffles even past the last row.
// one_vector_per_lane: every row is exactly G aligned 16-byte vectors (K = 32 floats, G = 8), so the rows
// are one run of vectors; each lane then loads one vector of kRowSets rows before folding any, which
// keeps kRowSets loads in flight per thread where the short rows would otherwise allow one.
template <unsigned G, typename scalar_t, typename acc_t, typename out_t, typename Ops>
__global__ void __launch_bounds__(kBlock)
    row_group_kernel(const scalar_t* __restrict__ in, int64_t rows, int64_t K, bool one_vector_per_lane,
                     out_t* __restrict__ out, Ops ops) {
  constexpr int64_t kRowsPerWarp = kWarpSize / G;
  constexpr int kRowSets = UndispatchedTuning::kRowSets;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kBlock / kWarpSize);
  const unsigned lane = threadIdx.x % G;
  const int64_t group_in_warp = (threadIdx.x % kWarpSize) / G;
  if (one_vector_per_lane) {
    using V = Vec16<scalar_t>;
    const V* vectors = reinterpret_cast<const V*>(in);
    for (int64_t first = warp * kRowsPerWarp * kRowSets; first < rows; first += warps * kRowsPerWarp * kRowSets) {
      V v[kRowSets];
#pragma unroll
      for (int u = 0; u < kRowSets; ++u) {
        const int64_t row = first + u * kRowsPerWarp + group_in_warp;
        if (row < rows) v[u] = load_vector(vectors + row * G + lane);
      }
#pragma unroll
      for (int u = 0; u < kRowSets; ++u) {
        const int64_t row = first + u * kRowsPerWarp + group_in_warp;
        acc_t a = row < rows ? fold_vector<acc_t>(v[u], ops) : Ops::identity();
        a = warp_reduce<G>(a, ops);
        if (lane == 0 && row < rows) out[row] = static_cast<out_t>(project_result(ops, a));
      }
    }
    return;
  }
  for (int64_t first = warp * kRowsPerWarp; first < rows; first += warps * kRowsPerWarp) {
    const int64_t row = first + group_in_warp;
    acc_t v = row < rows ? thread_reduce<acc_t>(in + row * K, K, lane, G, ops) : Ops::identity();
    v = warp_reduce<G>(v, ops);
    if (lane == 0 && row < rows) out[row] = static_cast<out_t>(project_result(ops, v));
  }
}

// One block per (row, split): blockIdx.y picks the split [y * chunk, (y + 1) * chunk) of every row.
// One split: the result; several: partials[y][row], folded by a column reduction.
template <typename scalar_t, typename acc_t, typename out_t, typename Ops>
__global__ void __launch_bounds__(kBlock)
    row_block_kernel(const scalar_t* __restrict__ in, int64_t rows, int64_t K, int64_t chunk,
                     acc_t* __restrict__ partials, out_t* __restrict__ out, Ops ops) {
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t length = K - begin < chunk ? K - begin : chunk;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    acc_t v = thread_reduce<acc_t>(in + row * K + begin, length, threadIdx.x, kBlock, ops);
    v = block_reduce<kBlock>(v, ops);
    if (threadIdx.x == 0) {
      if (gridDim.y == 1) out[row] = static_cast<out_t>(project_result(ops, v));
      else partials[blockIdx.y * rows + row] = v;
    }
    __syncthreads();  // block_reduce's shared memory is reused by the next row
  }
}

// The fold of split partials, partials[split][output], is itself a column reduction: (1, splits, outputs),
// with partials_ops (the partials are transformed already).
template <typename scalar_t, typename acc_t, typename out_t, typename Ops>
void launch_columns(const scalar_t* in, int64_t outer, int64_t K, int64_t N, out_t* out, Ops ops,
                    const at::TensorOptions& options, cudaStream_t stream);

// Rows up to this many 16-byte vectors go to row_group_kernel (at most 8 vectors a lane); longer rows
// get a block each.
constexpr int64_t kMaxGroupRowVectors = UndispatchedTuning::kMaxGroupRowVectors;
// A split of a long row keeps each of the block's threads busy for at least this many vectors.
constexpr int64_t kMinVectorsPerThread = UndispatchedTuning::kMinVectorsPerThread;

template <typename scalar_t, typename acc_t, typename out_t, typename Ops>
void launch_rows(const scalar_t* in, int64_t rows, int64_t K, out_t* out, Ops ops, const at::TensorOptions& options,
                 cudaStream_t stream) {
  constexpr int64_t kVector = Vec16<scalar_t>::kSize;
  const int64_t vectors = ceil_div(K, kVector);
  if (vectors <= kMaxGroupRowVectors) {
    // One vector per lane up to 32 lanes (K = 32 floats: 8 lanes, 4 rows per warp); then more per lane.
    const int64_t lanes = std::min<int64_t>(kWarpSize, next_power_of_two(vectors));
    const bool one_vector_per_lane =
        K == lanes * kVector && reinterpret_cast<uintptr_t>(in) % sizeof(Vec16<scalar_t>) == 0;
    with_power_of_two<1, 32>(lanes, [&](auto g) {
      constexpr unsigned G = decltype(g)::value;
      auto kernel = row_group_kernel<G, scalar_t, acc_t, out_t, Ops>;
      const int64_t grid = std::min(ceil_div(rows, kBlock / G), resident_blocks(kernel) * 32);  // grid-stride beyond
      kernel<<<grid, kBlock, 0, stream>>>(in, rows, K, one_vector_per_lane, out, ops);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return;
  }
  // One block per row; few long rows (32 x 2^24) cannot fill the GPU that way: split them too.
  auto kernel = row_block_kernel<scalar_t, acc_t, out_t, Ops>;
  const int64_t row_blocks = std::min<int64_t>(rows, std::numeric_limits<int32_t>::max());
  int64_t splits = choose_splits(row_blocks, resident_blocks(kernel),
                                 std::max<int64_t>(1, vectors / (kBlock * kMinVectorsPerThread)));
  const int64_t chunk = ceil_div(vectors, splits) * kVector;  // whole vectors: every split starts aligned
  splits = ceil_div(K, chunk);
  at::Tensor partials;
  acc_t* partial_ptr = nullptr;
  if (splits > 1) {
    partials = at::empty({splits * rows * static_cast<int64_t>(sizeof(acc_t))}, options.dtype(at::kByte));
    partial_ptr = reinterpret_cast<acc_t*>(partials.mutable_data_ptr());
  }
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits));
  kernel<<<grid, kBlock, 0, stream>>>(in, rows, K, chunk, partial_ptr, out, ops);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (splits > 1) {
    launch_columns<acc_t, acc_t>(partial_ptr, 1, splits, rows, out, partials_ops(ops), options, stream);
  }
}

// ---------------------------------------------------------------------------------------- columns ----

// C adjacent elements in one load (C * sizeof(scalar_t) bytes, aligned to that).
template <int C, typename scalar_t>
struct alignas(C * sizeof(scalar_t)) Columns {
  scalar_t value[C];
};

// Thread (x, y) of a (bx, by) block owns C adjacent columns of one slab b (group = blockIdx.x * bx + x)
// and folds rows y, y + by, ... of its split [blockIdx.y * rows_per_split, ...) of K; the by slices are
// then folded pairwise in shared memory. One split: the result; several: partials[split][b * N + n].
template <int C, typename scalar_t, typename acc_t, typename out_t, typename Ops>
__global__ void __launch_bounds__(kBlock)
    column_kernel(const scalar_t* __restrict__ in, int64_t outer, int64_t K, int64_t N, int64_t rows_per_split,
                  acc_t* __restrict__ partials, out_t* __restrict__ out, Ops ops) {
  using Load = Columns<C, scalar_t>;
  const int64_t groups_per_slab = N / C;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = group < outer * groups_per_slab;
  const int64_t b = group / groups_per_slab, n = (group % groups_per_slab) * C;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t k_end = k_begin + rows_per_split < K ? k_begin + rows_per_split : K;
  const int64_t step = blockDim.y;

  acc_t acc[C];
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = Ops::identity();
  if (active) {
    const scalar_t* column = in + b * K * N + n;
    int64_t k = k_begin + threadIdx.y;
    constexpr int kInFlight = UndispatchedTuning::kColumnLoadsInFlight;
    for (; k + (kInFlight - 1) * step < k_end; k += kInFlight * step) {
      Load v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) v[u] = *reinterpret_cast<const Load*>(column + (k + u * step) * N);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c] = ops(acc[c], load_element<acc_t>(ops, v[u].value[c]));
    }
    for (; k < k_end; k += step) {
      const Load v = *reinterpret_cast<const Load*>(column + k * N);
#pragma unroll
      for (int c = 0; c < C; ++c) acc[c] = ops(acc[c], load_element<acc_t>(ops, v.value[c]));
    }
  }

  __shared__ acc_t slices[kBlock][C];
  const unsigned slot = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int c = 0; c < C; ++c) slices[slot][c] = acc[c];
  __syncthreads();
  for (unsigned s = blockDim.y / 2; s > 0; s >>= 1) {
    if (threadIdx.y < s) {
#pragma unroll
      for (int c = 0; c < C; ++c) slices[slot][c] = ops(slices[slot][c], slices[slot + s * blockDim.x][c]);
    }
    __syncthreads();
  }
  if (threadIdx.y != 0 || !active) return;
  const int64_t first_output = b * N + n;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    if (gridDim.y == 1) out[first_output + c] = static_cast<out_t>(project_result(ops, slices[slot][c]));
    else partials[blockIdx.y * outer * N + first_output + c] = slices[slot][c];
  }
}

// A split of K keeps each thread busy for at least this many rows.
constexpr int64_t kMinRowsPerThread = UndispatchedTuning::kMinRowsPerThread;

template <typename scalar_t, typename acc_t, typename out_t, typename Ops>
void launch_columns(const scalar_t* in, int64_t outer, int64_t K, int64_t N, out_t* out, Ops ops,
                    const at::TensorOptions& options, cudaStream_t stream) {
  // Four columns a thread when every slab's row starts at a multiple of four elements (one 16-byte load
  // for float32), else one.
  constexpr int kFour = 4;
  const bool four = N % kFour == 0 && reinterpret_cast<uintptr_t>(in) % (kFour * sizeof(scalar_t)) == 0;
  const int64_t groups = outer * N / (four ? kFour : 1);
  const int64_t bx = std::min<int64_t>(kWarpSize, next_power_of_two(groups)), by = kBlock / bx;
  const int64_t blocks = ceil_div(groups, bx);
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "torch_reduce: too many columns for one launch");
  auto kernel = four ? column_kernel<kFour, scalar_t, acc_t, out_t, Ops>
                     : column_kernel<1, scalar_t, acc_t, out_t, Ops>;
  int64_t splits = choose_splits(blocks, resident_blocks(kernel), std::max<int64_t>(1, K / (by * kMinRowsPerThread)));
  const int64_t rows_per_split = ceil_div(K, splits);
  splits = ceil_div(K, rows_per_split);
  at::Tensor partials;
  acc_t* partial_ptr = nullptr;
  if (splits > 1) {
    partials = at::empty({splits * outer * N * static_cast<int64_t>(sizeof(acc_t))}, options.dtype(at::kByte));
    partial_ptr = reinterpret_cast<acc_t*>(partials.mutable_data_ptr());
  }
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
  const dim3 block(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  kernel<<<grid, block, 0, stream>>>(in, outer, K, N, rows_per_split, partial_ptr, out, ops);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (splits > 1) {  // splits <= K / 8: the fold's own splits, if any, are fewer again
    launch_columns<acc_t, acc_t>(partial_ptr, 1, splits, outer * N, out, partials_ops(ops), options, stream);
  }
}

// ---------------------------------------------------------------------------------------- the ops ----

void launch_cuda(const ReduceKind& kind, const ReduceProblem& p, const at::Tensor& out) {
  check_kernel_image_for_current_device();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  TORCH_REDUCE_DISPATCH_DIM(p.input.scalar_type(), "torch_reduce dim reduction", [&] {
    using acc_t = acc_type<scalar_t>;
    with_reduce_ops<scalar_t>(kind, p.reduced, [&](auto ops) {
      using out_t = kernel_out_t<scalar_t, decltype(ops)>;
      const scalar_t* in = p.input.const_data_ptr<scalar_t>();
      out_t* result = out.mutable_data_ptr<out_t>();
      if (p.outer * p.inner == 1) {
        launch_device_reduce<kBlock, scalar_t, acc_t>(in, p.reduced, result, ops, true, out.device());
      } else if (p.inner == 1) {
        launch_rows<scalar_t, acc_t>(in, p.outer, p.reduced, result, ops, out.options(), stream);
      } else {
        launch_columns<scalar_t, acc_t>(in, p.outer, p.reduced, p.inner, result, ops, out.options(), stream);
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) { impl_dim_reductions<&launch_cuda>(m); }

}  // namespace torch_reduce::cuda
