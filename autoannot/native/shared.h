// What the native module's two sources share: observer.cpp (the RecordFunction observer, the
// call-site walk, the module's definition) and ring_hooks.cpp (the ring writer and torch's
// process-group hooks).
#pragma once

#include <torch/extension.h>

// The caller's "file:line" as the recorder finds it (observer.cpp; with the GIL): a new
// reference, null with a Python error set.
PyObject* autoannot_caller_site();

// The ring writer's and the process-group hooks' functions, added to the module.
void autoannot_add_ring_hooks(pybind11::module_& m);

// fork(): the ring writer's mutexes taken before, released on both sides after.
void autoannot_ring_hooks_before_fork();
void autoannot_ring_hooks_after_fork();
