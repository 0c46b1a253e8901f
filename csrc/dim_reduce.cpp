#include "dim_reduce.h"

#include <ATen/DeviceGuard.h>
#include <ATen/WrapDimUtilsMulti.h>

#include <algorithm>
#include <bitset>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace torch_reduce {

const char* reduction_name(Reduction r) {
  switch (r) {
#define TORCH_REDUCE_NAME(name, reduction, Signature) \
  case Reduction::reduction: return #name;
    TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_NAME)
#undef TORCH_REDUCE_NAME
  }
  return "?";
}

// Complex numbers sum and average (two real reductions: reduce_dims), multiply (complex_product) and have norms
// (the norm of their magnitudes, complex32's too); torch has no max or min of them (complex_extremum).
// uint16/32/64 take every row whose result may be an integer (torch's CUDA kernels take them for amax/amin, its
// CPU ones do not).
void check_dim_reduction_dtype(Reduction r, at::ScalarType type) {
  const char* name = reduction_name(r);
  switch (type) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kBool:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kUInt16: case at::kUInt32: case at::kUInt64:
      return;  // the mean and norm of an integer tensor raise torch's errors (result_type)
    case at::kComplexFloat: case at::kComplexDouble:
      TORCH_CHECK_NOT_IMPLEMENTED(r != Reduction::Amax && r != Reduction::Amin, "\"", name,
                                  "\" not implemented for '", type, "'");
      return;
    case at::kComplexHalf:
      if (r == Reduction::VectorNorm) return;  // |z| in float16 (torch's abs), then the float16 kernels
      [[fallthrough]];
    default:
      // NotImplementedError, the class of torch's own refusal ("sum_cpu" not implemented for ...).
      TORCH_CHECK_NOT_IMPLEMENTED(false, name, ": unsupported dtype ", type,
                                  "; expected float32, float64, float16, bfloat16, an integer type, bool, complex64 or "
                                  "complex128 (sum, mean, prod, vector_norm), or complex32 (vector_norm)");
  }
}

void check_vector_norm_dtypes(at::ScalarType input, std::optional<at::ScalarType> dtype) {
  const bool complex = at::isComplexType(input);
  TORCH_CHECK(at::isFloatingType(input) || complex,
              "linalg.vector_norm: Expected a floating point or complex tensor as input. Got ", input);
  if (!dtype) return;
  TORCH_CHECK(at::isFloatingType(*dtype) || at::isComplexType(*dtype),
              "linalg.vector_norm: dtype should be floating point or complex, but got ", *dtype);
  TORCH_CHECK(at::isComplexType(*dtype) == complex, "linalg.vector_norm: dtype should be",
              complex ? " complex" : " real", " for ", complex ? "complex" : "real", " inputs, but got ", *dtype);
  TORCH_CHECK(at::promote_types(input, *dtype) == *dtype, "linalg.vector_norm: the dtype of the input (", input,
              ") should be convertible without narrowing to the specified dtype (", *dtype, ")");
}

