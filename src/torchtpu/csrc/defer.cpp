// DeferAndFuse's per-op fast path: one call records an op whose key was recorded before.
//
// Recording an op already seen is the common case of every training step (129 ops a GPT
// step). In Python it ran kernel -> executor.run_plan -> deferred.record -> op_result,
// five frames around the native walk, key and record: ~4 us of the ~6 us an op cost.
// defer_record, called by each op's native kernel (kernel_front.cpp), does the same steps, in
// the same order and with the same objects, in one call. It returns NotImplemented, having
// changed nothing, whenever the op needs anything else (another mode, a first call, a
// generator, a missing argument): executor.run_plan, which stays the reference, then handles
// the call. It finds the op key's recorded info by the key's words, written straight from the
// call's values (walk_key in collect.cpp), without the spec tuples and OpKey that run_plan
// makes: walking into those and encoding them was about a quarter of this path's time.
#include <torch/extension.h>

#include <torch/csrc/Device.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "engine_native.h"
#include "py_helpers.h"

namespace torchtpu {
namespace {

// Set once by _defer_setup (leaked on purpose: they live as long as the module).
PyObject *g_deferred, *g_config, *g_missing, *g_eligible;
PyObject *s_defer_and_fuse, *s_launch_blocking, *s_debug_checks_override, *s_graph, *s_native_record,
    *s_lock, *s_acquire, *s_release, *s_names, *s_defaults, *s_runtime_scalar, *s_mutated, *s_returns,
    *s_returns_list, *s_arg, *s_since_sync, *s_period, *s_stats, *s_period_cuts, *s_chunk_nodes, *s_max_nodes,
    *s_min_period, *s_min_cut_nodes, *s_flush, *s_cut, *s_history, *s_history_occurrences, *s_on_period,
    *s_argument_check, *s_func_arg_positions;

// deferred's globals and config's settings, read per recorded op. Module globals and plain
// instance attributes live in a dict: reading that dict skips the generic attribute lookup
// (the type's MRO first), ~10 of them an op. A name missing from the dict (never, unless a
// test deletes one) takes the generic path, which raises the AttributeError.
PyObject *g_deferred_dict, *g_config_dict;

PyObject* dict_get(PyObject* dict, PyObject* owner, PyObject* name, py::object& holder) {  // borrowed
  PyObject* v = PyDict_GetItemWithError(dict, name);
  if (v != nullptr) return v;
  if (PyErr_Occurred()) throw py::error_already_set();
  holder = steal(PyObject_GetAttr(owner, name));
  return holder.ptr();
}

bool config_true(PyObject* name) {
  py::object holder;
  return PyObject_IsTrue(dict_get(g_config_dict, g_config, name, holder)) == 1;
}

py::object module_get(PyObject* name) {
  py::object holder;
  return py::reinterpret_borrow<py::object>(dict_get(g_deferred_dict, g_deferred, name, holder));
}

// What a call needs of an OpPlan, read once per plan (plans live as long as the process).
struct FastPlan {
  bool eligible = false;
  py::object names, defaults, runtime_scalar;  // tuple, tuple, list
  bool mutated = false;
  bool returns_list = false;
  std::vector<std::pair<bool, Py_ssize_t>> returns;  // (from an argument, position)
  // OpPlan.argument_check (None for most ops) and the positions of its arguments among the
  // call's values: a check of runtime scalars (a fill value's range), run on every call, as
  // executor.run_plan does, before anything is recorded
  py::object argument_check;
  std::vector<Py_ssize_t> check_positions;
};
// Leaked, like the objects above: destroying it at exit would drop Python references after
// the interpreter has finalized.
auto* g_plans = new std::unordered_map<PyObject*, FastPlan>();

const FastPlan& fast_plan(py::handle plan) {
  auto it = g_plans->find(plan.ptr());
  if (it != g_plans->end()) return it->second;
  FastPlan fp;
  fp.eligible = PyObject_IsTrue(steal(PyObject_CallOneArg(g_eligible, plan.ptr())).ptr()) == 1;
  if (fp.eligible) {
    fp.names = steal(PySequence_Tuple(py::object(plan.attr(s_names)).ptr()));
    fp.defaults = steal(PySequence_Tuple(py::object(plan.attr(s_defaults)).ptr()));
    fp.runtime_scalar = plan.attr(s_runtime_scalar);
    fp.mutated = PyObject_IsTrue(py::object(plan.attr(s_mutated)).ptr()) == 1;
    fp.returns_list = PyObject_IsTrue(py::object(plan.attr(s_returns_list)).ptr()) == 1;
    for (py::handle r : py::object(plan.attr(s_returns))) {
      const bool from_arg = PyObject_RichCompareBool(PyTuple_GET_ITEM(r.ptr(), 0), s_arg, Py_EQ) == 1;
      fp.returns.emplace_back(from_arg, PyLong_AsSsize_t(PyTuple_GET_ITEM(r.ptr(), 1)));
    }
    TORCH_CHECK(PyList_Check(fp.runtime_scalar.ptr()), "OpPlan.runtime_scalar must be a list");
    py::object check = plan.attr(s_argument_check);
    if (!check.is_none()) {
      fp.argument_check = check;
      for (py::handle i : py::object(plan.attr(s_func_arg_positions))) fp.check_positions.push_back(PyLong_AsSsize_t(i.ptr()));
    }
  }
  Py_INCREF(plan.ptr());  // the map holds its plans
  return g_plans->emplace(plan.ptr(), std::move(fp)).first->second;
}


// The schema's values in order, defaults filled in (executor.normalize_args); empty when an
// argument is missing or there are too many (the Python path raises for those).
py::object normalize(const FastPlan& fp, py::handle args, py::handle kwargs) {
  const Py_ssize_t n = PyTuple_GET_SIZE(fp.names.ptr());
  const Py_ssize_t given = PyTuple_GET_SIZE(args.ptr());
  if (given > n) return py::object();
  py::object values = steal(PyList_New(n));
  for (Py_ssize_t i = 0; i < given; ++i) {
    PyObject* v = PyTuple_GET_ITEM(args.ptr(), i);
    PyList_SET_ITEM(values.ptr(), i, Py_NewRef(v));
  }
  const bool has_kwargs = kwargs.ptr() != Py_None && PyDict_GET_SIZE(kwargs.ptr()) > 0;
  for (Py_ssize_t i = given; i < n; ++i) {
    PyObject* v = has_kwargs ? PyDict_GetItemWithError(kwargs.ptr(), PyTuple_GET_ITEM(fp.names.ptr(), i)) : nullptr;
    if (v == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      v = PyTuple_GET_ITEM(fp.defaults.ptr(), i);
      if (v == g_missing) return py::object();
    }
    PyList_SET_ITEM(values.ptr(), i, Py_NewRef(v));
  }
  return values;
}

// A fresh executor._Collector for walk_key: its slots filled as its __init__ does, but for the
// storage keys and storage index, which walk_key keeps as key words and in C++ (None here).
py::object new_collector() {
  auto* type = reinterpret_cast<PyTypeObject*>(g_collector_type);
  py::object col = steal(type->tp_alloc(type, 0));
  const CollectorSlots& slots = g_collector_slots;
  set_slot(col.ptr(), slots.storages, steal(PyList_New(0)).ptr());
  set_slot(col.ptr(), slots.skeys, Py_None);
  set_slot(col.ptr(), slots.storage_index, Py_None);
  set_slot(col.ptr(), slots.inputs, steal(PyList_New(0)).ptr());
  set_slot(col.ptr(), slots.device, Py_None);
  set_slot(col.ptr(), slots.has_f64, Py_False);
  return col;
}

// executor.op_result: the op's return value from its arguments and new tensors.
py::object op_result(const FastPlan& fp, py::handle values, py::handle new_tensors) {
  const auto pick = [&](const std::pair<bool, Py_ssize_t>& r) -> py::object {
    PyObject* seq = r.first ? values.ptr() : new_tensors.ptr();
    if (r.second < 0 || r.second >= PyList_GET_SIZE(seq)) throw py::index_error("op return out of range");
    return py::reinterpret_borrow<py::object>(PyList_GET_ITEM(seq, r.second));
  };
  if (fp.returns_list) {
    if (fp.mutated) {
      if (fp.returns.empty()) throw py::index_error("a mutated list return without a position");
      return pick({true, fp.returns[0].second});
    }
    return py::reinterpret_borrow<py::object>(new_tensors);
  }
  if (fp.returns.empty()) return py::none();
  if (fp.returns.size() == 1) return pick(fp.returns[0]);
  py::tuple out(fp.returns.size());
  for (size_t i = 0; i < fp.returns.size(); ++i) {
    PyTuple_SET_ITEM(out.ptr(), i, pick(fp.returns[i]).release().ptr());
  }
  return out;
}

// The device of a call without tpu tensors (a factory op such as arange, or the scalar_tensor
// of an attention mask): its tpu device argument, else the current device, as
// executor._device_from_args (which sets the collector's device in the Python path).
int device_from_args(py::handle values) {
  const Py_ssize_t n = PyList_GET_SIZE(values.ptr());
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v = PyList_GET_ITEM(values.ptr(), i);
    if (THPDevice_Check(v)) {
      const c10::Device& d = reinterpret_cast<THPDevice*>(v)->device;
      if (d.type() == c10::DeviceType::PrivateUse1) return d.has_index() ? d.index() : current_device();
    }
  }
  return current_device();
}

// Holds deferred._lock (an RLock, shared with flushes from other threads) for a scope. Its
// bound acquire and release are kept (the module's lock never changes; if it did, they are
// fetched again): looking the methods up cost as much as calling them.
class DeferredLock {
 public:
  explicit DeferredLock(py::handle lock) {
    static PyObject *held_lock = nullptr, *acquire = nullptr, *release = nullptr;  // leaked with the module
    if (lock.ptr() != held_lock) {
      PyObject* a = steal(PyObject_GetAttr(lock.ptr(), s_acquire)).release().ptr();
      PyObject* r = steal(PyObject_GetAttr(lock.ptr(), s_release)).release().ptr();
      Py_XDECREF(acquire);
      Py_XDECREF(release);
      Py_XDECREF(held_lock);
      held_lock = lock.inc_ref().ptr();
      acquire = a;
      release = r;
    }
    release_ = py::reinterpret_borrow<py::object>(release);
    steal(PyObject_CallNoArgs(acquire));
  }
  ~DeferredLock() {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);  // keep a pending exception across the release
    PyObject* r = PyObject_CallNoArgs(release_.ptr());
    if (r == nullptr) PyErr_WriteUnraisable(release_.ptr());
    Py_XDECREF(r);
    PyErr_Restore(type, value, trace);
  }
  DeferredLock(const DeferredLock&) = delete;
  DeferredLock& operator=(const DeferredLock&) = delete;

