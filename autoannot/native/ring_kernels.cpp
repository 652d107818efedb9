// The c10d kernels: the always-on ring's launches made below torch's Python API (DDP's reducer,
// autograd's backward, ``pg.*``, compiled code, C++ callers) on a torch whose process groups
// take no hooks (torch < 2.14), seen by a kernel of ours on each c10d operator of the table.
//
// Why: there, the native observer's other door to such a launch is a RecordFunction callback
// on every operator with its inputs, which every operator of a step pays while a ring is open
// (a DDP step on 2 gloo ranks: 1.073x its instructions). A kernel on the c10d operators alone
// costs the collectives only.
//
// Where: torch's BackendSelect key. Every thread includes it by default (so a launch from any
// thread reaches the kernel, autograd's and C++'s alike, with no thread-local key to hold), and
// it has a fall-through for every operator torch gives no kernel there (all but its factory
// functions; the c10d operators have none): no other operator pays anything. The kernel runs
// below autograd, Python subclasses, functionalization and tracing (their tensors never reach
// it; a meta tensor does, and is let through), and redispatches to the keys below its own:
// torch's kernel for the tensors' device. This borrows a key torch keeps for another purpose;
// its blast radius: the table's c10d operators only, each checked to have no BackendSelect
// kernel first (one there: the kernels are taken off again and the observer's callback serves
// the ring, as before); registered
// through torch::Library, the registration TORCH_LIBRARY_IMPL makes, built and destroyed at run
// time as torch.library's Python Library does; only while a ring is open on such a torch; taken
// off at disable().
//
// What it does, by a mode Python sets as the agent's demand changes:
//   0  anything else open (a capture, a recorder, a block, another journal): the launch is let
//      through at once (the observer's callback sees it, as before);
//   2  one ring with files open and nothing else (the always-on case): a launch of a key seen
//      before (its operator, group and tensors' dtypes and sizes: the observer's key) is written
//      to the ring here, its return when the operator returns (failed where it raised); a new
//      key's launch goes to Python (the observer derives its kind; Python writes it and tells its
//      ids), and its return is written here. A launch a proxy annotates is its own.

#include "shared.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

constexpr size_t kKnownLimit = 4096;

std::atomic<int> g_mode{0};
// (with the GIL) Python: ended(failed) ends the launch Python wrote; inside: the agent's
// state.inside (the threads inside a proxy's call).
PyObject* g_ended = nullptr;
PyObject* g_inside = nullptr;
// (with the GIL) a launch's key -> (the ring's kind id, the group's slot), for one attach.
std::unordered_map<std::string, std::pair<uint32_t, uint32_t>>& g_known =
    *new std::unordered_map<std::string, std::pair<uint32_t, uint32_t>>();
uint64_t g_known_generation = 0;
// (with the GIL) the kernels, while registered; never destroyed at exit (torch's dispatcher may
// be gone by then), only by unregister_kernels (disable())
torch::Library* g_library = nullptr;
std::vector<std::string>& g_registered = *new std::vector<std::string>();

std::atomic<uint64_t> g_written_here{0};  // (tests, benchmarks: written with no Python call)
std::atomic<uint64_t> g_handed_to_python{0};

const c10::DispatchKeySet kBelow(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);

// How the launch under way on this thread is ended.
enum class Ends { kNothing, kHere, kPython };

// (with the GIL) the launch written to the ring, or handed to Python to write; how it ends.
Ends enter(const void* op, c10::ArrayRef<const c10::IValue> inputs) {
  if (autoannot_inside_a_call(g_inside)) {
    return Ends::kNothing;  // (a proxy's launch: its own)
  }
  thread_local std::string key;
  key.clear();
  if (!autoannot_launch_key(op, inputs, key)) {
    return Ends::kNothing;  // (tracing, or a value no key is made of: the observer's)
  }
  uint64_t generation = autoannot_ring_generation();
  if (g_known_generation != generation || g_known.size() >= kKnownLimit) {
    g_known.clear();
    g_known_generation = generation;
  }
  auto found = g_known.find(key);  // (none while no ring is attached: Python attaches it)
  if (found != g_known.end() && found->second.first != kNotTheWriters) {
    uint32_t site = 0;
    if (autoannot_ring_site(site) &&
        autoannot_ring_enter(found->second.first, site, found->second.second)) {
      g_written_here.fetch_add(1, std::memory_order_relaxed);
      return Ends::kHere;
    }
    return Ends::kNothing;
  }
  PyObject* site = autoannot_caller_site();
  if (site == nullptr) {
    PyErr_Clear();
    return Ends::kNothing;
  }
  g_handed_to_python.fetch_add(1, std::memory_order_relaxed);
  std::string learned = key;  // (Python may launch, and key others, before it answers)
  PyObject* told = autoannot_kernel_entered(op, learned, inputs, site);
  Py_DECREF(site);
  Ends ends = Ends::kNothing;
  std::pair<uint32_t, uint32_t> ids{kNotTheWriters, 0};
  if (told == nullptr) {
    autoannot_warn("the c10d kernels", "handing a launch to Python");
  } else if (PyTuple_CheckExact(told) && PyTuple_GET_SIZE(told) == 2) {
    ids = autoannot_ids_told(told);
    ends = Ends::kHere;  // (written through the writer: this thread's record, ended here)
  } else if (told == Py_True) {
    ends = Ends::kPython;
  }
  Py_XDECREF(told);
  uint64_t now = autoannot_ring_generation();  // (Python may have attached the ring now)
  if (g_known_generation != now) {
    g_known.clear();
    g_known_generation = now;
  }
  g_known[learned] = ids;
  return ends;
}