namespace {

// The dtype the op returns, with torch's rules and messages.
at::ScalarType result_type(Reduction r, at::ScalarType input, std::optional<at::ScalarType> dtype) {
  switch (r) {
    case Reduction::Sum:
    case Reduction::Prod: {
      const at::ScalarType t = dtype.value_or(sum_result_type(input));
      TORCH_CHECK_NOT_IMPLEMENTED(t != at::kUInt16 && t != at::kUInt32 && t != at::kUInt64, "\"",
                                  reduction_name(r), "\" not implemented for '", t, "'");  // torch has no such output
      return t;
    }
    case Reduction::Mean: {
      const at::ScalarType t = dtype.value_or(input);
      TORCH_CHECK(at::isFloatingType(t) || at::isComplexType(t), "mean(): could not infer output dtype. ",
                  dtype ? "Optional dtype" : "Input dtype", " must be either a floating point or complex dtype. Got: ",
                  t);
      return t;
    }
    case Reduction::VectorNorm:
      check_vector_norm_dtypes(input, dtype);
      return c10::toRealValueType(dtype.value_or(input));
    default: return input;
  }
}

// The dims, with torch's errors in torch's order: each dim in turn is wrapped (out of range raises) and, where
// the reduction has no identity (amax, amin; vector_norm of order inf or below 0) and the input is empty, checked
// for a zero size, named as the caller gave it; repeats raise only after every dim passed (dim_list_to_bitset).
// vector_norm's dims otherwise go straight to dim_list_to_bitset, which raises for range and repeats in turn.
void check_dims(Reduction r, const at::Tensor& x, const ReduceCall& call) {
  const bool extremum = r == Reduction::Amax || r == Reduction::Amin;
  const bool no_identity =
      x.numel() == 0 && (extremum || (r == Reduction::VectorNorm && (call.ord < 0 || call.ord == INFINITY)));
  const bool every_dim = !call.dim.has_value() || call.dim->empty();
  if (no_identity && every_dim) {
    TORCH_CHECK(!extremum, reduction_name(r), "(): Expected reduction dim to be specified for input.numel() == 0. ",
                "Specify the reduction dim with the 'dim' argument.");
    TORCH_CHECK(false, "linalg.vector_norm cannot compute the ", call.ord,
                " norm on an empty tensor because the operation does not have an identity");
  }
  if (every_dim || (r == Reduction::VectorNorm && !no_identity)) return;
  for (int64_t d : *call.dim) {
    const int64_t wrapped = at::maybe_wrap_dim(d, x.dim());  // a 0-dim tensor takes 0 and -1
    if (!no_identity || x.size(wrapped) != 0) continue;     // an empty input has dims
    TORCH_CHECK_INDEX(!extremum, reduction_name(r), "(): Expected reduction dim ", d, " to have non-zero size.");
    TORCH_CHECK(false, "linalg.vector_norm cannot compute the ", call.ord, " norm on the dimension ", d,
                "because this dimension is empty and the operation does not have an identity");
  }
}

// An empty reduction's value: the ops object's identity through its final map (sum 0, prod 1, mean 0/0).
double empty_value(const ReduceKind& kind, at::ScalarType type) {
  double value = 0;
  TORCH_REDUCE_DISPATCH_DIM(type, "torch_reduce empty reduction", [&] {
    with_reduce_ops<scalar_t>(kind, [&](auto ops) {
      value = static_cast<double>(project_result(ops, decltype(ops)::identity()));
    });
  });
  return value;
}

// A run of adjacent dims in memory, all reduced or all kept: (reduced?, product of their sizes).
using Run = std::pair<bool, int64_t>;

// The input as runs over one dense stretch of memory, outermost first, plus where each output lands:
// `kept_order` lists the kept dims of size > 1 in the order the kernels write them (outermost first).
struct Layout {
  at::Tensor input;  // 1-D, the elements in the runs' order
  std::vector<Run> runs;
  std::vector<int64_t> kept_order;
};

void append_run(std::vector<Run>& runs, bool reduced, int64_t size) {
  if (!runs.empty() && runs.back().first == reduced) runs.back().second *= size;
  else runs.emplace_back(reduced, size);
}

// Without copying when the input is dense: its dims in memory order (size-1 dims dropped), runs of
// reduced or kept dims merged, however many reduced runs there are. Else (gaps such as x[::2]) the reduced
// dims are permuted last and copied: (kept, reduced).
Layout layout_of(const at::Tensor& x, const std::bitset<at::dim_bitset_size>& reduce_mask) {
  const int64_t ndim = x.dim();
  Layout layout;
  std::vector<int64_t> order;
  for (int64_t d = 0; d < ndim; ++d)
    if (x.size(d) > 1) order.push_back(d);
  if (x.is_non_overlapping_and_dense()) {
    // Dims of size > 1 of a dense tensor have distinct strides: descending stride is memory order.
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
    layout.input = x.as_strided({x.numel()}, {1});
  } else {
    std::stable_partition(order.begin(), order.end(), [&](int64_t d) { return !reduce_mask[d]; });
    std::vector<int64_t> permutation = order;
    for (int64_t d = 0; d < ndim; ++d)
      if (x.size(d) <= 1) permutation.push_back(d);
    layout.input = x.permute(permutation).contiguous().view(-1);
  }
  for (int64_t d : order) {
    append_run(layout.runs, reduce_mask[d], x.size(d));
    if (!reduce_mask[d]) layout.kept_order.push_back(d);
  }
  return layout;
}

// An input with its expanded dims (size > 1, stride 0) narrowed to one slice; `reduced` is the product of
// the reduced ones' sizes (the times each element repeats in every reduction), `kept` whether a kept one was
// narrowed (the result is expanded back).
struct Repeats {
  at::Tensor input;
  int64_t reduced = 1;
  bool kept = false;
};

Repeats read_once(const at::Tensor& x, const std::bitset<at::dim_bitset_size>& reduce_mask) {
  Repeats repeats{x};
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (x.size(d) <= 1 || x.stride(d) != 0) continue;
    if (reduce_mask[d]) repeats.reduced *= x.size(d);
    else repeats.kept = true;
    repeats.input = repeats.input.narrow(d, 0, 1);
  }
  return repeats;
}

