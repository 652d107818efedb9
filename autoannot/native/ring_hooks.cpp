// The always-on ring's writer, and torch's process-group hooks in C++ (torch >= 2.14).
//
// The writer: the ring's mapped file (autoannot/keep/ring.py describes its layout) written in
// C++. Once a ring is attached (ring_attach) every record of it is written here, by Python (the
// proxies' launches: ring_enter, ring_returned; a graph replay's launches: ring_write_many) and by
// the hooks below alike, so one counter orders the ring; Python keeps the kinds' and call
// sites' ids (each written to the names file the first time it is seen).
//
// The hooks (AUTOANNOT_GROUP_HOOKS: built where torch's process groups take pre/post collective
// hooks, c10d/Hooks.hpp): registered on each group in place of Python's, they act by a mode
// Python sets as the agent's demand changes:
//   0  nothing asks for launches: return at once;
//   1  hand each launch to Python (``before`` and ``after``: the agent's hook observer), as
//      torch's Python hooks would;
//   2  one ring and nothing else open (the always-on case): a launch of a kind and from a call
//      site seen before is written to the ring here, its return at the post-hook; Python is
//      called only for a launch of a new kind or from a new call site, for one a proxy
//      annotates (none: its own), and for one called through ``torch.ops`` (its op is read
//      from Python's frame).
// A launch's kind is keyed by what the hook tells (its op's hook name, group, root, its
// tensors' dtypes and sizes, and which outputs are inputs): a superset of what Python keys a
// hooked launch by, so one key is one kind. Its call site is the caller's "file:line" as the
// recorder finds it (autoannot_caller_site), an interned string: its id is kept by the string.

#include "shared.h"
#include "ring_format.h"

#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#ifndef AUTOANNOT_GROUP_HOOKS
#define AUTOANNOT_GROUP_HOOKS 0
#endif
#if AUTOANNOT_GROUP_HOOKS
#include <torch/csrc/distributed/c10d/Hooks.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace py = pybind11;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ring's records are little-endian");

