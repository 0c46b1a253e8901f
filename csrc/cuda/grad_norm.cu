// The global gradient norm on the GPU, each device's list in two launches:
//   norm_partials_kernel  the list cut into chunks of kListChunkBytes; a persistent grid (as many blocks as the
//                         GPU holds at once) whose warps stride over the chunks, a chunk a warp, so a list of
//                         small tensors (1,000 of 256 floats) runs at once and a large one is shared evenly; each
//                         chunk's fold, in float32 (float64 when the list holds float64, a narrower tensor's
//                         terms kept in float32's range), to its own partial;
//   norm_fold_kernel      one block: each tensor's partials folded in order by a thread, a warp or the whole
//                         block, by their count, into its norm (foreach_norm); then the block folds the tensors'
//                         accumulators, each in torch's range for its dtype (in_torch_range), in a fixed tree
//                         into the total (total_norm), and the float32 sum of the norms' rounded terms that gives
//                         the total torch's range (in_rounded_range).
// No float atomics, and nothing depends on which warp ran a chunk: the same list gives the same bits on every run.
//   clip_scale_kernel     every gradient times torch's clip coefficient, which each thread computes from the total
//                         on the device, in the total's dtype with torch's roundings: no host sync (a coefficient
//                         of 1 returns at once: multiplying by it changes no bit). Warps stride
//                         over parts of the chunks (kListScaleParts a chunk), so that the last warps to finish
//                         have less left to do than a whole chunk; a part makes no partial, so its size costs the
//                         fold nothing.
//
// A launch's tensors travel as a kernel parameter (a table passed by value, read in place: __grid_constant__).
// CUDA 12.1+ takes up to 32 KB of parameters on sm_70+, so no table is copied to the device before the launch:
// a copy would be one more operation on the stream per call, and a CUDA graph would capture the address of a
// pinned host buffer that the caching allocator hands out again, where a parameter is captured by value. A
// list longer than a table (kListTensors) takes two launches per table.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/TypeCast.h>
#include <torch/library.h>

#include <algorithm>

#include "common/dispatch.h"
#include "cuda/arch_check.cuh"
#include "cuda/block_reduce.cuh"
#include "cuda/full_reduce.cuh"
#include "cuda/launch.cuh"
#include "cuda/tuning.h"
#include "grad_norm.h"

namespace torch_reduce::cuda {
namespace {

constexpr size_t kMaxKernelParameterBytes = 32764;  // CUDA 12.1+, sm_70+

// The element types of a list, one byte a tensor in the tables: a list may mix them.
enum class Element : uint8_t { Float, Double, Half, BFloat16 };

Element element_of(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return Element::Double;
    case at::kHalf: return Element::Half;
    case at::kBFloat16: return Element::BFloat16;
    default: return Element::Float;
  }
}

// Calls f(scalar_t()) for the element type. On the device the branch is uniform: a block works on one tensor at a
// time.
template <typename F>
__device__ __forceinline__ void with_element(Element e, F&& f) {
  switch (e) {
    case Element::Double: f(double()); return;
    case Element::Half: f(c10::Half()); return;
    case Element::BFloat16: f(c10::BFloat16()); return;
    case Element::Float: f(float()); return;
  }
}

template <typename T>
__device__ __forceinline__ void store(void* out, Element e, T value) {
  with_element(e, [&](auto zero) {
    using out_t = decltype(zero);
    *static_cast<out_t*>(out) = static_cast<out_t>(value);
  });
}

// The tensors of one launch of the partials or scaling kernel.
template <int kCapacity>
struct ListTable {
  void* data[kCapacity];               // each tensor's first element (its elements are dense from there)
  int64_t numel[kCapacity];
  int64_t first_chunk[kCapacity + 1];  // the launch's chunks before each tensor's; [count]: all of them
  Element element[kCapacity];
  bool range_terms[kCapacity];         // in a float64 fold, terms kept in float32's range (norm_partials_kernel)
  int32_t count;
};

// The fold's view of the same tensors: where each one's partials are, and where its norm goes.
template <int kCapacity>
struct FoldTable {
  void* norm[kCapacity];               // each tensor's 0-dim norm (foreach_norm)
  int64_t first_chunk[kCapacity + 1];
  // The tensors the fold kernel folds, all but those of one chunk (whose partial is their accumulator, stored by
  // the partials kernel): [0, warp_folded) of at most kFoldWarpChunks chunks, a warp each; then the larger.
  int32_t folded[kCapacity];
  Element element[kCapacity];          // the norms' types: their range (in_torch_range)
  bool float32_fold[kCapacity];        // the tensors torch folds in float32 (in_torch_range)
  int32_t count, warp_folded, folded_count;
  bool stores_norms;                   // foreach_norm
  bool only_tensor;                    // a list of one tensor (tensor_contribution)
  bool rounded_range;                  // a total not float64 of several tensors: in_rounded_range
};

// The tensor a chunk belongs to: the last with first_chunk <= chunk (empty tensors own no chunk).
template <typename Table>
__device__ __forceinline__ int tensor_of_chunk(const Table& table, int64_t chunk) {
  int low = 0, high = table.count;  // first_chunk[low] <= chunk < first_chunk[high]
  while (high - low > 1) {
    const int middle = (low + high) / 2;
    if (table.first_chunk[middle] <= chunk) {
      low = middle;
    } else {
      high = middle;
    }
  }
  return low;
}

// Elements of one chunk of scalar_t: kListChunkBytes whatever the type.
template <typename Tuning, typename scalar_t>
constexpr int64_t kChunkElements = Tuning::kListChunkBytes / static_cast<int64_t>(sizeof(scalar_t));

// Elements of the chunk at `offset` of a tensor of `numel`: a whole chunk but for the tensor's last.
template <typename Tuning, typename scalar_t>
__device__ __forceinline__ int64_t chunk_length(int64_t numel, int64_t offset) {
  const int64_t left = numel - offset;
  return left < kChunkElements<Tuning, scalar_t> ? left : kChunkElements<Tuning, scalar_t>;
}

// A chunk is a warp's unit of work (the partials and scaling kernels): the grid's warps stride over the
// list's chunks, so a list of small tensors runs a chunk per warp at once instead of queueing them on blocks.
template <typename Tuning>
constexpr unsigned kListWarps = Tuning::kListBlock / kWarpSize;

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x % kWarpSize; }

