// Argument walking for the engine's op keys: the hot loop of executor._Collector.
//
// Every op call (Strict, Debug and DeferAndFuse alike) walks its arguments into a
// hashable key plus its runtime inputs. In Python each tpu tensor costs ~2 us
// (device, dtype, storage lookup, buffer attribute, shape, stride, offset), and a
// training step walks ~1000 of them, mostly the parameter lists of foreach ops.
// This file does the common cases in C++ with the same results, element for element,
// as the Python methods, which stay the reference: anything unusual (a tensor on
// another device, a lazy conj/neg view, a generator) is handed back to them.
#include <torch/extension.h>

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include "engine_native.h"
#include "py_helpers.h"

namespace torchtpu {
namespace {

// Set once by _collect_setup: the numpy -> torch dtype map, the storage attribute
// holding the buffer, and the interned names used on every call.
PyObject* g_numpy_to_torch = nullptr;
PyObject* g_buffer_attr = nullptr;
PyObject* g_generator_type = nullptr;
PyObject *s_storages, *s_skeys, *s_storage_index, *s_inputs, *s_device, *s_has_f64, *s_tensor, *s_generator,
    *s_dtype, *s_shape, *s_dtype_slot, *s_shape_slot;
PyObject *k_T, *k_L, *k_V, *k_S, *k_U, *k_B, *k_storage, *k_scalar;

// A collector's state, read once per walk and written back before any call into
// Python (which may change it) and at the end.
struct State {
  py::handle col;
  py::object storages, skeys, storage_index, inputs;
  long device = -1;  // -1: None
  bool has_f64 = false;

