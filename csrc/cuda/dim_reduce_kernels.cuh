#pragma once
// The dim reductions' CUDA kernels and their launch (dim_reduce.h's table on the GPU), over the normal form
// (B, K, N), every one through the same kernels, driven by its ops object (common/reduce_ops.h):
//   B * N == 1: the whole tensor, launch_device_reduce (full_reduce.cuh), single pass;
//   N == 1:     rows of K contiguous elements. Narrow rows: those that divide a 16-byte vector (or are two)
//               folded in registers, whole rows a thread; the others tiles of whole rows through shared memory;
//               short rows: G lanes per row (G = 1..32, from K), several rows per warp, warp_reduce<G>, and longer
//               rows a warp each too where they are many; long rows: one block per row, block_reduce; long
//               rows but few of them: each row split over several blocks;
//   N > 1:      columns: each thread owns 1, 4 or (16-bit and byte types, where they fill the GPU) 8 adjacent
//               columns and walks K; the block's threadIdx.y slices are folded through shared memory; K split
//               over blockIdx.y when B * N cannot fill the GPU.
// Split partials (rows or columns) are folded in the same launch by the last block of each row or column
// block to finish, as the single-pass full reduction does (a ticket a row or column block): a second launch
// and its host time cost more than the fold (H200, one eager call: (128, 512, 64) over dim 1 took 20.9 us
// against torch's 12.6 with a second launch, 9.6 against 9.8 in one).
// Every fold has a fixed order and no float atomics (the tickets are integers): the same input gives the
// same bits on every run. Block sizes, lanes and splits are the current device's architecture's (tuning.h,
// with_tuning).
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "common/dispatch.h"
#include "cuda/block_reduce.cuh"
#include "cuda/dim_reduce_launch.h"
#include "cuda/full_reduce.cuh"
#include "cuda/tuning.h"

