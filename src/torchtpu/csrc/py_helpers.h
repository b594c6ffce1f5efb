// Small CPython helpers shared by the engine's native loops (collect.cpp, record.cpp).
#pragma once

#include <torch/extension.h>

#include <initializer_list>
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

}  // namespace torchtpu