  explicit State(py::handle c) : col(c) {
    storages = col.attr(s_storages);
    skeys = col.attr(s_skeys);
    storage_index = col.attr(s_storage_index);
    inputs = col.attr(s_inputs);
    load_scalars();
  }
  void load_scalars() {
    py::object d = col.attr(s_device);
    device = d.is_none() ? -1 : d.cast<long>();
    has_f64 = PyObject_IsTrue(py::object(col.attr(s_has_f64)).ptr()) == 1;
  }
  void store_scalars() const {
    col.attr(s_device) = device < 0 ? py::none() : py::object(py::int_(device));
    col.attr(s_has_f64) = py::bool_(has_f64);
  }
  // The Python method `name` of the collector on `v`, for the cases kept in Python.
  py::object python(PyObject* name, py::handle v) {
    store_scalars();
    py::object out = col.attr(name)(v);
    load_scalars();
    return out;
  }
};

// A buffer's shape or dtype. A Buffer keeps them in slots (set by whoever made it; None
// until PJRT is asked through the property): reading the slot skips a Python frame per
// tensor. A Pending has plain shape and dtype attributes.
py::object buffer_field(py::handle buf, PyObject* slot_name, PyObject* property_name) {
  PyObject* raw = nullptr;
  if (_PyObject_LookupAttr(buf.ptr(), slot_name, &raw) < 0) throw py::error_already_set();
  if (raw != nullptr && raw != Py_None) return py::reinterpret_steal<py::object>(raw);
  Py_XDECREF(raw);
  return buf.attr(property_name);
}

// isinstance(v, torch.Tensor) at C level. THPVariable_Check calls PyObject_IsInstance, which
// for anything but an exact torch.Tensor (an int, None, a list, a Parameter) looks up and calls
// the metaclass's __instancecheck__: a Python-level call per argument value. torch.Tensor's
// metaclass does not override it, so the subtype check says the same.
inline bool is_tensor(PyObject* v) {
  return THPVariableClass != nullptr && PyObject_TypeCheck(v, reinterpret_cast<PyTypeObject*>(THPVariableClass));
}

py::object int_tuple(c10::IntArrayRef values) {
  py::tuple out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    PyTuple_SET_ITEM(out.ptr(), i, PyLong_FromLongLong(values[i]));
  }
  return out;
}

py::object tensor_spec(State& st, py::handle v) {
  const at::Tensor& t = THPVariable_Unpack(v.ptr());
  const c10::Device dev = t.device();
  if (dev.type() != c10::DeviceType::PrivateUse1 || t.is_conj() || t.is_neg()) {
    return st.python(s_tensor, v);  // a host scalar, a device mismatch error, a lazy view
  }
  const long idx = dev.has_index() ? dev.index() : 0;
  if (st.device >= 0 && st.device != idx) {
    return st.python(s_tensor, v);  // raises PyTorch's two-devices error
  }
  st.device = idx;
  const at::ScalarType type = t.scalar_type();
  if (type == at::kDouble || type == at::kComplexDouble) {
    st.has_f64 = true;
  }
  py::handle dtype(reinterpret_cast<PyObject*>(torch::getTHPDtype(type)));
  const c10::Storage& storage = t.storage();
  py::object sid = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(storage.unsafeGetStorageImpl()));
  PyObject* found = PyDict_GetItemWithError(st.storage_index.ptr(), sid.ptr());
  py::object slot;
  if (found != nullptr) {
    slot = py::reinterpret_borrow<py::object>(found);
  } else {
    if (PyErr_Occurred()) throw py::error_already_set();
    slot = py::int_(PyList_GET_SIZE(st.storages.ptr()));
    if (PyDict_SetItem(st.storage_index.ptr(), sid.ptr(), slot.ptr()) != 0) throw py::error_already_set();
    py::object s = py::reinterpret_steal<py::object>(THPStorage_Wrap(storage));
    if (!s) throw py::error_already_set();
    if (PyList_Append(st.storages.ptr(), s.ptr()) != 0) throw py::error_already_set();
    const int64_t nbytes = static_cast<int64_t>(storage.nbytes());
    PyObject* raw_buf = nullptr;
    // (the 3.11 spelling of PyObject_GetOptionalAttr: no AttributeError raised for a missing buffer)
    if (_PyObject_LookupAttr(s.ptr(), g_buffer_attr, &raw_buf) < 0) throw py::error_already_set();
    py::object buf = py::reinterpret_steal<py::object>(raw_buf);
    py::object skey;
    if (!buf || buf.is_none()) {
      py::int_ numel(nbytes / static_cast<int64_t>(c10::elementSize(type)));
      skey = tuple_of({k_U, numel, dtype});
    } else {
      py::object np_dtype = buffer_field(buf, s_dtype_slot, s_dtype);
      PyObject* dt = PyDict_GetItemWithError(g_numpy_to_torch, np_dtype.ptr());
      if (dt == nullptr) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, np_dtype.ptr());
        throw py::error_already_set();
      }
      const auto buf_type = reinterpret_cast<THPDtype*>(dt)->scalar_type;
      py::int_ numel(nbytes / static_cast<int64_t>(c10::elementSize(buf_type)));
      py::object shape = buffer_field(buf, s_shape_slot, s_shape);
      skey = tuple_of({k_B, shape, py::handle(dt), numel});
    }
    if (PyList_Append(st.skeys.ptr(), skey.ptr()) != 0) throw py::error_already_set();
    py::object input = tuple_of({k_storage, slot});
    if (PyList_Append(st.inputs.ptr(), input.ptr()) != 0) throw py::error_already_set();
  }
  py::object shape = int_tuple(t.sizes());
  py::object stride = int_tuple(t.strides());
  py::int_ offset(t.storage_offset());
  return tuple_of({k_T, slot, dtype, shape, stride, offset});
}

py::object scalar_spec(State& st, py::handle v) {
  py::int_ slot(PyList_GET_SIZE(st.inputs.ptr()));
  py::handle dtype, kind;
  if (PyBool_Check(v.ptr())) {
    dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(at::kBool));
    kind = reinterpret_cast<PyObject*>(&PyBool_Type);
  } else if (PyLong_Check(v.ptr())) {
    dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(at::kLong));
    kind = reinterpret_cast<PyObject*>(&PyLong_Type);
  } else {  // a float: its dtype is decided by the op's other arguments (see has_f64)
    dtype = Py_None;
    kind = reinterpret_cast<PyObject*>(&PyFloat_Type);
  }
  py::object input = tuple_of({k_scalar, v, dtype});
  if (PyList_Append(st.inputs.ptr(), input.ptr()) != 0) throw py::error_already_set();
  return tuple_of({k_S, slot, kind});
}

