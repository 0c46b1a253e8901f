#include "grad_norm.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "dim_reduce.h"

namespace torch_reduce {
namespace {

bool is_float_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

void check_norm_input(const at::Tensor& t, double ord, std::optional<at::ScalarType> dtype) {
  const at::ScalarType type = t.scalar_type();
  TORCH_CHECK(is_float_type(type) || at::isComplexType(type),
              "linalg.vector_norm: Expected a floating point or complex tensor as input. Got ", type);
  check_vector_norm_dtypes(type, dtype);
  const bool empty = t.sym_numel() == 0;  // symbolic under torch.compile
  if (empty && ord == INFINITY)
    TORCH_CHECK(false, "_foreach_norm cannot compute the infinity norm on an empty tensor because the operation does "
                "not have an identity");
  TORCH_CHECK(!empty || !(ord < 0), "linalg.vector_norm cannot compute the ", ord,
              " norm on an empty tensor because the operation does not have an identity");
}

}  // namespace

void check_norm_list(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(!tensors.empty(), "Tensor list must have at least one tensor.");
  for (const at::Tensor& t : tensors) check_norm_input(t, ord, dtype);
}

void check_clip_grads(at::TensorList grads, const at::Tensor& total_norm, const char* op) {
  TORCH_CHECK(!grads.empty(), "Tensor list must have at least one tensor.");
  for (const at::Tensor& g : grads)
    TORCH_CHECK(is_float_type(g.scalar_type()) || at::isComplexType(g.scalar_type()), op,
                ": expected floating point or complex gradients (float32, float64, float16, bfloat16, complex32, "
                "complex64, complex128), got ", g.scalar_type());
  TORCH_CHECK(total_norm.dim() == 0 && is_float_type(total_norm.scalar_type()), op,
              ": total_norm must be a 0-dim floating tensor, got shape ", total_norm.sizes(), " of ",
              total_norm.scalar_type());
  for (const at::Tensor& g : grads) check_scalable(g);
}

void check_scalable(const at::Tensor& g) {
  if (g.layout() == at::kStrided) at::assert_no_internal_overlap(g);
  check_not_inference(g);
}

void check_not_inference(const at::Tensor& g) {
  TORCH_CHECK(!g.is_inference() || c10::InferenceMode::is_enabled(),
              "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone to get a "
              "normal tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 for more "
              "details.");
}

bool norm_folds_square(const at::Tensor& t, double ord, bool fast_route) {
  return ord == 2 && fast_route && t.is_cuda() && t.sym_numel() == 1;
}

bool norm_is_magnitude(const at::Tensor& t, double ord, bool fast_route) {
  return t.numel() == 1 && ord != 0 && !norm_folds_square(t, ord, fast_route);  // real tensors: the kernels'
}

bool torch_fast_route(at::TensorList tensors) {
  return std::all_of(tensors.begin(), tensors.end(), [&](const at::Tensor& t) {
    return t.scalar_type() == tensors[0].scalar_type() && t.device() == tensors[0].device() && !t.is_complex() &&
           t.is_non_overlapping_and_dense();
  });
}

std::vector<char> total_fast_routes(at::TensorList tensors, bool foreach) {
  struct Group {
    at::Device device;
    at::ScalarType type;
    bool fast;  // every tensor of the group real and dense
  };
  std::vector<Group> groups;
  const auto group_of = [&](const at::Tensor& t) {
    return std::find_if(groups.begin(), groups.end(),
                        [&](const Group& g) { return g.device == t.device() && g.type == t.scalar_type(); });
  };
  for (const at::Tensor& t : tensors) {
    auto it = group_of(t);
    if (it == groups.end()) it = groups.insert(groups.end(), {t.device(), t.scalar_type(), foreach});
    it->fast = it->fast && !t.is_complex() && t.is_non_overlapping_and_dense();
  }
  std::vector<char> fast;
  for (const at::Tensor& t : tensors) fast.push_back(group_of(t)->fast);
  return fast;
}

std::vector<char> total_magnitudes(at::TensorList tensors, double ord, bool foreach) {
  std::vector<char> magnitude(tensors.size(), 0), fast;  // the routes only where a one-element tensor needs them
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k].numel() != 1) continue;
    if (fast.empty()) fast = total_fast_routes(tensors, foreach);
    magnitude[k] = norm_is_magnitude(tensors[k], ord, fast[k]);
  }
  return magnitude;
}

