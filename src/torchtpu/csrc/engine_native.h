// The engine's native pieces that one file of this module calls in another.
#pragma once

#include <torch/extension.h>

namespace torchtpu {

// collect.cpp: (specs, has_generator) of a call's schema values, filling the collector.
py::tuple walk_all(py::handle col, py::handle values, py::handle runtime_scalar);

// op_key.cpp: the exact cache key (a torchtpu._C.OpKey) of a tuple of key items.
py::object op_key_of(py::handle items);

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
