// The drop-ins' Python entry points in C: torch_reduce.sum, mean, amax, amin, prod, vector_norm, layer_norm,
// rms_norm, add_layer_norm, add_rms_norm, var_mean and clip_grad_norm_. The common call (plain tensors; dims or a
// shape as an int, a tuple or a list; keepdim, ord, eps, correction; no dtype=, out= or unbiased) is parsed here
// and goes to the op's typed dispatcher handle, unboxed. torch.ops' boxed path costs about 2.5 us more a call
// than torch's own bindings (CPU tensors, 2 cores: torch.sum 2.0 us, the op through torch.ops 4.1 us, through its
// Python wrapper 5.7 us), which made every small reduction slower than torch's. Anything else takes the Python
// wrapper (torch_reduce/reductions.py, functional.py, grad_norm.py), unchanged: tensor subclasses and
// __torch_function__ modes, dtype= and out=, unusual argument types, and every call that raised (the wrapper runs
// it again, so its errors are the op's own, word for word) but for an error raised by Python code the op called,
// which is returned as it is (run_released). A call that warned returns its result, its warnings raised as
// Python's (warn_in_python).
// torch.compile traces the wrapper in its place (torch.compiler.substitute_in_graph, _entry_points.py).
//
// Only Python's limited API is used, so _C stays abi3; two symbols come from libtorch_python, whose C++ ABI _C
// depends on anyway: THPVariable_Wrap, and the tensor object's layout (a PyObject header, then the at::Tensor).
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/variable.h>

#include <array>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dim_reduce.h"
#include "layernorm.h"

PyObject* THPVariable_Wrap(const at::TensorBase& var);  // libtorch_python

namespace torch_reduce {
namespace {

struct TensorObject {  // torch/csrc/autograd/python_variable.h's THPVariable, up to the field read here
  PyObject_HEAD
  at::Tensor cdata;
};

// The entry points: the dim reductions' table (a new row gets one with nothing else to write), then the norms.
enum class Entry {
#define TORCH_REDUCE_ENTRY(name, reduction, Signature) name,
  TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_ENTRY)
#undef TORCH_REDUCE_ENTRY
  layer_norm, rms_norm, add_layer_norm, add_rms_norm, var_mean, clip_grad_norm_, kCount
};
constexpr auto kEntries = static_cast<size_t>(Entry::kCount);
#define TORCH_REDUCE_CHECK_ENTRY(name, reduction, Signature) \
  static_assert(static_cast<int>(Entry::name) == static_cast<int>(Reduction::reduction));
TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_CHECK_ENTRY)
#undef TORCH_REDUCE_CHECK_ENTRY

// Set from Python (_C._fast_call_setup): the types read directly (torch.Tensor, nn.Parameter: neither has a
// __torch_function__ of its own) and each entry point's Python wrapper.
PyObject* plain_types = nullptr;
std::array<PyObject*, kEntries> wrappers{};
// plain_types' items (plain_types holds their references), compared without a call into Python: without the
// limited API's PyTuple_Size and PyTuple_GetItem for each parameter, clip_grad_norm_'s host time for 1,000
// parameters went from 98 to 78 us with them in the CPU's caches, from 263 to 167 us out of them (H200 machine,
// scripts/clip_host_probe.py, medians of three runs).
std::array<PyObject*, 2> plain_type_items{};

bool is_plain_tensor(PyObject* obj) {
  const auto* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
  return type == plain_type_items[0] || type == plain_type_items[1];
}

const at::Tensor& tensor_of(PyObject* obj) { return reinterpret_cast<TensorObject*>(obj)->cdata; }

