// autoannot's native kernel: the c10d ops of a launch made in a CUDA-graph capture are noted
// here, in C++, with no Python call and no GIL; the Python layer turns the notes into ledger
// entries when the capture ends (autoannot/native/__init__.py).
//
// It sits on TESTING_ONLY_GenericWrapper, a key torch never includes outside its own C++ tests,
// just above the agent's Python kernels (DeferredInit). A thread includes both while it holds
// the agent's dispatcher layer. For each c10d op:
//   * armed (a capture in progress, nothing else asking for launches), the launch's tensors
//     hold data, the current stream is capturing, and the Python layer's key is not excluded
//     (a Python-API launch the proxies annotate themselves) or a call handed off by a proxy
//     is running on this thread (see below): note the launch, then redispatch
//     below both keys (the Python kernel is skipped);
//   * otherwise: redispatch below this key (the Python kernel, where it is included).
// Everything else the key reaches falls through.
//
// The proxies of the Python API (dist.all_reduce, ...) can hand their launches to it: a
// proxy's wrapper is then handoff_wrapper(python_wrapper, label), a C function wrapt calls
// with no Python frame. Where the kernel would note the launch (handing off is on: a capture is
// the only demand, no coalescing block open; this thread holds the layer and its stream is
// capturing), it resolves the caller's line, keeps (label, line) for the thread while the
// original runs (the Python kernels' key excluded, as the Python wrapper has it), and the note
// made below takes them; a launch no kernel of this one noted is noted by the Python side
// after the call. Otherwise it calls the Python wrapper.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::TESTING_ONLY_GenericWrapper;
constexpr c10::DispatchKey kPythonKey = c10::DispatchKey::DeferredInit;

// One argument of a noted launch: a value kept as is (group, ints, reduce op), a tensor's
// dtype and sizes (never the tensor: the capture's memory stays as the program left it), or
// a list of these.
struct Arg {
  enum Kind : uint8_t { kValue, kTensor, kList } kind = kValue;
  c10::IValue value;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<int64_t, 5> sizes;  // (no allocation for most tensors)
  std::vector<Arg> items;
};

// A kind of launch: its op and the arguments its metadata is read from, alike (the key
// launch_key() builds). The first launch's arguments are kept until the kind is first drained,
// given to Python to derive the kind's metadata once, then let go (the group is not held:
// Python forgets the kinds, here, as soon as a group it derived from is gone, so a new group
// at its address gets kinds of its own).
struct Kind {
  uint64_t id;  // never reused: Python keeps what it derived by it
  std::string key;
  std::vector<Arg> args;
  bool given = false;
};

struct Note {
  uint64_t seq;
  uint64_t capture;
  const std::string* op;  // "c10d::allreduce_" (the dispatcher's own name: ops stay registered)
  std::shared_ptr<Kind> kind;  // its kind; null for a launch of no kind kept, with its args:
  std::vector<Arg> args;
  // A Python-API launch handed off by its proxy: its label and call site (str, owned; taken
  // by drain()); null for a C++-origin launch.
  PyObject* label = nullptr;
  PyObject* site = nullptr;
};

// The handed-off call running on this thread (see handoff_wrapper): its label and call site
// until a note takes them; `active` for the whole call (calls nested in it go straight
// through, as the proxies' own depth rule does).
struct Pending {
  bool active = false;
  PyObject* label = nullptr;
  PyObject* site = nullptr;
};
thread_local Pending t_pending;
std::atomic<bool> g_handoff{false};
PyObject* g_sites = nullptr;    // recorder.SITES: code -> {f_lasti: "file:line"} or None
PyObject* g_site_from = nullptr;  // recorder.site_from(frame) -> "file:line"

std::atomic<uint64_t> g_seq{0};
std::atomic<bool> g_armed{false};
std::atomic<uint64_t> g_test_capture{0};  // tests on a machine with no CUDA: every launch is in it
std::atomic<uint64_t> g_noted{0};
std::mutex g_mutex;
// Never destroyed: at exit, after Python has finalized, a note's group must not be released
// and a thread still carrying the key must still find the fall-through (as the Python side's
// fall-through on DeferredInit, see dispatch._key).
std::vector<Note>& g_notes = *new std::vector<Note>();
torch::Library* g_fallthrough = nullptr;
torch::Library* g_library = nullptr;  // deleted by remove_kernels() only
std::vector<std::string> g_registered;
// Per op, by the address of the dispatcher's name of it (what a kernel gets: no hashing of the
// name): the arguments a launch's metadata is read from (the rest, such as the reduce op, is
// not part of its kind); written only while no thread includes the key (register_kernels()).
// And the kinds of launch known (see Kind).
std::unordered_map<const std::string*, std::vector<size_t>>& g_read_by_op =
    *new std::unordered_map<const std::string*, std::vector<size_t>>();