namespace torch_reduce::cuda::dim {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How many blocks of `kernel` (Tuning::kDimBlock threads) the GPU runs at once: one wave.
template <typename Tuning, typename Kernel>
int64_t resident_blocks(Kernel kernel) {
  return resident_blocks_per_sm(kernel, Tuning::kDimBlock) * multiprocessors();
}

// Into how many splits to cut the reduced extent when `blocks` blocks cover the outputs once. None where the
// blocks fill 1 / Tuning::kUnsplitWaveDivisor of a wave already: their reads keep the memory busy. Fewer blocks
// finish in waves of `resident`: the time goes as ceil(blocks * s / resident) / s, so (8192, 1024) over dim 0,
// 8 blocks, gets a whole wave's worth of splits. Each split also writes its partials and the fold reads them
// back: split_share is that traffic, per split, as a share of the input's bytes, and weighs the time. Left out,
// (32, 2^24) over dim 0 (15.5 waves) took 3 splits (float32; bfloat16 2): 19% (25%) more bytes than the input,
// for 3% fewer waves. H200, graph replay, 3 (2) splits -> 1: float32 sum 589 -> 513 us, bfloat16 321 -> 256
// (torch 518 and 272). The fewest splits within 2% of the best; at most max_splits (work per thread).
template <typename Tuning>
int64_t choose_splits(int64_t blocks, int64_t resident, int64_t max_splits, double split_share) {
  if (Tuning::kUnsplitWaveDivisor * blocks >= resident) return 1;
  const int64_t limit = std::min<int64_t>({max_splits, 65535, std::max<int64_t>(64, 4 * ceil_div(resident, blocks))});
  const auto time = [&](int64_t s) {
    const double traffic = s > 1 ? 1.0 + split_share * static_cast<double>(s) : 1.0;
    return traffic * static_cast<double>(ceil_div(blocks * s, resident)) / static_cast<double>(s);
  };
  double best_time = time(1);
  for (int64_t s = 2; s <= limit; ++s) best_time = std::min(best_time, time(s));
  int64_t s = 1;
  while (time(s) > 1.02 * best_time) ++s;
  return s;
}

// choose_splits' split_share for a reduced extent of K elements: a split's partials, one accumulator an output,
// written and then read back, against the K elements an output reads.
template <typename acc_t, typename scalar_t>
double split_share(int64_t K) {
  return 2.0 * sizeof(acc_t) / (static_cast<double>(K) * sizeof(scalar_t));
}

inline int64_t next_power_of_two(int64_t v) {
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
template <typename Tuning, unsigned G, typename scalar_t, typename acc_t, typename out_t, typename Ops>
__global__ void __launch_bounds__(Tuning::kDimBlock)
    row_group_kernel(const scalar_t* __restrict__ in, int64_t rows, int64_t K, bool one_vector_per_lane,
                     out_t* __restrict__ out, Ops ops) {
  constexpr int64_t kRowsPerWarp = kWarpSize / G;
  constexpr int kRowSets = Tuning::kRowSets;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * Tuning::kDimBlock + threadIdx.x) / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (Tuning::kDimBlock / kWarpSize);
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

// C adjacent elements in one load or store (C * sizeof(scalar_t) bytes, aligned to that).
template <int C, typename scalar_t>
struct alignas(C * sizeof(scalar_t)) Columns {
  scalar_t value[C];
};

// Narrow rows that divide a 16-byte vector or are two of them (float32: K of 1, 2, 4 or 8; 16-bit: 1 to 16): a
// thread takes a unit of whole vectors that holds whole rows (a vector of R = kSize / K rows, or the two vectors
// of one row), folds each row in registers, left to right from the identity (the CPU kernel's order, as the tile
// kernel's), and writes the unit's R results in one store where the output's address allows it (a fresh
// tensor's does). kTileVectors units a thread are loaded before any is folded. The last rows % R rows, past the
// last whole unit, take a thread each. H200, graph replay, against the tile kernel: bfloat16 (2^27, 2) 341 -> 203
// us, (2^24, 16) 330 -> 136; float32 (2^27, 2) 432 -> 401, (2^25, 8) 397 -> 278 (the tile kernel: a shared-memory
// pass and a store of one result a row).
template <typename Tuning, int K, typename scalar_t, typename acc_t, typename out_t, typename Ops>
__global__ void __launch_bounds__(Tuning::kDimBlock)
    row_vector_kernel(const scalar_t* __restrict__ in, int64_t rows, out_t* __restrict__ out, Ops ops) {
  using V = Vec16<scalar_t>;
  constexpr int kUnit = std::max<int>(K, V::kSize);  // elements
  constexpr int U = kUnit / V::kSize, R = kUnit / K;
  using Results = Columns<R, out_t>;
  constexpr int kLoads = Tuning::kTileVectors;
  const int64_t units = rows / R;
  const V* source = reinterpret_cast<const V*>(in);
  const bool whole_stores = reinterpret_cast<uintptr_t>(out) % sizeof(Results) == 0;
  const auto fold_row = [&](const auto& element) {
    acc_t a = Ops::identity();
#pragma unroll
    for (int k = 0; k < K; ++k) a = ops(a, load_element<acc_t>(ops, element(k)));
    return static_cast<out_t>(project_result(ops, a));
  };
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * Tuning::kDimBlock * kLoads + threadIdx.x; first < units;
       first += static_cast<int64_t>(gridDim.x) * Tuning::kDimBlock * kLoads) {
    V v[kLoads][U];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = first + u * Tuning::kDimBlock;
#pragma unroll
      for (int w = 0; w < U; ++w) {
        if (i < units) v[u][w] = load_vector(source + i * U + w);
      }
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = first + u * Tuning::kDimBlock;
      if (i >= units) break;
      Results results;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        results.value[r] = fold_row([&](int k) { return v[u][(r * K + k) / V::kSize].value[(r * K + k) % V::kSize]; });
      }
      if (whole_stores) {
        reinterpret_cast<Results*>(out)[i] = results;
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) out[i * R + r] = results.value[r];
      }
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < rows % R) {
    const int64_t row = units * R + threadIdx.x;
    out[row] = fold_row([&](int k) { return in[row * K + k]; });
  }
}