// max, min and the norms of order +-inf are the same over any repeats of their elements; the others fold them.
bool folds_repeats(const ReduceKind& kind) {
  if (kind.reduction == Reduction::Amax || kind.reduction == Reduction::Amin) return false;
  return !(kind.reduction == Reduction::VectorNorm && std::isinf(kind.ord));
}

// Accumulators of elements read once, made those of each element read k times: a sum (mean, the norms'
// sums of |x|^p) times k, a product to the power k. Integers wrap modulo 2^64 as k additions or products
// would; floating ones are computed in double and rounded once, at least as accurate as k terms folded one
// by one (inf and NaN stay, 0 stays 0: k > 1).
void fold_repeats(Reduction r, const at::Tensor& partial, int64_t k) {
  if (!at::isFloatingType(partial.scalar_type())) {
    const at::Tensor bits = partial.view(at::kLong);  // uint64's accumulators: the same bits as int64's
    if (r == Reduction::Prod) bits.copy_(at::pow(bits, k));
    else bits.mul_(k);
    return;
  }
  const at::Tensor wide = partial.to(at::kDouble);
  if (r != Reduction::Prod) {
    partial.copy_(wide * static_cast<double>(k));
    return;
  }
  // |p|^k, negative for a negative p and an odd k (decided on k itself, which a double may round above 2^53).
  const at::Tensor magnitude = at::pow(wide.abs(), static_cast<double>(k));
  partial.copy_(k % 2 == 1 ? at::copysign(magnitude, wide) : magnitude);
}

// A product of complex numbers: the parts mix at every step, so it is not two real reductions as a sum is, and
// the kernels' ops objects are real. torch's complex multiply, pairwise: the reduced dims moved last and flattened,
// the first half of the elements times the second until one is left (an odd last element carried along): a fixed
// order, log2(n) launches of torch's elementwise multiply. Each of the n - 1 products rounds and each rounding
// reaches the result, in this order as in any (about sqrt(n) roundings of its magnitude: test_complex_prod).
at::Tensor complex_product(const at::Tensor& x, const std::bitset<at::dim_bitset_size>& reduce_mask, bool keepdim) {
  std::vector<int64_t> permutation, out_shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!reduce_mask[d]) {
      permutation.push_back(d);
      out_shape.push_back(x.size(d));
    } else if (keepdim) {
      out_shape.push_back(1);
    }
  }
  const auto kept = static_cast<int64_t>(permutation.size());
  if (kept == x.dim()) return x.clone().view(out_shape);  // nothing reduced (a 0-dim tensor's own dim)
  for (int64_t d = 0; d < x.dim(); ++d)
    if (reduce_mask[d]) permutation.push_back(d);
  at::Tensor rows = x.permute(permutation).flatten(kept);
  if (rows.size(-1) == 0) return at::ones(out_shape, x.options());
  for (int64_t n = rows.size(-1); n > 1; n = rows.size(-1)) {
    const int64_t half = n / 2;
    const at::Tensor product = rows.narrow(-1, 0, half) * rows.narrow(-1, half, half);
    rows = n % 2 == 0 ? product : at::cat({product, rows.narrow(-1, n - 1, 1)}, -1);
  }
  return rows.reshape(out_shape);
}

// The normal form of reducing run `at` (runs.size() for none): the runs before it outer, after it inner.
ReduceProblem problem_of(const at::Tensor& input, const std::vector<Run>& runs, size_t at) {
  int64_t outer = 1, reduced = 1, inner = 1;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (i == at) reduced = runs[i].second;
    else (i < at ? outer : inner) *= runs[i].second;
  }
  return {input, outer, reduced, inner};
}

}  // namespace

bool complex_extremum(Reduction r, at::ScalarType type) {
  return (r == Reduction::Amax || r == Reduction::Amin) && at::isComplexType(type);
}

void check_reduction_input(Reduction r, at::ScalarType input, std::optional<at::ScalarType> dtype) {
  const bool cast_first = dtype && (r == Reduction::Sum || r == Reduction::Mean || r == Reduction::Prod);
  if (!complex_extremum(r, input) && !cast_first) check_dim_reduction_dtype(r, input);
}