 private:
  py::object release_;
};

long module_long(PyObject* name) {
  py::object v = module_get(name);
  const long out = PyLong_AsLong(v.ptr());
  if (out == -1 && PyErr_Occurred()) throw py::error_already_set();
  return out;
}

void set_module_long(PyObject* name, long value) {
  check(PyDict_SetItem(g_deferred_dict, name, steal(PyLong_FromLong(value)).ptr()));  // as a module setattr
}

long item_long(PyObject* list, Py_ssize_t i) {  // a key id of a graph's keys or of the period
  return PyLong_AsLong(PyList_GET_ITEM(list, i));
}

void count_period_cut() {
  py::object stats = module_get(s_stats);
  PyObject* n = PyDict_GetItemWithError(stats.ptr(), s_period_cuts);
  if (n == nullptr) throw py::key_error("period_cuts");
  check(PyDict_SetItem(stats.ptr(), s_period_cuts, steal(PyNumber_Add(n, py::int_(1).ptr())).ptr()));
}

// The repeat history (deferred._history: the op keys recorded since the last read or period
// cut, across the graphs chunking cut in between) starts over.
void reset_history() {
  py::object keys = module_get(s_history);
  check(PyList_SetSlice(keys.ptr(), 0, PyList_GET_SIZE(keys.ptr()), nullptr));
  PyDict_Clear(module_get(s_history_occurrences).ptr());
  check(PyDict_SetItem(g_deferred_dict, s_on_period, Py_True));
}