py::object walk(State& st, py::handle v, bool runtime_scalar) {
  PyObject* p = v.ptr();
  if (is_tensor(p)) {
    return tensor_spec(st, v);
  }
  const bool is_list = PyList_Check(p);
  if (is_list || PyTuple_Check(p)) {
    const Py_ssize_t n = is_list ? PyList_GET_SIZE(p) : PyTuple_GET_SIZE(p);
    PyObject* first = n > 0 ? (is_list ? PyList_GET_ITEM(p, 0) : PyTuple_GET_ITEM(p, 0)) : nullptr;
    if (first != nullptr && (is_tensor(first) || first == Py_None || runtime_scalar)) {
      py::tuple items(n);
      for (Py_ssize_t i = 0; i < n; ++i) {
        // re-read each time: a call into Python may not resize a list we hold, but be safe
        py::handle x = is_list ? PyList_GET_ITEM(p, i) : PyTuple_GET_ITEM(p, i);
        py::object spec = is_tensor(x.ptr()) ? tensor_spec(st, x) : walk(st, x, runtime_scalar);
        PyTuple_SET_ITEM(items.ptr(), i, spec.release().ptr());
      }
      return tuple_of({k_L, items});
    }
    py::object as_tuple = is_list ? py::reinterpret_steal<py::object>(PyList_AsTuple(p))
                                  : py::reinterpret_borrow<py::object>(p);
    return tuple_of({k_V, as_tuple});
  }
  if (runtime_scalar && (PyLong_Check(p) || PyFloat_Check(p))) {
    return scalar_spec(st, v);
  }
  // A C-level subtype check: torch.Generator's metaclass has a Python __instancecheck__,
  // and PyObject_IsInstance would run it for every int, None or dtype argument.
  if (PyObject_TypeCheck(p, reinterpret_cast<PyTypeObject*>(g_generator_type))) {
    return st.python(s_generator, v);
  }
  return tuple_of({k_V, v});
}

// ---- the same walk, as OpKey words (DeferAndFuse's native record, csrc/defer.cpp) ----------
//
// A call whose key was recorded before only needs its key to find what recording needs
// (deferred._OpInfo); the spec tuples walk() builds, three per tensor, were then made only
// to be encoded into the key's words and dropped. KeyWalker writes those words directly,
// word for word what OpKey's encoding of walk_all's specs and storage keys gives (tests
// compare them), and fills the collector's storages and inputs as walk() does. It declines
// (returns false) wherever walk() would call back into Python.
class KeyWalker {
 public:
  KeyWalker(py::handle col, WalkedKey& out)
      : col_(col), storages_(col.attr(s_storages)), inputs_(col.attr(s_inputs)), out_(out) {}

  bool value(PyObject* p, bool runtime_scalar, std::vector<uint64_t>& words) {
    if (is_tensor(p)) return tensor(p, words);
    const bool is_list = PyList_Check(p);
    if (is_list || PyTuple_Check(p)) {
      const Py_ssize_t n = is_list ? PyList_GET_SIZE(p) : PyTuple_GET_SIZE(p);
      PyObject* first = n > 0 ? (is_list ? PyList_GET_ITEM(p, 0) : PyTuple_GET_ITEM(p, 0)) : nullptr;
      if (first != nullptr && (is_tensor(first) || first == Py_None || runtime_scalar)) {
        words.push_back(key_tuple_word(2));
        append_key_str("L", words);
        words.push_back(key_tuple_word(static_cast<size_t>(n)));
        for (Py_ssize_t i = 0; i < n; ++i) {
          PyObject* x = is_list ? PyList_GET_ITEM(p, i) : PyTuple_GET_ITEM(p, i);
          if (!(is_tensor(x) ? tensor(x, words) : value(x, runtime_scalar, words))) return false;
        }
        return true;
      }
      py::object as_tuple = is_list ? steal(PyList_AsTuple(p)) : py::reinterpret_borrow<py::object>(p);
      words.push_back(key_tuple_word(2));
      append_key_str("V", words);
      return append_key_words(as_tuple.ptr(), words);
    }
    if (runtime_scalar && (PyLong_Check(p) || PyFloat_Check(p))) return scalar(p, words);
    if (PyObject_TypeCheck(p, reinterpret_cast<PyTypeObject*>(g_generator_type))) return false;
    words.push_back(key_tuple_word(2));
    append_key_str("V", words);
    return append_key_words(p, words);
  }

