// LayerNorm and RMSNorm backward on the GPU (one kernel, RowNorm says which), one pass over x and dy:
//   LayerNorm: grad_input = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * weight, xhat = (x - mean) * rstd;
//   RMSNorm:   grad_input = rstd * (g - xhat * mean(g * xhat)),            xhat = x * rstd;
//   grad_weight (and LayerNorm's grad_bias) = column sums of dy * xhat (and dy), without float atomics: a
//   resident grid of blocks walks the rows, each block sums its rows' columns into one partial row, and
//   column_fold_kernel folds the partials in a fixed order (the same bits on every run). x and dy are read
//   once: 3 x N elements of traffic (torch reads them twice, once for grad_input and once for the column sums).
//   The fold is a programmatic dependent launch (launch_dependent, sm_90 and newer): the row kernel's blocks let it
//   launch once their rows are done, and its blocks wait there for the partial rows: the fold's launch overlaps the
//   row kernel's last rows. H200, the backward op alone, graph replay, 20 LayerNorm and RMSNorm cases of 1024-65536
//   rows, two runs each: 0.97-1.15x (geomean 1.02x; bfloat16 LayerNorm 1024x1024 7.8 -> 6.8 us, RMSNorm 2048x1600
//   11.6 -> 10.8); the same launch allowed at the row kernel's start, its blocks waiting beside the rows:
//   0.96-1.07x (geomean 1.01x; RMSNorm float32 1024x2560 13.7 -> 14.3 us); logs/ab_bwd_dependent_fold.jsonl.
//   A fused add + norm's backward passes grad_sum, the gradient of the sum's other uses, which is added to
//   grad_input as it is stored.
// Row kernel (16-byte aligned rows): thread t of a row's group owns the same columns in every row it visits
// (row_layout.cuh), so it adds its columns' terms of every row into the same column sums (ColumnSums):
//   Registers: two accumulators an element in registers, from the first row to the last, at 512 threads per SM
//              (Tuning::kBackwardThreads);
//   Shared:    in the group's slab of shared memory (16-byte runs, column_run), at 1024 threads per SM
//              (Tuning::kSharedSumsThreads) of a group just as large as the row needs (any multiple of 32) at
//              two vectors a thread, three where 1024 threads of two do not hold it (Tuning::kWideSharedSumsItems);
//              short rows two at a time (ROWS), one barrier and one column-sum update for both
//              (Tuning::kRowPairsMaxBlock: float32 16384x1024 1.19-1.25x, bfloat16 65536x1024 1.03-1.06x), and
//              many rows of 512-768 threads too, at 768 threads per SM (Tuning::kWideRowPairsMinBlock: bfloat16
//              8192-12288 columns 1.01-1.10x on the H100), and of 256 threads in a block of that fixed size
//              (Tuning::kFixedRowPairsBlock: LayerNorm bfloat16 4096 columns 1.03-1.04x on the H100);
//              on sm_90 and newer the blocks run in clusters whose blocks add up their column sums through
//              distributed shared memory at the end, one partial row a cluster (Tuning::kColumnSumsCluster).
// What bounds this kernel is how many rows an SM has in progress: each row's loads wait on its reduction's
// barrier, so an SM keeps about (rows in progress) x (row bytes) in flight, and a 16-bit row keeps half a float32
// one's. With the sums in registers a bfloat16 thread's 2 x 8 accumulators a vector fill the 128 registers,
// so an SM held 2 rows of 4096 (1 of 8192); with them in shared memory it holds twice the threads and rows.
// The host plans both and launches the one with more rows in progress per SM (a shared-memory block takes
// Tuning::kSharedSumsMinRows rows at least, or its partial row costs more than its rows). H200, bfloat16,
// backward alone, graph replay, registers -> chosen, one run: LayerNorm 65536x1024 191 -> 134 us (45% -> 65% of
// the line), 16384x8192 334 -> 263 us (52% -> 66%); RMSNorm 8192x8192 161 -> 116 us (54% -> 75%); over the
// 30 shapes of N >= 2^24 the median 52% -> 59% (LayerNorm) and 61% -> 66% (RMSNorm), 0.93-1.43x; float32
// 0.95-1.12x (median 1.00).
// Where a row's x and dy are between the two passes (RowSource):
//   Held:   in registers (16-bit ones packed), for rows of up to Tuning::kHeldItems vectors a thread;
//   Reread: wider rows (up to Tuning::kRereadItems vectors a thread): read again in the second pass, from L2
//           (the block's row was just read), so that the registers hold the accumulators alone; where the
//           shared-memory column sums keep as many rows in progress, those hold the row instead (16-bit rows of
//           12296..18432 columns).
// Rows as wide as Reread's whose x and dy are too large for the prefetch below are split over a cluster of blocks
// instead (Tuning::kRowSplit), each holding its share: ClusterAllreduce adds the row's sums over the cluster.
// A plan that keeps one row in progress per SM prefetches each group's next row into L2 where the row is wide
// but not too large (Tuning::kPrefetchMinColumns, kPrefetchMaxRowBytes).
// Measured on the H200 and kept out (bfloat16 ran at 35-75% of the line with the sums in registers; none of these
// moved it):
// - the next row staged in shared memory with cp.async while this one is computed (two stages): float32
//   65536x4096 65% of the line against 82%; bfloat16 no faster;
// - bulk copies (TMA) of x and dy into shared memory 2-4 rows ahead per block, column sums in registers:
//   bfloat16 0.52-1.03x the Held kernel (16384x4096: 185 vs 147 us), float32 0.64-1.00x;
// - the next row's x and dy loaded into registers during this one, by loads the compiler may not move or
//   repeat (ld.global volatile, issued before the row's barrier; SASS checked), two vectors a thread: within
//   2% at 13 shapes, LayerNorm and RMSNorm; one vector a thread at 1024 threads per SM: 0.59-1.09x;
// - the shared-memory sums in power-of-two blocks: a row of 2560 or 5120 left a block's threads idle, 0.92-0.96x
//   the register kernel there;
// - the column-sum terms added in the first pass, before the row's barrier (the second pass dx alone), and no
//   grad_sum add without one: 0.96-1.05x over 32 LayerNorm/RMSNorm cases (geomean 1.00; ncu, bfloat16
//   16384x4096: 38.1 -> 37.4 instructions an element, an instruction issued in 65-66% of cycles);
// - 4 vectors a thread at 512 threads per SM for the shared-memory sums (half the per-row reduction and
//   indexing per element, 100-120 registers): 0.90-0.94x where it changed the plan (bfloat16 16384x4096,
//   8192x8192, float32 16384x4096);
// - the group's next rows copied into shared memory by cp.async beside the shared-memory column sums (each thread
//   its own vectors, so no barrier), their loads in flight through the whole of this row: 0.79-1.05x over 36
//   LayerNorm/RMSNorm cases (geomean 0.955; bfloat16 16384x4096 0.94x and 0.88x, 1024x4096 0.79x), at the same
//   blocks per SM or with the staged rows counted as in progress (layernorm_bwd_variants.md). Loads in flight
//   are not what holds the bfloat16 backward.
// - the 16-bit weight widened once into shared memory (behind the column sums, in column_run's layout) and read from
//   there in both passes, where each pass loads and widens it, with the row offset carried from row to row (no
//   multiply a row): 492 instructions a row in the shared-memory kernel's loop for 522 (bfloat16 LayerNorm, two
//   vectors a thread), but 0.89-1.04x over 26 LayerNorm/RMSNorm cases (geomean 0.97; bfloat16 LayerNorm 16384x4096
//   116.5 -> 130.9 us, RMSNorm 65536x1024 106.8 -> 115.3; float32 the same): fewer instructions, not less time.
// - fewer blocks for the register kernel where the rows are few (each group taking 2, 4 or 8 rows at least, so fewer
//   partial rows: at 1024 rows of 2560 the kernel's 528 blocks take about 2 rows each, and their partial rows
//   are a third of the bytes), or the shared-memory sums wherever they fit: LayerNorm float32 1024x2560 16.4 ->
//   15.6-15.8 us at best (too little for forward + backward at 1.3x torch there, which needs about 14.3), RMSNorm
//   bfloat16 1024x1024 and 1024x1600 1.16x at 2 rows, but 0.68-0.85x at rows of 768 columns (1024 and 2048 rows,
//   both dtypes) and 0.95-1.08x at 2048 rows of 1024 columns or more (logs/ab_bwd_min_rows.jsonl): no one rule
//   gained.
// - the register kernel's blocks in clusters of 2 or 4 that add up their column sums through distributed shared
//   memory at the end (one partial row a cluster, as the shared-memory kernel's): at few rows the partial rows are
//   not what costs; LayerNorm and RMSNorm, 22 shapes each, two runs: clusters of 2 0.80-1.03x (geomean 0.965),
//   of 4 0.75-1.06x (0.958; float32 LayerNorm 1024x768 7.0 -> 9.3 us, 1024x2560 15.7 -> 17.4; gains only at 2048-8192
//   rows of float32 2560-5120, 1.05-1.06x); logs/ab_bwd_register_clusters.jsonl. Nsight Compute (caches flushed
//   between kernels), float32 LayerNorm 1024x2560: the row kernel 12.6-13.4 us with 22% of the SM's warps active (4
//   blocks of 128 an SM, 2 rows each, one after the other), the fold 6.0-6.2 us reading the 528 partial rows from
//   DRAM; in graph replay they are still in L2 and the two take 16 us (logs/ncu_bwd_few_rows.csv). What holds
//   these shapes is the row kernel's few rows in progress, not the fold.
// Nsight Compute, bfloat16 16384x4096, sums in registers: 121 registers, 4 warps per scheduler (1.2 eligible),
// an instruction issued in 57% of cycles, DRAM 50% busy, the top stall (30%) a wait on L1TEX. Sums in shared
// memory (the kernel chosen there): 64 registers, 6.7 warps per scheduler (2.3 eligible), an instruction issued in
// 67% of cycles, DRAM 54% busy (the same at 65536x1024; float32 16384x4096, registers: 36% and 81%). bfloat16 is
// widened by shift and mask (widen, row_layout.cuh) and sum(g * (x - mean)) is scaled by rstd once a row: fewer
// instructions an element, 0.99-1.06x (geomean 1.01).
// Streaming kernel (rows that are not 16-byte aligned, or wider): element by element, the column sums in
// shared memory, or in global scratch when two blocks' worth do not fit an SM.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cooperative_groups.h>

