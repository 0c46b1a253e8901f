// The dim reductions (dim_reduce.h's table) on the CPU: the reference path. Plain loops over the normal form
// in the accumulate type, in parallel, in runs of 64 terms in sequence a value (8 lanes of a 512-element row run;
// a column of a slab, or a share of its rows: fold_slabs) whose results fold pairwise (lanes.h: PairwiseFold), so
// a float sum's rounding error grows with log2 of the reduced length, as torch's cascade sum's, not with the
// length; a whole-tensor reduction uses the CPU model of the GPU's single-pass kernel (cpu/model.h), whose tree
// does the same, unless its order does not matter.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <numeric>
#include <vector>

#include "common/dispatch.h"
#include "cpu/isa.h"
#include "cpu/lanes.h"
#include "cpu/model.h"
#include "dim_reduce.h"
#include "ladder.h"

namespace torch_reduce::cpu {
namespace {

constexpr int64_t kModelBlock = 256;

// Elements a task folds at least when one fold is split over threads.
constexpr int64_t kChunk = 1 << 16;

// Running values a slab's walk keeps in registers at a time: a compile-time count (a runtime one stays in memory,
// a load and a store an element: one thread, int64 sums over dim 0 of (250000, 32) 9.8 -> 2.6 ms, float32 ones of
// (65536, 256) 4.5 -> 2.7 ms, torch 4.9 and 5.1).
constexpr int64_t kBlockValues = 32;

// acc[w] = ops over r < count of rows[r * stride + w] for w < kBlockValues, in that order.
template <typename acc_t, typename scalar_t, typename Ops>
void fold_block(const scalar_t* __restrict rows, int64_t count, int64_t stride, const Ops& ops, acc_t* acc) {
  acc_t reg[kBlockValues];
  std::copy_n(acc, kBlockValues, reg);
  for (int64_t r = 0; r < count; ++r)
    for (int64_t w = 0; w < kBlockValues; ++w) reg[w] = ops(reg[w], load_element<acc_t>(ops, rows[r * stride + w]));
  std::copy_n(reg, kBlockValues, acc);
}

// Rows of a slab of N columns a step of its walk: a power of two, so that N < kBlockValues columns fill whole
// blocks (the step is lcm(N, kBlockValues) values).
int64_t rows_a_step(int64_t N) { return N < kBlockValues ? kBlockValues / std::gcd(N, kBlockValues) : 1; }

// Integer max and min (acc_t widens them, to int64) folded in the input's own type, one running value: a reduction
// the compiler vectorizes at the input's width (32 int8 an AVX2 vector, where int64 lanes took 4). One thread,
// amax over rows of (256, 65536): int8 4.7 -> 0.72 ms, int16 4.4 -> 1.4, int32 8.9 -> 3.0 (torch 0.72, 1.4, 2.8).
template <typename acc_t, typename scalar_t, typename Ops>
inline constexpr bool kNarrowExtreme =
    std::is_integral_v<scalar_t> && (std::is_same_v<Ops, MaxOp<acc_t>> || std::is_same_v<Ops, MinOp<acc_t>>);

// x[0, n), loaded, in lanes.
template <typename acc_t, typename scalar_t, typename Ops>
acc_t fold_run(const scalar_t* x, int64_t n, const Ops& ops) {
  const auto term = [&](int64_t j) { return load_element<acc_t>(ops, x[j]); };
  if constexpr (kKeyedExtreme<acc_t, Ops>) {
    return keyed_extreme<acc_t, Ops>(n, term);
  } else if constexpr (kNarrowExtreme<acc_t, scalar_t, Ops>) {
    // bool as its bytes, 0 and 1: a byte max vectorizes, a bool one did not (one thread, (256, 65536) over rows
    // 13.6 -> 0.7 ms, torch 4.4).
    using narrow_t = std::conditional_t<std::is_same_v<scalar_t, bool>, uint8_t, scalar_t>;
    using Narrow = std::conditional_t<std::is_same_v<Ops, MaxOp<acc_t>>, MaxOp<narrow_t>, MinOp<narrow_t>>;
    const narrow_t* v = reinterpret_cast<const narrow_t*>(x);
    const auto step = [&](narrow_t& top, int64_t j) { top = Narrow()(top, v[j]); };
    if constexpr (sizeof(narrow_t) == 8) {
      // AVX2 has no 64-bit max: a compare and a select a vector, each waiting on the last, so two chains (one
      // thread, amax over rows of (256, 4096) int64 0.215 -> 0.13 ms, torch 0.092). The narrower types' max is one
      // instruction a vector, and in two chains they ran slower (int32 0.045 -> 0.053, torch 0.046).
      const auto top = fold_halves(n, Narrow::identity(), step);
      return static_cast<acc_t>(Narrow()(top[0], top[1]));
    } else {
      narrow_t top = Narrow::identity();
      for (int64_t j = 0; j < n; ++j) step(top, j);
      return static_cast<acc_t>(top);
    }
  } else {
    return lane_fold<acc_t>(n, ops, term);
  }
}

// The whole tensor: an order-free fold (reduce_ops.h: OrderFree) in lanes, in parallel chunks; any other through
// the model's tree (the GPU's bits, a float sum's rounding error at O(log n)). The model loads elements without
// a transform, so an ops object that has one (a norm) is applied to every element first and the model folds
// those values.
template <typename acc_t, typename scalar_t, typename Ops>
acc_t reduce_whole(const scalar_t* in, int64_t n, const Ops& ops) {
  if constexpr (OrderFree<Ops>::value) {
    std::vector<acc_t> parts((n + kChunk - 1) / kChunk);
    parallel_for_best_vectors(0, static_cast<int64_t>(parts.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        parts[c] = fold_run<acc_t>(in + c * kChunk, std::min(kChunk, n - c * kChunk), ops);
      }
    });
    return lane_fold<acc_t>(static_cast<int64_t>(parts.size()), ops, [&](int64_t c) { return parts[c]; });
  } else if constexpr (HasTransform<Ops>::value) {
    std::vector<acc_t> loaded(n);
    parallel_for_best_vectors(0, n, kChunk, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) loaded[i] = load_element<acc_t>(ops, in[i]);
    });
    return device_reduce<acc_t>(loaded.data(), n, kModelBlock, kModelGpu, true, partials_ops(ops));
  } else {
    return device_reduce<acc_t>(in, n, kModelBlock, kModelGpu, true, ops);
  }
}