 private:
  // tensor_spec's ("T", slot, dtype, shape, stride, offset), and its storage key on first sight
  bool tensor(PyObject* v, std::vector<uint64_t>& words) {
    const at::Tensor& t = THPVariable_Unpack(v);
    const c10::Device dev = t.device();
    if (dev.type() == c10::DeviceType::CPU && t.dim() == 0 && !t.is_conj() && !t.is_neg()) {
      // a host scalar (lr, a step count): _Collector.tensor's ("C", slot, dtype) and its host input
      return append_key_words(py::object(col_.attr(s_tensor)(py::handle(v))).ptr(), words);
    }
    if (dev.type() != c10::DeviceType::PrivateUse1 || t.is_conj() || t.is_neg()) return false;
    const long idx = dev.has_index() ? dev.index() : 0;
    if (out_.device >= 0 && out_.device != idx) return false;
    out_.device = idx;
    const at::ScalarType type = t.scalar_type();
    if (type == at::kDouble || type == at::kComplexDouble) out_.has_f64 = true;
    const c10::Storage& storage = t.storage();
    const c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    size_t slot = 0;
    while (slot < seen_.size() && seen_[slot] != impl) ++slot;
    if (slot == seen_.size()) {
      seen_.push_back(impl);
      if (!storage_key(storage, type, slot)) return false;
    }
    words.push_back(key_tuple_word(6));
    append_key_str("T", words);
    append_key_int(static_cast<int64_t>(slot), words);
    words.push_back(key_dtype_word(type));
    const auto ints = [&](c10::IntArrayRef values) {
      words.push_back(key_tuple_word(values.size()));
      for (const int64_t x : values) append_key_int(x, words);
    };
    ints(t.sizes());
    ints(t.strides());
    append_key_int(t.storage_offset(), words);
    return true;
  }

  // tensor_spec's storage key, ("U", numel, dtype) or ("B", shape, dtype, numel), and its input
  bool storage_key(const c10::Storage& storage, at::ScalarType type, size_t slot) {
    py::object s = steal(THPStorage_Wrap(storage));
    check(PyList_Append(storages_.ptr(), s.ptr()));
    const auto nbytes = static_cast<int64_t>(storage.nbytes());
    PyObject* raw_buf = nullptr;
    if (_PyObject_LookupAttr(s.ptr(), g_buffer_attr, &raw_buf) < 0) throw py::error_already_set();
    py::object buf = py::reinterpret_steal<py::object>(raw_buf);
    std::vector<uint64_t>& words = out_.skeys;
    if (!buf || buf.is_none()) {
      words.push_back(key_tuple_word(3));
      append_key_str("U", words);
      append_key_int(nbytes / static_cast<int64_t>(c10::elementSize(type)), words);
      words.push_back(key_dtype_word(type));
    } else {
      py::object np_dtype = buffer_field(buf, s_dtype_slot, s_dtype);
      PyObject* dt = PyDict_GetItemWithError(g_numpy_to_torch, np_dtype.ptr());
      if (dt == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return false;
      }
      const auto buf_type = reinterpret_cast<THPDtype*>(dt)->scalar_type;
      py::object shape = buffer_field(buf, s_shape_slot, s_shape);
      words.push_back(key_tuple_word(4));
      append_key_str("B", words);
      if (!append_key_words(shape.ptr(), words)) return false;
      words.push_back(key_dtype_word(buf_type));
      append_key_int(nbytes / static_cast<int64_t>(c10::elementSize(buf_type)), words);
    }
    ++out_.n_skeys;
    check(PyList_Append(inputs_.ptr(), tuple_of({k_storage, py::int_(slot)}).ptr()));
    return true;
  }