// p.grad for a leaf p, read from its autograd metadata; nullptr for a non-leaf. p.is_leaf() and p.grad() are
// virtual calls through autograd's hooks, about a fifth of clip_grad_norm_'s host time for 1,000 parameters. A
// view asks autograd: its grad_fn may be rebuilt when it is read.
const at::Tensor* leaf_grad(const at::Tensor& p) {
  static const at::Tensor kNoGrad;
  const auto* meta = static_cast<const torch::autograd::AutogradMeta*>(p.unsafeGetTensorImpl()->autograd_meta());
  if (meta == nullptr) return &kNoGrad;
  if (meta->is_view_) return p.is_leaf() ? &p.grad() : nullptr;
  return meta->grad_fn_ ? nullptr : &meta->grad_;
}

// The warnings an op gave (TORCH_WARN), raised as Python's after the call (warn_in_python), as torch's bindings
// raise them. torch.ops, which the wrappers call, gives them to c10's log on stderr instead (var_mean's "degrees of
// freedom is <= 0" went to stderr that way), so the wrapper's calls are watched too (call_wrapper).
struct WarningSeen : c10::WarningHandler {
  std::vector<c10::Warning> warnings;
  void process(const c10::Warning& warning) override { warnings.push_back(warning); }
};

// False where a warning became an error (a filter set to "error"): the error is set.
bool warn_in_python(const WarningSeen& seen) {
  for (const c10::Warning& warning : seen.warnings) {
    PyObject* category = std::holds_alternative<c10::Warning::DeprecationWarning>(warning.type())
                             ? PyExc_DeprecationWarning : PyExc_UserWarning;
    if (PyErr_WarnEx(category, warning.msg().c_str(), 1) != 0) return false;
  }
  return true;
}

// The Python wrapper, called with the caller's arguments as they came. The warnings of the ops it reaches through
// torch.ops (a tensor subclass's or a __torch_function__ mode's call) are raised as Python's after it, as for the
// common call, where c10's log would print them; an error it raised stays set, after them.
PyObject* call_wrapper(Entry e, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* wrapper = wrappers[static_cast<size_t>(e)];
  if (wrapper == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "torch_reduce._C: an entry point's Python wrapper is not set");
    return nullptr;
  }
  PyObject* positional = PyTuple_New(nargs);
  if (positional == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(positional, i, args[i]);
  }
  PyObject* keywords = nullptr;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_Size(kwnames);
  if (nkw > 0) {
    keywords = PyDict_New();
    for (Py_ssize_t i = 0; keywords != nullptr && i < nkw; ++i) {
      if (PyDict_SetItem(keywords, PyTuple_GetItem(kwnames, i), args[nargs + i]) != 0) Py_CLEAR(keywords);
    }
    if (keywords == nullptr) {
      Py_DECREF(positional);
      return nullptr;
    }
  }
  WarningSeen warnings;
  PyObject* result;
  {
    const c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    result = PyObject_Call(wrapper, positional, keywords);
  }
  Py_DECREF(positional);
  Py_XDECREF(keywords);
  if (result == nullptr) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (!warn_in_python(warnings)) PyErr_Clear();  // the call's own error wins over a warning made an error
    PyErr_Restore(type, value, traceback);
    return nullptr;
  }
  if (!warn_in_python(warnings)) Py_CLEAR(result);
  return result;
}

bool is_exact_int(PyObject* obj) { return PyLong_CheckExact(obj); }  // not bool, not a numpy or tensor scalar

bool read_int(PyObject* obj, int64_t& value) {
  if (!is_exact_int(obj)) return false;
  const long long v = PyLong_AsLongLong(obj);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  value = v;
  return true;
}

