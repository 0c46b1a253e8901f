#pragma once
// Every tuned number of the CUDA kernels, per GPU architecture, in the manner of CUB's per-architecture
// policies: block sizes, vectors a thread holds, the thresholds between kernels and the grid rules. One struct
// per architecture; its members are compile-time constants, since the kernels take them as template parameters
// and launch bounds. The host picks the current device's struct at run time (with_tuning) and instantiates
// the kernels with it, so tuning a new GPU generation is one struct here.
//
// Facts of the device are not tuning and are not written here: the SM count, threads and shared memory per SM
// or block, and the L2 size are read from the device properties at run time (launch.cuh).
#include <ATen/cuda/CUDAContext.h>

#include <cstdint>

namespace torch_reduce::cuda {

// Hopper (sm_90): tuned on an H200 (132 SMs). A number a measurement chose says which; the others are the
// design's (a register budget, a vector width), not a measurement's.
struct HopperTuning {
  // ---- Dimension reductions (dim_reduce_kernels.cuh) ---------------------------------------------------
  static constexpr unsigned kDimBlock = 256;  // every row and column kernel
  // Rows up to this many 16-byte vectors get 1..32 lanes (at most 8 vectors a lane); longer rows a block each
  // (but see kMaxWarpRowVectors).
  static constexpr int64_t kMaxGroupRowVectors = 32 * 8;
  // Longer rows, up to this many vectors, a warp each too where there are at least as many rows as resident
  // warps: a block a row kept few loads in flight between its barriers. H200, graph replay, (64, 256, 56, 56)
  // over (2, 3), rows of 3136: bfloat16 sum 44.4 -> 30.7 us (0.70x -> 1.03x torch), float32 amax 71.2 -> 59.7
  // (0.76x -> 0.92x); float32 sum lost, 50.0 -> 52.8 us (1.08x -> 1.03x).
  static constexpr int64_t kMaxWarpRowVectors = 32 * 32;
  // Rows that are exactly one vector a lane: rows a lane loads before folding any (loads in flight).
  static constexpr int kRowSets = 4;
  // A split of a long row keeps each of the block's threads busy for at least this many vectors.
  static constexpr int64_t kMinVectorsPerThread = 8;
  // A row or column reduction whose blocks fill at least 1 / kUnsplitWaveDivisor of a wave is not split: their reads
  // alone keep the memory busy, and the waves of a split grid cost more than they save. H200, graph replay: rows of
  // (768, 65536) float32 sum, 4 splits in three waves of 1,056 blocks 59.5 us, a block a row 48-54; the float32
  // product over dim 0 of it (512 blocks of 42 registers, 660 a wave), 5 splits in four waves 59.5-61.0 us (torch
  // 50.5-52.0).
  static constexpr int64_t kUnsplitWaveDivisor = 2;
  static constexpr int kColumnLoadsInFlight = 4;  // column kernel: rows a thread loads before adding any
  // Rows shorter than this many bytes are read as tiles of whole rows through shared memory, kTileVectors
  // 16-byte vectors a thread: a lane a row kept one 8-byte load in flight ((2^27, 2) over dim -1: 1336 GB/s).
  // Rows that divide a vector, or are two, skip the tile: kTileVectors units of them a thread, folded in registers.
  static constexpr int64_t kTileRowBytes = 64;
  static constexpr int kTileVectors = 4;
  // A split of the reduced extent keeps each column thread busy for at least this many rows.
  static constexpr int64_t kMinRowsPerThread = 8;