// Narrow rows (K elements, fewer than kTileRowBytes bytes): a lane per row would keep one or two small loads
// in flight. Instead a block reads a tile of whole rows (tile_rows), one contiguous run of 16-byte vectors
// (kTileVectors a thread, all issued before any is used), into shared memory; then each thread folds its
// rows from there, left to right from the identity (the CPU kernel's order), and writes them. The tile's
// rows are a multiple of the vector width, so every tile starts aligned.
template <typename Tuning, typename scalar_t, typename acc_t, typename out_t, typename Ops>
__global__ void __launch_bounds__(Tuning::kDimBlock)
    row_tile_kernel(const scalar_t* __restrict__ in, int64_t rows, int64_t K, int64_t tile_rows,
                    out_t* __restrict__ out, Ops ops) {
  using V = Vec16<scalar_t>;
  constexpr int kTileVectors = Tuning::kTileVectors;
  __shared__ V tile[Tuning::kDimBlock * kTileVectors];
  const scalar_t* const elements = reinterpret_cast<const scalar_t*>(tile);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * tile_rows; first < rows;
       first += static_cast<int64_t>(gridDim.x) * tile_rows) {
    const int64_t tile_rows_here = rows - first < tile_rows ? rows - first : tile_rows;
    const int64_t count = tile_rows_here * K;  // elements
    const int64_t vectors = count / V::kSize;
    const V* source = reinterpret_cast<const V*>(in + first * K);
    V v[kTileVectors];
#pragma unroll
    for (int u = 0; u < kTileVectors; ++u) {
      const int64_t i = threadIdx.x + u * Tuning::kDimBlock;
      if (i < vectors) v[u] = load_vector(source + i);
    }
#pragma unroll
    for (int u = 0; u < kTileVectors; ++u) {
      const int64_t i = threadIdx.x + u * Tuning::kDimBlock;
      if (i < vectors) tile[i] = v[u];
    }
    // The last tile's few elements past its last whole vector.
    scalar_t* const tail = reinterpret_cast<scalar_t*>(tile);
    for (int64_t j = vectors * V::kSize + threadIdx.x; j < count; j += Tuning::kDimBlock) tail[j] = in[first * K + j];
    __syncthreads();
    for (int64_t r = threadIdx.x; r < tile_rows_here; r += Tuning::kDimBlock) {
      acc_t a = Ops::identity();
      for (int64_t k = 0; k < K; ++k) a = ops(a, load_element<acc_t>(ops, elements[r * K + k]));
      out[first + r] = static_cast<out_t>(project_result(ops, a));
    }
    __syncthreads();  // the tile is read before the next one lands
  }
}

// One block per (row, split). Where the whole grid runs in one wave (one_loop), a row's gridDim.y blocks are one
// grid-stride loop over it, as the whole-tensor kernel's grid is over the tensor, so they read neighbouring vectors
// at any time; otherwise split y folds the run [y * chunk, (y + 1) * chunk) (a row's blocks then run in different
// waves, so one loop would not keep their reads together). H200, graph replay, three sessions, against runs for
// every grid: (32, 2^24) float32 sum and amax 493-511 -> 471-484 us, bfloat16 252-261 -> 238-246, (8, 2^24)
// 1.01-1.02x. One split: the result; several: partials[y][row], and the row's last block to finish (tickets[row])
// folds them, splits in order.
template <typename Tuning, typename scalar_t, typename acc_t, typename out_t, typename Ops>
__global__ void __launch_bounds__(Tuning::kDimBlock)
    row_block_kernel(const scalar_t* __restrict__ in, int64_t rows, int64_t K, int64_t chunk, bool one_loop,
                     acc_t* __restrict__ partials, unsigned* __restrict__ tickets, out_t* __restrict__ out, Ops ops) {
  const int64_t begin = one_loop ? 0 : static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t length = one_loop ? K : (K - begin < chunk ? K - begin : chunk);
  const int64_t thread = one_loop ? static_cast<int64_t>(blockIdx.y) * Tuning::kDimBlock + threadIdx.x : threadIdx.x;
  const int64_t threads = one_loop ? static_cast<int64_t>(gridDim.y) * Tuning::kDimBlock : Tuning::kDimBlock;
  __shared__ bool last_of_row;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    acc_t v = thread_reduce<acc_t>(in + row * K + begin, length, thread, threads, ops);
    v = block_reduce<Tuning::kDimBlock>(v, ops);
    if (gridDim.y == 1) {
      if (threadIdx.x == 0) out[row] = static_cast<out_t>(project_result(ops, v));
      __syncthreads();  // block_reduce's shared memory is reused by the next row
      continue;
    }
    if (threadIdx.x == 0) {
      partials[blockIdx.y * rows + row] = v;
      __threadfence();  // the partial is visible before the ticket says it is there
      last_of_row = atomicAdd(tickets + row, 1u) == gridDim.y - 1;
    }
    __syncthreads();
    if (last_of_row) {
      const auto fold = partials_ops(ops);
      acc_t w = Ops::identity();
      for (int64_t y = threadIdx.x; y < gridDim.y; y += Tuning::kDimBlock) {
        w = fold(w, load_from_l2(partials + y * rows + row));
      }
      w = block_reduce<Tuning::kDimBlock>(w, fold);
      if (threadIdx.x == 0) {
        out[row] = static_cast<out_t>(project_result(ops, w));
        tickets[row] = 0;  // ready for the next launch that uses it
      }
    }
    __syncthreads();
  }
}