// f(chunk, part, tensor) for each part this warp owns of the chunks cut into kParts: parts warp, warp + warps,
// ... of the grid.
template <typename Tuning, int kParts, typename Table, typename F>
__device__ __forceinline__ void for_each_warp_part(const Table& table, F&& f) {
  const int64_t parts = table.first_chunk[table.count] * kParts;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kListWarps<Tuning>;
  for (int64_t part = static_cast<int64_t>(blockIdx.x) * kListWarps<Tuning> + threadIdx.x / kWarpSize;
       part < parts; part += warps) {
    const int64_t chunk = part / kParts;
    f(chunk, static_cast<int>(part % kParts), tensor_of_chunk(table, chunk));
  }
}

// g(k, loads) for this lane's 16-byte vectors k, k + 32, ... (loads of them, all loaded before any is used)
// of x[0, n) when x is aligned; h(k) for the elements that no aligned vector covers.
template <typename Tuning, typename scalar_t, typename G, typename H>
__device__ __forceinline__ void visit_chunk(const scalar_t* x, int64_t n, G&& g, H&& h) {
  constexpr int kVector = Vec16<scalar_t>::kSize;
  const unsigned lane = lane_id();
  int64_t scalar_from = 0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const int64_t count = n / kVector;
    int64_t k = lane;
    for (; k + (Tuning::kListLoads - 1) * kWarpSize < count; k += Tuning::kListLoads * kWarpSize)
      g(k, std::integral_constant<int, Tuning::kListLoads>());
    for (; k < count; k += kWarpSize) g(k, std::integral_constant<int, 1>());
    scalar_from = count * kVector;
  }
  for (int64_t k = scalar_from + lane; k < n; k += kWarpSize) h(k);
}