namespace {

// ---------------------------------------------------------------------------------------------
// The ring writer

using Record = AutoannotRecord;  // (ring_format.h: ring_format.py's layout)

struct Writer {
  std::mutex mutex;
  char* base = nullptr;  // the mapping (null: no ring attached)
  uint64_t capacity = 0;
  uint64_t count = 0;  // launches entered so far
  uint64_t generation = 0;  // one more at each attach and detach
  std::vector<int64_t> seqs;  // a group's next seq, by its slot (Python numbers the groups)
  Py_buffer view{};  // (the mapping stays exported while attached: Python cannot unmap it)
};
Writer& g_writer = *new Writer();  // (never destroyed: hooks may run at exit)
std::atomic<bool> g_attached{false};  // (read with no lock: whether a ring is attached)
std::atomic<uint64_t> g_generation{0};  // (read with no lock: the writer's generation)
// (owned; with the GIL) the attached ring's site_id(site) -> its id of a call site
PyObject* g_ring_site_id = nullptr;

// The record this thread entered last, until its return is written.
struct Running {
  uint64_t at = 0, count = 0, generation = 0;
  bool set = false;
};
thread_local Running t_running;

int64_t monotonic_ns() {  // time.monotonic_ns()
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// (The writer's lock held, a ring attached) The one place a record is written: launch number
// w.count, of the group in `slot` (its next seq), entered and returned at the times given; its
// offset in the ring. The count in the header is the caller's to write, after its records.
uint64_t put_record(Writer& w, uint32_t kind, uint32_t site, uint32_t slot, int64_t entered_ns,
                    int64_t returned_ns) {
  if (slot >= w.seqs.size()) {
    w.seqs.resize(slot + 1, 0);
  }
  Record record{w.seqs[slot]++, entered_ns, returned_ns, 0, kind, site, 0, 0};
  uint64_t at = kRingHeaderBytes + (w.count % w.capacity) * sizeof(Record);
  std::memcpy(w.base + at, &record, sizeof record);
  w.count += 1;
  return at;
}

// The record of a launch entered now; false where no ring is attached.
bool enter(uint32_t kind, uint32_t site, uint32_t slot) {
  std::lock_guard<std::mutex> lock(g_writer.mutex);
  Writer& w = g_writer;
  if (w.base == nullptr) {
    return false;
  }
  uint64_t at = put_record(w, kind, site, slot, monotonic_ns(), 0);
  t_running = Running{at, w.count - 1, w.generation, true};
  std::memcpy(w.base + kRingCountAt, &w.count, sizeof w.count);  // (after the record: readers)
  return true;
}

// The launch this thread entered last returned now (or raised), unless its record is gone.
void returned(bool failed) {
  if (!t_running.set) {
    return;
  }
  t_running.set = false;
  std::lock_guard<std::mutex> lock(g_writer.mutex);
  Writer& w = g_writer;
  if (w.base == nullptr || t_running.generation != w.generation ||
      w.count - t_running.count >= w.capacity) {
    return;  // (another ring, or written over since)
  }
  int64_t value = failed ? kRingFailed : monotonic_ns();
  std::memcpy(w.base + t_running.at + kRingReturnedAt, &value, sizeof value);
}

void clear_caches();

void attach(py::object mapping, uint64_t capacity, uint64_t count, std::vector<int64_t> seqs,
            py::object site_id) {
  Py_buffer view;
  if (PyObject_GetBuffer(mapping.ptr(), &view, PyBUF_WRITABLE) != 0) {
    throw py::error_already_set();
  }
  if (capacity == 0 ||
      static_cast<uint64_t>(view.len) < kRingHeaderBytes + capacity * sizeof(Record)) {
    PyBuffer_Release(&view);
    throw std::invalid_argument("the mapping is smaller than a ring of this capacity");
  }
  Py_buffer old{};
  {
    std::lock_guard<std::mutex> lock(g_writer.mutex);
    Writer& w = g_writer;
    std::swap(old, w.view);
    w.view = view;
    w.base = static_cast<char*>(view.buf);
    w.capacity = capacity;
    w.count = count;
    w.seqs = std::move(seqs);
    w.generation += 1;
    g_generation.store(w.generation);
    g_attached.store(true);
  }
  if (old.obj != nullptr) {
    PyBuffer_Release(&old);
  }
  clear_caches();  // (ids are a ring's)
  Py_XDECREF(g_ring_site_id);
  g_ring_site_id = site_id.is_none() ? nullptr : site_id.inc_ref().ptr();
}

// The ring let go of: (count, seqs by slot) for Python to go on with; None if none attached.
py::object detach() {
  Py_buffer old{};
  uint64_t count;
  std::vector<int64_t> seqs;
  {
    std::lock_guard<std::mutex> lock(g_writer.mutex);
    Writer& w = g_writer;
    if (w.base == nullptr) {
      return py::none();
    }
    std::swap(old, w.view);
    w.base = nullptr;
    w.generation += 1;
    g_generation.store(w.generation);
    g_attached.store(false);
    count = w.count;
    seqs.swap(w.seqs);
  }
  PyBuffer_Release(&old);
  clear_caches();
  Py_XDECREF(g_ring_site_id);
  g_ring_site_id = nullptr;
  return py::make_tuple(count, seqs);
}

// (with the GIL) a call site (a reference held) -> its id in the attached ring.
std::unordered_map<PyObject*, uint32_t>& g_sites = *new std::unordered_map<PyObject*, uint32_t>();
constexpr size_t kCacheLimit = 4096;

void clear_sites() {  // (with the GIL)
  for (auto& entry : g_sites) {
    Py_DECREF(entry.first);
  }
  g_sites.clear();
}

// (with the GIL) the attached ring's id of the caller's call site; false on failure (a Python
// error is cleared: Python's path says it).
bool site_id(uint32_t& id) {
  PyObject* site = autoannot_caller_site();
  if (site == nullptr) {
    PyErr_Clear();
    return false;
  }
  auto found = g_sites.find(site);
  if (found != g_sites.end()) {
    id = found->second;
    Py_DECREF(site);
    return true;
  }
  PyObject* told = g_ring_site_id != nullptr ? PyObject_CallOneArg(g_ring_site_id, site) : nullptr;
  unsigned long value = told != nullptr ? PyLong_AsUnsignedLong(told) : 0;
  Py_XDECREF(told);
  if (told == nullptr || PyErr_Occurred()) {
    PyErr_Clear();
    Py_DECREF(site);
    return false;
  }
  if (g_sites.size() >= kCacheLimit) {
    clear_sites();
  }
  g_sites.emplace(site, static_cast<uint32_t>(value));  // (keeps the reference)
  id = static_cast<uint32_t>(value);
  return true;
}

// ring_enter(kind, site, slot) and ring_returned(failed): the proxies' path, with no pybind.
PyObject* ring_enter(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  if (count != 3) {
    PyErr_SetString(PyExc_TypeError, "ring_enter(kind, site, slot)");
    return nullptr;
  }
  unsigned long values[3];
  for (int i = 0; i < 3; ++i) {
    values[i] = PyLong_AsUnsignedLong(args[i]);
    if (values[i] == static_cast<unsigned long>(-1) && PyErr_Occurred()) {
      return nullptr;
    }
  }
  return PyBool_FromLong(enter(static_cast<uint32_t>(values[0]), static_cast<uint32_t>(values[1]),
                               static_cast<uint32_t>(values[2])));
}

PyObject* ring_returned(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  returned(count > 0 && PyObject_IsTrue(args[0]) == 1);
  Py_RETURN_NONE;
}

// ring_write_many(ids, entered_ns, returned_ns): a record for each (kind, site, slot) packed in
// ids ("<III" each: a graph replay's launches, in order), each its group's next seq, entered
// and returned at the times given (the replay's), under one lock.
PyObject* ring_write_many(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  if (count != 3) {
    PyErr_SetString(PyExc_TypeError, "ring_write_many(ids, entered_ns, returned_ns)");
    return nullptr;
  }
  long long times[2];
  for (int i = 0; i < 2; ++i) {
    times[i] = PyLong_AsLongLong(args[1 + i]);
    if (times[i] == -1 && PyErr_Occurred()) {
      return nullptr;
    }
  }
  Py_buffer ids{};
  if (PyObject_GetBuffer(args[0], &ids, PyBUF_SIMPLE) != 0) {
    return nullptr;
  }
  size_t n = static_cast<size_t>(ids.len) / (3 * sizeof(uint32_t));
  bool written = false;
  {
    std::lock_guard<std::mutex> lock(g_writer.mutex);
    Writer& w = g_writer;
    if (w.base != nullptr) {
      const char* at_id = static_cast<const char*>(ids.buf);
      for (size_t i = 0; i < n; ++i, at_id += 3 * sizeof(uint32_t)) {
        uint32_t id[3];
        std::memcpy(id, at_id, sizeof id);
        put_record(w, id[0], id[1], id[2], times[0], times[1]);
      }
      std::memcpy(w.base + kRingCountAt, &w.count, sizeof w.count);
      written = true;
    }
  }
  PyBuffer_Release(&ids);
  return PyBool_FromLong(written);
}

PyMethodDef g_ring_write_many = {"ring_write_many", reinterpret_cast<PyCFunction>(ring_write_many),
                                 METH_FASTCALL,
                                 "ring_write_many(ids, entered_ns, returned_ns): a record for "
                                 "each (kind, site, slot) packed in ids ('<III' each)"};
PyMethodDef g_ring_enter = {"ring_enter", reinterpret_cast<PyCFunction>(ring_enter),
                            METH_FASTCALL, "ring_enter(kind, site, slot): a launch entered now"};
PyMethodDef g_ring_returned = {"ring_returned", reinterpret_cast<PyCFunction>(ring_returned),
                               METH_FASTCALL,
                               "ring_returned(failed): this thread's last launch returned"};

// ---------------------------------------------------------------------------------------------
// The process-group hooks

#if AUTOANNOT_GROUP_HOOKS

std::atomic<int> g_mode{0};
// Python, set by the hook observer (owned; with the GIL): before(group_key, args) -> None
// (nothing to end), True (call after()), or (kind, slot) (it wrote the launch to the attached
// ring alone: the post-hook ends it here, and launches of this key are written here);
// after(group_key, args); inside: the agent's state.inside (thread ident -> depth: the threads inside a proxy's call); the code
// objects of torch.ops' calls (a launch called through them is Python's).
PyObject* g_before = nullptr;
PyObject* g_after = nullptr;
PyObject* g_inside = nullptr;
std::vector<PyObject*>& g_op_codes = *new std::vector<PyObject*>();

// (with the GIL) a kind's key -> (the ring's kind id, the group's slot).
std::unordered_map<std::string, std::pair<uint32_t, uint32_t>>& g_keys =
    *new std::unordered_map<std::string, std::pair<uint32_t, uint32_t>>();

// Launches whose post-hook goes to Python: (group key, op id).
struct PairHash {
  size_t operator()(const std::pair<int64_t, int64_t>& p) const {
    return std::hash<int64_t>()(p.first) * 31 + std::hash<int64_t>()(p.second);
  }
};
std::mutex g_pending_mutex;
std::unordered_set<std::pair<int64_t, int64_t>, PairHash>& g_pending =
    *new std::unordered_set<std::pair<int64_t, int64_t>, PairHash>();
constexpr size_t kPendingLimit = 1024;  // (launches that raised: let go)

// This thread's launch written here, until its post-hook.
struct Written {
  int64_t group = 0, op = 0;
  bool set = false;
};
thread_local Written t_written;

std::atomic<uint64_t> g_written_here{0};  // (tests, benchmarks: launches written with no Python)
std::atomic<uint64_t> g_handed_to_python{0};

// -DAUTOANNOT_TIME_HOOKS (benchmarks/native_hook_time.py's build only): the time spent in the
// hooks, summed.
#ifdef AUTOANNOT_TIME_HOOKS
std::atomic<uint64_t> g_hook_ns{0}, g_hook_calls{0};
struct Timed {
  int64_t started = monotonic_ns();
  ~Timed() {
    g_hook_ns.fetch_add(monotonic_ns() - started, std::memory_order_relaxed);
    g_hook_calls.fetch_add(1, std::memory_order_relaxed);
  }
};
#define AUTOANNOT_TIMED Timed timed_hook
#else
#define AUTOANNOT_TIMED
#endif

template <typename T>
void put(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void put_tensor(std::string& key, const at::Tensor& tensor) {
  if (!tensor.defined()) {
    put(key, static_cast<int8_t>(-1));
    return;
  }
  put(key, static_cast<int8_t>(tensor.scalar_type()));
  auto sizes = tensor.sizes();
  put(key, static_cast<int32_t>(sizes.size()));
  key.append(reinterpret_cast<const char*>(sizes.data()), sizes.size() * sizeof(int64_t));
}

void key_of(int64_t group, const c10d::PreHookArgs& args, std::string& key) {
  put(key, static_cast<uint8_t>(args.name));
  put(key, group);
  put(key, args.root);
  put(key, static_cast<int32_t>(args.input_tensors.size()));
  for (const auto& tensor : args.input_tensors) {
    put_tensor(key, tensor);
  }
  put(key, static_cast<int32_t>(args.output_tensors.size()));
  for (const auto& tensor : args.output_tensors) {
    int32_t same = -1;  // the input it is, if any
    for (size_t i = 0; i < args.input_tensors.size(); ++i) {
      if (tensor.defined() && args.input_tensors[i].unsafeGetTensorImpl() ==
                                  tensor.unsafeGetTensorImpl()) {
        same = static_cast<int32_t>(i);
        break;
      }
    }
    put(key, same);
    if (same < 0) {
      put_tensor(key, tensor);
    }
  }
}

// (with the GIL) whether Python's innermost frame is torch.ops' call of an op.
bool called_through_torch_ops() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  if (frame == nullptr) {
    return false;
  }
  PyCodeObject* code = PyFrame_GetCode(frame);
  bool found = false;
  for (PyObject* known : g_op_codes) {
    found = found || known == reinterpret_cast<PyObject*>(code);
  }
  Py_DECREF(code);
  return found;
}

// (with the GIL, mode 2) the launch written here; false: Python's to see.
bool write_here(int64_t group, const c10d::PreHookArgs& args, std::string& key, bool& ignored) {
  if (autoannot_inside_a_call(g_inside)) {
    ignored = true;  // (the proxy's own launch)
    return true;
  }
  if (called_through_torch_ops()) {
    return false;
  }
  key_of(group, args, key);  // (kept by the caller where Python writes it: the next is here)
  if (!g_attached.load(std::memory_order_relaxed)) {
    return false;
  }
  auto known = g_keys.find(key);
  if (known == g_keys.end()) {
    return false;
  }
  uint32_t site = 0;
  if (!site_id(site) || !enter(known->second.first, site, known->second.second)) {
    return false;
  }
  g_written_here.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void warn(const char* what) { autoannot_warn("process group hooks", what); }

// (with the GIL) Python's fn(group, args), what it returned; None where it raised (said once).
template <typename Args>
py::object call_python(PyObject* fn, int64_t group, const Args& args, const char* what) {
  try {
    return py::reinterpret_borrow<py::object>(fn)(group, py::cast(args));
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  warn(what);
  return py::none();
}

void pre_hook(int64_t group, const c10d::PreHookArgs& args) {
  AUTOANNOT_TIMED;
  int mode = g_mode.load(std::memory_order_relaxed);
  if (mode == 0 || !Py_IsInitialized()) {
    return;
  }
  t_written.set = false;
  PyGILState_STATE gil = PyGILState_Ensure();
  std::string key;
  bool ignored = false;
  if (mode == 2 && write_here(group, args, key, ignored)) {
    if (!ignored) {
      t_written = Written{group, args.op_id, true};
    }
    PyGILState_Release(gil);
    return;
  }
  if (g_before == nullptr) {
    PyGILState_Release(gil);
    return;
  }
  g_handed_to_python.fetch_add(1, std::memory_order_relaxed);
  {  // (what Python returned is let go of before the GIL)
    py::object told = call_python(g_before, group, args, "handing a launch to Python");
    try {
      if (py::isinstance<py::tuple>(told) && py::len(told) == 2) {
        std::pair<uint32_t, uint32_t> ids = autoannot_ids_told(told.ptr());
        if (!key.empty() && ids.first != kNotTheWriters) {  // (written to the attached ring
          if (g_keys.size() >= kCacheLimit) {  // alone, by its hooked kind)
            g_keys.clear();
          }
          g_keys[key] = ids;
        }
        t_written = Written{group, args.op_id, true};
      } else if (told.ptr() == Py_True) {
        std::lock_guard<std::mutex> lock(g_pending_mutex);
        if (g_pending.size() >= kPendingLimit) {
          g_pending.clear();
        }
        g_pending.emplace(group, args.op_id);
      }
    } catch (py::error_already_set& error) {
      error.restore();
      warn("handing a launch to Python");
    } catch (std::exception& error) {
      PyErr_SetString(PyExc_RuntimeError, error.what());
      warn("handing a launch to Python");
    }
  }
  PyGILState_Release(gil);
}

void post_hook(int64_t group, const c10d::PostHookArgs& args) {
  AUTOANNOT_TIMED;
  if (t_written.set && t_written.group == group && t_written.op == args.op_id) {
    t_written.set = false;
    returned(false);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(g_pending_mutex);
    if (g_pending.empty() || g_pending.erase({group, args.op_id}) == 0) {
      return;
    }
  }
  if (!Py_IsInitialized()) {
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  if (g_after != nullptr) {
    call_python(g_after, group, args, "handing a launch's end to Python");
  }
  PyGILState_Release(gil);
}

void hook_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int64_t key,
                int64_t hook_id) {
  group->registerPreHook(hook_id, [key](const c10d::PreHookArgs& args) { pre_hook(key, args); });
  group->registerPostHook(hook_id,
                          [key](const c10d::PostHookArgs& args) { post_hook(key, args); });
}

void unhook_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int64_t hook_id) {
  group->unregisterPreHook(hook_id);
  group->unregisterPostHook(hook_id);
}

void set_python(py::object before, py::object after, py::object inside, py::list op_codes) {
  for (PyObject** slot : {&g_before, &g_after, &g_inside}) {
    Py_XDECREF(*slot);
    *slot = nullptr;
  }
  for (PyObject* code : g_op_codes) {
    Py_DECREF(code);
  }
  g_op_codes.clear();
  if (before.is_none()) {  // (at exit: no Python is called after)
    g_mode.store(0);
    return;
  }
  g_before = before.inc_ref().ptr();
  g_after = after.inc_ref().ptr();
  g_inside = inside.inc_ref().ptr();
  for (py::handle code : op_codes) {
    if (!code.is_none()) {
      g_op_codes.push_back(code.inc_ref().ptr());
    }
  }
}

#endif  // AUTOANNOT_GROUP_HOOKS

void clear_caches() {  // (with the GIL)
#if AUTOANNOT_GROUP_HOOKS
  g_keys.clear();
#endif
  clear_sites();
}

}  // namespace

bool autoannot_inside_a_call(PyObject* inside) {
  if (inside == nullptr || !PyDict_Check(inside) || PyDict_GET_SIZE(inside) == 0) {
    return false;
  }
  PyObject* ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
  int found = ident != nullptr ? PyDict_Contains(inside, ident) : -1;
  Py_XDECREF(ident);
  if (found < 0) {
    PyErr_Clear();
  }
  return found == 1;
}

void autoannot_warn(const char* subject, const char* what) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  PyObject* diagnostics = PyImport_ImportModule("autoannot.base.diagnostics");
  PyObject* warn_once = diagnostics ? PyObject_GetAttrString(diagnostics, "warn_once") : nullptr;
  PyObject* result = warn_once ? PyObject_CallFunction(warn_once, "ssO", subject, what,
                                                       value ? value : Py_None)
                               : nullptr;
  Py_XDECREF(result);
  Py_XDECREF(warn_once);
  Py_XDECREF(diagnostics);
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
}

bool autoannot_ring_attached() { return g_attached.load(std::memory_order_relaxed); }

uint64_t autoannot_ring_generation() { return g_generation.load(std::memory_order_relaxed); }

bool autoannot_ring_site(uint32_t& id) { return site_id(id); }

std::pair<uint32_t, uint32_t> autoannot_ids_told(PyObject* told) {
  std::pair<uint32_t, uint32_t> ids{kNotTheWriters, 0};
  if (told != nullptr && PyTuple_CheckExact(told) && PyTuple_GET_SIZE(told) == 2) {
    unsigned long kind = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(told, 0));
    unsigned long slot = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(told, 1));
    if (!PyErr_Occurred() && kind < kNotTheWriters && slot < kNotTheWriters) {
      ids = {static_cast<uint32_t>(kind), static_cast<uint32_t>(slot)};
    }
  }
  PyErr_Clear();
  return ids;
}

