// DeferAndFuse recording: the per-input and per-output bookkeeping of deferred.record().
//
// Recording an op classifies each collected input (a buffer argument, a value of this
// graph, a cut graph's pending result, a scalar...) into the node's inputs and the graph's
// wiring, then gives each output storage a Pending value. A GPT training step runs these
// loops ~700 times for inputs and ~370 for outputs; in Python they were a third of the
// recording time. This file does them with the same objects and in the same order as
// deferred._record_io_python, which stays as the reference (and handles RNG seeds).
#include <torch/extension.h>

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "engine_native.h"
#include "py_helpers.h"

namespace torchtpu {

py::tuple new_tensor_with_data(py::handle size_obj, py::handle stride_obj, py::handle dtype, int index,
                               py::handle attr, py::handle data);  // shim.cpp

namespace {

// Set once by _record_setup (leaked on purpose: they live as long as the module).
PyObject *g_pending_type, *g_node_type, *g_attr, *g_uninit, *g_uninit_wire, *g_f32, *g_f64, *g_empty;
PyObject *k_storage, *k_scalar, *k_host, *k_buf, *k_pending, *k_later, *k_a, *k_p;

py::object weakref(py::handle obj) {
  return steal(PyWeakref_NewRef(obj.ptr(), nullptr));
}

bool is_kind(PyObject* kind, PyObject* interned) {
  return kind == interned || PyUnicode_Compare(kind, interned) == 0;
}

// Byte offsets of the __slots__ of Pending and _Node in their instances (see slot_offset in
// py_helpers.h). A GPT step makes ~370 Pendings and ~130 nodes.
struct PendingSlots {
  Py_ssize_t graph, node, index, shape, torch_dtype, dtype, resolved;
} g_slots;
struct NodeSlots {
  Py_ssize_t info, inputs, device, where;
} g_node_slots;
// ... and of the fields of deferred._Graph, _OpInfo and executor._Collector that every recorded
// op reads: a generic attribute read looks the name up in the type's MRO and then in the
// instance dict, and a recorded op made ~25 of them.
Py_ssize_t g_graph_slots[static_cast<int>(GraphField::kCount)];
PyObject* g_graph_type;

// A slot's value as a new reference: any allocation may run the cyclic GC, whose finalizers may
// record (or flush) on this thread and so replace a graph's lists while a caller still uses them.
py::object slot_object(py::handle obj, Py_ssize_t offset) {
  return py::reinterpret_borrow<py::object>(get_slot(obj.ptr(), offset));
}

py::object graph_slot(py::handle g, GraphField field) {
  return slot_object(g, g_graph_slots[static_cast<int>(field)]);
}

// The same object as Pending(g, node, index, shape, dtype, np_dtype) (see deferred.Pending).
py::object new_pending(py::handle g, long node, long index, py::handle shape, py::handle dtype, py::handle np_dtype) {
  auto* type = reinterpret_cast<PyTypeObject*>(g_pending_type);
  py::object p = steal(type->tp_alloc(type, 0));
  PyObject* obj = p.ptr();
  py::object node_obj = steal(PyLong_FromLong(node)), index_obj = steal(PyLong_FromLong(index));
  set_slot(obj, g_slots.graph, g.ptr());
  set_slot(obj, g_slots.resolved, Py_None);
  set_slot(obj, g_slots.node, node_obj.ptr());
  set_slot(obj, g_slots.index, index_obj.ptr());
  set_slot(obj, g_slots.shape, shape.ptr());
  set_slot(obj, g_slots.torch_dtype, dtype.ptr());
  set_slot(obj, g_slots.dtype, np_dtype.ptr());
  return p;
}

struct NodeIO {
  py::list inputs;
  py::tuple wires;
  py::list new_tensors;
};

// A node's inputs, wires and new tensors, or nothing when an input is an RNG seed
// (deferred._record_io_python does those). Adds the node's arguments to the graph.
std::optional<NodeIO> record_io(py::handle g, py::handle col, py::handle layouts, py::handle written,
                                long node_index, int device) {
  TORCH_CHECK(g_pending_type != nullptr, "torchtpu._C._record_setup was not called");
  check_type(g, g_graph_type, "deferred._Graph");
  check_type(col, g_collector_type, "executor._Collector");
  py::object col_inputs = slot_object(col, g_collector_slots.inputs);
  TORCH_CHECK(PyList_Check(col_inputs.ptr()), "_Collector.inputs must be a list");
  const Py_ssize_t n_in = PyList_GET_SIZE(col_inputs.ptr());
  for (Py_ssize_t i = 0; i < n_in; ++i) {
    PyObject* kind = PyTuple_GET_ITEM(PyList_GET_ITEM(col_inputs.ptr(), i), 0);
    if (!is_kind(kind, k_storage) && !is_kind(kind, k_scalar) && !is_kind(kind, k_host)) {
      return std::nullopt;
    }
  }
  py::object storages = slot_object(col, g_collector_slots.storages);
  const bool has_f64 = PyObject_IsTrue(get_slot(col.ptr(), g_collector_slots.has_f64)) == 1;
  py::object args = graph_slot(g, GraphField::kArgs);
  py::object arg_of = graph_slot(g, GraphField::kArgOf);
  py::object touched = graph_slot(g, GraphField::kTouched);
  TORCH_CHECK(PyList_Check(storages.ptr()) && PyList_Check(args.ptr()) && PyDict_Check(arg_of.ptr()) &&
                  PyList_Check(touched.ptr()),
              "a graph's args and touched must be lists, its arg_of a dict");
  py::list inputs(0);
  py::tuple wires(n_in);
  const auto add_arg = [&](Py_ssize_t i, const py::object& a) {
    check(PyList_Append(inputs.ptr(), a.ptr()));
    py::object wire = tuple_of({k_a, py::int_(PyList_GET_SIZE(args.ptr()))});
    PyTuple_SET_ITEM(wires.ptr(), i, wire.release().ptr());
    check(PyList_Append(args.ptr(), a.ptr()));
  };
  for (Py_ssize_t i = 0; i < n_in; ++i) {
    PyObject* inp = PyList_GET_ITEM(col_inputs.ptr(), i);
    PyObject* kind = PyTuple_GET_ITEM(inp, 0);
    if (!is_kind(kind, k_storage)) {
      if (is_kind(kind, k_scalar)) {
        PyObject* dtype = PyTuple_GET_ITEM(inp, 2);
        if (dtype == Py_None) dtype = has_f64 ? g_f64 : g_f32;
        add_arg(i, tuple_of({k_scalar, PyTuple_GET_ITEM(inp, 1), dtype}));
      } else {  // host
        add_arg(i, tuple_of({k_host, PyTuple_GET_ITEM(inp, 1)}));
      }
      continue;
    }
    py::handle s = PyList_GET_ITEM(storages.ptr(), PyLong_AsSsize_t(PyTuple_GET_ITEM(inp, 1)));
    PyObject* raw = nullptr;
    if (_PyObject_LookupAttr(s.ptr(), g_attr, &raw) < 0) throw py::error_already_set();
    py::object buf = py::reinterpret_steal<py::object>(raw);
    if (!buf || buf.is_none()) {
      check(PyList_Append(inputs.ptr(), g_uninit));
      PyTuple_SET_ITEM(wires.ptr(), i, py::handle(g_uninit_wire).inc_ref().ptr());
      continue;
    }
    py::object a;
    if (Py_TYPE(buf.ptr()) == reinterpret_cast<PyTypeObject*>(g_pending_type)) {
      py::object graph = slot_object(buf, g_slots.graph);
      if (graph.is(g)) {
        check(PyList_Append(inputs.ptr(), tuple_of({k_pending, buf}).ptr()));
        py::object wire = tuple_of({k_p, get_slot(buf.ptr(), g_slots.node), get_slot(buf.ptr(), g_slots.index)});
        PyTuple_SET_ITEM(wires.ptr(), i, wire.release().ptr());
        continue;
      }
      check_type(graph, g_graph_type, "deferred._Graph");
      if (PyObject_IsTrue(graph_slot(graph, GraphField::kInFlight).ptr()) != 1) {
        PyErr_SetString(PyExc_AssertionError, "stale pending storage");
        throw py::error_already_set();
      }
      // a result of a cut graph still compiling: an argument, bound when it launches
      a = tuple_of({k_later, buf, weakref(s)});
      set_graph_field(g, GraphField::kHasLater, Py_True);
    } else {
      a = tuple_of({k_buf, buf, weakref(s)});
    }
    check(PyList_Append(inputs.ptr(), a.ptr()));
    // a buffer read twice is one argument (keyed by identity, as id() in Python)
    py::object id = steal(PyLong_FromVoidPtr(buf.ptr()));
    PyObject* pos = PyDict_GetItemWithError(arg_of.ptr(), id.ptr());
    py::object position;
    if (pos != nullptr) {
      position = py::reinterpret_borrow<py::object>(pos);
    } else {
      if (PyErr_Occurred()) throw py::error_already_set();
      position = py::int_(PyList_GET_SIZE(args.ptr()));
      check(PyDict_SetItem(arg_of.ptr(), id.ptr(), position.ptr()));
      check(PyList_Append(args.ptr(), a.ptr()));
    }
    PyTuple_SET_ITEM(wires.ptr(), i, tuple_of({k_a, position}).release().ptr());
  }
  py::list new_tensors(0);
  long k = 0;
  if (!layouts.is_none()) {
    // per new tensor: (shape, stride, dtype, numpy dtype, buffer shape), or None
    for (py::handle layout : layouts) {
      if (layout.is_none()) {
        check(PyList_Append(new_tensors.ptr(), Py_None));
        continue;
      }
      PyObject* l = layout.ptr();
      py::object pending = new_pending(g, node_index, k, PyTuple_GET_ITEM(l, 4), PyTuple_GET_ITEM(l, 2),
                                       PyTuple_GET_ITEM(l, 3));
      py::tuple made = new_tensor_with_data(PyTuple_GET_ITEM(l, 0), PyTuple_GET_ITEM(l, 1),
                                            PyTuple_GET_ITEM(l, 2), device, g_attr, pending);
      check(PyList_Append(touched.ptr(), weakref(made[1]).ptr()));
      check(PyList_Append(new_tensors.ptr(), made[0].ptr()));
      ++k;
    }
  } else {
    // per written storage: (slot, buffer shape, dtype, numpy dtype)
    for (py::handle w : written) {
      PyObject* t = w.ptr();
      py::handle s = PyList_GET_ITEM(storages.ptr(), PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 0)));
      py::object pending = new_pending(g, node_index, k, PyTuple_GET_ITEM(t, 1), PyTuple_GET_ITEM(t, 2),
                                       PyTuple_GET_ITEM(t, 3));
      check(PyObject_SetAttr(s.ptr(), g_attr, pending.ptr()));
      check(PyList_Append(touched.ptr(), weakref(s).ptr()));
      ++k;
    }
  }
  return NodeIO{std::move(inputs), std::move(wires), std::move(new_tensors)};
}