// Under g_mutex; never destroyed (kinds hold groups, see g_notes).
std::unordered_map<std::string, std::shared_ptr<Kind>>& g_kinds =
    *new std::unordered_map<std::string, std::shared_ptr<Kind>>();
uint64_t g_kind_ids = 0;

const c10::DispatchKeySet kBelowKey(c10::DispatchKeySet::FULL_AFTER, kKey);
const c10::DispatchKeySet kBelowPythonKey(c10::DispatchKeySet::FULL_AFTER, kPythonKey);

// cuStreamGetCaptureInfo(stream, *status, *id): the first version, every driver since CUDA
// 10.1 exports it; looked up in the driver torch loaded (no CUDA headers needed here).
using CaptureInfo = int (*)(void*, int*, unsigned long long*);

CaptureInfo capture_info() {
  static CaptureInfo function = []() -> CaptureInfo {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == nullptr) {
      driver = dlopen("libcuda.so.1", RTLD_NOW);
    }
    return driver ? reinterpret_cast<CaptureInfo>(dlsym(driver, "cuStreamGetCaptureInfo"))
                  : nullptr;
  }();
  return function;
}

// Streams known to take part in a capture in progress, and its id: asked of the driver once
// per stream and capture (a stream takes part in one capture at a time); forgotten when a
// capture begins or ends (forget_streams()).
std::mutex g_streams_mutex;
std::unordered_map<void*, uint64_t> g_streams;
std::atomic<uint64_t> g_streams_generation{1};

// The id of the capture the current CUDA stream takes part in; 0 if none.
uint64_t current_capture() {
  uint64_t test = g_test_capture.load(std::memory_order_relaxed);
  if (test != 0) {
    return test;
  }
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    return 0;
  }
  CaptureInfo query = capture_info();
  if (query == nullptr) {
    return 0;
  }
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  void* handle = guard->getStream(guard->getDevice()).native_handle();
  // This thread's last answer, while no capture has begun or ended since (the proxy's
  // handing off and the kernel below it ask for the same stream).
  thread_local void* last_handle = nullptr;
  thread_local uint64_t last_id = 0;
  thread_local uint64_t last_generation = 0;
  uint64_t generation = g_streams_generation.load(std::memory_order_acquire);
  if (handle == last_handle && generation == last_generation) {
    return last_id;
  }
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    auto found = g_streams.find(handle);
    if (found != g_streams.end()) {
      id = found->second;
    }
  }
  if (id == 0) {
    int status = 0;
    unsigned long long asked = 0;
    if (query(handle, &status, &asked) != 0 || status != 1) {  // 1: ACTIVE
      return 0;
    }
    id = asked;
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    g_streams[handle] = id;
  }
  last_handle = handle;
  last_id = id;
  last_generation = generation;
  return id;
}

void forget_streams() {
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  g_streams.clear();
  g_streams_generation.fetch_add(1, std::memory_order_acq_rel);
}

bool holds_data(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.is_meta()) {
    return false;
  }
  auto keys = tensor.key_set();
  return !keys.has(c10::DispatchKey::Python) && !keys.has(c10::DispatchKey::Functionalize);
}

// Note an argument; false when a tensor in it holds no data (tracing: nothing launches).
bool note(const c10::IValue& value, Arg& arg) {
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    if (!holds_data(tensor)) {
      return false;
    }
    arg.kind = Arg::kTensor;
    arg.dtype = tensor.scalar_type();
    arg.sizes.assign(tensor.sizes().begin(), tensor.sizes().end());
    return true;
  }
  if (value.isList()) {
    arg.kind = Arg::kList;
    for (const auto& item : value.toListRef()) {
      arg.items.emplace_back();
      if (!note(item, arg.items.back())) {
        return false;
      }
    }
    return true;
  }
  arg.kind = Arg::kValue;
  arg.value = value;
  return true;
}