// A float32 or 16-bit tensor that torch folds in float32 (table.range_terms) in a float64 fold: its terms kept in
// float32's range (Float32RangeTerms), as torch's.
template <typename Tuning, typename Ops, typename acc_t>
__global__ void __launch_bounds__(Tuning::kListBlock, Tuning::kListBlocksPerMultiprocessor)
    norm_partials_kernel(const __grid_constant__ ListTable<Tuning::kListTensors> table, const Ops ops,
                         acc_t* partials, acc_t* accumulators) {
  for_each_warp_part<Tuning, 1>(table, [&](int64_t chunk, int, int i) {
    acc_t acc = Ops::identity();
    with_element(table.element[i], [&](auto zero) {
      using scalar_t = decltype(zero);
      const int64_t offset = (chunk - table.first_chunk[i]) * kChunkElements<Tuning, scalar_t>;
      const scalar_t* x = static_cast<const scalar_t*>(table.data[i]) + offset;
      const auto* vectors = reinterpret_cast<const Vec16<scalar_t>*>(x);
      const auto fold_chunk = [&](const auto& term_ops) {
        visit_chunk<Tuning>(x, chunk_length<Tuning, scalar_t>(table.numel[i], offset),
            [&](int64_t k, auto loads) {
              Vec16<scalar_t> held[loads()];
#pragma unroll
              for (int j = 0; j < loads(); ++j) held[j] = load_vector(vectors + k + j * kWarpSize);
#pragma unroll
              for (int j = 0; j < loads(); ++j) acc = ops(acc, fold_vector<acc_t>(held[j], term_ops));
            },
            [&](int64_t k) { acc = ops(acc, load_element<acc_t>(term_ops, x[k])); });
      };
      if constexpr (std::is_same_v<acc_t, double> && !std::is_same_v<scalar_t, double>) {
        if (table.range_terms[i]) {
          fold_chunk(Float32RangeTerms<Ops>{ops});
          return;
        }
      }
      fold_chunk(ops);
    });
    acc = warp_reduce(acc, ops);
    if (lane_id() == 0) {
      partials[chunk] = acc;
      if (table.first_chunk[i + 1] - table.first_chunk[i] == 1) accumulators[i] = acc;
    }
  });
}

// One block folds each tensor's partials in order into its accumulator (`accumulators`, by tensor), by the
// tensor's chunk count: one chunk, none (the partials kernel stored its partial as its accumulator); up to
// kFoldWarpChunks, a warp (lane-strided, then the shuffle tree); more, the whole block (GPT-2's embedding). Then
// the block stores the norms (foreach_norm) and folds the accumulators in a fixed tree into the total
// (total_norm), in the range of the rounded norms' sum; it stores both sums in `table_sums` (accumulator, rounded
// sum), which a list of several tables combines. Which threads fold a tensor depends on the table alone: the same
// bits on every run. The table lists the tensors to fold, so no lane reads another tensor's entry than its warp's:
// kernel parameters are read through the constant cache, which serves a warp's different addresses one after
// another.
template <typename Tuning, typename Ops, typename acc_t>
__global__ void __launch_bounds__(Tuning::kFoldBlock)
    norm_fold_kernel(const __grid_constant__ FoldTable<Tuning::kListTensors> table, const Ops ops,
                     const acc_t* partials, acc_t* accumulators, acc_t* table_sums, void* total,
                     Element total_element) {
  constexpr unsigned kWarps = Tuning::kFoldBlock / kWarpSize;
  const unsigned lane = lane_id();
  for (int w = threadIdx.x / kWarpSize; w < table.warp_folded; w += kWarps) {
    const int i = table.folded[w];
    acc_t acc = Ops::identity();
#pragma unroll 8
    for (int64_t c = table.first_chunk[i] + lane; c < table.first_chunk[i + 1]; c += kWarpSize)
      acc = ops(acc, partials[c]);
    acc = warp_reduce(acc, ops);
    if (lane == 0) accumulators[i] = acc;
  }
  for (int w = table.warp_folded; w < table.folded_count; ++w) {
    const int i = table.folded[w];
    acc_t acc = Ops::identity();
#pragma unroll 4
    for (int64_t c = table.first_chunk[i] + threadIdx.x; c < table.first_chunk[i + 1]; c += Tuning::kFoldBlock)
      acc = ops(acc, partials[c]);
    acc = block_reduce<Tuning::kFoldBlock>(acc, ops);
    if (threadIdx.x == 0) accumulators[i] = acc;
    __syncthreads();  // block_reduce's shared memory serves the next tensor
  }
  __syncthreads();  // every accumulator stored
  acc_t acc = Ops::identity();
  float rounded_sum = 0;
  for (int i = threadIdx.x; i < table.count; i += Tuning::kFoldBlock) {
    acc_t tensor_accumulator;
    with_element(table.element[i], [&](auto zero) {
      using norm_t = decltype(zero);
      tensor_accumulator = in_torch_range<norm_t>(ops, accumulators[i], table.float32_fold[i]);
      if (table.rounded_range) rounded_sum += rounded_norm_term<norm_t>(ops, tensor_accumulator);
    });
    if (table.stores_norms) store(table.norm[i], table.element[i], project_result(ops, tensor_accumulator));
    acc = ops(acc, tensor_contribution(ops, tensor_accumulator, table.only_tensor));
  }
  acc = block_reduce<Tuning::kFoldBlock>(acc, ops);
  if (table.rounded_range) {
    __syncthreads();  // block_reduce's shared memory
    rounded_sum = block_reduce<Tuning::kFoldBlock>(rounded_sum, SumOp<float>());
  }
  if (threadIdx.x == 0) {
    table_sums[0] = acc;
    table_sums[1] = static_cast<acc_t>(rounded_sum);
    if (table.rounded_range) acc = in_rounded_range(ops, acc, rounded_sum);
    if (total != nullptr) store(total, total_element, project_result(ops, acc));
  }
}