at::ScalarType total_norm_dtype(at::TensorList tensors) {
  at::ScalarType type = c10::toRealValueType(tensors[0].scalar_type());
  for (const at::Tensor& t : tensors) type = at::promoteTypes(type, c10::toRealValueType(t.scalar_type()));
  return type;
}

namespace {

// A complex tensor as its (real, imaginary) pairs, sharing its memory (a conjugate view's conjugate: the same
// magnitudes, and a real scaling commutes with it).
at::Tensor pairs_of(const at::Tensor& t) { return at::view_as_real(t.is_conj() ? t.conj() : t); }

}  // namespace

at::Tensor magnitudes(const at::Tensor& t, std::optional<at::ScalarType> dtype) {
  if (!t.is_complex()) return at::abs(t);
  at::ScalarType type = t.scalar_type() == at::kComplexHalf ? at::kComplexFloat : t.scalar_type();
  if (dtype) type = at::promoteTypes(type, *dtype);
  return at::abs(t.to(type));
}

NormOperands real_operands(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype) {
  NormOperands operands{{}, dtype ? std::optional(c10::toRealValueType(*dtype)) : std::nullopt, {}};
  operands.tensors.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    operands.norm_types.push_back(operands.dtype.value_or(c10::toRealValueType(t.scalar_type())));
    if (!t.is_complex()) {
      operands.tensors.push_back(t);
    } else if (ord == 2) {
      operands.tensors.push_back(pairs_of(t));  // sum |z|^2 = sum re^2 + im^2: no copy
    } else {
      operands.tensors.push_back(magnitudes(t, dtype));
    }
  }
  return operands;
}

std::vector<at::Tensor> real_views(at::TensorList grads) {
  std::vector<at::Tensor> views;
  views.reserve(grads.size());
  for (const at::Tensor& g : grads) views.push_back(g.is_complex() ? pairs_of(g) : g);
  return views;
}

std::vector<std::pair<at::Device, std::vector<int64_t>>> group_by_device(at::TensorList tensors) {
  std::vector<std::pair<at::Device, std::vector<int64_t>>> groups;
  for (int64_t i = 0; i < static_cast<int64_t>(tensors.size()); ++i) {
    const at::Device device = tensors[i].device();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == device; });
    if (it == groups.end()) it = groups.insert(groups.end(), {device, {}});
    it->second.push_back(i);
  }
  return groups;
}

std::vector<at::Tensor> select(at::TensorList tensors, const std::vector<int64_t>& positions) {
  std::vector<at::Tensor> chosen;
  chosen.reserve(positions.size());
  for (int64_t i : positions) chosen.push_back(tensors[i]);
  return chosen;
}

at::Tensor dense_elements(const at::Tensor& t) { return t.is_non_overlapping_and_dense() ? t : t.contiguous(); }

at::Tensor clip_coefficient(const at::Tensor& total_norm, double max_norm) {
  return at::clamp_max(at::reciprocal(total_norm + 1e-6) * max_norm, 1.0);
}

at::Tensor total_of_sums(const at::Tensor& sums, double ord, bool rounded_range, at::ScalarType total_type) {
  const at::Tensor accumulators = sums.select(1, 0);
  at::Tensor folded;
  if (ord == INFINITY) {
    folded = accumulators.amax();
  } else if (ord == -INFINITY) {
    folded = accumulators.amin();
  } else {
    folded = accumulators.sum();
    if (rounded_range && ord != 0 && !std::isnan(ord)) {  // the orders that sum powers (sums_powers)
      const at::Tensor rounded_sum = sums.select(1, 1).to(at::kFloat).sum();  // in float32, as torch's
      folded = at::where(rounded_sum.isinf() != folded.to(at::kFloat).isinf(), rounded_sum.to(folded.dtype()), folded);
    }
  }
  if (total_type != at::kDouble && ord != 0)  // a sum past float32's largest: inf (in_torch_range)
    folded = at::where(folded.to(at::kFloat).isinf(), INFINITY, folded);
  if (ord == 2) {
    folded = folded.sqrt();
  } else if (ord != 0 && ord != 1 && std::isfinite(ord)) {
    folded = folded.pow(1.0 / ord);
  }
  return folded.to(total_type);
}

namespace {

// Sparse COO gradients (nn.Embedding(sparse=True)'s), as torch takes them: a sparse tensor's norm is its coalesced
// values' (torch's too, implicit zeros left out for every order), computed by the dense kernels.
std::vector<at::Tensor> norm_operands(at::TensorList tensors) {
  std::vector<at::Tensor> operands;
  for (const at::Tensor& t : tensors) operands.push_back(t.is_sparse() ? t.coalesce()._values() : t);
  return operands;
}

std::vector<at::Tensor> foreach_norm_sparse(at::TensorList tensors, double ord, std::optional<at::ScalarType> dtype) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("reduce::foreach_norm", "")
          .typed<std::vector<at::Tensor>(at::TensorList, double, std::optional<at::ScalarType>)>();
  return op.call(norm_operands(tensors), ord, dtype);
}