template <typename T>
void append(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// What of an argument decides its launch's metadata, as bytes; false where a value is of no
// kind kept (its launch is derived each time).
bool append_key(std::string& key, const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    key.push_back('T');
    append(key, static_cast<int8_t>(tensor.scalar_type()));
    append(key, tensor.dim());
    for (int64_t size : tensor.sizes()) {
      append(key, size);
    }
  } else if (value.isList()) {
    const auto& items = value.toListRef();
    key.push_back('L');
    append(key, items.size());
    for (const auto& item : items) {
      if (!append_key(key, item)) {
        return false;
      }
    }
  } else if (value.isNone()) {
    key.push_back('N');
  } else if (value.isInt()) {
    key.push_back('I');
    append(key, value.toInt());
  } else if (value.isBool()) {
    key.push_back(value.toBool() ? 't' : 'f');
  } else if (value.isString()) {
    key.push_back('S');
    const auto& text = value.toStringRef();
    append(key, text.size());
    key.append(text);
  } else if (value.isObject() && value.toObjectRef().slots().size() == 1 &&
             value.toObjectRef().getSlot(0).isCapsule()) {
    // a bound C++ object (the ProcessGroup): the object itself (the boxed wrapper is new
    // for each call). Its kinds hold it; Python forgets them when a group it derived from
    // is gone.
    key.push_back('G');
    append(key, static_cast<const void*>(value.toObjectRef().getSlot(0).toCapsule().get()));
  } else {
    return false;
  }
  return true;
}

// The launch's kind key (op, then the arguments its metadata is read from); false where it
// has none.
bool launch_key(const std::string* op, c10::ArrayRef<c10::IValue> args, std::string& key) {
  auto read = g_read_by_op.find(op);
  if (read == g_read_by_op.end()) {
    return false;
  }
  key.assign(*op);
  key.push_back('\0');
  for (size_t index : read->second) {
    if (index >= args.size() || !append_key(key, args[index])) {
      return false;
    }
  }
  return true;
}

bool note_all(c10::ArrayRef<c10::IValue> values, std::vector<Arg>& args) {
  args.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (!note(values[i], args[i])) {
      return false;
    }
  }
  return true;
}

// Whether every tensor of the launch holds data (tracing launches nothing).
bool holds_data(const c10::IValue& value) {
  if (value.isTensor()) {
    return holds_data(value.toTensor());
  }
  if (value.isList()) {
    for (const auto& item : value.toListRef()) {
      if (!holds_data(item)) {
        return false;
      }
    }
  }
  return true;
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  // (a handed-off call excludes the Python kernels' key too: it is this kernel's to note)
  if (g_armed.load(std::memory_order_relaxed) &&
      (t_pending.active || !c10::impl::tls_is_dispatch_key_excluded(kPythonKey))) {
    uint64_t capture = current_capture();
    if (capture != 0) {
      const std::string* name = &op.operator_name().name;
      auto args = torch::jit::last(*stack, op.schema().arguments().size());
      bool real = true;
      for (const auto& value : args) {
        real = real && holds_data(value);
      }
      if (real) {
        Note entry{0, capture, name, nullptr, {}};
        Pending& pending = t_pending;  // (a handed-off call's label and line: moved, no GIL)
        entry.label = pending.label;
        entry.site = pending.site;
        pending.label = pending.site = nullptr;
        thread_local std::string key;
        bool keyed = launch_key(name, args, key);
        if (!keyed) {
          note_all(args, entry.args);
        }
        {
          std::lock_guard<std::mutex> lock(g_mutex);
          if (keyed) {
            std::shared_ptr<Kind>& kind = g_kinds[key];
            if (!kind) {  // a new kind: its args (its group) kept for Python
              kind = std::make_shared<Kind>();
              kind->id = ++g_kind_ids;
              kind->key = key;
              note_all(args, kind->args);
            }
            entry.kind = kind;
          }
          entry.seq = g_seq.fetch_add(1) + 1;
          g_notes.push_back(std::move(entry));
        }
        g_noted.fetch_add(1, std::memory_order_relaxed);
        op.redispatchBoxed(keys & kBelowPythonKey, stack);
        return;
      }
    }
  }
  op.redispatchBoxed(keys & kBelowKey, stack);
}