#include <functional>

#include "common/dispatch.h"
#include "cuda/arch_check.cuh"
#include "common/reduce_ops.h"
#include "cuda/launch.cuh"
#include "cuda/row_layout.cuh"
#include "cuda/tuning.h"
#include "layernorm.h"
#include "norm_ops.h"

namespace torch_reduce::cuda {
namespace {

enum class RowSource { Held, Reread };
// Where the row kernel keeps its threads' column sums between rows.
enum class ColumnSums { Registers, Shared };

// Whether a row kernel always gets a weight (ones where the norm has none), so that it has one path: the null
// weight's branch doubled the shared-memory kernels' code and cost a move an element a pass (bfloat16 LayerNorm
// 16384x4096 backward 1.06x, 33.5 against 35.8 instructions an element), and 16-bit register kernels ran 1.02-1.07x
// without it (bfloat16 rows of 12288). The float32 register kernels keep the branch: without it ptxas issues the
// weight's loads among the row's, the row's last loads later (float32 LayerNorm 8192x8192 0.84x, 16384x4096 0.94x).
template <typename scalar_t>
constexpr bool weight_given(ColumnSums sums) {
  return sums == ColumnSums::Shared || sizeof(scalar_t) == 2;
}

// The column sums' layout, in shared memory and in the partial rows: 16-byte runs of acc_t (R = 4 floats or 2
// doubles), element e of a thread's vector i at (e / R) * vectors * R + i * R + e % R. A float32 row's sums are
// then in column order; a 16-bit row's (8 elements a vector) are two interleaved halves. A thread reads and
// writes whole runs, and a warp's runs are consecutive: no bank conflicts, whole sectors.
template <typename acc_t>
__device__ __forceinline__ Vec16<acc_t>* column_run(acc_t* columns, int64_t vectors, int64_t i, int run) {
  constexpr int kRun = Vec16<acc_t>::kSize;
  return reinterpret_cast<Vec16<acc_t>*>(columns + (run * vectors + i) * kRun);
}

template <typename acc_t>
__device__ __forceinline__ Vec16<acc_t> run_of(const acc_t* terms) {
  Vec16<acc_t> v;
#pragma unroll
  for (int e = 0; e < Vec16<acc_t>::kSize; ++e) v.value[e] = terms[e];
  return v;
}

// *p += terms[0 .. R), one 16-byte load and store.
template <typename acc_t>
__device__ __forceinline__ void add_run(Vec16<acc_t>* p, const acc_t* terms) {
  Vec16<acc_t> v = load_vector(p);
#pragma unroll
  for (int e = 0; e < Vec16<acc_t>::kSize; ++e) v.value[e] += terms[e];
  store_vector(p, v);
}


// g = dy * weight rounded on its own: an FMA fusing it into `g - mean_g` would keep the product's rounding
// error, which rstd then amplifies (a constant row, e.g. hidden = 1, must give exactly zero).
__device__ __forceinline__ float mul_rounded(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rounded(double a, double b) { return __dmul_rn(a, b); }

// Asks L2 for bytes [p, p + bytes) (16-byte aligned, a multiple of 16, under 4 GiB) without waiting for them:
// one bulk prefetch by the group's thread 0 on sm_90 and newer, else a line at a time, the group's threads
// striding (on the H200 the bulk prefetch ran 0-4% faster than the lines: bfloat16 rows of 18432).
template <unsigned GROUP>
__device__ __forceinline__ void prefetch_to_l2(const void* p, int64_t bytes, unsigned t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (t == 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(static_cast<uint32_t>(bytes)));
#else
  for (int64_t offset = static_cast<int64_t>(t) * 128; offset < bytes; offset += int64_t{group_threads<GROUP>()} * 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(p) + offset));
  }
#endif
}

// A 16-byte load the compiler may not merge with an earlier load of the same address: the Reread kernel's
// second pass reads x and dy again instead of keeping the first pass's values alive.
template <typename scalar_t>
__device__ __forceinline__ Vec16<scalar_t> load_vector_again(const Vec16<scalar_t>* p) {
  uint4 raw;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
               : "l"(p));
  Vec16<scalar_t> v;
  memcpy(&v, &raw, sizeof(v));
  return v;
}