// The live outputs of a graph being flushed: per (node, index) still held by a storage, in
// first-touch order, and the (storage, Pending) pairs awaiting it. deferred.flush()'s loop
// over the touched storages, which visits ~150 weakrefs per GPT step.
py::tuple live_outputs(py::handle g, py::handle touched) {
  py::list live(0);
  py::dict holders;
  // Every storage visited, held until the loop ends. The weakref hands out a borrowed pointer,
  // and the allocations below can run the cyclic garbage collector: a storage whose tensor was
  // only reachable from garbage cycles was freed mid-loop, its dangling pointer then stored in
  // `holders` and its address reused under `seen` (issue 43's SIGSEGV "in index_reduce_": the
  // collector crashed in whatever frame allocated next).
  py::list keep(0);
  std::unordered_set<PyObject*> seen;
  const Py_ssize_t n = PyList_GET_SIZE(touched.ptr());
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* s = PyWeakref_GetObject(PyList_GET_ITEM(touched.ptr(), i));  // borrowed
    if (s == nullptr) throw py::error_already_set();
    if (s == Py_None) continue;  // dead
    check(PyList_Append(keep.ptr(), s));  // a strong reference before anything allocates
    if (!seen.insert(s).second) continue;  // written by several nodes
    PyObject* raw = nullptr;
    if (_PyObject_LookupAttr(s, g_attr, &raw) < 0) throw py::error_already_set();
    py::object v = py::reinterpret_steal<py::object>(raw);
    if (!v || Py_TYPE(v.ptr()) != reinterpret_cast<PyTypeObject*>(g_pending_type) ||
        get_slot(v.ptr(), g_slots.graph) != g.ptr()) {
      continue;  // overwritten by a newer graph's value, or already a buffer
    }
    py::object key = tuple_of({get_slot(v.ptr(), g_slots.node), get_slot(v.ptr(), g_slots.index)});
    PyObject* h = PyDict_GetItemWithError(holders.ptr(), key.ptr());  // borrowed
    py::object held;
    if (h == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      held = steal(PyList_New(0));
      check(PyDict_SetItem(holders.ptr(), key.ptr(), held.ptr()));
      check(PyList_Append(live.ptr(), key.ptr()));
      h = held.ptr();
    }
    check(PyList_Append(h, tuple_of({s, v}).ptr()));
  }
  return py::make_tuple(live, holders);
}