// The N > 1 columns of `outer` slabs of K rows, each column's terms in runs of kRunTerms, their results folded
// pairwise (a float product: one serial run). A slab of few columns takes `spread` rows a step, so its running
// values fill register blocks: element e of a run goes to value e % W (column e % N), and at the run's end a
// column's `spread` values fold pairwise. A long slab is split into tasks of a power of two runs each, whole
// subtrees of the slab's tree, then folded as that tree: the same bits at any split and thread count, and a few
// slabs of many rows use every thread. Sum over dim 0 of float32 (4e6, 2), one thread: 14.6 ms as a running value
// a column in memory, 1.4 ms so (torch 3.1); two threads 0.7 ms (torch 3.1).
template <typename acc_t, typename out_t, typename scalar_t, typename Ops>
void fold_slabs(const scalar_t* in, int64_t outer, int64_t K, int64_t N, const Ops& ops, out_t* result) {
  constexpr bool kSerial = std::is_same_v<Ops, ProdOp<acc_t>> && !OrderFree<Ops>::value;
  const int64_t spread = kSerial ? 1 : rows_a_step(N);
  const int64_t W = spread * N;
  const int64_t run_rows = kSerial ? std::max<int64_t>(K, 1) : kRunTerms * spread;
  int64_t task_runs = 1;
  while (!kSerial && task_runs * run_rows * N < kChunk) task_runs *= 2;
  const int64_t task_rows = task_runs * run_rows;
  const int64_t tasks = std::max<int64_t>((K + task_rows - 1) / task_rows, 1);
  const auto store = [&](int64_t b, const acc_t* acc) {
    for (int64_t n = 0; n < N; ++n) result[b * N + n] = static_cast<out_t>(project_result(ops, acc[n]));
  };
  std::vector<acc_t> parts(tasks > 1 ? static_cast<size_t>(outer * tasks * N) : 0);
  parallel_for_best_vectors(0, outer * tasks, 1, [&](int64_t begin, int64_t end) {
    PairwiseFold<acc_t, Ops> tree(ops, N);
    std::vector<acc_t> values(static_cast<size_t>(W));
    for (int64_t t = begin; t < end; ++t) {
      const scalar_t* slab = in + (t / tasks) * K * N;
      const int64_t k_end = std::min(K, (t % tasks + 1) * task_rows);
      tree.reset();
      for (int64_t k0 = (t % tasks) * task_rows; k0 < k_end; k0 += run_rows) {
        acc_t* __restrict acc = values.data();
        std::fill(acc, acc + W, Ops::identity());
        const scalar_t* __restrict rows = slab + k0 * N;
        const int64_t run_end = std::min(k_end - k0, run_rows) * N;
        // The run as `steps` rows of W values (a tail of fewer), in blocks of kBlockValues, the rest in memory.
        const int64_t steps = run_end / W;
        int64_t w0 = 0;
        for (; w0 + kBlockValues <= W; w0 += kBlockValues) fold_block(rows + w0, steps, W, ops, acc + w0);
        for (int64_t r = 0; r < steps; ++r)
          for (int64_t w = w0; w < W; ++w) acc[w] = ops(acc[w], load_element<acc_t>(ops, rows[r * W + w]));
        for (int64_t e = steps * W; e < run_end; ++e)
          acc[e - steps * W] = ops(acc[e - steps * W], load_element<acc_t>(ops, rows[e]));
        for (int64_t half = spread / 2; half > 0; half /= 2)
          for (int64_t i = 0; i < half * N; ++i) acc[i] = ops(acc[i], acc[i + half * N]);
        std::copy_n(acc, N, tree.run());
        tree.push();
      }
      if (tasks == 1) {
        store(t, tree.finish());
      } else {
        std::copy_n(tree.finish(), N, parts.data() + t * N);
      }
    }
  });
  if (tasks == 1) return;
  // A slab's whole tasks pushed as its tree's nodes of their rank; a last partial one is the ranks below them.
  const int64_t whole = K / task_rows;
  parallel_for_best_vectors(0, outer, 1, [&](int64_t begin, int64_t end) {
    PairwiseFold<acc_t, Ops> tree(ops, N);
    for (int64_t b = begin; b < end; ++b) {
      const acc_t* part = parts.data() + b * tasks * N;
      tree.reset();
      for (int64_t t = 0; t < whole; ++t) {
        std::copy_n(part + t * N, N, tree.run());
        tree.push();
      }
      store(b, whole < tasks ? tree.finish(part + whole * N) : tree.finish());
    }
  });
}

