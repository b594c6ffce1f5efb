// OpKey: the exact, fast cache key of one op call (executor.run_plan) or graph call.
//
// A key used to be a nested Python tuple (op plan, precision, specs, storage keys).
// Python equality made two bugs and one cost:
// - 2 == 2.0 == True and 0.0 == -0.0 as tuple items, so `floor_divide(int_t, 2)` and
//   `floor_divide(int_t, 2.0)` shared one program (an int64 result for the second), and
//   `nan_to_num(posinf=-0.0)` reused the program of `posinf=0.0`;
// - every dict hit re-hashed and re-compared the whole tuple item by item (the shapes
//   and strides of ~80 tensors for one foreach op of an optimizer step).
// An OpKey encodes the items once into 64-bit words, with a type tag per value (in the
// low byte; a string's or sequence's length, or a dtype, above it) and a float's bit pattern, so equal keys mean the same typed values; it hashes and compares
// those words. Objects it cannot encode by value keep their Python equality (the
// "others" tuple); objects with identity equality are encoded by address and kept alive
// by the key's own reference to the items.
#include <torch/extension.h>

#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine_native.h"
#include "py_helpers.h"

namespace torchtpu {
namespace {

enum Tag : uint64_t {
  kNone = 1, kFalse, kTrue, kInt, kFloat, kComplex, kStr, kTuple, kList, kDtype, kLayout, kMemoryFormat,
  kDevice, kIdentity, kOther, kSmallInt, kShortStr, kNumberSubclass,
};

struct OpKeyObject {
  PyObject_HEAD
  PyObject* items;   // the tuple the key was made from (indexable: key[1] is the precision)
  PyObject* others;  // values compared with Python equality, or nullptr
  std::vector<uint64_t>* words;
  Py_hash_t hash;
};

// The words of fixed-size values, shared by Encoder and by the key words that collect.cpp
// writes straight from a call's values (append_key_*): the two must agree word for word.
#if PY_VERSION_HEX < 0x030C0000
constexpr bool kSmallIntWords = true;  // CPython <= 3.11's int layout: a one-digit int is one word
#else
constexpr bool kSmallIntWords = false;  // (3.12 changed the layout Encoder reads the digit from)
#endif
constexpr uint64_t tuple_word(size_t n) { return kTuple | (static_cast<uint64_t>(n) << 8); }
constexpr uint64_t small_int_word(int64_t x) { return kSmallInt | (static_cast<uint64_t>(x) << 8); }
constexpr uint64_t dtype_word(at::ScalarType type) { return kDtype | (static_cast<uint64_t>(type) << 8); }
inline uint64_t short_str_word(const char* text, size_t n) {  // n <= 6 ASCII characters
  uint64_t w = 0;
  std::memcpy(&w, text, n);
  return kShortStr | (static_cast<uint64_t>(n) << 8) | (w << 16);
}

struct Encoder {
  // Words go to a scratch buffer kept between calls (one per thread: keys are also made on
  // compile threads), so encoding allocates nothing once the buffer has grown.
  std::vector<uint64_t>& scratch;
  size_t size = 0;
  PyObject* others = nullptr;  // a list, created on the first value that needs it

  inline void add(uint64_t w) {
    if (C10_UNLIKELY(size == scratch.size())) scratch.resize(std::max<size_t>(256, 2 * size));
    scratch[size++] = w;
  }

  void other(PyObject* v) {
    if (others == nullptr) others = steal(PyList_New(0)).release().ptr();
    add(kOther);
    add(static_cast<uint64_t>(PyList_GET_SIZE(others)));
    check(PyList_Append(others, v));
  }