bool read_float(PyObject* obj, double& value) {
  if (is_exact_int(obj)) {  // one past int64 takes the wrapper, which raises torch's OverflowError for a Scalar
    int64_t v = 0;
    if (!read_int(obj, v)) return false;
    value = static_cast<double>(v);
    return true;
  }
  if (!PyFloat_CheckExact(obj)) return false;
  value = PyFloat_AsDouble(obj);
  if (value == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

// A tuple, or a subclass that iterates as one (torch.Size): its items are what the wrapper's iteration reads. A
// subclass with an __iter__ of its own takes the wrapper.
bool iterates_as_tuple(PyObject* obj) {
  if (PyTuple_CheckExact(obj)) return true;
  if (!PyTuple_Check(obj)) return false;
  static void* const tuple_iter = PyType_GetSlot(&PyTuple_Type, Py_tp_iter);
  return PyType_GetSlot(Py_TYPE(obj), Py_tp_iter) == tuple_iter;
}

// An int, or a tuple (torch.Size too) or list of ints, into values; false for anything else.
bool read_ints(PyObject* obj, c10::SmallVector<int64_t, 8>& values) {
  int64_t v = 0;
  if (read_int(obj, v)) {
    values.push_back(v);
    return true;
  }
  const bool tuple = iterates_as_tuple(obj);
  if (!tuple && !PyList_CheckExact(obj)) return false;
  const Py_ssize_t n = tuple ? PyTuple_Size(obj) : PyList_Size(obj);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!read_int(tuple ? PyTuple_GetItem(obj, i) : PyList_GetItem(obj, i), v)) return false;
    values.push_back(v);
  }
  return true;
}

// None or a plain tensor (an optional weight or bias).
bool read_optional_tensor(PyObject* obj, std::optional<at::Tensor>& t) {
  if (obj == nullptr || obj == Py_None) return true;
  if (!is_plain_tensor(obj)) return false;
  t = tensor_of(obj);
  return true;
}

// Each entry point's parameters (positional first, named as the wrapper's, then keyword-only), its parse of
// the common call (false: the wrapper's call) and its op call.
template <Reduction R, typename Signature>
struct DimReductionSpec {
  static constexpr Entry kEntry = static_cast<Entry>(R);
  static constexpr bool kOrd = std::is_same_v<Signature, OrdDimsDtype>;
  static constexpr std::array<const char*, kOrd ? 4 : 3> kPositional = [] {
    if constexpr (kOrd) {
      return std::array<const char*, 4>{"x", "ord", "dim", "keepdim"};
    } else {
      return std::array<const char*, 3>{"input", "dim", "keepdim"};
    }
  }();
  static constexpr std::array<const char*, 2> kKeywordOnly{"dtype", "out"};  // the wrapper's when given
  static constexpr size_t kGiven = kPositional.size();  // the keyword-only ones must be absent or None

  struct Args {
    const at::Tensor* input;
    c10::SmallVector<int64_t, 8> dims;
    bool all_dims, keepdim;
    double ord = 2.0;
  };
  static bool parse(PyObject* const* slots, Args& a) {
    size_t next = 1;
    if constexpr (kOrd) {
      PyObject* ord = slots[next++];
      if (ord != nullptr && !read_float(ord, a.ord)) return false;
    }
    PyObject* dim = slots[next++];
    PyObject* keepdim = slots[next];
    a.all_dims = dim == nullptr || dim == Py_None;
    if (!a.all_dims && !read_ints(dim, a.dims)) return false;
    if (keepdim != nullptr && keepdim != Py_True && keepdim != Py_False) return false;
    // sum/mean/prod(x, keepdim=...) without dim: the wrapper raises torch's TypeError.
    if (std::is_same_v<Signature, DimsDtype> && dim == nullptr && keepdim != nullptr) return false;
    // amax/amin take no dtype=, not even None: the wrapper's TypeError.
    if (std::is_same_v<Signature, Dims> && slots[kGiven] != nullptr) return false;
    a.keepdim = keepdim == Py_True;
    return true;
  }
  static at::Tensor run(const Args& a) {
    at::OptionalIntArrayRef dim;
    if (!a.all_dims || std::is_same_v<Signature, Dims>) dim = at::IntArrayRef(a.dims);  // amax(dim=None): all
    return Signature::call(dim_reduction_op<R, Signature>(), *a.input, ReduceCall{dim, a.keepdim, std::nullopt, a.ord});
  }
};