at::Tensor reduce_dims(Reduction r, const at::Tensor& self, const ReduceCall& call, ReduceLauncher launch) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  // A complex amax/amin raises where torch's does: after the dims' and the empty input's checks, and only where
  // its result has elements (torch returns an empty one, as no kernel runs).
  const bool unsupported_extremum = complex_extremum(r, self.scalar_type());
  const std::optional<at::ScalarType> dtype = call.dtype;
  check_reduction_input(r, self.scalar_type(), dtype);
  const at::ScalarType out_type = result_type(r, self.scalar_type(), dtype);
  if (r == Reduction::VectorNorm && at::isComplexType(self.scalar_type())) {
    // The norm of the magnitudes, |x| in the real type of dtype= (complex) when given, as torch's.
    ReduceCall real_call = call;
    real_call.dtype = std::nullopt;
    return reduce_dims(r, at::abs(dtype ? self.to(*dtype) : self), real_call, launch);
  }
  // dtype= casts the input first (as torch does), so the sum runs in the accumulate type of that dtype.
  // Without it the kernels read the input as it is: an integer sum accumulates in int64 anyway.
  const at::ScalarType input_type = dtype.value_or(self.scalar_type());
  if (!unsupported_extremum) check_dim_reduction_dtype(r, input_type);

  const int64_t ndim = self.dim();
  const bool all_dims = !call.dim.has_value() || call.dim->empty();  // torch: dim=None and dim=() mean every dim
  check_dims(r, self, call);
  std::bitset<at::dim_bitset_size> reduce_mask;
  if (all_dims) {
    for (int64_t d = 0; d < ndim; ++d) reduce_mask.set(d);
  } else {
    reduce_mask = at::dim_list_to_bitset(*call.dim, ndim);  // wraps negative dims; raises on repeats
    // A 0-dim tensor's dim 0 (or -1) is the tensor itself, not the pair dim of a complex one's real view.
    if (ndim == 0) reduce_mask.reset();
  }
  if (r == Reduction::Prod && at::isComplexType(input_type))
    return complex_product(dtype ? self.to(input_type) : self, reduce_mask, call.keepdim);

  // A complex sum or mean is two real ones: the kernels read the (real, imaginary) pairs as a kept trailing
  // dim of 2, and the result is viewed as complex again.
  const bool complex = at::isComplexType(input_type);
  const auto as_out = [&](const at::Tensor& t) { return complex ? at::view_as_complex(t) : t; };
  std::vector<int64_t> out_shape;
  int64_t reduced_count = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!reduce_mask[d]) out_shape.push_back(self.size(d));
    else {
      reduced_count *= self.size(d);
      if (call.keepdim) out_shape.push_back(1);
    }
  }
  if (unsupported_extremum) {
    if (c10::multiply_integers(out_shape) == 0) return at::empty(out_shape, self.options());
    check_dim_reduction_dtype(r, self.scalar_type());  // raises
  }
  if (complex) out_shape.push_back(2);
  const at::ScalarType value_type = c10::toRealValueType(out_type);
  const auto out_options = self.options().dtype(value_type);
  if (c10::multiply_integers(out_shape) == 0) return as_out(at::empty(out_shape, out_options));
  ReduceKind kind{r, call.ord, reduced_count, Stage::Whole};
  if (reduced_count == 0) {
    return as_out(at::full(out_shape, empty_value(kind, c10::toRealValueType(input_type)), out_options));
  }
  if (r == Reduction::VectorNorm && reduced_count == 1) {
    // One element a result: its norm is |x| (order 0: x != 0), exact, as torch's; the kernels' root of |x|^p
    // would overflow for float32 |x| > 1.8e19 at order 2 and round at others.
    const at::Tensor x = self.to(input_type);
    const at::Tensor norm = call.ord == 0 ? at::ne(x, 0) : at::abs(x);
    return norm.to(value_type).reshape(out_shape).contiguous();
  }

  // Expanded dims (stride 0) hold one slice repeated: it is read (and cast) once, never copied out.
  const Repeats repeats = read_once(self, reduce_mask);
  const at::Tensor x = repeats.input.scalar_type() == input_type ? repeats.input : repeats.input.to(input_type);
  const at::Tensor input = complex ? at::view_as_real(x) : x;
  std::vector<int64_t> computed_shape;  // out_shape with the kept repeated dims as 1
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (!reduce_mask[d]) computed_shape.push_back(input.size(d));
    else if (call.keepdim) computed_shape.push_back(1);
  }
  const int64_t outputs = c10::multiply_integers(computed_shape);
  const bool fold = repeats.reduced > 1 && folds_repeats(kind);

  Layout layout = layout_of(input, reduce_mask);
  // Reduced runs apart in memory: the largest first (it shrinks the intermediate most), each stage's
  // accumulators the next one's input, until one reduced run is left.
  at::Tensor source = layout.input;
  std::vector<Run>& runs = layout.runs;
  const auto is_reduced = [](const Run& run) { return run.first; };
  while (std::count_if(runs.begin(), runs.end(), is_reduced) > 1) {
    size_t at = runs.size();
    for (size_t i = 0; i < runs.size(); ++i)
      if (runs[i].first && (at == runs.size() || runs[i].second > runs[at].second)) at = i;
    const ReduceProblem stage = problem_of(source, runs, at);
    kind.stage = kind.stage == Stage::Whole ? Stage::First : Stage::Middle;
    at::Tensor partial = at::empty({stage.outer * stage.inner},
                                   input.options().dtype(accumulate_type(r, input.scalar_type())));
    launch(kind, stage, partial);
    source = partial;
    std::vector<Run> remaining;
    for (size_t i = 0; i < runs.size(); ++i)
      if (i != at) append_run(remaining, runs[i].first, runs[i].second);
    runs = remaining;
  }
  const auto reduced_run = std::find_if(runs.begin(), runs.end(), is_reduced);
  ReduceProblem problem = problem_of(source, runs, static_cast<size_t>(reduced_run - runs.begin()));
  if (fold) {
    // The repeats multiply the accumulators (before the final map: a norm's root, a mean's division by
    // every element's count), which a last launch over one accumulator each then projects.
    kind.stage = kind.stage == Stage::Whole ? Stage::First : Stage::Middle;
    at::Tensor partial = at::empty({outputs}, input.options().dtype(accumulate_type(r, input.scalar_type())));
    launch(kind, problem, partial);
    fold_repeats(r, partial, repeats.reduced);
    problem = ReduceProblem{partial, outputs, 1, 1};
  }
  if (kind.stage != Stage::Whole) kind.stage = Stage::Last;
  at::Tensor out = at::empty({outputs}, input.options().dtype(kernel_result_type(r, problem.input.scalar_type())));
  launch(kind, problem, out);

  // The kernel wrote the kept dims in layout.kept_order; return them in the input's order, contiguous
  // (a copy only when that order differs, e.g. a permuted input keeping several dims).
  at::Tensor result = out.view(computed_shape);
  if (!std::is_sorted(layout.kept_order.begin(), layout.kept_order.end())) {
    std::vector<int64_t> written_sizes;
    for (int64_t d : layout.kept_order) written_sizes.push_back(input.size(d));
    std::vector<int64_t> by_dim(layout.kept_order.size());
    std::iota(by_dim.begin(), by_dim.end(), 0);
    std::sort(by_dim.begin(), by_dim.end(),
              [&](int64_t a, int64_t b) { return layout.kept_order[a] < layout.kept_order[b]; });
    result = out.view(written_sizes).permute(by_dim).contiguous().view(computed_shape);
  }
  if (result.scalar_type() != value_type) result = result.to(value_type);
  if (repeats.kept) result = result.expand(out_shape).contiguous();
  return as_out(result);
}

