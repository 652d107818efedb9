// What the native module's sources share: observer.cpp (the RecordFunction observer, the
// call-site walk, the module's definition), ring_hooks.cpp (the ring writer and torch's
// process-group hooks) and ring_kernels.cpp (the c10d kernels).
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
// A launch's ids in the attached ring as Python told them once for its key (the route's
// for_native: a tuple of its kind's id and its group's slot); anything else (None, True, an
// error: null) is kNotTheWriters' — Python writes that key's launches. Leaves no Python error.
constexpr uint32_t kNotTheWriters = UINT32_MAX;
std::pair<uint32_t, uint32_t> autoannot_ids_told(PyObject* told);

// (with the GIL) whether this thread is inside a proxy's call: `inside` is the agent's
// state.inside (thread ident -> depth; null: none).
bool autoannot_inside_a_call(PyObject* inside);

// (with the GIL, a Python error set) the error said once by Python's diagnostics, as
// "`subject`: `what`", and cleared.
void autoannot_warn(const char* subject, const char* what);

// For the c10d kernels (ring_kernels.cpp), from the observer (observer.cpp): the table's
// operator of this name (null: not observed); a launch's key from its arguments (false: not a
// launch of real tensors, or no key); whether this thread's launch is another's now (a proxy's
// claimed call, an operator the observer watches), and a claim taken (+1) or let go (-1);
// (with the GIL) a launch of a new key handed to Python's entered(op, kind id, described, site):
// what it answered (a new reference; null with a Python error set).
const void* autoannot_table_op(const std::string& name);
bool autoannot_launch_key(const void* op, c10::ArrayRef<const c10::IValue> inputs,
                          std::string& key);
bool autoannot_claimed();
void autoannot_claim(int delta);
void autoannot_set_kernel_entered(PyObject* entered);
PyObject* autoannot_kernel_entered(const void* op, const std::string& key,
                                   c10::ArrayRef<const c10::IValue> inputs, PyObject* site);

// The ring writer's and the process-group hooks' functions, added to the module; the c10d
// kernels' likewise.
void autoannot_add_ring_hooks(pybind11::module_& m);
void autoannot_add_ring_kernels(pybind11::module_& m);

// fork(): the ring writer's mutexes taken before, released on both sides after.
void autoannot_ring_hooks_before_fork();
void autoannot_ring_hooks_after_fork();