// After a launch: each Pending of a live output resolves to its buffer, and each storage still
// holding that Pending (not overwritten by a newer graph) takes the buffer.
void bind_outputs(py::handle live, py::handle outs, py::handle holders) {
  for (py::handle seq : {live, outs}) {
    if (!PyList_Check(seq.ptr()) && !PyTuple_Check(seq.ptr())) throw py::type_error("expected a list or tuple");
  }
  if (!PyDict_Check(holders.ptr())) throw py::type_error("holders must be a dict");
  const Py_ssize_t n = std::min(PySequence_Fast_GET_SIZE(live.ptr()), PySequence_Fast_GET_SIZE(outs.ptr()));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* buf = PySequence_Fast_GET_ITEM(outs.ptr(), i);
    PyObject* held = PyDict_GetItemWithError(holders.ptr(), PySequence_Fast_GET_ITEM(live.ptr(), i));
    if (held == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, PySequence_Fast_GET_ITEM(live.ptr(), i));
      throw py::error_already_set();
    }
    const Py_ssize_t m = PyList_GET_SIZE(held);
    for (Py_ssize_t j = 0; j < m; ++j) {
      PyObject* pair = PyList_GET_ITEM(held, j);
      PyObject* storage = PyTuple_GET_ITEM(pair, 0);
      PyObject* pending = PyTuple_GET_ITEM(pair, 1);
      replace_slot(pending, g_slots.resolved, buf);
      PyObject* raw = nullptr;
      if (_PyObject_LookupAttr(storage, g_attr, &raw) < 0) throw py::error_already_set();
      const bool current = raw == pending;
      Py_XDECREF(raw);
      if (current) check(PyObject_SetAttr(storage, g_attr, buf));
    }
  }
}

