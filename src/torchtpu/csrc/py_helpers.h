// Small CPython helpers shared by the engine's native loops (collect.cpp, record.cpp, defer.cpp).
#pragma once

#include <torch/extension.h>

#include <structmember.h>

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace torchtpu {

// Interns each name into its slot; the strings live as long as the module.
inline void intern_all(std::initializer_list<std::pair<PyObject**, const char*>> names) {
  for (const auto& [slot, text] : names) {
    *slot = PyUnicode_InternFromString(text);
    if (*slot == nullptr) throw py::error_already_set();
  }
}

// A new tuple holding new references to `items`.
inline py::object tuple_of(std::initializer_list<py::handle> items) {
  py::tuple out(items.size());
  size_t i = 0;
  for (py::handle h : items) {
    PyTuple_SET_ITEM(out.ptr(), i++, h.inc_ref().ptr());
  }
  return out;
}

// A CPython status (0 = success) or a new reference, turned into a C++ exception on failure.
inline void check(int status) {
  if (status != 0) throw py::error_already_set();
}

inline py::object steal(PyObject* p) {
  if (p == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(p);
}

// Objects of Python classes with __slots__ (Pending, _Node, _Collector) are made and read
// here by their slots' byte offsets, read from the slot descriptors once: that skips the
// class call and its __init__ frame, half of each object's cost.
inline Py_ssize_t slot_offset(PyObject* type, const char* name) {
  py::object descr = steal(PyObject_GetAttrString(type, name));
  const std::string what = std::string(reinterpret_cast<PyTypeObject*>(type)->tp_name) + "." + name;
  if (Py_TYPE(descr.ptr()) != &PyMemberDescr_Type) {
    throw std::runtime_error(what + " is not a __slots__ member");
  }
  const PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(descr.ptr())->d_member;
  if (member->type != T_OBJECT_EX) {
    throw std::runtime_error(what + " is not an object slot");
  }
  return member->offset;
}

inline void set_slot(PyObject* obj, Py_ssize_t offset, PyObject* value) {
  Py_INCREF(value);
  *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset) = value;  // empty after tp_alloc
}

inline PyObject* get_slot(PyObject* obj, Py_ssize_t offset) {  // borrowed; never empty for a made Pending
  PyObject* v = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
  return v != nullptr ? v : Py_None;
}

inline void replace_slot(PyObject* obj, Py_ssize_t offset, PyObject* value) {
  PyObject** field = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
  PyObject* old = *field;
  Py_INCREF(value);
  *field = value;
  Py_XDECREF(old);
}

}  // namespace torchtpu