// layer_norm(input, normalized_shape, weight, bias, eps), rms_norm(input, normalized_shape, weight, eps), and
// their fused residual adds add_layer_norm / add_rms_norm(input, residual, normalized_shape, ...): (out, sum).
template <RowNorm kNorm, bool kAdd>
struct NormSpec {
  static constexpr bool kLayer = kNorm == RowNorm::Layer;
  static constexpr Entry kEntry = kLayer ? (kAdd ? Entry::add_layer_norm : Entry::layer_norm)
                                         : (kAdd ? Entry::add_rms_norm : Entry::rms_norm);
  static constexpr size_t kShape = kAdd ? 2 : 1;  // where normalized_shape is
  static constexpr auto kPositional = [] {
    if constexpr (kLayer && kAdd) {
      return std::array<const char*, 6>{"input", "residual", "normalized_shape", "weight", "bias", "eps"};
    } else if constexpr (kLayer) {
      return std::array<const char*, 5>{"input", "normalized_shape", "weight", "bias", "eps"};
    } else if constexpr (kAdd) {
      return std::array<const char*, 5>{"input", "residual", "normalized_shape", "weight", "eps"};
    } else {
      return std::array<const char*, 4>{"input", "normalized_shape", "weight", "eps"};
    }
  }();
  static constexpr std::array<const char*, 0> kKeywordOnly{};
  static constexpr size_t kGiven = kPositional.size();

  struct Args {
    const at::Tensor* input;
    const at::Tensor* residual;
    c10::SmallVector<int64_t, 8> shape;
    std::optional<at::Tensor> weight, bias;
    std::optional<double> eps;
  };
  static bool parse(PyObject* const* slots, Args& a) {
    if (kAdd) {
      if (slots[1] == nullptr || !is_plain_tensor(slots[1])) return false;
      a.residual = &tensor_of(slots[1]);
      // Nested (sizes() would throw outside the op's try), or another dtype or shape: the wrapper's (it
      // broadcasts and promotes them, as torch's input + residual).
      if (a.input->is_nested() || a.residual->is_nested()) return false;
      if (a.residual->scalar_type() != a.input->scalar_type() || !a.residual->sizes().equals(a.input->sizes()))
        return false;
    }
    if (slots[kShape] == nullptr || !read_ints(slots[kShape], a.shape)) return false;
    if (!read_optional_tensor(slots[kShape + 1], a.weight)) return false;
    if (kLayer && !read_optional_tensor(slots[kShape + 2], a.bias)) return false;
    // RMSNorm's weight in a dtype the kernels do not take: the wrapper casts it (_rms_weight).
    if (!kLayer && a.weight) {
      const at::ScalarType in = a.input->scalar_type(), w = a.weight->scalar_type();
      if (w != in && !(w == at::kFloat && (in == at::kHalf || in == at::kBFloat16))) return false;
    }
    PyObject* eps = slots[kShape + (kLayer ? 3 : 2)];
    if (eps == nullptr || eps == Py_None) {
      if (kLayer) a.eps = 1e-5;  // the wrapper's default (eps=None: the wrapper's error)
      return !(kLayer && eps == Py_None);  // rms_norm's None: the op's default, the dtype's machine epsilon
    }
    double value = 0;
    if (!read_float(eps, value)) return false;
    a.eps = value;
    return true;
  }
  static auto run(const Args& a) {
    using at::Tensor;
    using Optional = const std::optional<Tensor>&;
    const c10::SymIntArrayRef shape = c10::fromIntArrayRefSlow(a.shape);
    const auto op = [](const char* name, auto* signature) {
      return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<std::remove_pointer_t<decltype(signature)>>();
    };
    if constexpr (kLayer && kAdd) {
      using Fn = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, c10::SymIntArrayRef,
                                                              Optional, Optional, double);
      static const auto handle = op("reduce::add_layer_norm_fwd", static_cast<Fn*>(nullptr));
      const auto r = handle.call(*a.input, *a.residual, shape, a.weight, a.bias, *a.eps);
      return std::make_tuple(std::get<0>(r), std::get<1>(r));
    } else if constexpr (kLayer) {
      using Fn = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, c10::SymIntArrayRef, Optional, Optional, double);
      static const auto handle = op("reduce::layer_norm_fwd", static_cast<Fn*>(nullptr));
      return std::get<0>(handle.call(*a.input, shape, a.weight, a.bias, *a.eps));
    } else if constexpr (kAdd) {
      using Fn = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, c10::SymIntArrayRef, Optional,
                                                    std::optional<double>);
      static const auto handle = op("reduce::add_rms_norm_fwd", static_cast<Fn*>(nullptr));
      const auto r = handle.call(*a.input, *a.residual, shape, a.weight, a.eps);
      return std::make_tuple(std::get<0>(r), std::get<1>(r));
    } else {
      using Fn = std::tuple<Tensor, Tensor>(const Tensor&, c10::SymIntArrayRef, Optional, std::optional<double>);
      static const auto handle = op("reduce::rms_norm_fwd", static_cast<Fn*>(nullptr));
      return std::get<0>(handle.call(*a.input, shape, a.weight, a.eps));
    }
  }
};