bool autoannot_ring_enter(uint32_t kind, uint32_t site, uint32_t slot) {
  return enter(kind, site, slot);
}

void autoannot_ring_returned(bool failed) { returned(failed); }

void autoannot_ring_hooks_before_fork() {
  g_writer.mutex.lock();
#if AUTOANNOT_GROUP_HOOKS
  g_pending_mutex.lock();
#endif
}

void autoannot_ring_hooks_after_fork() {
#if AUTOANNOT_GROUP_HOOKS
  g_pending_mutex.unlock();
#endif
  g_writer.mutex.unlock();
}

void autoannot_add_ring_hooks(py::module_& m) {
  m.def("ring_attach", &attach, py::arg("mapping"), py::arg("capacity"), py::arg("count"),
        py::arg("seqs"), py::arg("site_id"),
        "write this ring's records here from now on (its mapping, its count, its groups' next "
        "seqs by slot, and its site_id(site): a call site's id, asked once a site)");
  m.def("ring_detach", &detach, "let go of the ring: (count, seqs by slot), or None");
  m.def("ring_count", []() -> int64_t {
    std::lock_guard<std::mutex> lock(g_writer.mutex);
    return g_writer.base == nullptr ? -1 : static_cast<int64_t>(g_writer.count);
  });
  m.attr("ring_enter") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_ring_enter, nullptr, nullptr));
  m.attr("ring_returned") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_ring_returned, nullptr, nullptr));
  m.attr("ring_write_many") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_ring_write_many, nullptr, nullptr));
  m.attr("GROUP_HOOKS") = bool(AUTOANNOT_GROUP_HOOKS);
#if AUTOANNOT_GROUP_HOOKS
  m.def("hook_group", &hook_group, py::arg("group"), py::arg("key"), py::arg("hook_id"),
        "the native pre/post hooks on this group, for group key `key`");
  m.def("unhook_group", &unhook_group, py::arg("group"), py::arg("hook_id"));
  m.def("set_hook_python", &set_python, py::arg("before"), py::arg("after"),
        py::arg("inside"), py::arg("op_codes"));
  m.def("set_hook_mode", [](int mode) { g_mode.store(mode); });
  m.def("hook_mode", []() { return g_mode.load(); });
  m.def("hook_counts", []() {
    return py::make_tuple(g_written_here.load(), g_handed_to_python.load());
  });
  m.def("forget_hook_keys", []() { clear_caches(); }, "a group gone: its key may be reused");
#ifdef AUTOANNOT_TIME_HOOKS
  m.def("hook_time", []() { return py::make_tuple(g_hook_ns.load(), g_hook_calls.load()); },
        "(a timing build) nanoseconds spent in the hooks, and the hooks' calls");
#endif
#endif
}