// (argument position, index into live or -1) per buffer argument dead after graph g: its storage
// freed, or now holding another value; that value's index into live where it is one of g's
// results (deferred._dead_arguments_python is the reference). A flush visits every argument: ~100
// per GPT program.
py::tuple dead_arguments(py::handle g, py::handle args, py::handle live) {
  if (!PyList_Check(args.ptr()) || !PyList_Check(live.ptr())) throw py::type_error("args and live must be lists");
  py::list dead(0);
  py::dict position;  // (node, index) -> its index into live, made at the first in-place update
  bool have_position = false;
  const Py_ssize_t n = PyList_GET_SIZE(args.ptr());
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PyList_GET_ITEM(args.ptr(), i);
    const bool later = is_kind(PyTuple_GET_ITEM(a, 0), k_later);  // a cut graph's result (a Pending)
    if (!later && !is_kind(PyTuple_GET_ITEM(a, 0), k_buf)) continue;
    PyObject* s = PyWeakref_GetObject(PyTuple_GET_ITEM(a, 2));  // borrowed
    if (s == nullptr) throw py::error_already_set();
    const py::object s_ref = py::reinterpret_borrow<py::object>(s);  // alive while looked at (see live_outputs)
    py::object v;
    if (s != Py_None) {
      PyObject* raw = nullptr;
      if (_PyObject_LookupAttr(s, g_attr, &raw) < 0) throw py::error_already_set();
      v = py::reinterpret_steal<py::object>(raw);
      if (v.ptr() == PyTuple_GET_ITEM(a, 1)) continue;  // still this graph's argument
      // a later argument's Pending whose graph has launched since: the storage holds its buffer
      if (later && v && v.ptr() == get_slot(PyTuple_GET_ITEM(a, 1), g_slots.resolved)) continue;
    }
    long j = -1;
    if (v && Py_TYPE(v.ptr()) == reinterpret_cast<PyTypeObject*>(g_pending_type) &&
        get_slot(v.ptr(), g_slots.graph) == g.ptr()) {
      if (!have_position) {
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(live.ptr()); ++k) {
          check(PyDict_SetItem(position.ptr(), PyList_GET_ITEM(live.ptr(), k), py::int_(k).ptr()));
        }
        have_position = true;
      }
      py::object key = tuple_of({get_slot(v.ptr(), g_slots.node), get_slot(v.ptr(), g_slots.index)});
      PyObject* found = PyDict_GetItemWithError(position.ptr(), key.ptr());  // borrowed
      if (found == nullptr && PyErr_Occurred()) throw py::error_already_set();
      if (found != nullptr) j = PyLong_AsLong(found);
    }
    check(PyList_Append(dead.ptr(), tuple_of({py::int_(i), py::int_(j)}).ptr()));
  }
  return steal(PyList_AsTuple(dead.ptr()));
}

}  // namespace