// The repeated-ops heuristic, after each recorded node: true when the graph should be cut at a
// repeat boundary. Two copies of the same sequence of op keys (successive steps or blocks, at
// least MIN_PERIOD ops) ending at the last node make it the period (repeated to hold
// MIN_CUT_NODES ops: a flush and launch cost about as much as recording 10-20 ops); from then on
// a graph is cut each time the history has recorded one period. The history spans chunk cuts:
// a training step is longer than a chunk, and were repeats sought within one graph, a step would
// never be found, the chunk cut points would drift from step to step with the step's length, and
// each step would compile new programs until every phase had been seen (38 programs for a small
// GPT loop where 9 do: tests/test_defer_and_fuse.py).
bool repeats(py::handle g) {
  py::object graph_keys = graph_field(g, GraphField::kKeys);
  py::object keys = module_get(s_history);
  check(PyList_Append(keys.ptr(), PyList_GET_ITEM(graph_keys.ptr(), PyList_GET_SIZE(graph_keys.ptr()) - 1)));
  const Py_ssize_t n = PyList_GET_SIZE(keys.ptr());
  py::object period = module_get(s_period);
  if (!period.is_none() && PyObject_IsTrue(module_get(s_on_period).ptr()) == 1) {
    if (n <= PyList_GET_SIZE(period.ptr()) && item_long(keys.ptr(), n - 1) == item_long(period.ptr(), n - 1)) {
      if (n == PyList_GET_SIZE(period.ptr())) {
        count_period_cut();
        reset_history();
        return true;
      }
      return false;
    }
    // Off the period (a step's head after its repeated blocks): repeats are sought again, so
    // the next cut falls at the same op of every step, and the chunk cuts counted from it too.
    check(PyDict_SetItem(g_deferred_dict, s_on_period, Py_False));
  }
  PyObject* last = PyList_GET_ITEM(keys.ptr(), n - 1);
  py::object occurrences = module_get(s_history_occurrences);
  PyObject* earlier = PyDict_GetItemWithError(occurrences.ptr(), last);  // borrowed
  if (earlier == nullptr) {
    if (PyErr_Occurred()) throw py::error_already_set();
    check(PyDict_SetItem(occurrences.ptr(), last, steal(Py_BuildValue("[n]", n - 1)).ptr()));
    return false;
  }
  py::object earlier_ref = py::reinterpret_borrow<py::object>(earlier);
  const long min_period = module_long(s_min_period);
  const Py_ssize_t lowest = std::max<Py_ssize_t>(n / 2 - 1, 0);
  int checked = 0;
  // Candidate periods: distances back to earlier occurrences of the last op.
  for (Py_ssize_t j = PyList_GET_SIZE(earlier) - 1; j >= 0; --j) {
    const Py_ssize_t q = PyLong_AsSsize_t(PyList_GET_ITEM(earlier, j));
    if (q > n - 1 - min_period) continue;
    if (q < lowest) break;
    const Py_ssize_t p = n - 1 - q;
    bool same = n - 2 * p >= 0;  // two whole copies fit
    for (Py_ssize_t i = 0; i < p && same; ++i) {
      same = item_long(keys.ptr(), n - 2 * p + i) == item_long(keys.ptr(), n - p + i);
    }
    if (same) {
      const long min_cut = module_long(s_min_cut_nodes);
      const Py_ssize_t copies = (min_cut + p - 1) / p;
      py::object one = steal(PyList_GetSlice(keys.ptr(), n - p, n));
      check(PyDict_SetItem(g_deferred_dict, s_period, steal(PySequence_Repeat(one.ptr(), copies)).ptr()));
      count_period_cut();
      reset_history();
      return true;
    }
    if (++checked >= 8) break;
  }
  check(PyList_Append(earlier, steal(PyLong_FromSsize_t(n - 1)).ptr()));
  if (n >= 2 * module_long(s_max_nodes)) reset_history();  // (no period that long is sought)
  return false;
}

