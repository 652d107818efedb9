// What the native module's two sources share: observer.cpp (the RecordFunction observer, the
// call-site walk, the module's definition) and ring_hooks.cpp (the ring writer and torch's
// process-group hooks).
#pragma once

#include <torch/extension.h>

// The caller's "file:line" as the recorder finds it (observer.cpp; with the GIL): a new
// reference, null with a Python error set.
PyObject* autoannot_caller_site();

// The ring writer (ring_hooks.cpp), for the proxies' C wrapper (observer.cpp): whether a ring
// is attached, and which attach this is (ids are an attached ring's); the attached ring's id of
// the caller's call site (with the GIL; false on failure, no Python error left); a launch
// entered now (false: no ring attached), and this thread's last launch returned (or raised).
bool autoannot_ring_attached();
uint64_t autoannot_ring_generation();
bool autoannot_ring_site(uint32_t& id);
bool autoannot_ring_enter(uint32_t kind, uint32_t site, uint32_t slot);
void autoannot_ring_returned(bool failed);

// (with the GIL) whether this thread is inside a proxy's call: `inside` is the agent's
// state.inside (thread ident -> depth; null: none).
bool autoannot_inside_a_call(PyObject* inside);

// The ring writer's and the process-group hooks' functions, added to the module.
void autoannot_add_ring_hooks(pybind11::module_& m);

// fork(): the ring writer's mutexes taken before, released on both sides after.
void autoannot_ring_hooks_before_fork();
void autoannot_ring_hooks_after_fork();