  void encode(PyObject* v) {
    // most frequent first: the tuples, ints and tag strings of tensor specs
    if (PyTuple_Check(v)) {  // torch.Size included: it means the same as a tuple of ints
      const Py_ssize_t n = PyTuple_GET_SIZE(v);
      add(tuple_word(static_cast<size_t>(n)));
      for (Py_ssize_t i = 0; i < n; ++i) encode(PyTuple_GET_ITEM(v, i));
      return;
    }
    if (PyLong_CheckExact(v)) {
#if PY_VERSION_HEX < 0x030C0000  // the int layout of CPython <= 3.11 (3.12 changed it)
      const Py_ssize_t digits = Py_SIZE(v);
      if (digits >= -1 && digits <= 1) {  // |v| < 2**30 (one digit): one word
        const int64_t x = digits * static_cast<int64_t>(reinterpret_cast<PyLongObject*>(v)->ob_digit[0]);
        return add(small_int_word(x));
      }
#endif
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
      if (overflow != 0) return other(v);
      add(kInt);
      return add(static_cast<uint64_t>(x));
    }
    if (PyUnicode_CheckExact(v)) {
      Py_ssize_t n = 0;
      const char* text;
      if (PyUnicode_IS_COMPACT_ASCII(v)) {
        n = PyUnicode_GET_LENGTH(v);
        text = static_cast<const char*>(PyUnicode_DATA(v));
        if (n <= 6) return add(short_str_word(text, static_cast<size_t>(n)));  // spec tags: one word
      } else {
        text = PyUnicode_AsUTF8AndSize(v, &n);
        if (text == nullptr) throw py::error_already_set();
      }
      add(kStr | (static_cast<uint64_t>(n) << 8));
      for (Py_ssize_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        std::memcpy(&w, text + i, static_cast<size_t>(std::min<Py_ssize_t>(8, n - i)));
        add(w);
      }
      return;
    }
    if (THPDtype_Check(v)) {
      return add(dtype_word(reinterpret_cast<THPDtype*>(v)->scalar_type));
    }
    if (v == Py_None) return add(kNone);
    if (PyBool_Check(v)) return add(v == Py_True ? kTrue : kFalse);
    if (PyFloat_CheckExact(v)) {
      const double x = PyFloat_AS_DOUBLE(v);
      uint64_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      add(kFloat);
      return add(bits);
    }
    if (PyList_CheckExact(v)) {
      const Py_ssize_t n = PyList_GET_SIZE(v);
      add(kList | (static_cast<uint64_t>(n) << 8));
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); ++i) encode(PyList_GET_ITEM(v, i));
      return;
    }
    if (THPLayout_Check(v)) {
      return add(kLayout | (static_cast<uint64_t>(reinterpret_cast<THPLayout*>(v)->layout) << 8));
    }
    if (THPMemoryFormat_Check(v)) {
      return add(kMemoryFormat |
                 (static_cast<uint64_t>(reinterpret_cast<THPMemoryFormat*>(v)->memory_format) << 8));
    }
    if (THPDevice_Check(v)) {
      const c10::Device& d = reinterpret_cast<THPDevice*>(v)->device;
      add(kDevice);
      return add((static_cast<uint64_t>(d.type()) << 32) | static_cast<uint16_t>(d.index()));
    }
    if (PyComplex_CheckExact(v)) {
      const Py_complex c = PyComplex_AsCComplex(v);
      uint64_t re, im;
      std::memcpy(&re, &c.real, sizeof re);
      std::memcpy(&im, &c.imag, sizeof im);
      add(kComplex);
      add(re);
      return add(im);
    }
    PyTypeObject* type = Py_TYPE(v);
    if (PyFloat_Check(v) || PyLong_Check(v)) {
      // a subclass (numpy.float64, an IntEnum): its value exactly, and its type, which the
      // value keeps alive (as Python equality would, 0.0 == -0.0 and 2 == 2.0 otherwise)
      add(kNumberSubclass);
      add(reinterpret_cast<uint64_t>(type));
      if (PyFloat_Check(v)) {
        const double x = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        return add(bits);
      }
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
      if (overflow != 0) return other(v);
      return add(static_cast<uint64_t>(x));
    }
    if (PyType_Check(v) || (type->tp_richcompare == PyBaseObject_Type.tp_richcompare &&
                            type->tp_hash == PyBaseObject_Type.tp_hash)) {
      // identity equality (an op plan, a Python type): the address says it all, and the
      // key's reference to its items keeps the object, hence the address, alive
      add(kIdentity);
      return add(reinterpret_cast<uint64_t>(v));
    }
    other(v);
  }
};