template <typename Tuning, typename scalar_t, typename acc_t, typename out_t, typename Ops>
void launch_rows(const scalar_t* in, int64_t rows, int64_t K, out_t* out, Ops ops, cudaStream_t stream) {
  constexpr int64_t kVector = Vec16<scalar_t>::kSize;
  const int64_t vectors = ceil_div(K, kVector);
  const bool aligned = reinterpret_cast<uintptr_t>(in) % sizeof(Vec16<scalar_t>) == 0;
  if ((kVector % K == 0 || K == 2 * kVector) && aligned) {
    with_power_of_two<1, 2 * kVector>(K, [&](auto k) {
      constexpr int64_t kK = decltype(k)::value;
      auto kernel = row_vector_kernel<Tuning, kK, scalar_t, acc_t, out_t, Ops>;
      const int64_t units = rows / (std::max(kK, kVector) / kK);
      const int64_t grid = std::clamp<int64_t>(ceil_div(units, int64_t{Tuning::kDimBlock} * Tuning::kTileVectors), 1,
                                               resident_blocks<Tuning>(kernel));  // one wave, units strided
      kernel<<<grid, Tuning::kDimBlock, 0, stream>>>(in, rows, out, ops);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return;
  }
  if (K * int64_t{sizeof(scalar_t)} < Tuning::kTileRowBytes && aligned) {
    constexpr int64_t kTileElements = int64_t{Tuning::kDimBlock} * Tuning::kTileVectors * kVector;
    const int64_t tile_rows = kTileElements / K / kVector * kVector;  // whole rows, a multiple of the vector width
    auto kernel = row_tile_kernel<Tuning, scalar_t, acc_t, out_t, Ops>;
    const int64_t grid = std::min(ceil_div(rows, tile_rows), resident_blocks<Tuning>(kernel));  // one wave, tiles strided
    kernel<<<grid, Tuning::kDimBlock, 0, stream>>>(in, rows, K, tile_rows, out, ops);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  // Rows longer than kMaxGroupRowVectors, up to kMaxWarpRowVectors, also take a warp each where they are enough
  // to give every resident warp one: no block barrier between a row's loads and the next row's.
  if (vectors <= Tuning::kMaxGroupRowVectors ||
      (vectors <= Tuning::kMaxWarpRowVectors &&
       rows >= resident_blocks<Tuning>(row_group_kernel<Tuning, 32, scalar_t, acc_t, out_t, Ops>) *
                   (Tuning::kDimBlock / kWarpSize))) {
    // One vector per lane up to 32 lanes (K = 32 floats: 8 lanes, 4 rows per warp); then more per lane.
    const int64_t lanes = std::min<int64_t>(kWarpSize, next_power_of_two(vectors));
    const bool one_vector_per_lane = K == lanes * kVector && aligned;
    with_power_of_two<1, 32>(lanes, [&](auto g) {
      constexpr unsigned G = decltype(g)::value;
      auto kernel = row_group_kernel<Tuning, G, scalar_t, acc_t, out_t, Ops>;
      const int64_t grid = std::min(ceil_div(rows, Tuning::kDimBlock / G), resident_blocks<Tuning>(kernel) * 32);  // grid-stride beyond
      kernel<<<grid, Tuning::kDimBlock, 0, stream>>>(in, rows, K, one_vector_per_lane, out, ops);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return;
  }
  // One block per row; few long rows (32 x 2^24) cannot fill the GPU that way: split them too.
  auto kernel = row_block_kernel<Tuning, scalar_t, acc_t, out_t, Ops>;
  const int64_t row_blocks = std::min<int64_t>(rows, std::numeric_limits<int32_t>::max());
  const int64_t resident = resident_blocks<Tuning>(kernel);
  const int64_t max_splits = std::max<int64_t>(1, vectors / (Tuning::kDimBlock * Tuning::kMinVectorsPerThread));
  int64_t splits = choose_splits<Tuning>(row_blocks, resident, max_splits, split_share<acc_t, scalar_t>(K));
  const bool one_loop = row_blocks * splits <= resident;
  const int64_t chunk = ceil_div(vectors, splits) * kVector;  // whole vectors: every run starts aligned
  if (!one_loop) splits = ceil_div(K, chunk);
  FoldScratch scratch;
  if (splits > 1) scratch = fold_scratch(splits * rows * static_cast<int64_t>(sizeof(acc_t)), rows);
  acc_t* partial_ptr = static_cast<acc_t*>(scratch.partials);
  unsigned* tickets = scratch.tickets;
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits));
  kernel<<<grid, Tuning::kDimBlock, 0, stream>>>(in, rows, K, chunk, one_loop, partial_ptr, tickets, out, ops);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------- columns ----

// Thread (x, y) of a (bx, by) block owns C adjacent columns of one slab b (group = blockIdx.x * bx + x)
// and folds rows y, y + by, ... of its split [blockIdx.y * rows_per_split, ...) of K; the by slices are
// then folded pairwise in shared memory. One split: the result; several: partials[split][b * N + n], and the
// last of a column block's splits to finish (tickets[blockIdx.x]) folds them the same way (split y, y + by,
// ... a thread, then the slices), so the order is the same whichever block that is.
template <typename Tuning, int C, typename scalar_t, typename acc_t, typename out_t, typename Ops>
__global__ void __launch_bounds__(Tuning::kDimBlock)
    column_kernel(const scalar_t* __restrict__ in, int64_t outer, int64_t K, int64_t N, int64_t rows_per_split,
                  acc_t* __restrict__ partials, unsigned* __restrict__ tickets, out_t* __restrict__ out, Ops ops) {
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
    // Rounds of kInFlight rows, their loads issued before any is folded. The last, partial round too: a row past
    // the split loads the split's last row instead (in bounds) and its fold is dropped; one row at a time, a
    // thread of (7, 2^20) over dim 0 waited for three loads one after another. Whole rounds test no bounds. H200,
    // graph replay, with every round tested: amax over (768, 65536) dim 0 67.2 us against 59.0 untested, (4096,
    // 4096) over dim 0 25.4 against 22.9. ptxas (CUDA 13.0) issues a round's four loads two at a time (float32
    // sum: 32 registers, 2048 threads an SM). Three forms that issue more at once ran (32, 2^24) over dim 0
    // float32 at torch's speed (about 515 us against 589), each only because it held fewer blocks an SM, so that
    // choose_splits took one split there instead of three (the partials' bytes are weighed since): a warp barrier
    // after the loads (42 registers; bfloat16 (32, 2^24) 358 -> 430 us, (768, 65536) sum 54.5 -> 61.3, (3000,
    // 5000) and (4096, 4096) 4-16% slower), each round's rows folded last first (38-48 registers; (4096, 4096),
    // (3000, 5000), (768, 65536) 0.85-0.92x), and rows streamed through shared memory by cp.async, 4 or 8 rows
    // ahead a thread (float32 (16, 64, 2^16) over dim 1 65.6 -> 67.0 and 78.2 us, bfloat16 (8, 2^24) over dim 0
    // 73.9 -> 82.3 and 82.1): none kept.
    constexpr int kInFlight = Tuning::kColumnLoadsInFlight;
    const auto fold_round = [&](int64_t k, auto partial) {
      Load v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t row = k + u * step;
        v[u] = *reinterpret_cast<const Load*>(column + (decltype(partial)::value && row >= k_end ? k_end - 1 : row) * N);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (decltype(partial)::value && k + u * step >= k_end) break;
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c] = ops(acc[c], load_element<acc_t>(ops, v[u].value[c]));
      }
    };
    int64_t k = k_begin + threadIdx.y;
    for (; k + (kInFlight - 1) * step < k_end; k += kInFlight * step) fold_round(k, std::false_type());
    if (k < k_end) fold_round(k, std::true_type());
  }

  // The slices' sums, then the partials, move as whole runs of C (16-byte accesses where they are that wide):
  // one value at a time, C apart, a warp's shared-memory accesses were C-way bank conflicts and each of its
  // loads of the partials touched a sector a lane.
  using Sums = Columns<C, acc_t>;
  __shared__ Sums slices[Tuning::kDimBlock];
  const unsigned slot = threadIdx.y * blockDim.x + threadIdx.x;
  const auto fold_slices = [&](const auto& op) {
    Sums mine;
#pragma unroll
    for (int c = 0; c < C; ++c) mine.value[c] = acc[c];
    slices[slot] = mine;
    __syncthreads();
    for (unsigned s = blockDim.y / 2; s > 0; s >>= 1) {
      if (threadIdx.y < s) {
        const Sums other = slices[slot + s * blockDim.x];
#pragma unroll
        for (int c = 0; c < C; ++c) mine.value[c] = op(mine.value[c], other.value[c]);
        slices[slot] = mine;
      }
      __syncthreads();
    }
  };
  fold_slices(ops);
  const int64_t first_output = b * N + n;
  // partials[split] + first_output is C-aligned: N and n are multiples of C.
  const auto partial = [&](int64_t split) { return reinterpret_cast<Sums*>(partials + split * outer * N + first_output); };
  if (gridDim.y > 1) {
    __shared__ bool last_split;
    if (threadIdx.y == 0 && active) {
      *partial(blockIdx.y) = slices[slot];
      __threadfence();  // the partials are visible before the ticket says they are there
    }
    __syncthreads();
    if (slot == 0) last_split = atomicAdd(tickets + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last_split) return;
    const auto fold = partials_ops(ops);
#pragma unroll
    for (int c = 0; c < C; ++c) acc[c] = Ops::identity();
    if (active) {
      for (int64_t y = threadIdx.y; y < gridDim.y; y += step) {
        Sums p;
        if constexpr (sizeof(Sums) % 16 == 0) {
          p = load_from_l2(partial(y));
        } else {
#pragma unroll
          for (int c = 0; c < C; ++c) p.value[c] = load_from_l2(partial(y)->value + c);
        }
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c] = fold(acc[c], p.value[c]);
      }
    }
    fold_slices(fold);
    if (slot == 0) tickets[blockIdx.x] = 0;  // ready for the next launch that uses it
  }
  if (threadIdx.y != 0 || !active) return;
  // The C results in one store where the output's address allows it (a fresh tensor's does). C stores of 2 or 4
  // bytes, each of a warp's touching 16 sectors in part, cost far more than their bytes: H200, graph replay,
  // (3, 2^22) over dim 0 bfloat16 sum 21.6 -> 11.0 us, float32 mean 29.9 -> 19.7; (8, 2^24) bfloat16 sum 102 -> 74.
  const Sums result = slices[slot];
  using Results = Columns<C, out_t>;
  Results mine;
#pragma unroll
  for (int c = 0; c < C; ++c) mine.value[c] = static_cast<out_t>(project_result(ops, result.value[c]));
  if (reinterpret_cast<uintptr_t>(out) % sizeof(Results) == 0) {
    *reinterpret_cast<Results*>(out + first_output) = mine;
  } else {
#pragma unroll
    for (int c = 0; c < C; ++c) out[first_output + c] = mine.value[c];
  }
}