  // ---- Row statistics: var_mean and LayerNorm forward (row_layout.cuh) ------------------------------------
  // 16-byte vectors a thread keeps per row: 128 bytes whatever the dtype, so a bfloat16 row keeps as many bytes
  // in flight per thread as a float32 one. 16-bit elements stay packed between passes (repack), so they cost
  // the registers float32 elements do.
  static constexpr int kItems = 8;
  // Rows whose layout gives a thread at most this many vectors run the forward kernel compiled for that many, which
  // loads the weight and bias with the row instead of after the statistics (the kernel of kItems waits on those
  // loads with its row reduced). H200, graph replay, the op alone, 1024 rows of bfloat16 768-1600: LayerNorm
  // 4.02-4.91 -> 3.19-4.27 us (Liger-Kernel 3.01-4.13), RMSNorm 2.94-3.61 -> 2.57-3.27 (Liger 2.64-3.55); the same
  // bits. Forcing that many on wider rows (more threads a row) lost where it changed the layout (bfloat16
  // 16384x4096 LayerNorm 74.0 -> 87.6 us, float32 16384x4096 136 -> 172) and gained at float32 8192x1024 (23.2 ->
  // 20.2): benchmarks/results/nvidia-h200/norm_forward_layouts.md.
  static constexpr int kParamsFirstItems = 2;
  // Rows whose layout gives a thread more than that but at most this many run the forward kernel compiled for this
  // many at kHalfItemsThreads resident threads an SM (48 registers, no spills), where the kernel of kItems gets 1024
  // (64 registers). H200, graph replay, the op alone, 32 cases, against the kernel of kItems on the same layouts (the
  // same bits): LayerNorm geomean 1.03x, 0.97-1.16x (bfloat16 16384x768 20.4 -> 17.7 us, 65536x1024 82.0 -> 72.7,
  // 1024x4096 7.6 -> 6.7; Liger-Kernel 19.8, 77.6, 7.1); RMSNorm 1.01x, 0.97-1.05x.
  static constexpr int kHalfItems = 4;
  static constexpr unsigned kHalfItemsThreads = 1280;
  // float32 LayerNorm rows of a power-of-two number of vectors get at most this many a thread in the forward (more
  // threads a row), where the kernel of kHalfItems runs them. H200, graph replay, the op alone, against kItems (both
  // with that kernel), 14 shapes: 2048x4096 23.3 -> 20.5 us, 8192x1024 22.8 -> 20.0, 2048x1024 7.0 -> 6.2,
  // 16384x1024 40.2 -> 37.1 (Liger-Kernel 19.6, 19.8, 6.3, 37.4), 1024x8192 23.6 -> 22.4, eight shapes 0.97-1.03x
  // (about the noise of one run), and 1024x4096 10.5 -> 11.3 (one wave of blocks becomes one and a half). Other
  // widths leave a power-of-two block's last threads idle at this many a thread and lost in the benchmark (hidden
  // 5120, 1280 vectors on 512 threads: 16384x5120 171 -> 205 us; 12288, 3072 on 1024: 16384x12288 434 -> 531;
  // logs/layernorm_float32_items4_every_width.json). Not RMSNorm (float32 0.90-1.04x: 1024x4096 9.4 -> 10.5 us,
  // 8192x1024 20.0 -> 19.1), whose thread does half of LayerNorm's instructions a vector, nor bfloat16 (LayerNorm
  // 0.89-1.04x: 16384x2560 49.0 -> 55.1 us).
  static constexpr int kFloatLayerNormItems = 4;
  static constexpr unsigned kWarpRowsBlock = 128;  // warp-per-row kernels: four rows per block
  static constexpr unsigned kMinRowBlock = 64, kMaxRowBlock = 512;
  // Rows longer than kMaxRowBlock threads hold (float32 16,388..32,768 elements) take a block of this many in the
  // forward and var_mean, in registers too, where they streamed (LayerNorm's streamed statistics are Welford
  // updates, a division an element). float32 x18432, the ops alone, graph replay: LayerNorm forward 1.14-1.18x
  // (16384x18432 802 -> 682 us), RMSNorm 1.04-1.08x, var_mean 1.24-1.34x.
  static constexpr unsigned kWideRowBlock = 1024;
  // Few rows spread over more threads only where that makes blocks of this many threads or more. LayerNorm
  // forward, graph replay: 128-thread blocks of about two vectors a thread beat warps of seven (bfloat16
  // 1024x1600: 5.8 vs 6.5 us; float32 1024x1024: 4.9 vs 5.4 us), but 64-thread blocks lost to warps of three
  // or four (bfloat16 2048x768..1600: 6-9% slower).
  static constexpr int64_t kSpreadMinBlock = 128;
  static constexpr unsigned kStreamingBlock = 512;  // rows that stream through thread_reduce
  // Resident threads per SM the one-tensor kernels are compiled for (their register budget, 64 a thread).
  static constexpr unsigned kOneTensorThreads = 1024;
  // Resident threads per SM the norm forward kernel of `items` vectors a thread is compiled for.
  static constexpr unsigned norm_forward_threads(int items) {
    return items > kParamsFirstItems && items <= kHalfItems ? kHalfItemsThreads : kOneTensorThreads;
  }