// A 64-bit multiply-rotate hash over the words (a dict key hash, not a cryptographic one),
// in four independent lanes so that the multiplies overlap.
Py_hash_t hash_words(const uint64_t* words, size_t n) {
  uint64_t lane[4] = {0x9E3779B97F4A7C15ull ^ n, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull, 0x27D4EB2F165667C5ull};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) {
      const uint64_t h = lane[j] ^ (words[i + j] * 0xC2B2AE3D27D4EB4Full);
      lane[j] = ((h << 31) | (h >> 33)) * 0x9E3779B97F4A7C15ull;
    }
  }
  for (; i < n; ++i) {
    const uint64_t h = lane[0] ^ (words[i] * 0xC2B2AE3D27D4EB4Full);
    lane[0] = ((h << 31) | (h >> 33)) * 0x9E3779B97F4A7C15ull;
  }
  uint64_t h = lane[0] ^ ((lane[1] << 17) | (lane[1] >> 47)) ^ ((lane[2] << 34) | (lane[2] >> 30)) ^
               ((lane[3] << 51) | (lane[3] >> 13));
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  const Py_hash_t out = static_cast<Py_hash_t>(h);
  return out == -1 ? -2 : out;  // -1 is CPython's error value
}

void op_key_dealloc(PyObject* self) {
  auto* k = reinterpret_cast<OpKeyObject*>(self);
  Py_XDECREF(k->items);
  Py_XDECREF(k->others);
  delete k->words;
  Py_TYPE(self)->tp_free(self);
}

Py_hash_t op_key_hash(PyObject* self) { return reinterpret_cast<OpKeyObject*>(self)->hash; }

PyTypeObject OpKeyType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* op_key_richcompare(PyObject* a, PyObject* b, int op) {
  if ((op != Py_EQ && op != Py_NE) || Py_TYPE(b) != &OpKeyType) Py_RETURN_NOTIMPLEMENTED;
  auto* x = reinterpret_cast<OpKeyObject*>(a);
  auto* y = reinterpret_cast<OpKeyObject*>(b);
  bool equal = x == y || (x->hash == y->hash && *x->words == *y->words);
  if (equal && x != y && (x->others != nullptr || y->others != nullptr)) {
    if (x->others == nullptr || y->others == nullptr) {
      equal = false;
    } else {
      const int r = PyObject_RichCompareBool(x->others, y->others, Py_EQ);
      if (r < 0) return nullptr;
      equal = r == 1;
    }
  }
  if (op == Py_NE) equal = !equal;
  return PyBool_FromLong(equal);
}

Py_ssize_t op_key_length(PyObject* self) { return PyTuple_GET_SIZE(reinterpret_cast<OpKeyObject*>(self)->items); }

PyObject* op_key_item(PyObject* self, Py_ssize_t i) {
  PyObject* items = reinterpret_cast<OpKeyObject*>(self)->items;
  if (i < 0 || i >= PyTuple_GET_SIZE(items)) {
    PyErr_SetString(PyExc_IndexError, "OpKey index out of range");
    return nullptr;
  }
  return Py_NewRef(PyTuple_GET_ITEM(items, i));
}

PyObject* op_key_repr(PyObject* self) {
  return PyUnicode_FromFormat("OpKey%R", reinterpret_cast<OpKeyObject*>(self)->items);
}

PySequenceMethods op_key_sequence = {};