at::Tensor total_norm_sparse(at::TensorList tensors, double ord, bool foreach) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("reduce::total_norm", "")
                             .typed<at::Tensor(at::TensorList, double, bool)>();
  return op.call(norm_operands(tensors), ord, foreach);
}

void clip_grads_sparse(at::TensorList grads, const at::Tensor& total_norm, double max_norm) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("reduce::clip_grads_", "")
                             .typed<void(at::TensorList, const at::Tensor&, double)>();
  check_clip_grads(grads, total_norm, "reduce::clip_grads_");
  std::vector<at::Tensor> dense;
  for (const at::Tensor& g : grads) {
    if (g.is_sparse()) {
      g.mul_(clip_coefficient(total_norm.to(g.device()), max_norm));
    } else {
      dense.push_back(g);
    }
  }
  if (!dense.empty()) op.call(dense, total_norm, max_norm);
}

// Sparse compressed tensors (CSR, CSC, BSR, BSC; a list with one comes here), which torch's norms and clipping do
// not take either (they raise from deep inside): our error names the layout, where the dispatcher's would name a
// missing kernel.
[[noreturn]] void refuse_compressed(at::TensorList tensors, const char* op) {
  const auto compressed = std::find_if(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
    return t.layout() != at::kStrided && t.layout() != at::kSparse;
  });
  C10_THROW_ERROR(Error, c10::str(op, ": takes strided or sparse COO tensors, got one of layout ",
                                  compressed != tensors.end() ? compressed->layout() : at::kSparseCsr,
                                  "; densify it with .to_dense()"));
}

std::vector<at::Tensor> foreach_norm_compressed(at::TensorList tensors, double, std::optional<at::ScalarType>) {
  refuse_compressed(tensors, "reduce::foreach_norm");
}

at::Tensor total_norm_compressed(at::TensorList tensors, double, bool) {
  refuse_compressed(tensors, "reduce::total_norm");
}

void clip_grads_compressed(at::TensorList grads, const at::Tensor&, double) {
  refuse_compressed(grads, "reduce::clip_grads_");
}

}  // namespace

// A conjugate (complex) or negative (real) view's norm is its memory's, and a real coefficient's scaling commutes
// with both: the kernels take such views as they are (real_operands, real_views), where torch's fallbacks for these
// keys would copy the norms' inputs and refuse the mutable lists of clip_grads_ and clip_grad_norm_.
#define TORCH_REDUCE_VIEW_BITS_FALL_THROUGH(key)                           \
  TORCH_LIBRARY_IMPL(reduce, key, m) {                                     \
    m.impl("foreach_norm", torch::CppFunction::makeFallthrough());         \
    m.impl("total_norm", torch::CppFunction::makeFallthrough());           \
    m.impl("clip_grads_", torch::CppFunction::makeFallthrough());          \
    m.impl("clip_grad_norm_", torch::CppFunction::makeFallthrough());      \
  }
TORCH_REDUCE_VIEW_BITS_FALL_THROUGH(Conjugate)
TORCH_REDUCE_VIEW_BITS_FALL_THROUGH(Negative)
#undef TORCH_REDUCE_VIEW_BITS_FALL_THROUGH

#define TORCH_REDUCE_LIST_LAYOUT(key, kind)                                                 \
  TORCH_LIBRARY_IMPL(reduce, key, m) {                                                      \
    m.impl("foreach_norm", &foreach_norm_##kind);                                           \
    m.impl("total_norm", &total_norm_##kind);                                               \
    m.impl("clip_grads_", &clip_grads_##kind);                                              \
    m.impl("clip_grad_norm_", &clip_grad_norm<&total_norm_##kind, &clip_grads_##kind>);     \
  }
TORCH_REDUCE_LIST_LAYOUT(SparseCPU, sparse)
TORCH_REDUCE_LIST_LAYOUT(SparseCUDA, sparse)
TORCH_REDUCE_LIST_LAYOUT(SparseCsrCPU, compressed)
TORCH_REDUCE_LIST_LAYOUT(SparseCsrCUDA, compressed)
#undef TORCH_REDUCE_LIST_LAYOUT

}  // namespace torch_reduce