// The block's partial row from its groups' column sums (`columns`: [group][weight | bias][cols], in shared
// memory or global scratch; `slots` = param_sums * cols a group), added in group order: the same bits on every run.
template <unsigned BLOCK, unsigned kGroups, typename acc_t>
__device__ __forceinline__ void fold_groups(const acc_t* columns, int64_t slots, acc_t* __restrict__ partial) {
  for (int64_t c = threadIdx.x; c < slots; c += group_threads<BLOCK>()) {
    acc_t sum = 0;
    for (unsigned g = 0; g < kGroups; ++g) sum += columns[g * slots + c];
    partial[c] = sum;
  }
}

// A cluster's partial row: every block's column sums (`columns`, kGroups groups of `slots` in each block's
// shared memory) added in rank order, then group order, each block adding a 1/CLUSTER share of the slots
// from the others' shared memory: one partial row a cluster, not a block, for the fold to read.
template <unsigned BLOCK, unsigned kGroups, int CLUSTER, typename acc_t>
__device__ __forceinline__ void fold_cluster(acc_t* columns, int64_t slots, acc_t* __restrict__ partial) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's sums are final
  const int64_t share = (slots + CLUSTER - 1) / CLUSTER, begin = cluster.block_rank() * share;
  const int64_t end = begin + share < slots ? begin + share : slots;
  for (int64_t c = begin + threadIdx.x; c < end; c += group_threads<BLOCK>()) {
    acc_t sum = 0;
#pragma unroll
    for (int r = 0; r < CLUSTER; ++r) {
      const acc_t* remote = cluster.map_shared_rank(columns, r);
      for (unsigned g = 0; g < kGroups; ++g) sum += remote[g * slots + c];
    }
    partial[c] = sum;
  }
  cluster.sync();  // no block leaves while another reads its shared memory
#else
  __trap();  // the host launches clusters on sm_90 and newer only
#endif
}

// The combination of the values of a cluster's SPLIT blocks (each block's value the same in all its threads),
// returned to every thread of the cluster: each block's thread 0 writes its value into the slot of its rank in every
// block's shared memory, one cluster barrier, then every thread combines its block's slots in rank order (the same
// bits in every block). As in GroupAllreduce, two buffers alternate: a block writes a buffer again only after the
// next barrier, which every thread reaches after its reads of it. start() once before the first call: a block may
// write into another's shared memory only once that one runs.
template <int SPLIT, typename T>
class ClusterAllreduce {
  unsigned buffer_ = 0;

 public:
  __device__ __forceinline__ void start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __trap();  // the host launches clusters on sm_90 and newer only
#endif
  }
  template <typename Op>
  __device__ __forceinline__ T operator()(const T& v, Op op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    __shared__ T slots[2][SPLIT];
    if (threadIdx.x == 0) {
      const unsigned rank = cluster.block_rank();
#pragma unroll
      for (int r = 0; r < SPLIT; ++r) *cluster.map_shared_rank(&slots[buffer_][rank], r) = v;
    }
    cluster.sync();
    T out = slots[buffer_][0];
#pragma unroll
    for (int r = 1; r < SPLIT; ++r) out = op(out, slots[buffer_][r]);
    buffer_ ^= 1;
    return out;
#else
    __trap();
    return v;
#endif
  }
};

// The reductions of ROWS rows at once: each row's sum(g) (LayerNorm) and sum(g * xhat).
template <typename acc_t, int ROWS>
struct RowSums {
  SumPair<acc_t> row[ROWS];
  template <typename Shuffle>
  __device__ __forceinline__ static RowSums shuffled(const RowSums& v, Shuffle shuffle) {
    RowSums out;
#pragma unroll
    for (int q = 0; q < ROWS; ++q) out.row[q] = SumPair<acc_t>::shuffled(v.row[q], shuffle);
    return out;
  }
};

template <typename acc_t, int ROWS>
struct RowSumsOp {
  __device__ __forceinline__ static RowSums<acc_t, ROWS> identity() {
    RowSums<acc_t, ROWS> out;
#pragma unroll
    for (int q = 0; q < ROWS; ++q) out.row[q] = SumPairOp<acc_t>::identity();
    return out;
  }
  __device__ __forceinline__ RowSums<acc_t, ROWS> operator()(const RowSums<acc_t, ROWS>& a,
                                                             const RowSums<acc_t, ROWS>& b) const {
    RowSums<acc_t, ROWS> out;
#pragma unroll
    for (int q = 0; q < ROWS; ++q) out.row[q] = SumPairOp<acc_t>()(a.row[q], b.row[q]);
    return out;
  }
};

// Threads an SM a row kernel is compiled for (its registers: 65536 / that many), and its largest block: two rows
// at once of two or more vectors a thread hold twice the row registers (Tuning::kWideRowPairsThreads).
template <typename Tuning, ColumnSums kSums, int ITEMS, int ROWS>
constexpr unsigned row_kernel_sm_threads() {
  if (kSums == ColumnSums::Registers) return Tuning::kBackwardThreads;
  return ROWS > 1 && ITEMS > 1 ? Tuning::kWideRowPairsThreads : Tuning::kSharedSumsThreads;
}
template <unsigned BLOCK, unsigned kSmThreads>
constexpr unsigned row_kernel_max_block() {
  return BLOCK != kAnyBlock ? BLOCK : kSmThreads < 1024 ? kSmThreads : 1024;
}

// kGradSum: grad_sum is given (a fused add + norm's backward). A template flag, so the ordinary kernels keep
// their registers: the load and add spilled the wide-row kernels of 512 threads (ptxas: 88 bytes).
// ROWS: rows a group takes at once (consecutive ones; the grid's last group may have fewer): their loads are in
// flight together, one barrier reduces them all, and their column-sum terms are added to each other before
// they are added to the shared-memory sums.
template <typename Tuning, RowNorm kNorm, unsigned GROUP, unsigned BLOCK, int ITEMS, int ROWS, int CLUSTER, int SPLIT,
          RowSource kSource, ColumnSums kSums, bool kGradSum, typename scalar_t, typename param_t, typename acc_t>