py::object to_python(const Arg& arg) {
  switch (arg.kind) {
    case Arg::kTensor: {
      py::object dtype =
          py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(arg.dtype)));
      py::tuple sizes(arg.sizes.size());
      for (size_t i = 0; i < arg.sizes.size(); ++i) {
        sizes[i] = py::int_(arg.sizes[i]);
      }
      return py::make_tuple(py::str("tensor"), dtype, sizes);
    }
    case Arg::kList: {
      py::list items;
      for (const auto& item : arg.items) {
        items.append(to_python(item));
      }
      return std::move(items);
    }
    default:
      return torch::jit::toPyObject(arg.value);
  }
}

// Kernels for these ops ("c10d::allreduce_"), each with the arguments its launch's metadata is
// read from; the names registered (those without another kernel on the key). Call only while
// no thread includes the key.
std::vector<std::string> register_kernels(const std::vector<std::string>& ops,
                                          const std::vector<std::vector<size_t>>& read) {
  for (size_t i = 0; i < ops.size() && i < read.size(); ++i) {
    auto handle = c10::Dispatcher::singleton().findOp(c10::OperatorName(ops[i], ""));
    if (handle) {
      g_read_by_op[&handle->operator_name().name] = read[i];
    }
  }
  if (!g_fallthrough) {
    g_fallthrough = new torch::Library(
        torch::Library::IMPL, "_", kKey, __FILE__, __LINE__);
    g_fallthrough->fallback(torch::CppFunction::makeFallthrough());
  }
  if (g_library) {
    return g_registered;
  }
  auto library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "c10d", kKey, __FILE__, __LINE__);
  std::vector<std::string> registered;
  for (const auto& name : ops) {
    auto handle = c10::Dispatcher::singleton().findOp(c10::OperatorName(name, ""));
    if (!handle || handle->hasKernelForDispatchKey(kKey)) {
      continue;
    }
    library->impl(name.substr(name.find("::") + 2).c_str(),
                  torch::CppFunction::makeFromBoxedFunction<&kernel>());
    registered.push_back(name);
  }
  g_library = library.release();
  g_registered = registered;
  return registered;
}

void remove_kernels() {
  delete g_library;
  g_library = nullptr;
  g_registered.clear();
}

// The notes of one capture (all, for 0), in launch order, as (seq, op, kind, args, label,
// site): launches of one kind (op, and the arguments its metadata is read from) have one
// metadata; a kind's args are given the first time it is drained (None after); a launch of no
// kind kept (kind 0) always has its args. -1: let every note go, returning none.
py::list drain(int64_t capture) {
  std::vector<Note> taken;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::vector<Note> kept;
    for (auto& entry : g_notes) {
      bool take = capture <= 0 || entry.capture == static_cast<uint64_t>(capture);
      (take ? taken : kept).push_back(std::move(entry));
    }
    g_notes.swap(kept);
  }
  // (outside the lock: a group released here may run its destructor)
  auto handed = [](PyObject* owned) {  // a note's label or site, now Python's (None if null)
    return owned ? py::reinterpret_steal<py::object>(owned) : py::none();
  };
  auto as_python = [](const std::vector<Arg>& args) {
    py::tuple values(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      values[i] = to_python(args[i]);
    }
    return values;
  };
  py::list out;
  std::vector<std::shared_ptr<Kind>> unknown;  // new kinds of notes let go: not known after
  for (auto& entry : taken) {
    py::object label = handed(entry.label), site = handed(entry.site);
    entry.label = entry.site = nullptr;
    Kind* kind = entry.kind.get();
    if (capture < 0) {
      if (kind != nullptr && !kind->given) {
        unknown.push_back(entry.kind);
      }
      continue;
    }
    if (kind == nullptr) {
      out.append(py::make_tuple(entry.seq, *entry.op, 0, as_python(entry.args), label, site));
    } else if (kind->given) {
      out.append(py::make_tuple(entry.seq, *entry.op, kind->id, py::none(), label, site));
    } else {
      kind->given = true;
      out.append(py::make_tuple(entry.seq, *entry.op, kind->id, as_python(kind->args), label,
                                site));
      kind->args.clear();  // (its group let go)
    }
  }
  if (!unknown.empty()) {  // (their args, and groups, go with the last of their notes)
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& kind : unknown) {
      auto found = g_kinds.find(kind->key);
      if (found != g_kinds.end() && found->second == kind) {
        g_kinds.erase(found);
      }
    }
  }
  return out;
}