// var_mean(input, dim, keepdim=, correction=): (var, mean). The wrapper's other forms (unbiased, positional or a
// bool in dim's place) are its own.
struct VarMeanSpec {
  static constexpr Entry kEntry = Entry::var_mean;
  static constexpr std::array<const char*, 4> kPositional{"input", "dim", "unbiased", "keepdim"};
  static constexpr std::array<const char*, 1> kKeywordOnly{"correction"};
  static constexpr size_t kGiven = kPositional.size() + kKeywordOnly.size();  // correction is read here

  struct Args {
    const at::Tensor* input;
    c10::SmallVector<int64_t, 8> dims;
    bool all_dims, keepdim;
    std::optional<at::Scalar> correction;
  };
  static bool parse(PyObject* const* slots, Args& a) {
    PyObject *dim = slots[1], *keepdim = slots[3], *correction = slots[4];
    if (slots[2] != nullptr) return false;
    a.all_dims = dim == nullptr || dim == Py_None;
    if (!a.all_dims && !read_ints(dim, a.dims)) return false;
    if (keepdim != nullptr && keepdim != Py_True && keepdim != Py_False) return false;
    a.keepdim = keepdim == Py_True;
    if (correction == nullptr || correction == Py_None) return true;
    int64_t whole = 0;
    double real = 0;
    if (read_int(correction, whole)) {
      a.correction = at::Scalar(whole);
    } else if (PyFloat_CheckExact(correction) && read_float(correction, real)) {
      a.correction = at::Scalar(real);
    } else {
      return false;
    }
    return true;
  }
  static std::tuple<at::Tensor, at::Tensor> run(const Args& a) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("reduce::var_mean", "")
                               .typed<std::tuple<at::Tensor, at::Tensor>(
                                   const at::Tensor&, at::OptionalIntArrayRef, const std::optional<at::Scalar>&, bool)>();
    at::OptionalIntArrayRef dim;
    if (!a.all_dims) dim = at::IntArrayRef(a.dims);
    return op.call(*a.input, dim, a.correction, a.keepdim);
  }
};

PyObject* wrap(const at::Tensor& t) { return THPVariable_Wrap(t); }

PyObject* wrap(const std::tuple<at::Tensor, at::Tensor>& pair) {
  PyObject* first = THPVariable_Wrap(std::get<0>(pair));
  PyObject* second = first == nullptr ? nullptr : THPVariable_Wrap(std::get<1>(pair));
  PyObject* tuple = second == nullptr ? nullptr : PyTuple_New(2);
  if (tuple == nullptr) {
    Py_XDECREF(first);
    Py_XDECREF(second);
    return nullptr;
  }
  PyTuple_SetItem(tuple, 0, first);
  PyTuple_SetItem(tuple, 1, second);
  return tuple;
}