// After a recorded node (deferred._lock held): cut the graph where the repeated-ops
// heuristic or the chunk size says so.
void after_record(py::handle g, long node_index) {
  check_graph(g);  // before any state changes
  const long since = module_long(s_since_sync) + 1;
  set_module_long(s_since_sync, since);
  bool cut = repeats(g);
  if (cut) {
    set_module_long(s_since_sync, 0);
  } else {
    const long chunk = module_long(s_chunk_nodes);
    cut = node_index + 1 >= module_long(s_max_nodes);
    if (!cut && chunk != 0 && since % chunk == 0) {
      // A graph following the period is cut by chunks only when the period is longer than a
      // chunk (the chunks then fall at the same places in every period); a shorter one is left
      // to the period cut.
      py::object period = module_get(s_period);
      cut = period.is_none() || PyObject_IsTrue(module_get(s_on_period).ptr()) != 1 ||
            PyList_GET_SIZE(period.ptr()) > chunk;
    }
  }
  if (cut) {
    py::object flush = module_get(s_flush);
    py::dict kwargs;
    kwargs[s_cut] = py::bool_(true);
    steal(PyObject_Call(flush.ptr(), py::tuple().ptr(), kwargs.ptr()));
  }
}

// Op key words -> the deferred._OpInfo recorded for that key (deferred._op_info holds the same
// objects by OpKey, and never drops one). Filled by _remember_op_info when Python records a
// key first; leaked with its references, like g_plans.
struct WordsHash {
  size_t operator()(const std::vector<uint64_t>& words) const { return static_cast<size_t>(key_words_hash(words)); }
};
auto* g_infos = new std::unordered_map<std::vector<uint64_t>, PyObject*, WordsHash>();