// Max and min in float32 and float64 over the N > 1 columns of `outer` slabs of K rows, as keys (lanes.h), so the
// walk across n vectorizes; a column with a NaN gives its first. A slab of many rows is split over the threads in
// tasks of about kChunk elements, their keys folded (in any order: an integer max) and their NaNs taken in row order.
template <typename out_t, typename scalar_t, typename Ops>
void extreme_slabs(const scalar_t* in, int64_t outer, int64_t K, int64_t N, const Ops& ops, out_t* result) {
  using acc_t = ops_acc_t<Ops>;
  using Keys = ExtremeKeys<acc_t, Ops>;
  using key_t = typename Keys::key_t;
  const int64_t task_rows = std::max<int64_t>(kChunk / N, 1);
  const int64_t tasks = std::max<int64_t>((K + task_rows - 1) / task_rows, 1);
  const size_t size = static_cast<size_t>(outer * tasks * N);
  // Each task's key of a column over its rows, whether the column had a NaN there, and the first such NaN.
  std::vector<key_t> keys(size);
  std::vector<acc_t> first_nan(size);
  std::vector<uint8_t> nan_seen(size);
  parallel_for_best_vectors(0, outer * tasks, 1, [&](int64_t begin, int64_t end) {
    // N copied: a float64 key's int64 store could write the captured N, as far as the compiler knew, so it reloaded
    // N every element and left the loop scalar (one thread, float64 amax over dim 0 of (2048, 512) 1.32 -> 0.21 ms
    // with the copy, torch 0.25).
    const int64_t columns = N;
    std::vector<key_t> nan(static_cast<size_t>(columns));  // as wide as the keys, as keyed_extreme's flag
    for (int64_t t = begin; t < end; ++t) {
      const int64_t k0 = (t % tasks) * task_rows, k_end = std::min(K, k0 + task_rows);
      const scalar_t* rows = in + (t / tasks) * K * columns;
      key_t* key = keys.data() + t * columns;
      std::fill_n(key, columns, Keys::key(Ops::identity()));
      std::fill(nan.begin(), nan.end(), 0);
      for (int64_t k = k0; k < k_end; ++k) {
        for (int64_t n = 0; n < columns; ++n) {
          const acc_t v = load_element<acc_t>(ops, rows[k * columns + n]);
          key[n] = Keys::larger(Keys::key(v), key[n]);
          nan[n] |= v != v;
        }
      }
      for (int64_t n = 0; n < columns; ++n) {
        nan_seen[t * columns + n] = nan[n] != 0;
        for (int64_t k = k0; nan[n] != 0; ++k) {
          const acc_t v = load_element<acc_t>(ops, rows[k * columns + n]);
          if (v != v) {
            first_nan[t * columns + n] = v;
            break;
          }
        }
      }
    }
  });
  parallel_for_best_vectors(0, outer, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t n = 0; n < N; ++n) {
        key_t key = Keys::key(Ops::identity());
        for (int64_t t = b * tasks; t < (b + 1) * tasks; ++t) key = Keys::larger(keys[t * N + n], key);
        acc_t v = Keys::value(key);
        for (int64_t t = b * tasks; t < (b + 1) * tasks; ++t) {
          if (nan_seen[t * N + n]) {
            v = first_nan[t * N + n];
            break;
          }
        }
        result[b * N + n] = static_cast<out_t>(project_result(ops, v));
      }
    }
  });
}

