// The engine's native pieces that one file of this module calls in another.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <vector>

namespace torchtpu {

// collect.cpp: what walk_key gives: the OpKey words of walk_all's specs and storage keys.
struct WalkedKey {
  std::vector<uint64_t> specs, skeys;  // the words of each spec (storage key), one after another
  size_t n_specs = 0, n_skeys = 0;
  long device = -1;  // -1: no tpu tensor among the values
  bool has_f64 = false;

  void reset() {  // empty again, keeping the vectors' memory for the next walk
    specs.clear();
    skeys.clear();
    n_specs = n_skeys = 0;
    device = -1;
    has_f64 = false;
  }
};
// collect.cpp: walk_all's walk as OpKey words, filling the collector's storages and inputs
// (values and runtime_scalar: lists); false where walk_all would call back into Python.
bool walk_key(py::handle col, py::handle values, py::handle runtime_scalar, WalkedKey& out);

// op_key.cpp: appends to `words` what an OpKey encodes for `value` (so that the words of a
// tuple's items, after a tuple header word, are the words of the tuple's key); false when
// the value needs Python equality, which only a real OpKey holds.
bool append_key_words(PyObject* value, std::vector<uint64_t>& words);
// op_key.cpp: the words of a tuple's header (n items), an int, a short string, a dtype and an
// identity-compared object, as the OpKey encoding writes them.
uint64_t key_tuple_word(size_t n);
void append_key_int(int64_t value, std::vector<uint64_t>& words);
void append_key_str(const char* text, std::vector<uint64_t>& words);  // up to 6 ASCII characters
uint64_t key_dtype_word(at::ScalarType type);
void append_key_identity(PyObject* value, std::vector<uint64_t>& words);  // a type, compared by identity
// op_key.cpp: the hash an OpKey of these words has (without Python-equality values).
Py_hash_t key_words_hash(const std::vector<uint64_t>& words);
// op_key.cpp: an OpKey's words, or nullptr when it is not one or holds Python-equality values.
const std::vector<uint64_t>* op_key_words(PyObject* key);

// record.cpp, set by _record_setup: the slot offsets of executor._Collector and deferred._OpInfo
// (record.cpp and defer.cpp both make or read them), and the two types.
struct CollectorSlots {
  Py_ssize_t device, has_f64, inputs, skeys, storage_index, storages;
};
struct OpInfoSlots {
  Py_ssize_t emitted, layouts, written, key_id;
};
extern CollectorSlots g_collector_slots;
extern OpInfoSlots g_op_info_slots;
extern PyObject* g_collector_type;
extern PyObject* g_op_info_type;
// record.cpp: TypeError unless obj's type is exactly `type`: slot reads at another type's offsets
// would read foreign memory.
void check_type(py::handle obj, PyObject* type, const char* what);

// record.cpp: the fields of deferred._Graph (a slotted dataclass) read by their slots (a new
// reference); both raise TypeError for anything but a _Graph.
enum class GraphField { kNodes, kKeys, kArgs, kArgOf, kWiring, kTouched, kHasLater, kInFlight, kCount };
void check_graph(py::handle g);
py::object graph_field(py::handle g, GraphField field);
void set_graph_field(py::handle g, GraphField field, PyObject* value);

// record.cpp: records one node of an op key emitted before into graph g; its new tensors,
// or None where an input is an RNG seed (then nothing was recorded).
py::object record_node(py::handle g, py::handle info, py::handle col, py::handle layouts, long node_index,
                       int device);

// defer.cpp: DeferAndFuse's record of a call of an op key recorded before (kwargs: a dict or
// None); NotImplemented, having done nothing, for anything else.
py::object defer_record(py::handle plan, py::handle args, py::handle kwargs);

// shim.cpp: this thread's current tpu device (torch.tpu.current_device()).
c10::DeviceIndex current_device();

// precision_tls.cpp: engine/precision.py current() (a null object with a Python error set on failure).
py::object precision_current();

}  // namespace torchtpu