// The words of the call's OpKey, as executor.run_plan would make the key (plan, precision,
// has_f64, specs, storage keys), written straight from the values; false where walk_key
// declines. Fills the collector's storages, inputs, device and has_f64 as walk_all does.
bool call_words(py::handle plan, py::handle values, const FastPlan& fp, py::handle col,
                std::vector<uint64_t>& words) {
  // One WalkedKey per thread, reused: two vector allocations fewer per recorded op. A walk that
  // calls into Python (a host scalar) could record another op on this thread meanwhile: that
  // inner call walks into its own.
  thread_local WalkedKey reused;
  thread_local bool reused_busy = false;
  WalkedKey own;
  const bool nested = reused_busy;
  WalkedKey& walked = nested ? own : reused;
  walked.reset();
  reused_busy = true;
  struct Release {
    bool nested;
    ~Release() {
      if (!nested) reused_busy = false;
    }
  } release{nested};
  if (!walk_key(col, values, fp.runtime_scalar, walked)) return false;
  if (walked.device >= 0) replace_slot(col.ptr(), g_collector_slots.device, py::int_(walked.device).ptr());
  replace_slot(col.ptr(), g_collector_slots.has_f64, walked.has_f64 ? Py_True : Py_False);
  py::object precision = precision_current();
  if (!precision) throw py::error_already_set();
  words.clear();
  words.push_back(key_tuple_word(5));
  if (!append_key_words(plan.ptr(), words) || !append_key_words(precision.ptr(), words)) return false;
  if (!append_key_words(walked.has_f64 ? Py_True : Py_False, words)) return false;
  words.push_back(key_tuple_word(walked.n_specs));
  words.insert(words.end(), walked.specs.begin(), walked.specs.end());
  words.push_back(key_tuple_word(walked.n_skeys));
  words.insert(words.end(), walked.skeys.begin(), walked.skeys.end());
  return true;
}