  // ---- var_mean over too few rows to fill the GPU (var_mean.cu) --------------------------------------------
  static constexpr unsigned kChunkBlock = 512;
  static constexpr int64_t kMinChunk = 1 << 16;  // elements per block at least, so a block streams long enough
  static constexpr int64_t kChunksPerMultiprocessor = 4;  // blocks the rows are split into, per SM
  static constexpr int64_t kChunkAlignment = 256;  // a chunk's length is a multiple of this many elements

  // ---- LayerNorm backward (layer_norm_bwd.cu) ---------------------------------------------------------------
  static constexpr unsigned kBackwardThreads = 512;  // resident threads per SM the row kernel is compiled for
  // Row vectors a thread handles, so that its 2 x elements column accumulators (and a Held row's x and dy) fit
  // the 128 registers a thread gets at kBackwardThreads threads per SM: rows held in registers up to 24
  // elements a thread (float32 6 vectors, 16-bit 3; float64 4), read again from L2 up to 40 (float32 10,
  // 16-bit 5; float64 none).
  template <typename scalar_t>
  static constexpr int kHeldItems = sizeof(scalar_t) == 8 ? 4 : 24 / (16 / sizeof(scalar_t));
  template <typename scalar_t>
  static constexpr int kRereadItems = sizeof(scalar_t) == 8 ? 0 : 40 / (16 / sizeof(scalar_t));
  // The smallest block per row: 128-thread blocks of 4 vectors ran faster than 64-thread blocks of 8
  // (bfloat16 16384x4096 on the H200, an earlier kernel: 251 vs 201 us).
  static constexpr unsigned kMinBackwardBlock = 128;
  // The row kernel with its column sums in shared memory: 64 registers a thread, so twice the threads (and
  // rows in progress) of the kernel that keeps them in registers. Vectors a thread: 2 (ptxas: 56-64 registers,
  // no spills; 3 spilled 8-16 bytes in bfloat16, 4 spilled 52-104). With one weight path (layer_norm_bwd.cu,
  // weight_given) 3 fit bfloat16's 64 registers, but ran 0.90-1.01x the 2 over 22 bfloat16 cases (geometric
  // mean 0.97; 16384x4096 LayerNorm 116.5 -> 121.8 us: 5 rows in progress per SM for 4, 1.6 eligible warps a
  // scheduler for 1.8, and up to a third of a block's last warp idle). Rows a block takes at least: 8, so that its
  // partial row (8 bytes a column, written, then read by the fold) is at most a third of its rows' traffic (6
  // bytes a column a row in bfloat16). H200: without it, bfloat16 4096x1024 took 18.5 us against the register
  // kernel's 16.1.
  static constexpr unsigned kSharedSumsThreads = 1024;
  static constexpr int kSharedSumsItems = 2;
  static constexpr int64_t kSharedSumsMinRows = 8;
  // Rows that 1024 threads of kSharedSumsItems do not hold (16-bit 16392..24576 columns, float32 8196..12288) take
  // this many a thread in the shared-memory kernel (ptxas: 56-64 registers, 16-bit LayerNorm 0-8 bytes of stack),
  // where that keeps at least as many rows in progress as the Reread kernel (which reads each row twice at 512
  // threads an SM) or more than the others. H200, graph replay, the backward op alone, two runs: bfloat16 rows of
  // 18432 (768 threads, one row an SM either way) LayerNorm 1024-16384 rows 1.07-1.21x (16384x18432 659 -> 546 us),
  // RMSNorm 1.21-1.33x (625 -> 472); of 20480 (one row an SM, where the row split over a cluster kept half of one)
  // LayerNorm 0.93-1.06x (1024 rows 0.93x), RMSNorm 1.08-1.34x (16384x20480 723 -> 539). At as many rows as the
  // Held register kernel (float32 12288) it lost (0.94-1.01x), so a tie with that keeps the register kernel.
  static constexpr int kWideSharedSumsItems = 3;
  // Rows of at most this many 16-byte vectors (bfloat16 2048 elements, float32 1024) go two at a time to a
  // block of one vector a thread, instead of one at a time to a block of kSharedSumsItems: as many rows in
  // progress per SM, but one barrier and one shared-memory update of the column sums for two rows. H200, graph
  // replay, LayerNorm / RMSNorm backward, one run: float32 16384x1024 72.8 -> 58.4 us / 67.5 -> 57.0, 65536x768
  // 186 -> 168 / 177 -> 168; bfloat16 65536x1024 135 -> 128 / 135 -> 131, 16384x1024 42.8 -> 39.3 / 37.9 -> 35.5;
  // bfloat16 hidden 768 and 1600 0-4% faster. Wider rows did not gain: blocks of 512 (bfloat16 4096) 0.93-1.02x,
  // of 1024 (bfloat16 8192) 0.91-0.95x.
  static constexpr int64_t kRowPairsMaxBlock = 256;
  // Rows whose block of kSharedSumsItems vectors a thread has kWideRowPairsMinBlock threads or more (16-bit 8192
  // to 12288 columns, float32 4096 to 6144) also go two at a time, to a block of as many threads compiled for
  // kWideRowPairsThreads threads an SM (ptxas: 72-80 registers), where there are kWideRowPairsMinRowsPerSm rows an SM
  // at least: a 512-thread block holds two rows where two blocks held one each, a 768-thread block two rows where
  // one held one (or the register kernel one). H100, graph replay, the backward op alone, two runs each, alternating,
  // LayerNorm / RMSNorm against one row at a time: bfloat16 8192x8192 1.022x / 1.057x, 16384x8192 1.026x / 1.056x,
  // 65536x8192 1.010x / 1.036x, 16384x10240 1.095x / 1.016x, 16384x12288 1.016x / 1.018x; float16 16384x8192
  // 1.030x / 1.056x. At fewer rows each block has few pairs to walk and it lost: 1024x8192 0.93x / 0.90x, 4096x8192
  // 0.98x / 1.00x, 1024x12288 and 4096x12288 0.98-0.99x (2048x10240 1.04x / 1.02x): the boundary lies between 31
  // rows an SM (4096 on 132 SMs) and 62 (8192). Smaller blocks did not gain: 160-320 threads (bfloat16 2560, 5120)
  // 0.98-1.04x; 256 (bfloat16 4096) 0.89-0.97x at 1024 and 4096 rows, 0.98-1.01x at 16384 and 65536; as fixed
  // 256-thread blocks 0.93-0.99x and 1.00-1.04x (LayerNorm 16384x4096 1.037x, RMSNorm 1.008x). A fixed 256-thread
  // block of one row at a time (7% fewer instructions a row) ran 0.98-1.01x
  // (benchmarks/results/nvidia-h100/logs/ab_bwd_two_rows.jsonl).
  static constexpr unsigned kWideRowPairsMinBlock = 512, kWideRowPairsThreads = 768;
  static constexpr int64_t kWideRowPairsMinRowsPerSm = 48;
  // Rows whose block of kSharedSumsItems vectors a thread has exactly this many threads (16-bit 3592 to 4096
  // columns, float32 1796 to 2048) go two at a time too, under the same row limit, to a block of this fixed size
  // (its reduction unrolled at compile time: 913 instructions a pair in the row loop where the any-size block runs
  // 2 x 522, layernorm_bwd_instructions.md), also compiled for kWideRowPairsThreads threads an SM: 6 rows in progress
  // an SM where 4 blocks held 4. H100, graph replay, the backward op alone, two runs each, alternating, against one
  // row at a time: LayerNorm bfloat16 8192x4096 1.035x, 16384x4096 1.043x, 65536x4096 1.026x, 16384x4000 1.072x,
  // float16 16384x4096 1.030x, float32 16384x2048 and 65536x2048 1.009x and 1.015x; RMSNorm 0.995-1.012x. Below the
  // limit (the A/B above) it lost: 1024x4096 0.93x, 4096x4096 0.98-0.99x.
  static constexpr unsigned kFixedRowPairsBlock = 256;
  // Blocks of the column-sum plans in clusters of this many (sm_90 and newer): at the end each block adds a
  // share of the cluster's column sums from the others' shared memory, so the cluster writes one partial row,
  // and a block takes kSharedSumsMinRows / kColumnSumsCluster rows at least. H200, graph replay, the backward
  // op alone, one run, clusters of 2 and 4 rows a block at least against no clusters and 8 rows, 52 cases
  // (LayerNorm and RMSNorm, bfloat16 and float32, 1024-65536 rows of 1024-18432): 15 faster by more than 2%
  // (LayerNorm float32 16384x1024 1.25x, 65536x1024 1.19x; bfloat16 1024x8192 1.10x, 16384x1024 1.05x,
  // 4096x4096 1.04x, 65536x4096 1.03x; RMSNorm bfloat16 1024x8192 1.17x, float32 16384x1024 1.07x), 6 slower
  // (bfloat16 1024x1024 0.96x, RMSNorm 4096x1024 0.96-0.97x, float32 1024x8192 and 4096x1024 0.98x), 31 within
  // 2%. Clusters of 4 and 8 (1 to 8 rows a block at least) gained no more and lost up to 0.82x.
  static constexpr int kColumnSumsCluster = 2;
  // An SM with one row in progress waits on that row's reduction with none of the next row's loads in flight; the
  // row kernel then asks L2 for the group's next row first (one bulk prefetch), for rows of at least
  // kPrefetchMinColumns whose x and dy are at most kPrefetchMaxRowBytes. H200, graph replay, the backward op
  // alone, against no prefetch, two runs: bfloat16 rows of 12288 and 18432 (48 and 72 KiB) 1.09-1.17x at
  // 2048-16384 rows (1.03-1.05x at 1024); float32 8192 (64 KiB) 0.95-1.03x, and in the benchmark after it
  // 0.91-1.03x (0.93x at 65536 rows): left out; float32 12288 (96 KiB) 0.89-0.97x, 18432 (144 KiB) 0.76-0.86x.
  // Where several rows are in progress it lost (RMSNorm bfloat16 65536x5120 0.83x), and where each group takes few
  // rows it gained nothing: on for every plan whose groups take at most 8 (or 32) rows each, 26 LayerNorm/RMSNorm
  // cases of 1024-16384 rows, three runs, 0.88-1.03x (geomean 0.99; float32 1024x2560 LayerNorm 16.5 -> 18.8 us)
  // and 0.88-1.07x (0.99; benchmarks/results/nvidia-h200/logs/ab_bwd_prefetch_few_rows.jsonl).
  static constexpr int64_t kPrefetchMinColumns = 12288;
  static constexpr int64_t kPrefetchMaxRowBytes = 72 * 1024;
  // Rows too wide for the Held kernel whose x and dy exceed kPrefetchMaxRowBytes (float32 of more than 12288
  // columns, 16-bit of more than 18432) are split over a cluster of kRowSplit blocks of kSplitRowBlock threads,
  // each holding a quarter of the row in registers and the column sums of that quarter, the row's two sums
  // combined through distributed shared memory, each block prefetching its share of its next row: two blocks
  // (two rows' quarters) in progress per SM, where the Reread kernel keeps one row and reads it twice. H200,
  // graph replay, against the Reread kernel: float32 1024-16384 x 18432 LayerNorm 1.28-1.33x (16384 rows
  // 1382 -> 1063 us), RMSNorm 1.16-1.20x; split without the prefetch 1.14-1.18x and
  // 1.06-1.08x. bfloat16 18432 (72 KiB) gained less split (1.02-1.12x) than prefetched (1.09-1.17x), and
  // splitting rows that the Held kernel holds lost (float32 8192 and 12288 0.76-0.92x).
  static constexpr int kRowSplit = 4;
  static constexpr unsigned kSplitRowBlock = 256;
  // Column fold (column_fold_kernel): blocks of kFoldThreads, each a tile of partial-row slots and up to
  // kFoldMaxLanes lanes striding over the chunks, fewer where the slots take more than one wave of
  // kFoldWaveThreads an SM (wide rows) or the chunks are fewer. At 32 lanes everywhere a LayerNorm of 12288
  // columns folded its 24576 slots in 768 blocks of 1024 threads, three waves on 132 SMs (8 lanes: 192). H100, the
  // backward op alone, graph replay, two processes a build alternating, against 32 lanes: bfloat16 LayerNorm
  // 1024x12288 43.3 -> 39.3 us, 1024x18432 65.2 -> 60.1, 2048x8192 50.6 -> 48.2, RMSNorm 1024x12288 38.0 -> 35.9,
  // float32 LayerNorm 1024x12288 70.8 -> 66.8; 36 cases 0.985-1.10x, geomean 1.02
  // (benchmarks/results/nvidia-h100/layernorm_bwd_fold_lanes.md).
  static constexpr unsigned kFoldThreads = 1024, kFoldMaxLanes = 32, kFoldWaveThreads = 2048;