template <typename Tuning, typename scalar_t, typename acc_t, typename out_t, typename Ops>
void launch_columns(const scalar_t* in, int64_t outer, int64_t K, int64_t N, out_t* out, Ops ops,
                    cudaStream_t stream) {
  // A thread's columns: 4 adjacent ones where every slab's row starts at a multiple of 4 elements (one 16-byte
  // load for float32), else 1; 16-bit (and byte) types take 16 bytes' worth (8) where those groups alone fill the
  // resident threads: (32, 2^24) bfloat16 over dim 0 read 8 bytes a load at 69% of the line, float32 at 87%.
  // Elsewhere the wider groups halve the blocks, so that more splits of K fill the GPU, and the last block's fold
  // of the partials grows: 8 columns a thread everywhere ran bfloat16 (8192, 1024) over dim 0 at 0.62x, (64,
  // 256, 56, 56) channels_last over (0, 2, 3) at 0.49x the 4.
  constexpr int kWide = std::max<int>(4, std::min<int>(8, 16 / static_cast<int>(sizeof(scalar_t))));
  const auto fits = [&](int64_t c) { return N % c == 0 && reinterpret_cast<uintptr_t>(in) % (c * sizeof(scalar_t)) == 0; };
  const auto kernel_of = [](int64_t c) {
    return c == kWide ? column_kernel<Tuning, kWide, scalar_t, acc_t, out_t, Ops>
         : c == 4     ? column_kernel<Tuning, 4, scalar_t, acc_t, out_t, Ops>
                      : column_kernel<Tuning, 1, scalar_t, acc_t, out_t, Ops>;
  };
  const auto resident_threads = [&](int64_t c) { return resident_blocks<Tuning>(kernel_of(c)) * Tuning::kDimBlock; };
  const int64_t C = kWide > 4 && fits(kWide) && outer * N / kWide >= resident_threads(kWide) ? kWide : fits(4) ? 4 : 1;
  const int64_t groups = outer * N / C;
  const auto kernel = kernel_of(C);
  // Slices of K (by): as many as leave each thread kColumnLoadsInFlight rows, at most Tuning::kDimBlock / 32, and
  // no more than the resident threads hold beside the column groups; the rest of the block takes more columns.
  // (768, 65536) float32 over dim 0: 8 slices of 32 column groups. Where the groups alone fill the GPU, one slice:
  // (32, 2^24) over dim 0 in 8 slices ran blocks of one round of loads each, whose barriers and fold took a large
  // share of their time (float32 sum at 87% of the line, prod 60%).
  constexpr int64_t kInFlight = Tuning::kColumnLoadsInFlight;
  const int64_t resident = resident_threads(C);  // a cached lookup under a lock: once, not once a doubling
  int64_t spare_slices = 1;
  while (spare_slices * 2 * groups <= resident) spare_slices *= 2;
  const int64_t by = std::min<int64_t>({Tuning::kDimBlock / std::min<int64_t>(kWarpSize, next_power_of_two(groups)),
                                        next_power_of_two(ceil_div(K, kInFlight)), spare_slices});
  const int64_t bx = std::min<int64_t>(Tuning::kDimBlock / by, next_power_of_two(groups));
  const int64_t blocks = ceil_div(groups, bx);
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "torch_reduce: too many columns for one launch");
  int64_t splits = choose_splits<Tuning>(blocks, resident_blocks<Tuning>(kernel),
                                         std::max<int64_t>(1, K / (by * Tuning::kMinRowsPerThread)),
                                         split_share<acc_t, scalar_t>(K));
  const int64_t rows_per_split = ceil_div(K, splits);
  splits = ceil_div(K, rows_per_split);
  FoldScratch scratch;
  if (splits > 1) scratch = fold_scratch(splits * outer * N * static_cast<int64_t>(sizeof(acc_t)), blocks);
  acc_t* partial_ptr = static_cast<acc_t*>(scratch.partials);
  unsigned* tickets = scratch.tickets;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
  const dim3 block(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  kernel<<<grid, block, 0, stream>>>(in, outer, K, N, rows_per_split, partial_ptr, tickets, out, ops);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------- the launch ----

template <typename scalar_t>
void launch_dim_reduction(const ReduceKind& kind, const ReduceProblem& p, const at::Tensor& out) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_tuning([&](auto tuning) {
    using Tuning = decltype(tuning);
    with_stage_ops<scalar_t>(kind, [&](auto ops, auto out_type, auto whole) {
      using acc_t = ops_acc_t<decltype(ops)>;
      using out_t = typename decltype(out_type)::type;
      const scalar_t* in = p.input.const_data_ptr<scalar_t>();
      out_t* result = out.mutable_data_ptr<out_t>();
      if constexpr (decltype(whole)::value) {
        if (p.outer * p.inner == 1) {
          launch_device_reduce<Tuning::kDimBlock, scalar_t, acc_t>(in, p.reduced, result, ops, true);
          return;
        }
      }
      // A stage over the whole tensor (an expanded input's, whose repeats fold into its accumulator) is one row.
      if (p.inner == 1) {
        launch_rows<Tuning, scalar_t, acc_t>(in, p.outer, p.reduced, result, ops, stream);
      } else {
        launch_columns<Tuning, scalar_t, acc_t>(in, p.outer, p.reduced, p.inner, result, ops, stream);
      }
    });
  });
}

#define TORCH_REDUCE_INSTANTIATE_DIM_REDUCTION(T) \
  template void launch_dim_reduction<T>(const ReduceKind&, const ReduceProblem&, const at::Tensor&);

}  // namespace torch_reduce::cuda::dim