// The _OpInfo of the call's key (borrowed), or nullptr when its key was not recorded before.
PyObject* call_info(py::handle plan, py::handle values, const FastPlan& fp, py::handle col,
                    std::vector<uint64_t>& words) {
  if (!call_words(plan, values, fp, col, words)) return nullptr;
  const auto it = g_infos->find(words);
  return it == g_infos->end() ? nullptr : it->second;
}

}  // namespace

py::object defer_record(py::handle plan, py::handle args, py::handle kwargs) {
  TORCH_CHECK(g_deferred != nullptr, "torchtpu._C._defer_setup was not called");
  const py::object fallback = py::reinterpret_borrow<py::object>(Py_NotImplemented);
  if (!PyTuple_Check(args.ptr()) || (kwargs.ptr() != Py_None && !PyDict_Check(kwargs.ptr()))) return fallback;
  // DeferAndFuse, not Debug (which runs and checks every op), as executor.run_plan decides
  if (!config_true(s_defer_and_fuse) || config_true(s_launch_blocking)) return fallback;
  py::object holder;
  PyObject* checks = dict_get(g_config_dict, g_config, s_debug_checks_override, holder);
  if (checks != Py_None && PyObject_IsTrue(checks) == 1) return fallback;
  const FastPlan& fp = fast_plan(plan);
  if (!fp.eligible) return fallback;
  py::object values = normalize(fp, args, kwargs);
  if (!values) return fallback;
  if (fp.argument_check) {  // raises as the Python path would, nothing recorded
    const Py_ssize_t n = static_cast<Py_ssize_t>(fp.check_positions.size());
    py::object check_args = steal(PyTuple_New(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyTuple_SET_ITEM(check_args.ptr(), i, Py_NewRef(PyList_GET_ITEM(values.ptr(), fp.check_positions[i])));
    }
    steal(PyObject_Call(fp.argument_check.ptr(), check_args.ptr(), nullptr));
  }
  py::object col = new_collector();
  thread_local std::vector<uint64_t> words;  // the call's key words (kept: no allocation per call)
  PyObject* info = call_info(plan, values, fp, col, words);  // borrowed
  if (info == nullptr) return fallback;  // a key not recorded yet, or one walk_key declines
  PyObject* device_obj = get_slot(col.ptr(), g_collector_slots.device);
  const int device =
      device_obj == Py_None ? device_from_args(values) : static_cast<int>(PyLong_AsLong(device_obj));

  py::object new_tensors;
  {
    DeferredLock held(module_get(s_lock));
    py::object info_ref = py::reinterpret_borrow<py::object>(info);
    check_type(info, g_op_info_type, "deferred._OpInfo");
    if (PyObject_IsTrue(get_slot(info, g_op_info_slots.emitted)) != 1 ||
        PyObject_IsTrue(module_get(s_native_record).ptr()) != 1) {
      return fallback;
    }
    py::object g = module_get(s_graph);
    py::object nodes = graph_field(g, GraphField::kNodes);
    TORCH_CHECK(PyList_Check(nodes.ptr()), "a graph's nodes must be a list");
    const long node_index = static_cast<long>(PyList_GET_SIZE(nodes.ptr()));
    py::object layouts =
        fp.mutated ? py::none() : py::reinterpret_borrow<py::object>(get_slot(info, g_op_info_slots.layouts));
    try {
      new_tensors = record_node(g, info_ref, col, layouts, node_index, device);
    } catch (py::error_already_set& e) {
      // the recorder refuses a Pending of an older graph; one whose graph failed is the user's to
      // hear about (the failure's text), not an internal error (as deferred.record does)
      if (e.matches(PyExc_AssertionError)) {
        py::reinterpret_borrow<py::object>(g_deferred).attr("_raise_if_an_input_failed")(col);
      }
      throw;
    }
    if (new_tensors.is_none()) return fallback;  // an RNG seed input: nothing was recorded
    after_record(g, node_index);
  }
  return op_result(fp, values, new_tensors);
}

void register_defer(py::module& m) {
  m.def("_defer_setup", [](py::object deferred, py::object config, py::object missing, py::object eligible) {
    // (the collector's and op info's slots and types come from _record_setup, called before)
    TORCH_CHECK(g_collector_type != nullptr && g_op_info_type != nullptr, "call torchtpu._C._record_setup first");
    PyObject** config_dict = _PyObject_GetDictPtr(config.ptr());
    TORCH_CHECK(config_dict != nullptr && *config_dict != nullptr && PyDict_Check(*config_dict),
                "the config object must keep its settings in an instance dict");
    g_config_dict = *config_dict;  // (the config object, kept below, keeps its dict)
    g_deferred_dict = PyModule_GetDict(deferred.ptr());
    g_deferred = deferred.release().ptr();
    g_config = config.release().ptr();
    g_missing = missing.release().ptr();
    g_eligible = eligible.release().ptr();
    intern_all({{&s_defer_and_fuse, "defer_and_fuse"}, {&s_launch_blocking, "launch_blocking"},
                {&s_debug_checks_override, "debug_checks_override"},
                {&s_graph, "_graph"}, {&s_native_record, "_native_record"}, {&s_lock, "_lock"},
                {&s_acquire, "acquire"}, {&s_release, "release"}, {&s_names, "names"},
                {&s_defaults, "defaults"}, {&s_runtime_scalar, "runtime_scalar"}, {&s_mutated, "mutated"},
                {&s_returns, "returns"}, {&s_returns_list, "returns_list"}, {&s_arg, "arg"},
                {&s_since_sync, "_since_sync"}, {&s_period, "_period"}, {&s_stats, "stats"},
                {&s_period_cuts, "period_cuts"}, {&s_chunk_nodes, "CHUNK_NODES"}, {&s_max_nodes, "MAX_NODES"},
                {&s_min_period, "MIN_PERIOD"}, {&s_min_cut_nodes, "MIN_CUT_NODES"}, {&s_flush, "flush"},
                {&s_cut, "cut"}, {&s_history, "_history"}, {&s_history_occurrences, "_history_occurrences"},
                {&s_on_period, "_on_period"}, {&s_argument_check, "argument_check"},
                {&s_func_arg_positions, "func_arg_positions"}});
  });
  m.def(
      "_remember_op_info",
      [](py::handle key, py::handle info) {
        const std::vector<uint64_t>* words = op_key_words(key.ptr());
        if (words == nullptr) return false;  // a key with Python-equality values stays Python's
        auto [it, added] = g_infos->emplace(*words, info.ptr());
        if (added) Py_INCREF(info.ptr());
        return added;
      },
      "deferred.record(): the _OpInfo of a new op key, for the native record of its next calls");
  m.def(
      "_call_key_words",
      [](py::handle plan, py::handle args, py::handle kwargs) -> py::object {
        // tests: the key words defer_record computes for a call (None where it declines)
        const FastPlan& fp = fast_plan(plan);
        if (!fp.eligible) return py::none();
        py::object values = normalize(fp, args, kwargs);
        if (!values) return py::none();
        std::vector<uint64_t> words;
        if (!call_words(plan, values, fp, new_collector(), words)) return py::none();
        return py::cast(words);
      },
      "the OpKey words DeferAndFuse's native record computes for a call of plan (tests)");
  m.def(
      "_op_key_words",
      [](py::handle key) -> py::object {
        const std::vector<uint64_t>* words = op_key_words(key.ptr());
        return words == nullptr ? py::none() : py::cast(*words);
      },
      "an OpKey's words, or None when it holds Python-equality values (tests)");
  m.def("_after_record", &after_record,
        "DeferAndFuse, after a recorded node (deferred._lock held): cut the graph at a repeat or a chunk");
}

}  // namespace torchtpu