void launch_cpu(const ReduceKind& kind, const ReduceProblem& p, const at::Tensor& out) {
  TORCH_REDUCE_DISPATCH_DIM(p.input.scalar_type(), "torch_reduce dim reduction", [&] {
    with_stage_ops<scalar_t>(kind, [&](auto ops, auto out_type, auto) {
      using Ops = decltype(ops);
      using acc_t = ops_acc_t<Ops>;
      using out_t = typename decltype(out_type)::type;
      const scalar_t* in = p.input.const_data_ptr<scalar_t>();
      out_t* result = out.mutable_data_ptr<out_t>();
      const int64_t K = p.reduced, N = p.inner;
      if (p.outer * N == 1) {
        *result = static_cast<out_t>(project_result(ops, reduce_whole<acc_t>(in, K, ops)));
        return;
      }
      constexpr bool kProduct = std::is_same_v<Ops, ProdOp<acc_t>>;
      if (N > 1) {
        if constexpr (kKeyedExtreme<acc_t, Ops>) {
          return extreme_slabs<out_t>(in, p.outer, K, N, ops, result);
        } else {
          return fold_slabs<acc_t, out_t>(in, p.outer, K, N, ops, result);
        }
      }
      // Rows (N = 1) in lanes, but for a product (the order decides where its partial products over- or underflow,
      // and the serial one is the reference's). A fold whose order matters takes its terms in runs, their results
      // folded pairwise.
      constexpr bool kInRuns = !OrderFree<Ops>::value;
      parallel_for_best_vectors(0, p.outer, 1, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          const scalar_t* row = in + b * K;
          const auto term = [&](int64_t j) { return load_element<acc_t>(ops, row[j]); };
          acc_t acc = Ops::identity();
          if constexpr (kProduct) {
            for (int64_t k = 0; k < K; ++k) acc = ops(acc, term(k));
          } else if constexpr (kInRuns) {
            acc = pairwise_lane_fold<acc_t>(K, ops, term);
          } else {
            acc = fold_run<acc_t>(row, K, ops);
          }
          result[b] = static_cast<out_t>(project_result(ops, acc));
        }
      });
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, CPU, m) { impl_dim_reductions<&launch_cpu>(m); }

}  // namespace torch_reduce::cpu