__global__ void __launch_bounds__(
    (row_kernel_max_block<BLOCK, row_kernel_sm_threads<Tuning, kSums, ITEMS, ROWS>()>()),
    row_kernel_sm_threads<Tuning, kSums, ITEMS, ROWS>() /
        row_kernel_max_block<BLOCK, row_kernel_sm_threads<Tuning, kSums, ITEMS, ROWS>()>())
    row_norm_bwd_rows_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ in,
                               const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd,
                               const param_t* __restrict__ weight, const scalar_t* __restrict__ grad_sum,
                               scalar_t* __restrict__ grad_in, int64_t rows, int64_t cols,
                               acc_t* __restrict__ partials, bool prefetch_next) {
  using V = Vec16<scalar_t>;
  constexpr int kSize = V::kSize;
  constexpr unsigned kGroups = GROUP == BLOCK ? 1 : BLOCK / GROUP;
  constexpr bool kLayer = kNorm == RowNorm::Layer;
  static_assert(ROWS == 1 || (kSource == RowSource::Held && kSums == ColumnSums::Shared),
                "several rows at once: held rows, column sums in shared memory");
  static_assert(CLUSTER == 1 || kSums == ColumnSums::Shared, "a cluster folds column sums in shared memory");
  static_assert(SPLIT == 1 || (GROUP == BLOCK && ROWS == 1 && CLUSTER == 1 && kSource == RowSource::Held &&
                               kSums == ColumnSums::Registers),
                "a row split over a cluster: held rows, one block a row, column sums in registers");
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const unsigned group_size = group_threads<GROUP>();
  unsigned group = 0, t = threadIdx.x;
  if constexpr (kGroups > 1) {
    group = threadIdx.x / GROUP;
    t = threadIdx.x % GROUP;
  }
  const int64_t vectors = cols / kSize, slots = param_sums(kNorm) * cols;
  // The block's vectors of each row, [begin, end): all of them, or its rank's share of a row split over SPLIT
  // blocks; row_set: which of the grid's groups of blocks this one is in (its rows and its partial row).
  int64_t begin = 0, end = vectors, row_set = blockIdx.x;
  ClusterAllreduce<SPLIT, RowSums<acc_t, ROWS>> cluster_allreduce;
  if constexpr (SPLIT > 1) {
    const int64_t share = (vectors + SPLIT - 1) / SPLIT;
    begin = blockIdx.x % SPLIT * share;
    end = begin + share < vectors ? begin + share : vectors;
    row_set = blockIdx.x / SPLIT;
    cluster_allreduce.start();
  }
  const int64_t step = static_cast<int64_t>(gridDim.x / SPLIT) * kGroups * ROWS;
  const acc_t inv_cols = acc_t(1) / static_cast<acc_t>(cols);
  constexpr bool kHeld = kSource == RowSource::Held, kInShared = kSums == ColumnSums::Shared;
  constexpr int kRun = Vec16<acc_t>::kSize, kRuns = kSize / kRun;
  // The group's column sums (weight's, then bias's) in shared memory: always for kInShared, at the end for a
  // block of several groups.
  acc_t* const columns = reinterpret_cast<acc_t*>(shared_bytes) + group * slots;
  if constexpr (kInShared) {
    for (int64_t c = threadIdx.x; c < kGroups * slots; c += group_threads<BLOCK>()) {
      reinterpret_cast<acc_t*>(shared_bytes)[c] = 0;
    }
    __syncthreads();
  }
  // Vector k (column vector i) of tensor j (0: x, 1: dy) of row q of the current ones; again: the second pass.
  RowRegisters<scalar_t, kHeld ? ITEMS : 1> xr[ROWS], dyr[ROWS];
  const auto row_vector = [&](int j, int q, int64_t row, int k, int64_t i, bool again) {
    if constexpr (kHeld) {
      return j == 0 ? xr[q].v[k] : dyr[q].v[k];
    } else {
      const auto* p = reinterpret_cast<const V*>((j == 0 ? in : grad_out) + row * cols) + i;
      return again ? load_vector_again(p) : load_vector(p);
    }
  };

  constexpr int kHeldSums = kInShared ? 0 : ITEMS;
  acc_t dw[kHeldSums + 1][kSize], db[kHeldSums + 1][kSize];  // (+ 1: no zero-length arrays; unused when shared)
#pragma unroll
  for (int k = 0; k < kHeldSums; ++k) {
#pragma unroll
    for (int e = 0; e < kSize; ++e) dw[k][e] = db[k][e] = 0;
  }
  GroupAllreduce<GROUP, BLOCK, RowSums<acc_t, ROWS>> allreduce;
  // The group's rows; whole groups iterate together, so every thread reaches the group's reductions.
  for (int64_t first = (row_set * kGroups + group) * ROWS; first < rows; first += step) {
    // Row q of these is present where first + q < rows; an absent one is zeros (no terms) and is not stored.
    const auto present = [&](int q) { return q == 0 || first + q < rows; };
    acc_t mu[ROWS], rs[ROWS];
#pragma unroll
    for (int q = 0; q < ROWS; ++q) {
      if constexpr (kHeld) {
        if (present(q)) {
          load_row<GROUP>(xr[q], in + (first + q) * cols + begin * kSize, end - begin, t);
          load_row<GROUP>(dyr[q], grad_out + (first + q) * cols + begin * kSize, end - begin, t);
        } else {
          xr[q] = dyr[q] = {};
        }
      }
      mu[q] = kLayer && present(q) ? mean[first + q] : acc_t(0);
      rs[q] = present(q) ? rstd[first + q] : acc_t(0);
    }
    // The group's next rows (its share of them) into L2 while these are reduced (Tuning::kPrefetchMaxRowBytes).
    const int64_t next = first + step;
    if (prefetch_next && next < rows) {
      const int64_t bytes = SPLIT > 1 ? (end - begin) * int64_t{sizeof(V)}
                                      : (rows - next < ROWS ? rows - next : ROWS) * cols * int64_t{sizeof(scalar_t)};
      prefetch_to_l2<GROUP>(in + next * cols + begin * kSize, bytes, t);
      prefetch_to_l2<GROUP>(grad_out + next * cols + begin * kSize, bytes, t);
    }
    // f(k, i, weight) on each of the thread's vectors of the rows (weight 1 without one: weight_given).
    const bool weighted = weight_given<scalar_t>(kSums) || weight != nullptr;
    const auto visit_rows = [&](auto f) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t i = begin + t + static_cast<int64_t>(k) * group_size;
        if (i >= end) continue;
        acc_t wv[kSize];
        if (weighted) {
          load_params(weight, i * kSize, wv);
        } else {
#pragma unroll
          for (int e = 0; e < kSize; ++e) wv[e] = 1;
        }
        f(k, i, wv);
      }
    };
    RowSums<acc_t, ROWS> sums = RowSumsOp<acc_t, ROWS>::identity();
    visit_rows([&](int k, int64_t i, const acc_t(&wv)[kSize]) {
#pragma unroll
      for (int q = 0; q < ROWS; ++q) {
        acc_t xf[kSize], df[kSize];
        widen(row_vector(0, q, first + q, k, i, false), xf);
        widen(row_vector(1, q, first + q, k, i, false), df);
        // sum(g * (x - mean)), times rstd once a row below.
#pragma unroll
        for (int e = 0; e < kSize; ++e) {
          const acc_t g = weighted ? mul_rounded(df[e], wv[e]) : df[e];
          if (kLayer) sums.row[q].first += g;
          sums.row[q].second += g * (xf[e] - mu[q]);
        }
      }
    });
    sums = allreduce(sums, RowSumsOp<acc_t, ROWS>());
    if constexpr (SPLIT > 1) sums = cluster_allreduce(sums, RowSumsOp<acc_t, ROWS>());
    acc_t mean_g[ROWS], mean_gx[ROWS];