// Sparse layouts reach these kernels, not the dense ones: an error naming the layout, from the op itself.
namespace {

const char* layout_name(at::Layout layout) {
  switch (layout) {
    case at::kSparse: return "torch.sparse_coo";
    case at::kSparseCsr: return "torch.sparse_csr";
    case at::kSparseCsc: return "torch.sparse_csc";
    case at::kSparseBsr: return "torch.sparse_bsr";
    case at::kSparseBsc: return "torch.sparse_bsc";
    default: return "a non-strided layout";
  }
}

template <Reduction R>
struct RefuseLayout {
  static at::Tensor run(const at::Tensor& self, const ReduceCall&) {
    C10_THROW_ERROR(NotImplementedError,
                    c10::str("torch_reduce.", reduction_name(R), " takes strided (dense) tensors, got ",
                             layout_name(self.layout()),
                             R == Reduction::Sum ? "; torch.sum sums sparse tensors (or densify with .to_dense())"
                                                 : "; densify it with .to_dense()"));
  }
};

void refuse_layout(torch::Library& m) {
#define TORCH_REDUCE_REFUSE(name, reduction, Signature) \
  m.impl(#name, &Signature::template bind<RefuseLayout<Reduction::reduction>>);
  TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_REFUSE)
#undef TORCH_REDUCE_REFUSE
}

}  // namespace

TORCH_LIBRARY_IMPL(reduce, SparseCPU, m) { refuse_layout(m); }
TORCH_LIBRARY_IMPL(reduce, SparseCUDA, m) { refuse_layout(m); }
TORCH_LIBRARY_IMPL(reduce, SparseCsrCPU, m) { refuse_layout(m); }
TORCH_LIBRARY_IMPL(reduce, SparseCsrCUDA, m) { refuse_layout(m); }

}  // namespace torch_reduce