  // scalar_spec's ("S", slot, kind), and its ("scalar", value, dtype) input
  bool scalar(PyObject* p, std::vector<uint64_t>& words) {
    const Py_ssize_t slot = PyList_GET_SIZE(inputs_.ptr());
    py::handle dtype, kind;
    if (PyBool_Check(p)) {
      dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(at::kBool));
      kind = reinterpret_cast<PyObject*>(&PyBool_Type);
    } else if (PyLong_Check(p)) {
      dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(at::kLong));
      kind = reinterpret_cast<PyObject*>(&PyLong_Type);
    } else {
      dtype = Py_None;
      kind = reinterpret_cast<PyObject*>(&PyFloat_Type);
    }
    check(PyList_Append(inputs_.ptr(), tuple_of({k_scalar, p, dtype}).ptr()));
    words.push_back(key_tuple_word(3));
    append_key_str("S", words);
    append_key_int(slot, words);
    append_key_identity(kind.ptr(), words);
    return true;
  }

  py::handle col_;
  py::object storages_, inputs_;
  std::vector<const c10::StorageImpl*> seen_;  // storage slot -> its storage (a call has few)
  WalkedKey& out_;
};

}  // namespace

bool walk_key(py::handle col, py::handle values, py::handle runtime_scalar, WalkedKey& out) {
  TORCH_CHECK(g_numpy_to_torch != nullptr, "torchtpu._C._collect_setup was not called");
  TORCH_CHECK_INDEX(PyList_Check(values.ptr()) && PyList_Check(runtime_scalar.ptr()) &&
                        PyList_GET_SIZE(runtime_scalar.ptr()) >= PyList_GET_SIZE(values.ptr()),
                    "more argument values than schema arguments");
  KeyWalker walker(col, out);
  const Py_ssize_t n = PyList_GET_SIZE(values.ptr());
  out.n_specs = static_cast<size_t>(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const bool runtime_scalar_arg = PyList_GET_ITEM(runtime_scalar.ptr(), i) == Py_True;
    if (!walker.value(PyList_GET_ITEM(values.ptr(), i), runtime_scalar_arg, out.specs)) return false;
  }
  return true;
}

py::tuple walk_all(py::handle col, py::handle values_obj, py::handle runtime_scalar) {
  TORCH_CHECK(g_numpy_to_torch != nullptr, "torchtpu._C._collect_setup was not called");
  py::object values = py::reinterpret_steal<py::object>(PySequence_Fast(values_obj.ptr(), "values"));
  if (!values) throw py::error_already_set();
  State st(col);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(values.ptr());
  py::list specs(n);
  bool has_generator = false;
  TORCH_CHECK_INDEX(PyList_Check(runtime_scalar.ptr()) && PyList_GET_SIZE(runtime_scalar.ptr()) >= n,
                    "more argument values than schema arguments");
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* flag = PyList_GET_ITEM(runtime_scalar.ptr(), i);
    py::object spec = walk(st, PySequence_Fast_GET_ITEM(values.ptr(), i), flag == Py_True);
    PyObject* head = PyTuple_GET_ITEM(spec.ptr(), 0);
    if (PyUnicode_Check(head) && PyUnicode_CompareWithASCIIString(head, "G") == 0) {
      has_generator = true;
    }
    PyList_SET_ITEM(specs.ptr(), i, spec.release().ptr());
  }
  st.store_scalars();
  return py::make_tuple(specs, has_generator);
}

// The Buffer a storage holds (a new reference), or nullptr where it holds none or an object of
// another type than ``buffer_type`` (a DeferAndFuse Pending): _storage_buffers' and _weak_buffers'
// test of each storage.
static PyObject* exact_buffer(PyObject* storage, PyObject* buffer_type) {
  PyObject* raw = nullptr;
  if (_PyObject_LookupAttr(storage, g_buffer_attr, &raw) < 0) throw py::error_already_set();
  if (raw != nullptr && Py_TYPE(raw) != reinterpret_cast<PyTypeObject*>(buffer_type)) {
    Py_DECREF(raw);
    return nullptr;
  }
  return raw;
}