#pragma unroll
    for (int q = 0; q < ROWS; ++q) {
      if constexpr (kHeld) {
        repack(xr[q]);
        repack(dyr[q]);
      }
      mean_g[q] = kLayer ? sums.row[q].first * inv_cols : acc_t(0);
      mean_gx[q] = sums.row[q].second * rs[q] * inv_cols;
    }
    visit_rows([&](int k, int64_t i, const acc_t(&wv)[kSize]) {
      V o[ROWS];
      acc_t xf[ROWS][kSize], df[ROWS][kSize], gf[ROWS][kSize];
#pragma unroll
      for (int q = 0; q < ROWS; ++q) {
        widen(row_vector(0, q, first + q, k, i, true), xf[q]);
        widen(row_vector(1, q, first + q, k, i, true), df[q]);
        V gs = {};
        if (kGradSum && grad_in != nullptr && present(q)) {
          gs = load_vector(reinterpret_cast<const V*>(grad_sum + (first + q) * cols) + i);
        }
        widen(gs, gf[q]);
      }
      // One 16-byte run of column sums at a time, so that the shared-memory variant keeps one run's terms live.
#pragma unroll
      for (int r = 0; r < kRuns; ++r) {
        acc_t weight_terms[kRun], bias_terms[kRun];
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
          const int e = r * kRun + j;
#pragma unroll
          for (int q = 0; q < ROWS; ++q) {
            const acc_t d = df[q][e];
            const acc_t xhat = (xf[q][e] - mu[q]) * rs[q];
            const acc_t g = weighted ? mul_rounded(d, wv[e]) : d;
            if constexpr (kInShared) {
              weight_terms[j] = q == 0 ? d * xhat : weight_terms[j] + d * xhat;
              bias_terms[j] = q == 0 ? d : bias_terms[j] + d;
            } else {
              dw[k][e] += d * xhat;
              if (kLayer) db[k][e] += d;
            }
            o[q].value[e] = static_cast<scalar_t>(rs[q] * (g - mean_g[q] - xhat * mean_gx[q]) +
                                                  gf[q][e]);
          }
        }
        if constexpr (kInShared) {
          add_run(column_run(columns, vectors, i, r), weight_terms);
          if (kLayer) add_run(column_run(columns + cols, vectors, i, r), bias_terms);
        }
      }
#pragma unroll
      for (int q = 0; q < ROWS; ++q) {
        if (grad_in != nullptr && present(q)) store_vector(reinterpret_cast<V*>(grad_in + (first + q) * cols) + i, o[q]);
      }
    });
  }
  allow_dependent_launch();  // its rows are done: the column fold may launch (launch_dependent)
  if (partials == nullptr) return;
  // The block's partial row, in column_run's layout. Several groups (warp rows) meet in shared memory first.
  if constexpr (!kInShared) {
    acc_t* const sums = kGroups == 1 ? partials + row_set * slots : columns;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int64_t i = begin + t + static_cast<int64_t>(k) * group_size;
      if (i >= end) continue;
#pragma unroll
      for (int r = 0; r < kRuns; ++r) {
        store_vector(column_run(sums, vectors, i, r), run_of(dw[k] + r * kRun));
        if (kLayer) store_vector(column_run(sums + cols, vectors, i, r), run_of(db[k] + r * kRun));
      }
    }
    if constexpr (kGroups == 1) return;
  }
  if constexpr (CLUSTER > 1) {
    fold_cluster<BLOCK, kGroups, CLUSTER>(reinterpret_cast<acc_t*>(shared_bytes), slots,
                                          partials + blockIdx.x / CLUSTER * slots);
  } else {
    __syncthreads();
    fold_groups<BLOCK, kGroups>(reinterpret_cast<const acc_t*>(shared_bytes), slots, partials + blockIdx.x * slots);
  }
}

// The streaming kernel: as above, element by element, each thread adding its columns' dy * xhat and dy into
// its group's param_sums * cols accumulators (`columns`: dynamic shared memory, or global scratch when given),
// folded over the block's groups in order into the block's partial row at the end.
template <RowNorm kNorm, unsigned GROUP, unsigned BLOCK, bool kGradSum, typename scalar_t, typename param_t,
          typename acc_t>
__global__ void __launch_bounds__(BLOCK)
    row_norm_bwd_streaming_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ in,
                                    const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd,
                                    const param_t* __restrict__ weight, const scalar_t* __restrict__ grad_sum,
                                    scalar_t* __restrict__ grad_in, int64_t rows, int64_t cols,
                                    acc_t* __restrict__ column_scratch, acc_t* __restrict__ partials) {
  constexpr unsigned kGroups = BLOCK / GROUP;
  constexpr bool kLayer = kNorm == RowNorm::Layer;
  extern __shared__ __align__(16) unsigned char shared_columns[];
  const unsigned group = threadIdx.x / GROUP, t = threadIdx.x % GROUP;
  const bool column_sums = partials != nullptr;
  const int64_t slots = param_sums(kNorm) * cols;
  acc_t* columns = column_scratch != nullptr ? column_scratch + blockIdx.x * (kGroups * slots)
                                             : reinterpret_cast<acc_t*>(shared_columns);
  if (column_sums) {
    for (int64_t c = threadIdx.x; c < kGroups * slots; c += BLOCK) columns[c] = 0;
    __syncthreads();
  }
  acc_t* const weight_sums = columns + group * slots;
  acc_t* const bias_sums = weight_sums + cols;
  const acc_t inv_cols = acc_t(1) / static_cast<acc_t>(cols);
  GroupAllreduce<GROUP, BLOCK, SumPair<acc_t>> allreduce;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const scalar_t* x = in + row * cols;
    const scalar_t* dy = grad_out + row * cols;
    const acc_t mu = kLayer ? mean[row] : acc_t(0), rs = rstd[row];
    SumPair<acc_t> sums = SumPairOp<acc_t>::identity();
    for (int64_t j = t; j < cols; j += GROUP) {
      const acc_t d = static_cast<acc_t>(dy[j]);
      const acc_t g = weight != nullptr ? mul_rounded(d, static_cast<acc_t>(weight[j])) : d;
      if (kLayer) sums.first += g;
      sums.second += g * ((static_cast<acc_t>(x[j]) - mu) * rs);
    }
    sums = allreduce(sums, SumPairOp<acc_t>());
    const acc_t mean_g = kLayer ? sums.first * inv_cols : acc_t(0), mean_gx = sums.second * inv_cols;
    for (int64_t j = t; j < cols; j += GROUP) {
      const acc_t d = static_cast<acc_t>(dy[j]), xhat = (static_cast<acc_t>(x[j]) - mu) * rs;
      const acc_t g = weight != nullptr ? mul_rounded(d, static_cast<acc_t>(weight[j])) : d;
      if (column_sums) {
        weight_sums[j] += d * xhat;
        if (kLayer) bias_sums[j] += d;
      }
      if (grad_in != nullptr) {
        const acc_t extra = kGradSum ? static_cast<acc_t>(grad_sum[row * cols + j]) : acc_t(0);
        grad_in[row * cols + j] = static_cast<scalar_t>(rs * (g - mean_g - xhat * mean_gx) + extra);
      }
    }
  }
  allow_dependent_launch();
  if (column_sums) {
    __syncthreads();
    fold_groups<BLOCK, kGroups>(columns, slots, partials + blockIdx.x * slots);
  }
}

// Calls f(lanes), the fold's lanes over the chunks as a compile-time constant: kFoldMaxLanes (32), fewer (down to 4)
// where chunks x slots would take more than one wave of the GPU's threads (Tuning::kFoldWaveThreads an SM) or where
// there are fewer chunks than lanes.
template <typename Tuning, typename F>
void with_fold_lanes(int64_t chunks, int64_t slots, int64_t sms, F&& f) {
  static_assert(Tuning::kFoldMaxLanes == 32, "the lanes dispatched below");
  unsigned lanes = Tuning::kFoldMaxLanes;
  while (lanes > 4 && (lanes / 2 >= chunks || slots * lanes > sms * Tuning::kFoldWaveThreads)) lanes /= 2;
  switch (lanes) {
    case 32: return f(std::integral_constant<unsigned, 32>());
    case 16: return f(std::integral_constant<unsigned, 16>());
    case 8: return f(std::integral_constant<unsigned, 8>());
    default: return f(std::integral_constant<unsigned, 4>());
  }
}