// A group Python derived kinds from is gone (its address may be taken by a new one): launches
// get new kinds from now on (notes already made keep theirs). `if_idle`: only where no launch
// is noted and not drained (Python lets go of what it derived; a note would still need it);
// whether the kinds were forgotten.
bool forget_kinds(bool if_idle) {
  std::unordered_map<std::string, std::shared_ptr<Kind>> forgotten;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (if_idle && !g_notes.empty()) {
      return false;
    }
    forgotten.swap(g_kinds);
  }
  return true;  // (kinds freed here hold no group: a kind holding one is held by its note)
}

// call_excluded(function, args, kwargs): function(*args, **kwargs) with the Python kernels'
// key and this one excluded on this thread (the launch the proxies annotate, not annotated again below):
// one call from Python instead of two toggles through torch's bindings.
PyObject* call_excluded(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  if (count != 3 || !PyTuple_Check(args[1]) || (args[2] != Py_None && !PyDict_Check(args[2]))) {
    PyErr_SetString(PyExc_TypeError, "call_excluded(function, args: tuple, kwargs: dict|None)");
    return nullptr;
  }
  // (this kernel's key too: it would only let the launch through)
  c10::impl::ExcludeDispatchKeyGuard excluded(c10::DispatchKeySet({kPythonKey, kKey}));
  return PyObject_Call(args[0], args[1], args[2] == Py_None ? nullptr : args[2]);
}

PyMethodDef g_call_excluded = {"call_excluded", reinterpret_cast<PyCFunction>(call_excluded),
                               METH_FASTCALL, "function(*args, **kwargs), our key excluded"};

// The caller's "file:line" as recorder.call_site gives it: from recorder.SITES where every
// frame walked is known there, else recorder.site_from(frame). New reference; null on error.
PyObject* caller_site() {
  PyFrameObject* start = PyEval_GetFrame();  // borrowed: the proxy's caller (wrapt is C)
#if PY_VERSION_HEX >= 0x030B0000
  PyFrameObject* frame = start;
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* sites = PyDict_GetItemWithError(g_sites, reinterpret_cast<PyObject*>(code));
    Py_DECREF(code);
    if (sites == Py_None) {  // torch's, wrapt's, ours, the standard library's: look further up
      PyFrameObject* back = PyFrame_GetBack(frame);
      Py_DECREF(frame);
      frame = back;
      continue;
    }
    if (sites != nullptr && PyDict_Check(sites)) {
      PyObject* lasti = PyLong_FromLong(PyFrame_GetLasti(frame));
      PyObject* site = lasti ? PyDict_GetItemWithError(sites, lasti) : nullptr;
      Py_XDECREF(lasti);
      if (site != nullptr) {
        Py_INCREF(site);
        Py_DECREF(frame);
        return site;
      }
    }
    Py_DECREF(frame);
    break;  // not known yet: Python finds it (and keeps it)
  }
  if (PyErr_Occurred()) {
    return nullptr;
  }
#endif
  PyObject* from = start ? reinterpret_cast<PyObject*>(start) : Py_None;
  return PyObject_CallOneArg(g_site_from, from);
}