PyObject* make_op_key(PyObject* items) {
  if (!PyTuple_Check(items)) {
    PyErr_SetString(PyExc_TypeError, "OpKey takes a tuple");
    return nullptr;
  }
  // One scratch buffer per thread (compiles run keys on background threads too).
  thread_local std::vector<uint64_t> scratch;
  Encoder enc{scratch};
  try {
    enc.encode(items);
  } catch (...) {
    Py_XDECREF(enc.others);
    throw;
  }
  PyObject* others = nullptr;
  if (enc.others != nullptr) {
    others = PyList_AsTuple(enc.others);
    Py_DECREF(enc.others);
    if (others == nullptr) return nullptr;
  }
  Py_hash_t hash = hash_words(scratch.data(), enc.size);
  if (others != nullptr) {
    const Py_hash_t h = PyObject_Hash(others);
    if (h == -1) {
      Py_DECREF(others);
      return nullptr;
    }
    hash ^= h;
    if (hash == -1) hash = -2;
  }
  auto* k = PyObject_New(OpKeyObject, &OpKeyType);
  if (k == nullptr) {
    Py_XDECREF(others);
    return nullptr;
  }
  k->items = Py_NewRef(items);
  k->others = others;
  k->words = new std::vector<uint64_t>(scratch.data(), scratch.data() + enc.size);
  k->hash = hash;
  return reinterpret_cast<PyObject*>(k);
}

}  // namespace

bool append_key_words(PyObject* value, std::vector<uint64_t>& words) {
  Encoder enc{words};
  enc.size = words.size();
  try {
    enc.encode(value);
  } catch (...) {
    Py_XDECREF(enc.others);
    throw;
  }
  words.resize(enc.size);
  if (enc.others != nullptr) {
    Py_DECREF(enc.others);
    return false;
  }
  return true;
}

uint64_t key_tuple_word(size_t n) { return tuple_word(n); }

void append_key_int(int64_t value, std::vector<uint64_t>& words) {
  // as Encoder::encode writes a Python int: one word below 2**30 in magnitude (one CPython digit)
  constexpr int64_t kOneDigit = int64_t{1} << 30;
  if (kSmallIntWords && value > -kOneDigit && value < kOneDigit) {
    words.push_back(small_int_word(value));
    return;
  }
  words.push_back(kInt);
  words.push_back(static_cast<uint64_t>(value));
}

void append_key_str(const char* text, std::vector<uint64_t>& words) {
  const size_t n = std::strlen(text);
  TORCH_CHECK(n <= 6, "append_key_str takes up to 6 characters");
  words.push_back(short_str_word(text, n));
}

uint64_t key_dtype_word(at::ScalarType type) { return dtype_word(type); }

void append_key_identity(PyObject* value, std::vector<uint64_t>& words) {
  words.push_back(kIdentity);
  words.push_back(reinterpret_cast<uint64_t>(value));
}

Py_hash_t key_words_hash(const std::vector<uint64_t>& words) { return hash_words(words.data(), words.size()); }

const std::vector<uint64_t>* op_key_words(PyObject* key) {
  if (Py_TYPE(key) != &OpKeyType) return nullptr;
  const auto* k = reinterpret_cast<OpKeyObject*>(key);
  return k->others == nullptr ? k->words : nullptr;
}

py::object op_key_of(py::handle items) {
  return steal(make_op_key(items.ptr()));
}

void register_op_key(py::module& m) {
  op_key_sequence.sq_length = op_key_length;
  op_key_sequence.sq_item = op_key_item;
  OpKeyType.tp_name = "torchtpu._C.OpKey";
  OpKeyType.tp_basicsize = sizeof(OpKeyObject);
  OpKeyType.tp_dealloc = op_key_dealloc;
  OpKeyType.tp_hash = op_key_hash;
  OpKeyType.tp_richcompare = op_key_richcompare;
  OpKeyType.tp_as_sequence = &op_key_sequence;
  OpKeyType.tp_repr = op_key_repr;
  OpKeyType.tp_flags = Py_TPFLAGS_DEFAULT;
  OpKeyType.tp_doc = "An op call's exact cache key (see csrc/op_key.cpp)";
  if (PyType_Ready(&OpKeyType) < 0) throw py::error_already_set();
  Py_INCREF(&OpKeyType);
  m.add_object("OpKey", py::handle(reinterpret_cast<PyObject*>(&OpKeyType)));
  m.def(
      "_op_key", &op_key_of,
      "the exact cache key of a tuple of key items (see csrc/op_key.cpp)");
}

}  // namespace torchtpu