// grad_weight and grad_bias from the blocks' partial rows (chunks x slots: weight's cols, then bias's where
// slots == 2 * cols, each in column_run's layout over `vectors` vectors a row, runs of run_length elements;
// vectors == cols and run_length 1 are column order, the streaming kernel's): a block of kFoldThreads takes a tile
// of kFoldThreads / LANES slots, its LANES lanes (with_fold_lanes) striding over the chunks, the lanes folded in order:
// the same bits every run. LANES a template constant: as a run-time count (its divisions, the loop's stride) the
// fold took 0.4-0.6 us more at 1024 rows of 768-4096 (H100).
template <typename Tuning, unsigned LANES, typename param_t, typename acc_t>
__global__ void __launch_bounds__(Tuning::kFoldThreads)
    column_fold_kernel(const acc_t* __restrict__ partials, int64_t chunks, int64_t slots, int64_t cols, int64_t vectors,
                       int64_t run_length, param_t* __restrict__ grad_weight, param_t* __restrict__ grad_bias) {
  constexpr unsigned kTile = Tuning::kFoldThreads / LANES;
  const unsigned lane = threadIdx.x % kTile, chunk_lane = threadIdx.x / kTile;
  wait_for_previous_grid();  // the row kernel's partial rows
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTile + lane;  // slot of a partial row
  acc_t s = 0;
  if (c < slots) {
#pragma unroll 8
    for (int64_t k = chunk_lane; k < chunks; k += LANES) s += partials[k * slots + c];
  }
  __shared__ acc_t folded[LANES][kTile];  // a warp reads consecutive words
  folded[chunk_lane][lane] = s;
  __syncthreads();
  if (chunk_lane == 0 && c < slots) {
#pragma unroll
    for (unsigned k = 1; k < LANES; ++k) s += folded[k][lane];
    param_t* out = c < cols ? grad_weight : grad_bias;
    const int64_t slot = c < cols ? c : c - cols, run = slot / (vectors * run_length);
    const int64_t in_run = slot % (vectors * run_length);
    const int64_t column = in_run / run_length * (cols / vectors) + run * run_length + in_run % run_length;
    if (out != nullptr) out[column] = static_cast<param_t>(s);
  }
}