// handoff_wrapper's call: self is (python_wrapper, label, note_in_capture); args are
// wrapt's (wrapped, instance, args, kwargs).
PyObject* handoff_call(PyObject* self, PyObject* const* args, Py_ssize_t count) {
  PyObject* python_wrapper = PyTuple_GET_ITEM(self, 0);
  if (count != 4 || !PyTuple_Check(args[2]) || (args[3] != Py_None && !PyDict_Check(args[3]))) {
    return PyObject_Vectorcall(python_wrapper, args, count, nullptr);
  }
  PyObject* wrapped = args[0];
  PyObject* kwargs = args[3] == Py_None || PyDict_GET_SIZE(args[3]) == 0 ? nullptr : args[3];
  Pending& pending = t_pending;
  if (pending.active) {  // inside a handed-off call: its launch
    return PyObject_Call(wrapped, args[2], kwargs);
  }
  if (!g_handoff.load(std::memory_order_relaxed) || g_sites == nullptr ||
      !c10::impl::tls_is_dispatch_key_included(kKey) ||
      c10::impl::tls_is_dispatch_key_excluded(kPythonKey) || current_capture() == 0) {
    return PyObject_Vectorcall(python_wrapper, args, count, nullptr);
  }
  PyObject* site = caller_site();
  if (site == nullptr) {  // the Python wrapper annotates it (and says why, if it fails too)
    PyErr_Clear();
    return PyObject_Vectorcall(python_wrapper, args, count, nullptr);
  }
  PyObject* label = PyTuple_GET_ITEM(self, 1);
  Py_INCREF(label);
  pending = Pending{true, label, site};
  PyObject* result;
  {  // the Python kernels stand aside, as for the Python wrapper's call: this call is the launch
    c10::impl::ExcludeDispatchKeyGuard python_kernels(kPythonKey);
    result = PyObject_Call(wrapped, args[2], kwargs);
  }
  PyObject* left_label = pending.label;  // (not taken: nothing was noted)
  PyObject* left_site = pending.site;
  pending = Pending{};
  if (result != nullptr && left_label != nullptr) {
    // It returned, and no kernel of this one noted it (an op without one, fake tensors): the
    // Python side notes it as its wrapper would have (said once if that fails).
    PyObject* keywords = PyDict_Check(args[3]) ? (Py_INCREF(args[3]), args[3]) : PyDict_New();
    if (keywords != nullptr) {
      PyObject* late_args[] = {args[2], keywords, left_site};
      PyObject* noted = PyObject_Vectorcall(PyTuple_GET_ITEM(self, 2), late_args, 3, nullptr);
      Py_XDECREF(noted);
      Py_DECREF(keywords);
    }
    if (PyErr_Occurred()) {  // (the collective's result stands)
      PyErr_Clear();
    }
  }
  Py_XDECREF(left_label);
  Py_XDECREF(left_site);
  return result;
}

PyMethodDef g_handoff_call = {"handoff", reinterpret_cast<PyCFunction>(handoff_call),
                              METH_FASTCALL, "a proxy's wrapper handing launches to the kernel"};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "autoannot's native kernel for c10d launches in CUDA-graph captures";
  m.attr("KEY") = c10::toString(kKey);
  m.def("register_kernels", &register_kernels);
  m.def("remove_kernels", &remove_kernels);
  m.def("set_armed", [](bool armed) { g_armed.store(armed); });
  m.def("armed", []() { return g_armed.load(); });
  m.def("registered", []() { return g_fallthrough != nullptr; });
  // How many launches have been noted, read by Python with no call (a launch the proxies
  // annotate in a capture takes its place among the notes by it).
  static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t), "a plain 64-bit counter");
  m.attr("order") = py::memoryview::from_buffer(
      reinterpret_cast<const uint64_t*>(&g_seq), {1}, {sizeof(uint64_t)});
  m.def("noted", []() { return g_noted.load(); });
  m.def("pending", []() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_notes.size();
  });
  m.def("forget_streams", &forget_streams);
  m.attr("call_excluded") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_call_excluded, nullptr, nullptr));
  m.def("current_capture", []() -> py::object {
    uint64_t id = current_capture();
    return id ? py::object(py::int_(id)) : py::none();
  });
  m.def("set_test_capture", [](uint64_t id) { g_test_capture.store(id); });
  m.def("handoff_wrapper", [](py::object python_wrapper, py::str label,
                              py::object note_in_capture) {
    py::tuple self = py::make_tuple(python_wrapper, label, note_in_capture);
    return py::reinterpret_steal<py::object>(
        PyCFunction_NewEx(&g_handoff_call, self.ptr(), nullptr));
  }, "wrapt's wrapper for a Python-API collective: hands its launches in a capture to the "
     "kernel, else calls python_wrapper");
  m.def("set_handoff", [](bool on) { g_handoff.store(on); });
  m.def("handoff", []() { return g_handoff.load(); });
  m.def("set_site_resolver", [](py::dict sites, py::object site_from) {
    Py_XDECREF(g_sites);
    Py_XDECREF(g_site_from);
    g_sites = sites.inc_ref().ptr();
    g_site_from = site_from.inc_ref().ptr();
  });
  m.def("drain", &drain, py::arg("capture") = 0);
  m.def("forget_kinds", &forget_kinds, py::arg("if_idle") = false);
  m.def("kinds", []() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_kinds.size();
  });
}