CollectorSlots g_collector_slots;
OpInfoSlots g_op_info_slots;
PyObject* g_collector_type = nullptr;
PyObject* g_op_info_type = nullptr;

void check_type(py::handle obj, PyObject* type, const char* what) {
  if (Py_TYPE(obj.ptr()) != reinterpret_cast<PyTypeObject*>(type)) {
    throw py::type_error(std::string("expected a ") + what + ", got " + Py_TYPE(obj.ptr())->tp_name);
  }
}

void check_graph(py::handle g) {
  check_type(g, g_graph_type, "deferred._Graph");
}

py::object graph_field(py::handle g, GraphField field) {
  check_graph(g);
  return graph_slot(g, field);
}

void set_graph_field(py::handle g, GraphField field, PyObject* value) {
  check_graph(g);
  replace_slot(g.ptr(), g_graph_slots[static_cast<int>(field)], value);
}

py::object record_node(py::handle g, py::handle info, py::handle col, py::handle layouts, long node_index,
                       int device) {
  // record_io, then the node itself: its wiring, a _Node (without a source line: only an op
  // key emitted before comes here) and its key id. None where record_io declines.
  check_type(info, g_op_info_type, "deferred._OpInfo");
  std::optional<NodeIO> io =
      record_io(g, col, layouts, slot_object(info, g_op_info_slots.written), node_index, device);
  if (!io) return py::none();
  py::object key_id = slot_object(info, g_op_info_slots.key_id);
  py::object wiring = graph_slot(g, GraphField::kWiring);
  py::object nodes = graph_slot(g, GraphField::kNodes);
  py::object keys = graph_slot(g, GraphField::kKeys);
  TORCH_CHECK(PyList_Check(wiring.ptr()) && PyList_Check(nodes.ptr()) && PyList_Check(keys.ptr()),
              "a graph's wiring, nodes and keys must be lists");
  check(PyList_Append(wiring.ptr(), tuple_of({key_id, io->wires}).ptr()));
  auto* type = reinterpret_cast<PyTypeObject*>(g_node_type);
  py::object node = steal(type->tp_alloc(type, 0));
  py::object device_obj = steal(PyLong_FromLong(device));
  set_slot(node.ptr(), g_node_slots.info, info.ptr());
  set_slot(node.ptr(), g_node_slots.inputs, io->inputs.ptr());
  set_slot(node.ptr(), g_node_slots.device, device_obj.ptr());
  set_slot(node.ptr(), g_node_slots.where, g_empty);
  check(PyList_Append(nodes.ptr(), node.ptr()));
  check(PyList_Append(keys.ptr(), key_id.ptr()));
  return std::move(io->new_tensors);
}