// torch's clamp(max_norm / (total_norm + 1e-6), max=1) in T, total_norm's dtype: each step in T's accumulate type,
// rounded to T, as torch's add, reciprocal (t.__rtruediv__) and mul kernels round; NaN stays NaN.
template <typename T>
__device__ __forceinline__ T clip_coefficient_of(const T* total_norm, double max_norm) {
  using op_t = acc_type<T>;
  const T shifted = static_cast<T>(static_cast<op_t>(*total_norm) + static_cast<op_t>(1e-6));
  const T reciprocal = static_cast<T>(op_t(1) / static_cast<op_t>(shifted));
  const T coefficient = static_cast<T>(static_cast<op_t>(reciprocal) * static_cast<op_t>(max_norm));
  const op_t c = static_cast<op_t>(coefficient);
  return c > op_t(1) ? T(1) : coefficient;
}

// Every element times the coefficient as torch's in-place mul gives it: the coefficient cast to the gradient's
// dtype (c10::convert, as torch's kernels cast a mixed-dtype input), the product in its accumulate type.
template <typename Tuning, typename T>
__global__ void __launch_bounds__(Tuning::kListBlock, Tuning::kListBlocksPerMultiprocessor)
    clip_scale_kernel(const __grid_constant__ ListTable<Tuning::kListTensors> table, const T* total_norm,
                      double max_norm) {
  const T coefficient = clip_coefficient_of(total_norm, max_norm);
  // A norm within max_norm gives a coefficient of 1, and x * 1 is x, bit for bit, in every dtype: the gradients are
  // left unread and unwritten (two thirds of a clip's traffic, in the steps that clip nothing).
  if (static_cast<acc_type<T>>(coefficient) == acc_type<T>(1)) return;
  constexpr int kParts = Tuning::kListScaleParts;
  for_each_warp_part<Tuning, kParts>(table, [&](int64_t chunk, int part, int i) {
    with_element(table.element[i], [&](auto zero) {
      using scalar_t = decltype(zero);
      using op_t = acc_type<scalar_t>;
      const op_t c = static_cast<op_t>(c10::convert<scalar_t>(coefficient));
      const auto scale = [&](scalar_t v) { return static_cast<scalar_t>(static_cast<op_t>(v) * c); };
      constexpr int64_t kPartElements = kChunkElements<Tuning, scalar_t> / kParts;
      const int64_t chunk_offset = (chunk - table.first_chunk[i]) * kChunkElements<Tuning, scalar_t>;
      const int64_t in_chunk = chunk_length<Tuning, scalar_t>(table.numel[i], chunk_offset) - part * kPartElements;
      if (in_chunk <= 0) return;  // a part past a tensor's short last chunk
      scalar_t* x = static_cast<scalar_t*>(table.data[i]) + chunk_offset + part * kPartElements;
      auto* vectors = reinterpret_cast<Vec16<scalar_t>*>(x);
      visit_chunk<Tuning>(x, in_chunk < kPartElements ? in_chunk : kPartElements,
          [&](int64_t k, auto loads) {
            // Every load before the first store: the stores could alias later loads, so the compiler would
            // not move those loads above them.
            Vec16<scalar_t> held[loads()];
#pragma unroll
            for (int j = 0; j < loads(); ++j) held[j] = load_vector(vectors + k + j * kWarpSize);
#pragma unroll
            for (int j = 0; j < loads(); ++j) {
#pragma unroll
              for (int e = 0; e < Vec16<scalar_t>::kSize; ++e) held[j].value[e] = scale(held[j].value[e]);
              vectors[k + j * kWarpSize] = held[j];
            }
          },
          [&](int64_t k) { x[k] = scale(x[k]); });
    });
  });
}