void register_collect(py::module& m) {
  m.def("_collect_setup", [](py::object numpy_to_torch, py::str buffer_attr, py::object generator_type) {
    // Leaked on purpose, like the interned names: they live as long as the module.
    g_numpy_to_torch = numpy_to_torch.release().ptr();
    g_buffer_attr = buffer_attr.release().ptr();
    g_generator_type = generator_type.release().ptr();
    intern_all({{&s_storages, "storages"}, {&s_skeys, "skeys"}, {&s_storage_index, "storage_index"}, {&s_inputs, "inputs"},
                {&s_device, "device"}, {&s_has_f64, "has_f64"}, {&s_tensor, "tensor"}, {&s_generator, "generator"},
                {&s_dtype, "dtype"}, {&s_shape, "shape"},
                {&s_dtype_slot, "_dtype"}, {&s_shape_slot, "_shape"}, {&k_T, "T"}, {&k_L, "L"},
                {&k_V, "V"}, {&k_S, "S"}, {&k_U, "U"}, {&k_B, "B"},
                {&k_storage, "storage"}, {&k_scalar, "scalar"}});
  });
  m.def(
      "_walk",
      [](py::handle col, py::handle value, bool runtime_scalar) {
        TORCH_CHECK(g_numpy_to_torch != nullptr, "torchtpu._C._collect_setup was not called");
        State st(col);
        py::object spec = walk(st, value, runtime_scalar);
        st.store_scalars();
        return spec;
      },
      "one argument's spec (see executor._Collector.walk)");
  m.def("_walk_all", &walk_all, "(specs, has_generator) of a call's schema values (see executor.run_plan)");
  m.def(
      "_storage_buffers",
      [](py::handle inputs, py::handle storages, py::handle skeys, py::handle buffer_type) -> py::object {
        // executor.execute_and_bind's loop over a launch's inputs, for the common case where each
        // is a storage: its buffer, in order, skipping storages the program does not read ("U"
        // keys). None, having changed nothing, where an input is anything else (a scalar, a host
        // value, a seed) or a storage holds no Buffer (a DeferAndFuse Pending): Python's loop then.
        TORCH_CHECK(g_buffer_attr != nullptr, "torchtpu._C._collect_setup was not called");
        TORCH_CHECK(PyList_Check(inputs.ptr()) && PyList_Check(storages.ptr()) &&
                        (PyTuple_Check(skeys.ptr()) || PyList_Check(skeys.ptr())),
                    "_storage_buffers(inputs: list, storages: list, skeys: tuple or list, buffer_type)");
        const auto is = [](PyObject* o, PyObject* interned) {  // (kinds are interned; equal strings too)
          return o == interned || (PyUnicode_Check(o) && PyUnicode_Compare(o, interned) == 0);
        };
        const Py_ssize_t n_skeys = PySequence_Fast_GET_SIZE(skeys.ptr());
        const Py_ssize_t n = PyList_GET_SIZE(inputs.ptr());
        py::list buffers;
        for (Py_ssize_t i = 0; i < n; ++i) {
          PyObject* inp = PyList_GET_ITEM(inputs.ptr(), i);
          if (!PyTuple_Check(inp) || PyTuple_GET_SIZE(inp) != 2 || !is(PyTuple_GET_ITEM(inp, 0), k_storage)) {
            return py::none();
          }
          const Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(inp, 1));
          if (slot < 0 || slot >= n_skeys || slot >= PyList_GET_SIZE(storages.ptr())) {
            if (PyErr_Occurred()) throw py::error_already_set();
            return py::none();
          }
          PyObject* skey = PySequence_Fast_GET_ITEM(skeys.ptr(), slot);
          if (PyTuple_Check(skey) && PyTuple_GET_SIZE(skey) > 0 && is(PyTuple_GET_ITEM(skey, 0), k_U)) continue;
          py::object buf = py::reinterpret_steal<py::object>(
              exact_buffer(PyList_GET_ITEM(storages.ptr(), slot), buffer_type.ptr()));
          if (!buf) return py::none();
          check(PyList_Append(buffers.ptr(), buf.ptr()));
        }
        return std::move(buffers);
      },
      "the buffers of a launch's storage inputs, or None (see executor.execute_and_bind)");
  m.def(
      "_weak_buffers",
      [](py::handle refs, py::handle buffer_type) -> py::object {
        // graphs.TPUGraph._current_buffers: the buffers the storages behind ``refs`` (weak references)
        // hold now, in order; None, for Python to name the fault, where a storage is gone or holds
        // anything but a Buffer (none yet, a DeferAndFuse Pending). A replay reads ~180 of them:
        // 20 us as a comprehension, the host's work of every replayed decoding step.
        TORCH_CHECK(g_buffer_attr != nullptr, "torchtpu._C._collect_setup was not called");
        TORCH_CHECK(PyList_Check(refs.ptr()), "_weak_buffers(refs: list, buffer_type)");
        const Py_ssize_t n = PyList_GET_SIZE(refs.ptr());
        py::list buffers(n);
        for (Py_ssize_t i = 0; i < n; ++i) {
          PyObject* ref = PyList_GET_ITEM(refs.ptr(), i);
          if (!PyWeakref_Check(ref)) return py::none();
          PyObject* storage = PyWeakref_GET_OBJECT(ref);  // borrowed; Py_None once it died
          if (storage == Py_None) return py::none();
          PyObject* buf = exact_buffer(storage, buffer_type.ptr());
          if (buf == nullptr) return py::none();
          PyList_SET_ITEM(buffers.ptr(), i, buf);  // steals the reference
        }
        return std::move(buffers);
      },
      "the buffers of weakly referenced storages, or None (see graphs.TPUGraph._current_buffers)");
  m.def(
      "_same_storages",
      [](py::handle args, py::handle checks) -> bool {
        // compile/replayed.py's _Capture.matches: whether each (position, storage weakref, offset)
        // of ``checks`` names args[position]'s storage and offset: the tensors a replay reads in
        // place (parameters, a KV cache) are this call's. Compared as storage implementations, so a
        // call may pass another tensor object on the same storage (AOTAutograd does).
        TORCH_CHECK((PyList_Check(args.ptr()) || PyTuple_Check(args.ptr())) && PyList_Check(checks.ptr()),
                    "_same_storages(args: list or tuple, checks: list)");
        const Py_ssize_t n_args = PySequence_Fast_GET_SIZE(args.ptr());
        const Py_ssize_t n = PyList_GET_SIZE(checks.ptr());
        for (Py_ssize_t k = 0; k < n; ++k) {
          PyObject* check_item = PyList_GET_ITEM(checks.ptr(), k);
          TORCH_CHECK(PyTuple_Check(check_item) && PyTuple_GET_SIZE(check_item) == 3,
                      "_same_storages: each check is (position, storage weakref, offset)");
          const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(check_item, 0));
          if (i < 0 || i >= n_args) {
            if (PyErr_Occurred()) throw py::error_already_set();
            return false;
          }
          PyObject* arg = PySequence_Fast_GET_ITEM(args.ptr(), i);
          PyObject* ref = PyTuple_GET_ITEM(check_item, 1);
          if (!THPVariable_Check(arg) || !PyWeakref_Check(ref)) return false;
          PyObject* storage = PyWeakref_GET_OBJECT(ref);
          if (storage == Py_None || !THPStorage_Check(storage)) return false;
          const at::Tensor& t = THPVariable_Unpack(arg);
          if (!t.has_storage() || t.storage().unsafeGetStorageImpl() != THPStorage_Unpack(storage).unsafeGetStorageImpl()) {
            return false;
          }
          const int64_t offset = PyLong_AsLongLong(PyTuple_GET_ITEM(check_item, 2));
          if (offset == -1 && PyErr_Occurred()) throw py::error_already_set();
          if (t.storage_offset() != offset) return false;
        }
        return true;
      },
      "whether the checked arguments are on the given storages at the given offsets (see compile/replayed.py)");
}

}  // namespace torchtpu