// The kernel of one operator of the table (its observer's Op).
struct RingKernel final : c10::OperatorKernel {
  explicit RingKernel(const void* op) : op(op) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const void* observed = op;  // (nothing of this object is read after: see unregister)
    c10::DispatchKeySet below = keys & kBelow;
    if (g_mode.load(std::memory_order_relaxed) != 2 || autoannot_claimed() ||
        !Py_IsInitialized()) {
      handle.redispatchBoxed(below, stack);
      return;
    }
    size_t count = handle.schema().arguments().size();
    c10::ArrayRef<const c10::IValue> inputs(stack->data() + (stack->size() - count), count);
    Ends ends;
    {
      PyGILState_STATE gil = PyGILState_Ensure();
      ends = enter(observed, inputs);
      PyGILState_Release(gil);
    }
    if (ends == Ends::kNothing) {
      handle.redispatchBoxed(below, stack);
      return;
    }
    autoannot_claim(1);  // (its launch: the observer's callbacks leave it to us)
    try {
      handle.redispatchBoxed(below, stack);
    } catch (...) {
      autoannot_claim(-1);
      ended(ends, true);
      throw;
    }
    autoannot_claim(-1);
    ended(ends, false);
  }

  static void ended(Ends ends, bool failed) {
    if (ends == Ends::kHere) {
      autoannot_ring_returned(failed);
      return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    if (g_ended != nullptr) {
      PyObject* result = PyObject_CallOneArg(g_ended, failed ? Py_True : Py_False);
      if (result == nullptr) {
        autoannot_warn("the c10d kernels", "ending a launch in Python");
      }
      Py_XDECREF(result);
    }
    PyGILState_Release(gil);
  }

  const void* op;
};

// Register a kernel on each named operator of the table that has none at BackendSelect: the
// names registered, and those left alone (another kernel there). Once (a second call: those
// already registered).
std::pair<std::vector<std::string>, std::vector<std::string>> register_kernels(
    const std::vector<std::string>& names) {
  if (g_library != nullptr) {
    return {g_registered, {}};
  }
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d",
                                                  c10::DispatchKey::BackendSelect, __FILE__,
                                                  __LINE__);
  std::vector<std::string> registered, taken;
  for (const std::string& name : names) {
    const void* op = autoannot_table_op(name);
    auto handle = c10::Dispatcher::singleton().findOp(c10::OperatorName(name, ""));
    if (op == nullptr || !handle.has_value() || name.rfind("c10d::", 0) != 0) {
      continue;  // (not in this torch)
    }
    if (handle->hasKernelForDispatchKey(c10::DispatchKey::BackendSelect)) {
      taken.push_back(name);  // (someone's kernel there: left alone)
      continue;
    }
    library->impl(name.substr(6).c_str(),
                  torch::CppFunction::makeFromBoxedFunctor(std::make_unique<RingKernel>(op)));
    registered.push_back(name);
  }
  g_library = library.release();
  g_registered = registered;
  return {registered, taken};
}

// The kernels off torch's dispatcher (disable()). A launch already in a kernel goes on: torch
// keeps what the kernel's object holds alive no longer than its table entry, so a kernel reads
// nothing of its object after its first line.
void unregister_kernels() {
  g_mode.store(0);
  delete g_library;
  g_library = nullptr;
  g_registered.clear();
}

void set_python(py::object ended, py::object inside) {
  for (PyObject** slot : {&g_ended, &g_inside}) {
    Py_XDECREF(*slot);
    *slot = nullptr;
  }
  if (ended.is_none()) {  // (at exit: no Python is called after)
    g_mode.store(0);
    return;
  }
  g_ended = ended.inc_ref().ptr();
  g_inside = inside.inc_ref().ptr();
}

}  // namespace

void autoannot_add_ring_kernels(py::module_& m) {
  m.def("register_ring_kernels", &register_kernels, py::arg("names"),
        "the c10d kernels on these operators of the table that have no BackendSelect kernel: "
        "(the names registered, those left alone)");
  m.def("unregister_ring_kernels", &unregister_kernels);
  m.def("ring_kernels", []() { return g_registered; });
  m.def("set_ring_kernels_python", &set_python, py::arg("ended"), py::arg("inside"));
  m.def("set_ring_kernels_mode", [](int mode) { g_mode.store(mode); });
  m.def("ring_kernels_mode", []() { return g_mode.load(); });
  m.def("ring_kernel_counts", []() {
    return py::make_tuple(g_written_here.load(), g_handed_to_python.load());
  }, "(tests, benchmarks) launches the kernels wrote with no Python call, and handed to it");
  m.def("forget_ring_kernel_keys", []() { g_known.clear(); },
        "a group gone: its address may be reused");
}