// The tables of a device's list, kListTensors tensors each, and where each table's partials start.
template <typename Tuning>
struct ListTables {
  using Table = ListTable<Tuning::kListTensors>;
  static_assert(sizeof(Table) <= kMaxKernelParameterBytes && sizeof(FoldTable<Tuning::kListTensors>) <=
                kMaxKernelParameterBytes, "a table must fit the kernel parameters");
  std::vector<Table> tables;
  std::vector<int64_t> first_partial;  // per table, and at the end the partials of all

  explicit ListTables(at::TensorList dense) {
    const int64_t n = static_cast<int64_t>(dense.size());
    first_partial.push_back(0);
    for (int64_t start = 0; start < n; start += Tuning::kListTensors) {
      Table& table = tables.emplace_back();
      table.count = static_cast<int32_t>(std::min<int64_t>(Tuning::kListTensors, n - start));
      table.first_chunk[0] = 0;
      for (int32_t k = 0; k < table.count; ++k) {
        const at::Tensor& t = dense[start + k];
        const int64_t chunk = Tuning::kListChunkBytes / static_cast<int64_t>(t.element_size());
        table.data[k] = t.data_ptr();
        table.numel[k] = t.numel();
        table.element[k] = element_of(t.scalar_type());
        table.range_terms[k] = false;
        table.first_chunk[k + 1] = table.first_chunk[k] + (t.numel() + chunk - 1) / chunk;
      }
      first_partial.push_back(first_partial.back() + table.first_chunk[table.count]);
    }
  }
};

// Blocks for a warp a unit of work: as many as the GPU holds at once, or fewer when the units are fewer.
template <typename Tuning, typename Kernel>
int64_t persistent_grid(Kernel kernel, int64_t units) {
  const int64_t blocks = (units + kListWarps<Tuning> - 1) / kListWarps<Tuning>;
  return std::min<int64_t>(blocks, resident_blocks_per_sm(kernel, Tuning::kListBlock) * multiprocessors());
}

// What a launch computes of a total (total_norm): its dtype, whether the list is one tensor (tensor_contribution),
// and where it goes; undefined `out`: the device holds a part of the list, whose sums the caller combines.
struct TotalRequest {
  at::ScalarType dtype;
  bool only_tensor;
  at::Tensor out;
};