void register_record(py::module& m) {
  m.def("_record_setup", [](py::object pending_type, py::object node_type, py::object graph_type,
                            py::object info_type, py::object collector_type, py::str attr, py::object uninit,
                            py::object uninit_wire, py::object f32, py::object f64) {
    const std::pair<GraphField, const char*> graph_fields[] = {
        {GraphField::kNodes, "nodes"}, {GraphField::kKeys, "keys"},
        {GraphField::kArgs, "args"}, {GraphField::kArgOf, "arg_of"}, {GraphField::kWiring, "wiring"},
        {GraphField::kTouched, "touched"}, {GraphField::kHasLater, "has_later"},
        {GraphField::kInFlight, "in_flight"}};
    static_assert(sizeof(graph_fields) / sizeof(graph_fields[0]) == static_cast<size_t>(GraphField::kCount));
    for (const auto& [field, name] : graph_fields) {
      g_graph_slots[static_cast<int>(field)] = slot_offset(graph_type.ptr(), name);
    }
    g_op_info_slots = {slot_offset(info_type.ptr(), "emitted"), slot_offset(info_type.ptr(), "layouts"),
                       slot_offset(info_type.ptr(), "written"), slot_offset(info_type.ptr(), "key_id")};
    const auto col_slot = [&](const char* name) { return slot_offset(collector_type.ptr(), name); };
    g_collector_slots = {col_slot("device"), col_slot("has_f64"), col_slot("inputs"), col_slot("skeys"),
                         col_slot("storage_index"), col_slot("storages")};
    g_graph_type = graph_type.release().ptr();
    g_op_info_type = info_type.release().ptr();
    g_collector_type = collector_type.release().ptr();
    g_node_slots = {slot_offset(node_type.ptr(), "info"), slot_offset(node_type.ptr(), "inputs"),
                    slot_offset(node_type.ptr(), "device"), slot_offset(node_type.ptr(), "where")};
    g_node_type = node_type.release().ptr();
    g_slots = {slot_offset(pending_type.ptr(), "graph"), slot_offset(pending_type.ptr(), "node"),
               slot_offset(pending_type.ptr(), "index"), slot_offset(pending_type.ptr(), "shape"),
               slot_offset(pending_type.ptr(), "torch_dtype"), slot_offset(pending_type.ptr(), "dtype"),
               slot_offset(pending_type.ptr(), "resolved")};
    g_pending_type = pending_type.release().ptr();
    g_attr = attr.release().ptr();
    g_uninit = uninit.release().ptr();
    g_uninit_wire = uninit_wire.release().ptr();
    g_f32 = f32.release().ptr();
    g_f64 = f64.release().ptr();
    intern_all({{&k_storage, "storage"}, {&k_scalar, "scalar"}, {&k_host, "host"}, {&k_buf, "buf"},
                {&k_pending, "pending"}, {&k_later, "later"}, {&k_a, "a"}, {&k_p, "p"}, {&g_empty, ""}});
  });
  m.def(
      "_record_io",
      [](py::handle g, py::handle col, py::handle layouts, py::handle written, long node_index,
         int device) -> py::object {
        // -> (inputs, wires, new tensors), or None when an input is an RNG seed
        std::optional<NodeIO> io = record_io(g, col, layouts, written, node_index, device);
        if (!io) return py::none();
        return py::make_tuple(io->inputs, io->wires, io->new_tensors);
      },
      "DeferAndFuse record(): a node's inputs and wires, and its outputs' Pending storages");
  m.def("_record_node", &record_node,
        "deferred.record() for an op key emitted before: the node recorded, its new tensors returned");
  m.def("_live_outputs", &live_outputs,
        "deferred.flush(): (live (node, index) keys, {key: [(storage, Pending)]}) of a graph's touched storages");
  m.def("_dead_arguments", &dead_arguments,
        "deferred.flush(): (argument, index into live or -1) per buffer argument dead after the graph");
  m.def("_bind_outputs", &bind_outputs, "deferred._launch(): resolve each live output's Pendings to its buffer");
}

}  // namespace torchtpu