  // ---- Global gradient norm (grad_norm.cu) ---------------------------------------------------------------
  // The chunk and its loads were measured; the other numbers here are the design's (unmeasured).
  static constexpr unsigned kListBlock = 512;  // partials and scaling kernels
  // A chunk, a warp's unit of work: 16-byte vectors kListLoads a lane at a time, loaded before any is used.
  // H200, clip_grad_norm_ of GPT-2 small's 148 float32 gradients (124 M elements; a build whose every call read
  // and wrote them all), graph replay, three alternating processes a configuration: 64 KiB chunks of 4 loads 386-392 us
  // (3.8 TB/s over the three passes), 32 KiB 404-407, 128 KiB 395-398; 8 loads 388-392 (32 KiB of 8 loads
  // 405-407). The scaling walked in reverse chunk order, so that its first reads find what the norm pass left in
  // the L2, took 386-392: not kept (benchmarks/results/nvidia-h200/gradnorm_chunks.md).
  static constexpr int64_t kListChunkBytes = 1 << 16;
  static constexpr int kListLoads = 4;
  static constexpr int kListScaleParts = 4;  // the scaling kernel's unit of work: a quarter chunk a warp
  static constexpr int kListBlocksPerMultiprocessor = 2;  // 64 registers a thread
  static constexpr unsigned kFoldBlock = 1024;           // the fold's one block
  // A tensor of more chunks than this is folded by the whole fold block, not by a warp.
  static constexpr int64_t kFoldWarpChunks = 256;
  // Tensors per launch, the kernel-parameter table's length: 25 KB of the 32 KB allowed.
  static constexpr int kListTensors = 1024;
};

// UNMEASURED: Hopper's numbers until someone measures these GPUs. None of the hardware differences requires
// another compile-time number: 8.6, 8.9 and 12.x hold 1536 threads per SM (the others 2048), and Ampere, Ada and
// 12.x give a block 99-163 KiB of shared memory (Hopper and 10.x 227), but every one has 64K registers per SM,
// so the register budgets above (1024, 768 and 512 resident threads) fit everywhere; the grids and the shared-memory
// choices, which do depend on threads and shared memory per SM, are made from the device properties.
using AmpereTuning = HopperTuning;     // sm_80, sm_86: unmeasured
using AdaTuning = HopperTuning;        // sm_89: unmeasured
using BlackwellTuning = HopperTuning;  // sm_100, sm_120: unmeasured

enum class Architecture { Ampere, Ada, Hopper, Blackwell };

// The current device's architecture, from its compute capability (ATen caches the properties per device).
// Older GPUs get Ampere's tuning and newer ones Blackwell's: the nearest measured or default struct.
inline Architecture current_architecture() {
  const cudaDeviceProp* properties = at::cuda::getCurrentDeviceProperties();
  const int capability = properties->major * 10 + properties->minor;
  if (capability >= 100) return Architecture::Blackwell;
  if (capability >= 90) return Architecture::Hopper;
  if (capability == 89) return Architecture::Ada;
  return Architecture::Ampere;
}

// Calls f(Tuning()) with the current device's tuning struct. Architectures that share a struct share the
// instantiations of f, so an unmeasured architecture costs no code.
template <typename F>
decltype(auto) with_tuning(F&& f) {
  switch (current_architecture()) {
    case Architecture::Ampere: return f(AmpereTuning());
    case Architecture::Ada: return f(AdaTuning());
    case Architecture::Blackwell: return f(BlackwellTuning());
    case Architecture::Hopper: break;
  }
  return f(HopperTuning());
}

}  // namespace torch_reduce::cuda