// The slots of a call, `names` in order: its positional arguments, then its keyword ones by name (the first
// parameter by keyword is left to the wrapper). False where the wrapper must take the call: no positional
// argument, more than `positional`, or a name unknown or given twice (the wrapper's TypeError).
template <size_t N>
bool fill_slots(const std::array<const char*, N>& names, size_t positional, PyObject* const* args, Py_ssize_t nargs,
                PyObject* kwnames, std::array<PyObject*, N>& slots) {
  if (nargs < 1 || static_cast<size_t>(nargs) > positional) return false;
  for (Py_ssize_t i = 0; i < nargs; ++i) slots[i] = args[i];
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_Size(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GetItem(kwnames, k);
    size_t at = N;
    for (size_t j = 1; j < N; ++j)
      if (PyUnicode_CompareWithASCIIString(name, names[j]) == 0) at = j;
    if (at == N || slots[at] != nullptr) return false;
    slots[at] = args[nargs + k];
  }
  return true;
}

// result = run(), with the GIL released, as torch's bindings call ops; the warnings it gave, in `warnings`.
// False where it raised. An error of the op's own is dropped: the caller's fallback raises it again, or its own.
// An error raised by Python code the op called (a saved-tensor hook, a __torch_dispatch__ mode) is left set, and
// the caller returns it as it is (raised_in_python): running the call again would run that code again, and
// torch.utils.checkpoint's recomputation stops by such an error, which must reach it.
template <typename Result, typename Run>
bool run_released(Run run, Result& result, WarningSeen& warnings) {
  bool failed = false;
  PyThreadState* released = PyEval_SaveThread();
  try {
    const c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    result = run();
  } catch (...) {
    failed = true;
  }
  PyEval_RestoreThread(released);
  return !failed;
}

bool raised_in_python() { return PyErr_Occurred() != nullptr; }

template <typename Spec>
PyObject* entry_point(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  constexpr size_t kPositional = Spec::kPositional.size(), kAll = kPositional + Spec::kKeywordOnly.size();
  static constexpr std::array<const char*, kAll> kNames = [] {
    std::array<const char*, kAll> names{};
    for (size_t j = 0; j < kAll; ++j)
      names[j] = j < kPositional ? Spec::kPositional[j] : Spec::kKeywordOnly[j - kPositional];
    return names;
  }();
  const auto slow = [&] { return call_wrapper(Spec::kEntry, args, nargs, kwnames); };
  std::array<PyObject*, kAll> slots{};
  if (!fill_slots(kNames, kPositional, args, nargs, kwnames, slots)) return slow();
  for (size_t j = Spec::kGiven; j < kAll; ++j)
    if (slots[j] != nullptr && slots[j] != Py_None) return slow();
  if (!is_plain_tensor(slots[0]) || at::impl::torch_function_mode_enabled()) return slow();
  typename Spec::Args a{};
  a.input = &tensor_of(slots[0]);
  if (!Spec::parse(slots.data(), a)) return slow();
  decltype(Spec::run(a)) result;
  WarningSeen warnings;
  if (!run_released([&] { return Spec::run(a); }, result, warnings)) return raised_in_python() ? nullptr : slow();
  if (!warn_in_python(warnings)) return nullptr;
  return wrap(result);
}

// clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None). The common call
// (a list, tuple or other iterable of plain leaf parameters, at least one with a gradient, every gradient a
// plain tensor; numbers for max_norm and norm_type; error_if_nonfinite False; foreach None or False) reads the
// gradients here and calls the op: the wrapper's `[p.grad for p in parameters]` alone took 84 us for 1,000
// parameters (2 cores), against 573 us for the op on them. An iterable that is not a list or tuple (a
// generator, as model.parameters() is) is read into a list first, which the wrapper gets in its place if it
// takes the call. The op scales the gradients in place, so a call that warned is not run again: its warnings
// become Python's here; one that raised did so before scaling any (its checks come first) and is run again.
// A gradient is seen as C++ sees it: a subclass with __torch_dispatch__ (DTensor) goes to the wrapper, but the
// __torch_function__ of a gradient set by hand to a Python-only subclass is not consulted.
PyObject* clip_grad_norm_entry(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  static constexpr std::array<const char*, 5> kNames{"parameters", "max_norm", "norm_type", "error_if_nonfinite",
                                                     "foreach"};
  std::array<PyObject*, 5> slots{};
  PyObject* torch_tensor = plain_type_items[0];
  if (!fill_slots(kNames, kNames.size(), args, nargs, kwnames, slots) || torch_tensor == nullptr) {
    return call_wrapper(Entry::clip_grad_norm_, args, nargs, kwnames);
  }
  PyObject* parameters = slots[0];  // args[0]: the parameters by keyword are the wrapper's
  const int is_tensor = PyObject_IsInstance(parameters, torch_tensor);
  if (is_tensor != 0) return is_tensor < 0 ? nullptr : call_wrapper(Entry::clip_grad_norm_, args, nargs, kwnames);
  const bool sequence = PyList_CheckExact(parameters) || PyTuple_CheckExact(parameters);
  PyObject* list = sequence ? (Py_INCREF(parameters), parameters) : PySequence_List(parameters);
  if (list == nullptr) return nullptr;  // not iterable, or its iteration raised: the wrapper's list() would too
  if (!sequence && PyList_Size(list) == 0) {  // the wrapper warns of an empty generator, which it still is
    Py_DECREF(list);
    return call_wrapper(Entry::clip_grad_norm_, args, nargs, kwnames);
  }
  const auto slow = [&] {
    const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_Size(kwnames);
    c10::SmallVector<PyObject*, 8> given(args, args + nargs + nkw);
    given[0] = list;
    PyObject* result = call_wrapper(Entry::clip_grad_norm_, given.data(), nargs, kwnames);
    Py_DECREF(list);
    return result;
  };
  double max_norm = 0, norm_type = 2.0;
  PyObject *error_if_nonfinite = slots[3], *foreach = slots[4];
  if (slots[1] == nullptr || !read_float(slots[1], max_norm)) return slow();
  if (slots[2] != nullptr && !read_float(slots[2], norm_type)) return slow();
  if (error_if_nonfinite != nullptr && error_if_nonfinite != Py_False) return slow();
  if (foreach != nullptr && foreach != Py_None && foreach != Py_False) return slow();
  if (at::impl::torch_function_mode_enabled()) return slow();
  const bool is_list = PyList_CheckExact(list);
  const Py_ssize_t n = is_list ? PyList_Size(list) : PyTuple_Size(list);
  std::vector<at::Tensor> grads;
  grads.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = is_list ? PyList_GetItem(list, i) : PyTuple_GetItem(list, i);
    if (!is_plain_tensor(item)) return slow();
    const at::Tensor* grad = leaf_grad(tensor_of(item));
    if (grad == nullptr) return slow();  // p.grad warns on a non-leaf
    const at::Tensor& g = *grad;
    if (!g.defined()) continue;
    if (g.key_set().has(c10::DispatchKey::Python)) return slow();  // a tensor subclass (DTensor, ...)
    grads.push_back(g);
  }
  if (grads.empty()) return slow();
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("reduce::clip_grad_norm_", "")
                             .typed<at::Tensor(at::TensorList, double, double, bool)>();
  const bool foreach_route = foreach != Py_False;  // None: torch's route for plain tensors
  at::Tensor total;
  WarningSeen warnings;
  const bool ran = run_released([&] {
    const at::NoGradGuard no_grad;  // the wrapper's torch.no_grad()
    return op.call(grads, max_norm, norm_type, foreach_route);
  }, total, warnings);
  if (!ran) {
    if (!raised_in_python()) return slow();
    Py_DECREF(list);
    return nullptr;
  }
  Py_DECREF(list);
  if (!warn_in_python(warnings)) return nullptr;
  return wrap(total);
}