// The backward of either norm; `mean` is undefined for RMSNorm, and so is `bias`; grad_sum may be undefined.
template <RowNorm kNorm>
std::tuple<at::Tensor, at::Tensor, at::Tensor> row_norm_bwd(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask, const at::Tensor& grad_sum) {
  constexpr const char* op = kBackwardName<kNorm>;
  TORCH_CHECK(input.is_cuda(), op, ": expected every tensor on one CUDA device, got the input on ", input.device());
  const LayerNormShape s = layer_norm_shape(kNorm, input, normalized_shape, weight, bias, op);
  check_norm_bwd(grad_out, input, mean, rstd, s, op);
  check_grad_sum(grad_sum, input, op);
  const c10::cuda::CUDAGuard guard(input.device());
  check_kernel_image_for_current_device();
  const at::Tensor x = input.contiguous(), dy = grad_out.contiguous(), rs = rstd.contiguous();
  const at::Tensor m = mean.defined() ? mean.contiguous() : at::Tensor();
  const at::Tensor gsum = grad_sum.defined() ? grad_sum.contiguous() : at::Tensor();
  const at::Tensor w = defined(weight) ? weight->contiguous() : at::Tensor();
  auto [grad_input, grad_weight, grad_bias] = layer_norm_grads(input, weight, bias, output_mask, s);
  const int64_t rows = s.rows, cols = s.cols;
  if (cols == 0) return {grad_input, grad_weight, grad_bias};
  if (rows == 0) return {grad_input, grad_weight.zero_(), grad_bias.zero_()};
  const bool column_sums = grad_weight.numel() > 0 || grad_bias.numel() > 0;
  if (grad_input.numel() == 0 && !column_sums) return {grad_input, grad_weight, grad_bias};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t sms = multiprocessors();
  const auto stat_options = input.options().dtype(stat_scalar_type(input.scalar_type()));
  const int64_t slots = param_sums(kNorm) * cols;  // a partial row's column sums
  TORCH_REDUCE_DISPATCH_FLOATING(input.scalar_type(), op, [&] {
    with_tuning([&](auto tuning) {
      using Tuning = decltype(tuning);
      // The tuning's numbers are read as Tuning::k... in the lambdas below: local constexpr copies inside this
      // function template's nested generic lambdas are not constant expressions to g++ in C++17.
      with_param_type<scalar_t>(s.param_type, [&](auto param) {
        using param_t = decltype(param);
        using acc_t = acc_type<scalar_t>;
        const scalar_t *xp = x.const_data_ptr<scalar_t>(), *dyp = dy.const_data_ptr<scalar_t>();
        const param_t* wp = w.defined() ? w.const_data_ptr<param_t>() : nullptr;
        scalar_t* dxp = grad_input.numel() > 0 ? grad_input.mutable_data_ptr<scalar_t>() : nullptr;
        const acc_t *mp = m.defined() ? m.const_data_ptr<acc_t>() : nullptr, *rp = rs.const_data_ptr<acc_t>();
        const scalar_t* gsp = gsum.defined() ? gsum.const_data_ptr<scalar_t>() : nullptr;
        const bool aligned = aligned16(xp) && aligned16(dyp) && aligned16(wp) && aligned16(dxp) && aligned16(gsp);
        // A resident grid, so each block's partial covers many rows; it depends on the shape and the GPU alone,
        // so the column sums are the same bits on every run.
        at::Tensor partials;
        int64_t grid = 0, partial_vectors = cols, partial_run = 1;  // the partial rows' layout (column_fold_kernel)
        const auto partial_rows = [&](int64_t blocks) {
          grid = blocks;
          if (column_sums) partials = at::empty({grid, slots}, stat_options);
          return column_sums ? partials.mutable_data_ptr<acc_t>() : nullptr;
        };
        // f(std::bool_constant<grad_sum given>()).
        const auto with_grad_sum = [&](auto f) { return gsp != nullptr ? f(std::true_type()) : f(std::false_type()); };
        // A row kernel's launch, planned: its grid and how many rows an SM has in progress at once (what keeps
        // x and dy in flight); none (rows_per_sm 0) when its shared memory does not fit a block.
        struct RowPlan {
          double rows_per_sm = 0;
          bool split = false;   // rows split over clusters
          bool reread = false;  // each row read twice (RowSource::Reread)
          bool spills = false;  // its kernel uses local memory (local_bytes_per_thread)
          std::function<void(bool prefetch_next)> launch;
        };
        // threads: the block's (BLOCK, or the run-time size of a kAnyBlock block).
        // cluster: blocks that fold their column sums together; split: blocks a row is split over (either
        // launches clusters; each cluster writes one partial row).
        const auto plan_rows = [&](auto group, auto block, auto items, auto rows_at_once, auto source, auto sums,
                                   unsigned threads, int64_t row_grid, int64_t max_grid, auto cluster, auto split) {
          return with_grad_sum([&](auto grad_sum_given) {
            constexpr unsigned kGroup = decltype(group)::value, kBlock = decltype(block)::value;
            constexpr ColumnSums kSums = decltype(sums)::value;
            constexpr int kRowsAtOnce = decltype(rows_at_once)::value, kFoldCluster = decltype(cluster)::value;
            constexpr int kSplit = decltype(split)::value, kCluster = kFoldCluster > 1 ? kFoldCluster : kSplit;
            const auto kernel =
                row_norm_bwd_rows_kernel<Tuning, kNorm, kGroup, kBlock, decltype(items)::value, kRowsAtOnce,
                                         kFoldCluster, kSplit, decltype(source)::value, kSums,
                                         decltype(grad_sum_given)::value, scalar_t, param_t, acc_t>;
            // The groups' column sums in shared memory: all along (ColumnSums::Shared), or where several groups
            // (warp rows) meet at the end.
            constexpr int64_t kGroups = kGroup == kBlock ? 1 : kBlock / kGroup;
            size_t shared_bytes = 0;
            if constexpr (kSums == ColumnSums::Shared || kGroups > 1) {
              shared_bytes = kGroups * slots * sizeof(acc_t);
              if (shared_bytes > allow_max_dynamic_shared(kernel)) return RowPlan{};
            }
            const int64_t resident =
                kCluster > 1 ? resident_clusters(kernel, static_cast<int>(threads), shared_bytes, kCluster) * kCluster
                             : resident_blocks_per_sm(kernel, static_cast<int>(threads), shared_bytes) * sms;
            if (resident == 0) return RowPlan{};
            // A whole number of clusters; a block past the last rows adds nothing.
            const int64_t blocks =
                (std::min({row_grid * kSplit, resident, max_grid}) + kCluster - 1) / kCluster * kCluster;
            const int64_t in_progress = std::min(blocks / kSplit * kGroups * kRowsAtOnce, rows);
            return RowPlan{static_cast<double>(in_progress) / static_cast<double>(sms), kSplit > 1,
                           decltype(source)::value == RowSource::Reread, local_bytes_per_thread(kernel) > 0,
                           [=, &partial_rows](bool prefetch_next) {
                             acc_t* partial_ptr = partial_rows(blocks / kCluster);
                             at::Tensor ones;  // the weight where the norm has none (weight_given)
                             const param_t* weight_ptr = wp;
                             if (weight_given<scalar_t>(kSums) && wp == nullptr) {
                               ones = at::ones({cols}, input.options().dtype(s.param_type));
                               weight_ptr = ones.const_data_ptr<param_t>();
                             }
                             if constexpr (kCluster > 1) {
                               launch_in_clusters(kernel, blocks, threads, shared_bytes, stream, kCluster, dyp, xp, mp,
                                                  rp, weight_ptr, gsp, dxp, rows, cols, partial_ptr, prefetch_next);
                             } else {
                               kernel<<<blocks, threads, shared_bytes, stream>>>(dyp, xp, mp, rp, weight_ptr, gsp, dxp,
                                                                                rows, cols, partial_ptr, prefetch_next);
                               C10_CUDA_KERNEL_LAUNCH_CHECK();
                             }
                           }};
          });
        };
        // Blocks of the column-sum plans fold their partial rows a cluster at a time where the GPU has clusters
        // (sm_90 and newer), each block taking proportionally fewer rows at least (Tuning::kColumnSumsCluster).
        const bool clusters = at::cuda::getCurrentDeviceProperties()->major >= 9;
        const int64_t min_block_rows =
            clusters ? Tuning::kSharedSumsMinRows / Tuning::kColumnSumsCluster : Tuning::kSharedSumsMinRows;
        const auto with_cluster = [&](auto f) {
          return clusters ? f(std::integral_constant<int, Tuning::kColumnSumsCluster>())
                          : f(std::integral_constant<int, 1>());
        };
        using Held = std::integral_constant<RowSource, RowSource::Held>;
        using Reread = std::integral_constant<RowSource, RowSource::Reread>;
        using InRegisters = std::integral_constant<ColumnSums, ColumnSums::Registers>;
        using InShared = std::integral_constant<ColumnSums, ColumnSums::Shared>;
        using One = std::integral_constant<int, 1>;
        constexpr int64_t kSize = Vec16<scalar_t>::kSize;
        const int64_t vectors = cols / kSize;
        constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
        const int64_t row_bytes = 2 * cols * int64_t{sizeof(scalar_t)};  // a row's x and dy
        RowPlan plan;
        if (aligned && cols % kSize == 0) {
          using Items = std::integral_constant<int, Tuning::template kHeldItems<scalar_t>>;
          if (vectors <= int64_t{Tuning::kMaxRowBlock} * Items::value) {
            with_row_layout<Tuning, scalar_t, Items::value, Tuning::kMinBackwardBlock>(
                rows, cols, true, sms * Tuning::kBackwardThreads, [&](auto group, auto block, auto, int64_t row_grid) {
                  plan = plan_rows(group, block, Items(), One(), Held(), InRegisters(), decltype(block)::value,
                                   row_grid, kNoLimit, One(), One());
                });
          }
          // Rows too wide for the Held kernel: read again from L2 (Reread), or, where an SM's one row in progress
          // is too large to gain from Tuning::kPrefetchMaxRowBytes's prefetch, split over a cluster of
          // Tuning::kRowSplit blocks (sm_90 and newer), each holding its share of the row and of the column sums.
          if constexpr (Tuning::template kRereadItems<scalar_t> > 0) {
            using Block = std::integral_constant<unsigned, Tuning::kMaxRowBlock>;
            using Wide = std::integral_constant<int, Tuning::template kRereadItems<scalar_t>>;
            using SplitBlock = std::integral_constant<unsigned, Tuning::kSplitRowBlock>;
            using Split = std::integral_constant<int, Tuning::kRowSplit>;
            static_assert(int64_t{Split::value} * SplitBlock::value * Items::value >=
                              int64_t{Block::value} * Wide::value,
                          "a split row's shares fit the Held kernel wherever the Reread kernel's rows do");
            if (!plan.launch && vectors <= int64_t{Tuning::kMaxRowBlock} * Wide::value) {
              TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), op, ": too many rows for one launch: ", rows);
              if (clusters && row_bytes > Tuning::kPrefetchMaxRowBytes) {
                plan = plan_rows(SplitBlock(), SplitBlock(), Items(), One(), Held(), InRegisters(), SplitBlock::value,
                                 rows, kNoLimit, One(), Split());
              }
              if (!plan.launch) {
                plan = plan_rows(Block(), Block(), Wide(), One(), Reread(), InRegisters(), Block::value, rows,
                                 kNoLimit, One(), One());
              }
            }
          }
          // The column sums in shared memory instead, where that keeps more rows in progress per SM, or as many as a
          // plan that reads each row twice (Reread): a block of just the threads a row needs (any multiple of 32) at
          // Tuning::kSharedSumsItems vectors a thread, or Tuning::kWideSharedSumsItems where 1024 threads of those do
          // not hold the row, each block taking min_block_rows rows at least (a block's own partial row costs about
          // what 3 rows of reads do). At as many rows in progress as Reread's one an SM, holding the row won (H200,
          // graph replay, the backward op alone, two runs): bfloat16 rows of 14336-16384 (1024 threads of two)
          // LayerNorm 1.08-1.24x (16384x16384 555 -> 448 us), RMSNorm 1.14-1.32x; rows of 18432 (768 of three)
          // 1.07-1.21x and 1.21-1.33x. At as many rows as the Held register kernel's it lost (bfloat16 12288
          // 0.93-0.97x, float32 8192 0.95-0.98x), so a tie with that keeps the register kernel.
          using SharedItems = std::integral_constant<int, Tuning::kSharedSumsItems>;
          using WideSharedItems = std::integral_constant<int, Tuning::kWideSharedSumsItems>;
          const auto threads_for = [&](int items) {
            return (vectors + items - 1) / items;
          };
          const int64_t threads = threads_for(SharedItems::value), wide_threads = threads_for(WideSharedItems::value);
          if (wide_threads <= 1024 && rows <= std::numeric_limits<int32_t>::max()) {
            const auto min_rows = [&](int64_t groups) {
              return std::max<int64_t>(1, rows / (groups * min_block_rows));
            };
            const auto whole_warps = [](int64_t n) {
              return static_cast<unsigned>((n + kWarpSize - 1) / kWarpSize * kWarpSize);
            };
            using WarpGroup = std::integral_constant<unsigned, kWarpSize>;
            using WarpBlock = std::integral_constant<unsigned, Tuning::kWarpRowsBlock>;
            using AnyBlock = std::integral_constant<unsigned, kAnyBlock>;
            constexpr int64_t kWarpGroups = Tuning::kWarpRowsBlock / kWarpSize;
            RowPlan shared = with_cluster([&](auto cluster) {
              if (threads > 1024) {
                return plan_rows(AnyBlock(), AnyBlock(), WideSharedItems(), One(), Held(), InShared(),
                                 whole_warps(wide_threads), rows, min_rows(1), cluster, One());
              }
              return threads <= kWarpSize
                         ? plan_rows(WarpGroup(), WarpBlock(), SharedItems(), One(), Held(), InShared(),
                                     WarpBlock::value, (rows + kWarpGroups - 1) / kWarpGroups, min_rows(kWarpGroups),
                                     One(), One())
                         : plan_rows(AnyBlock(), AnyBlock(), SharedItems(), One(), Held(), InShared(),
                                     whole_warps(threads), rows, min_rows(1), cluster, One());
            });
            // Two rows at once: short rows in a block of one vector a thread (Tuning::kRowPairsMaxBlock), wide ones
            // in a block of as many threads as one row's where the rows are many (Tuning::kWideRowPairsMinBlock; a
            // block of Tuning::kFixedRowPairsBlock threads compiled for that size), where their kernel keeps its
            // registers (ptxas: float16 with grad_sum spills 158-276 bytes at 80 registers, bfloat16 none).
            using Two = std::integral_constant<int, 2>;
            using FixedPairBlock = std::integral_constant<unsigned, Tuning::kFixedRowPairsBlock>;
            const auto take_pairs = [&](auto block, auto items, unsigned block_threads) {
              RowPlan pairs = with_cluster([&](auto cluster) {
                return plan_rows(block, block, items, Two(), Held(), InShared(), block_threads, (rows + 1) / 2,
                                 min_rows(1), cluster, One());
              });
              if (!pairs.spills && pairs.rows_per_sm >= shared.rows_per_sm) shared = std::move(pairs);
            };
            const unsigned pair_threads = whole_warps(vectors), block_threads = whole_warps(threads);
            const bool many_rows = rows >= Tuning::kWideRowPairsMinRowsPerSm * sms;
            if (threads > kWarpSize && pair_threads <= Tuning::kRowPairsMaxBlock) {
              take_pairs(AnyBlock(), std::integral_constant<int, 1>(), pair_threads);
            } else if (many_rows && block_threads == FixedPairBlock::value) {
              take_pairs(FixedPairBlock(), SharedItems(), block_threads);
            } else if (many_rows && block_threads >= Tuning::kWideRowPairsMinBlock &&
                       block_threads <= Tuning::kWideRowPairsThreads) {
              take_pairs(AnyBlock(), SharedItems(), block_threads);
            }
            if (shared.rows_per_sm > plan.rows_per_sm ||
                (plan.reread && shared.launch && shared.rows_per_sm == plan.rows_per_sm)) {
              plan = std::move(shared);
            }
          }
        }
        const bool launched = static_cast<bool>(plan.launch);
        if (launched) {
          // A split row's blocks always prefetch their shares (a quarter of a row each).
          plan.launch(plan.split || (plan.rows_per_sm <= 1.0 && cols >= Tuning::kPrefetchMinColumns &&
                                     row_bytes <= Tuning::kPrefetchMaxRowBytes));
          partial_vectors = vectors;
          partial_run = Vec16<acc_t>::kSize;
        }
        if (!launched) {
          const int64_t warp_rows = int64_t{kWarpSize} * Tuning::template kHeldItems<scalar_t> * kSize;
          const auto launch = [&](auto group, auto block, int64_t row_grid) {
            with_grad_sum([&](auto grad_sum_given) {
              constexpr unsigned kGroup = decltype(group)::value, kBlock = decltype(block)::value;
              const auto kernel = row_norm_bwd_streaming_kernel<kNorm, kGroup, kBlock, decltype(grad_sum_given)::value,
                                                                scalar_t, param_t, acc_t>;
              // The column accumulators live in shared memory when two blocks' worth fit on an SM.
              const int64_t column_bytes = column_sums ? (kBlock / kGroup) * slots * int64_t{sizeof(acc_t)} : 0;
              const bool in_shared = column_bytes <= static_cast<int64_t>(allow_max_dynamic_shared(kernel) / 2);
              const size_t shared_bytes = in_shared ? static_cast<size_t>(column_bytes) : 0;
              acc_t* partial_ptr =
                  partial_rows(std::min(row_grid, resident_blocks_per_sm(kernel, kBlock, shared_bytes) * sms));
              at::Tensor scratch;
              if (!in_shared && column_sums) {
                scratch = at::empty({grid, column_bytes / int64_t{sizeof(acc_t)}}, stat_options);
              }
              acc_t* scratch_ptr = scratch.defined() ? scratch.mutable_data_ptr<acc_t>() : nullptr;
              kernel<<<grid, kBlock, shared_bytes, stream>>>(dyp, xp, mp, rp, wp, gsp, dxp, rows, cols, scratch_ptr,
                                                             partial_ptr);
              C10_CUDA_KERNEL_LAUNCH_CHECK();
            });
          };
          TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(), op, ": too many rows for one launch: ", rows);
          if (cols <= warp_rows) {
            constexpr unsigned kRowsPerBlock = Tuning::kWarpRowsBlock / kWarpSize;
            launch(std::integral_constant<unsigned, kWarpSize>(),
                   std::integral_constant<unsigned, Tuning::kWarpRowsBlock>(),
                   (rows + kRowsPerBlock - 1) / kRowsPerBlock);
          } else {
            launch(std::integral_constant<unsigned, Tuning::kStreamingBlock>(),
                   std::integral_constant<unsigned, Tuning::kStreamingBlock>(), rows);
          }
        }
        if (column_sums) {
          with_fold_lanes<Tuning>(grid, slots, sms, [&](auto lanes) {
            constexpr int64_t kTile = Tuning::kFoldThreads / decltype(lanes)::value;
            const int64_t tiles = (slots + kTile - 1) / kTile;
            TORCH_CHECK(tiles <= std::numeric_limits<int32_t>::max(), op, ": normalized size too large: ", cols);
            launch_dependent(column_fold_kernel<Tuning, decltype(lanes)::value, param_t, acc_t>, tiles,
                             Tuning::kFoldThreads, stream, partials.const_data_ptr<acc_t>(), grid, slots, cols,
                             partial_vectors, partial_run,
                             grad_weight.numel() > 0 ? grad_weight.mutable_data_ptr<param_t>() : nullptr,
                             grad_bias.numel() > 0 ? grad_bias.mutable_data_ptr<param_t>() : nullptr);
          });
        }
      });
    });
  });
  return {grad_input, grad_weight, grad_bias};
}

// The backward kernels as norm_ops.h's backend.
struct CudaNormBackward {
  template <RowNorm kNorm, typename... Args>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const Args&... args) {
    return row_norm_bwd<kNorm>(args...);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CUDA, m) { NormOps<CudaNormBackward>::register_backwards(m); }

}  // namespace torch_reduce::cuda