// The norms of a device's dense tensors (`lists`, on `device`), each of dtype `norm_types` (a list's): each tensor's
// into `norms` (when given: foreach_norm), the total as `total` asks (when given: total_norm); returns the tables'
// sums then (total_of_sums' [tables, 2]). `wide`: accumulate in float64; `float32_terms`: for a float64 tensor in
// the list, not for dtype=float64, so torch folds the narrower tensors in float32, but those whose norm is their
// `magnitude` (norm_is_magnitude), which enter as their dtype holds them.
template <typename Tuning>
at::Tensor launch_norms(const ListTables<Tuning>& lists, at::Device device, double ord, bool wide, bool float32_terms,
                        const std::vector<at::ScalarType>& norm_types, const std::vector<char>& magnitude,
                        const std::vector<at::Tensor>& norms, const std::optional<TotalRequest>& total) {
  const int64_t tables = static_cast<int64_t>(lists.tables.size());
  const auto options = at::TensorOptions().device(device).dtype(wide ? at::kDouble : at::kFloat);
  // One allocation: the chunks' partials, each table's accumulator and rounded sum (norm_fold_kernel), then each
  // table's tensors' accumulators.
  const int64_t all_chunks = lists.first_partial.back();
  const at::Tensor scratch = at::empty({all_chunks + tables * (2 + Tuning::kListTensors)}, options);
  // torch folds the rounded norms in float32 but for a float64 total, and takes one norm's magnitude.
  const bool rounded_range = total && total->dtype != at::kDouble && !total->only_tensor;
  const bool stores_total = total && total->out.defined() && tables == 1;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto run = [&](auto zero) {
    using acc_t = decltype(zero);
    with_norm_ops<acc_t>(ord, [&](auto ops) {
      using Ops = decltype(ops);
      for (int64_t g = 0; g < tables; ++g) {
        auto table = lists.tables[g];
        for (int32_t k = 0; k < table.count; ++k) {
          table.range_terms[k] = wide && float32_terms && table.element[k] != Element::Double &&
                                 !magnitude[g * Tuning::kListTensors + k];
        }
        acc_t* table_partials = scratch.mutable_data_ptr<acc_t>() + lists.first_partial[g];
        acc_t* table_sums = scratch.mutable_data_ptr<acc_t>() + all_chunks + 2 * g;
        acc_t* accumulators = scratch.mutable_data_ptr<acc_t>() + all_chunks + 2 * tables + g * Tuning::kListTensors;
        const int64_t chunks = table.first_chunk[table.count];
        if (chunks > 0) {
          const auto kernel = norm_partials_kernel<Tuning, Ops, acc_t>;
          kernel<<<persistent_grid<Tuning>(kernel, chunks), Tuning::kListBlock, 0, stream>>>(
              table, ops, table_partials, accumulators);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
        FoldTable<Tuning::kListTensors> fold;
        fold.count = table.count;
        fold.stores_norms = !norms.empty();
        fold.only_tensor = total && total->only_tensor;
        fold.rounded_range = rounded_range;
        std::vector<int32_t> block_folded;  // tensors of more than kFoldWarpChunks chunks
        int32_t listed = 0;
        for (int32_t k = 0; k <= table.count; ++k) fold.first_chunk[k] = table.first_chunk[k];
        for (int32_t k = 0; k < table.count; ++k) {
          const int64_t tensor_chunks = table.first_chunk[k + 1] - table.first_chunk[k];
          if (tensor_chunks > Tuning::kFoldWarpChunks) {
            block_folded.push_back(k);
          } else if (tensor_chunks != 1) {
            fold.folded[listed++] = k;
          }
          fold.float32_fold[k] = float32_terms && table.element[k] != Element::Double &&
                                 !(wide && magnitude[g * Tuning::kListTensors + k]);
          fold.element[k] = element_of(norm_types[g * Tuning::kListTensors + k]);
          if (fold.stores_norms) fold.norm[k] = norms[g * Tuning::kListTensors + k].data_ptr();
        }
        fold.warp_folded = listed;
        for (int32_t k : block_folded) fold.folded[listed++] = k;
        fold.folded_count = listed;
        norm_fold_kernel<Tuning, Ops, acc_t><<<1, Tuning::kFoldBlock, 0, stream>>>(
            fold, ops, table_partials, accumulators, table_sums, stores_total ? total->out.data_ptr() : nullptr,
            element_of(total ? total->dtype : at::kFloat));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
  };
  if (wide) {
    run(double());
  } else {
    run(float());
  }
  if (!total) return at::Tensor();
  const at::Tensor table_sums = scratch.narrow(0, all_chunks, 2 * tables).view({tables, 2});
  if (total->out.defined() && tables > 1) total->out.copy_(total_of_sums(table_sums, ord, rounded_range, total->dtype));
  return table_sums;
}

template <typename Tuning>
void launch_clip_scale(const ListTables<Tuning>& lists, const at::Tensor& total_norm, double max_norm) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  TORCH_REDUCE_DISPATCH_FLOATING(total_norm.scalar_type(), "reduce::clip_grads_", [&] {
    const auto kernel = clip_scale_kernel<Tuning, scalar_t>;
    for (const auto& table : lists.tables) {
      const int64_t chunks = table.first_chunk[table.count];
      if (chunks == 0) continue;
      kernel<<<persistent_grid<Tuning>(kernel, chunks * Tuning::kListScaleParts), Tuning::kListBlock, 0, stream>>>(
          table, total_norm.const_data_ptr<scalar_t>(), max_norm);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

// Runs f(device, positions) for each device of a list's `groups` (group_by_device), under a guard for a CUDA one.
template <typename F>
void for_each_device(const std::vector<std::pair<at::Device, std::vector<int64_t>>>& groups, const char* op, F&& f) {
  for (const auto& [device, positions] : groups) {
    TORCH_CHECK(device.is_cpu() || device.is_cuda(), op, ": expected CPU or CUDA tensors, got one on ", device);
    if (device.is_cpu()) {
      f(device, positions);
      continue;
    }
    const c10::cuda::CUDAGuard guard(device);
    check_kernel_image_for_current_device();
    f(device, positions);
  }
}

std::vector<at::Tensor> foreach_norm_cuda(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype) {
  const char* op = "reduce::foreach_norm";
  check_norm_list(tensors, ord, dtype);
  const NormOperands real = real_operands(tensors, ord, dtype);
  std::vector<at::Tensor> norms(tensors.size());
  for_each_device(group_by_device(real.tensors), op, [&](at::Device device, const std::vector<int64_t>& positions) {
    const std::vector<at::Tensor> group = select(real.tensors, positions);
    std::vector<at::Tensor> group_norms;
    if (device.is_cpu()) {
      group_norms = cpu::foreach_norm(select(tensors, positions), ord, dtype);
    } else {
      std::vector<at::Tensor> dense;
      std::vector<at::ScalarType> norm_types;
      std::vector<char> magnitude;
      const bool dtype_wide = real.dtype == at::kDouble, fast_route = torch_fast_route(tensors);
      bool wide = dtype_wide;
      for (size_t k = 0; k < group.size(); ++k) {
        dense.push_back(dense_elements(group[k]));
        wide = wide || group[k].scalar_type() == at::kDouble;
        norm_types.push_back(real.norm_types[positions[k]]);
        magnitude.push_back(norm_is_magnitude(tensors[positions[k]], ord, fast_route));
        group_norms.push_back(at::empty({}, group[k].options().dtype(norm_types.back())));
      }
      with_tuning([&](auto tuning) {
        using Tuning = decltype(tuning);
        launch_norms(ListTables<Tuning>(dense), device, ord, wide, !dtype_wide, norm_types, magnitude, group_norms,
                     std::nullopt);
      });
      for (size_t k = 0; k < group.size(); ++k) {
        if (magnitude[k]) group_norms[k].copy_(magnitudes(tensors[positions[k]], dtype).reshape({}));
      }
    }
    for (size_t k = 0; k < positions.size(); ++k) norms[positions[k]] = group_norms[k];
  });
  return norms;
}

// A list on one device: its total from its kernels. A list spread over devices: each device's sums (total_of_sums),
// folded on the first tensor's device as torch folds the norms there.
at::Tensor total_norm_cuda(at::TensorList tensors, double ord, bool foreach) {
  const char* op = "reduce::total_norm";
  check_norm_list(tensors, ord, std::nullopt);
  const at::ScalarType result_type = total_norm_dtype(tensors);
  const NormOperands operands = real_operands(tensors, ord, std::nullopt);
  const std::vector<at::Tensor>& real = operands.tensors;
  const auto groups = group_by_device(real);
  const bool one_device = groups.size() == 1;
  at::Tensor total;
  std::vector<at::Tensor> sums;  // each device's, on the first tensor's device, in float64
  for_each_device(groups, op, [&](at::Device device, const std::vector<int64_t>& positions) {
    if (device.is_cpu()) {
      if (one_device) {
        total = cpu::total_norm(tensors, ord, foreach);
      } else {
        sums.push_back(cpu::total_sums(select(tensors, positions), ord, result_type, false).to(real[0].device()));
      }
      return;
    }
    std::vector<at::Tensor> dense;
    std::vector<at::ScalarType> norm_types;
    bool wide = false;
    for (int64_t i : positions) {
      dense.push_back(dense_elements(real[i]));
      norm_types.push_back(operands.norm_types[i]);
      wide = wide || real[i].scalar_type() == at::kDouble;
    }
    const std::vector<char> magnitude = total_magnitudes(select(tensors, positions), ord, foreach);
    if (one_device) total = at::empty({}, real[0].options().dtype(result_type));
    if (tensors.size() == 1 && magnitude[0]) {
      total.copy_(magnitudes(tensors[0], std::nullopt).reshape({}));
      return;
    }
    with_tuning([&](auto tuning) {
      using Tuning = decltype(tuning);
      const at::Tensor device_sums = launch_norms(ListTables<Tuning>(dense), device, ord, wide, true, norm_types,
                                                  magnitude, {}, TotalRequest{result_type, tensors.size() == 1, total});
      if (!one_device) sums.push_back(device_sums.to(real[0].device(), at::kDouble));
    });
  });
  return one_device ? total : total_of_sums(at::cat(sums), ord, result_type != at::kDouble, result_type);
}

// Whether torch's g.mul_(coefficient) computes in a wider type than the scaling kernel. A 0-dim gradient meets the
// 0-dim coefficient as an equal in type promotion, so torch multiplies in their promoted type and rounds once (a
// float16 gradient by a float64 coefficient: in float64), where the kernel casts the coefficient to the gradient's
// dtype first, torch's rule for a gradient with dims; below float16's normals (a total norm over 16,000 times
// max_norm) that cast leaves the coefficient a few subnormal steps, and the product several steps off torch's.
bool scaled_in_a_wider_type(const at::Tensor& g, at::ScalarType coefficient_type) {
  return g.dim() == 0 && at::promoteTypes(g.scalar_type(), coefficient_type) != g.scalar_type();
}

void clip_grads_cuda(at::TensorList grads, const at::Tensor& total_norm, double max_norm) {
  const char* op = "reduce::clip_grads_";
  check_clip_grads(grads, total_norm, op);
  const std::vector<at::Tensor> views = real_views(grads);
  for_each_device(group_by_device(views), op, [&](at::Device device, const std::vector<int64_t>& positions) {
    if (device.is_cpu()) {
      cpu::clip_grads_(select(grads, positions), total_norm, max_norm);
      return;
    }
    const at::Tensor total_here = total_norm.to(device);
    std::vector<at::Tensor> dense;
    at::Tensor coefficient;  // for the gradients the kernel does not scale as torch's mul would
    for (int64_t i : positions) {
      if (views[i].is_non_overlapping_and_dense() && !scaled_in_a_wider_type(grads[i], total_norm.scalar_type())) {
        dense.push_back(views[i]);
      } else {
        if (!coefficient.defined()) coefficient = clip_coefficient(total_here, max_norm);
        grads[i].mul_(coefficient);  // torch's own in-place rules (and errors)
      }
    }
    if (dense.empty()) return;
    with_tuning([&](auto tuning) { launch_clip_scale(ListTables<decltype(tuning)>(dense), total_here, max_norm); });
  });
}

// One CUDA device and dense real gradients, or complex ones at order 2 (the common case): one pass over the list
// checks it and builds the tables that both the norm's and the scaling's launches read. Any other list:
// total_norm, then clip_grads_.
at::Tensor clip_grad_norm_cuda(at::TensorList grads, double max_norm, double norm_type, bool foreach) {
  check_norm_list(grads, norm_type, std::nullopt);
  const at::Device device = grads[0].device();
  bool one_dense_cuda_list = device.is_cuda();
  bool complex = false, zero_dim = false;
  at::ScalarType total_type = c10::toRealValueType(grads[0].scalar_type());  // total_norm_dtype's, in the same pass
  for (const at::Tensor& g : grads) {
    one_dense_cuda_list = one_dense_cuda_list && g.device() == device && g.is_non_overlapping_and_dense();
    if (one_dense_cuda_list) check_not_inference(g);  // a list that is not takes clip_grads_cuda's checks
    complex = complex || g.is_complex();
    zero_dim = zero_dim || g.dim() == 0;
    total_type = at::promoteTypes(total_type, c10::toRealValueType(g.scalar_type()));
  }
  const auto wider = [&](const at::Tensor& g) { return scaled_in_a_wider_type(g, total_type); };
  if (!one_dense_cuda_list || (complex && norm_type != 2) ||
      (zero_dim && std::any_of(grads.begin(), grads.end(), wider)) ||
      (grads.size() == 1 && total_magnitudes(grads, norm_type, foreach)[0]))
    return clip_grad_norm<&total_norm_cuda, &clip_grads_cuda>(grads, max_norm, norm_type, foreach);
  const bool wide = total_type == at::kDouble;  // only float types reach here: double iff one is double
  const c10::cuda::CUDAGuard guard(device);
  check_kernel_image_for_current_device();
  const at::Tensor total = at::empty({}, grads[0].options().dtype(total_type));
  std::vector<at::ScalarType> norm_types;
  for (const at::Tensor& g : grads) norm_types.push_back(c10::toRealValueType(g.scalar_type()));
  const std::vector<char> magnitude = total_magnitudes(grads, norm_type, foreach);
  with_tuning([&](auto tuning) {
    const ListTables<decltype(tuning)> lists(complex ? at::TensorList(real_views(grads)) : grads);
    launch_norms(lists, device, norm_type, wide, true, norm_types, magnitude, {},
                 TotalRequest{total_type, grads.size() == 1, total});
    launch_clip_scale(lists, total, max_norm);
  });
  return total;
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) {
  m.impl("foreach_norm", &foreach_norm_cuda);
  m.impl("total_norm", &total_norm_cuda);
  m.impl("clip_grads_", &clip_grads_cuda);
  m.impl("clip_grad_norm_", &clip_grad_norm_cuda);
}

}  // namespace torch_reduce::cuda