PyMethodDef* methods();

// {name: (wrapper, docstring)}: each entry point's Python wrapper, and its docstring (the wrapper's signature and
// doc, read by help() and inspect.signature when asked, so it may be set after the module is made).
PyObject* fast_call_setup(PyObject*, PyObject* args) {
  PyObject *types = nullptr, *table = nullptr;
  if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &types, &PyDict_Type, &table)) return nullptr;
  if (PyTuple_Size(types) > static_cast<Py_ssize_t>(plain_type_items.size())) {
    PyErr_SetString(PyExc_ValueError, "_fast_call_setup: at most two plain tensor types");
    return nullptr;
  }
  static std::array<std::string, kEntries> docs;
  Py_ssize_t pos = 0;
  PyObject *key = nullptr, *value = nullptr;
  while (PyDict_Next(table, &pos, &key, &value)) {
    PyObject *fn = nullptr, *doc = nullptr;
    if (!PyArg_ParseTuple(value, "OU", &fn, &doc)) return nullptr;
    const char* name = PyUnicode_AsUTF8AndSize(key, nullptr);
    const char* text = PyUnicode_AsUTF8AndSize(doc, nullptr);
    if (name == nullptr || text == nullptr) return nullptr;
    size_t i = 0;
    PyMethodDef* m = methods();
    for (; m[i].ml_name != nullptr && std::string(m[i].ml_name) != name; ++i) {
    }
    if (i >= kEntries) {
      PyErr_Format(PyExc_KeyError, "torch_reduce._C has no entry point %s", name);
      return nullptr;
    }
    docs[i] = text;
    m[i].ml_doc = docs[i].c_str();
    Py_INCREF(fn);
    Py_XDECREF(wrappers[i]);
    wrappers[i] = fn;
  }
  Py_INCREF(types);
  Py_XDECREF(plain_types);
  plain_types = types;
  plain_type_items = {};
  for (Py_ssize_t i = 0; i < PyTuple_Size(types); ++i) plain_type_items[i] = PyTuple_GetItem(types, i);
  Py_RETURN_NONE;
}

using FastCall = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*);

PyCFunction as_method(FastCall f) { return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f)); }

constexpr int kFastCall = METH_FASTCALL | METH_KEYWORDS;

PyMethodDef* methods() {  // in Entry's order
#define TORCH_REDUCE_METHOD(name, reduction, Signature) \
  {#name, as_method(&entry_point<DimReductionSpec<Reduction::reduction, Signature>>), kFastCall, nullptr},
  static PyMethodDef table[] = {
      TORCH_REDUCE_DIM_REDUCTIONS(TORCH_REDUCE_METHOD)
      {"layer_norm", as_method(&entry_point<NormSpec<RowNorm::Layer, false>>), kFastCall, nullptr},
      {"rms_norm", as_method(&entry_point<NormSpec<RowNorm::Rms, false>>), kFastCall, nullptr},
      {"add_layer_norm", as_method(&entry_point<NormSpec<RowNorm::Layer, true>>), kFastCall, nullptr},
      {"add_rms_norm", as_method(&entry_point<NormSpec<RowNorm::Rms, true>>), kFastCall, nullptr},
      {"var_mean", as_method(&entry_point<VarMeanSpec>), kFastCall, nullptr},
      {"clip_grad_norm_", as_method(&clip_grad_norm_entry), kFastCall, nullptr},
      {"_fast_call_setup", &fast_call_setup, METH_VARARGS,
       "_fast_call_setup(plain_types, {name: (wrapper, docstring)}): the tensor types read directly, and entry "
       "points' Python wrappers and docstrings."},
      {nullptr, nullptr, 0, nullptr}};
#undef TORCH_REDUCE_METHOD
  return table;
}

}  // namespace

PyMethodDef* fast_call_methods() { return methods(); }

}  // namespace torch_reduce
