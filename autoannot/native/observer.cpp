// autoannot's native observer: collective launches seen through torch's RecordFunction
// callbacks, the extension point torch documents for observing operators
// (at::addGlobalCallback; "Features for large-scale deployments"), with no dispatch key.
//
// One global callback, registered only while something asks for launches (a CUDA-graph capture
// in progress, a recorder or journal open) and removed after, fires on every thread for every
// operator; it acts on two names only:
//   * an operator of the table ("c10d::allreduce_", "_c10d_functional::all_reduce_", ...): the
//     outermost one on a thread is a launch (the ops it calls are the same launch);
//   * "record_param_comms": torch's own record of the launch, made by the process group just
//     before it launches (ProcessGroupNCCL; not gloo). Its ParamCommsDebugInfo holds the very
//     fields the profiler writes on the eager kernel: they become the launch's metadata.
//
// A launch is noted when its operator returns (not if it raised):
//   * in a capture (the current CUDA stream is capturing): a note, in C++, with no Python call
//     and no GIL, drained by Python when the capture ends (autoannot/native/__init__.py);
//   * while a recorder or journal is open ("listening"): Python is called with the launch
//     (records and journal lines want it at once, with its Python caller's line); a journal
//     also gets it when its operator is entered, before it runs.
// A launch whose metadata comes from no record_param_comms is described by its arguments
// (dtype and sizes of its tensors, its group, ints): Python derives it by the table, once per
// kind of launch.
//
// The Python API's proxies annotate their own launches: around such a call the proxy marks
// the thread "claimed" (call_claimed), and the observer leaves that launch to it. In a capture
// a proxy can instead hand its launch to the observer (handoff_wrapper: a C function wrapt
// calls, no Python frame): where the call's arguments make a key (the facts the proxy's
// key_of reads: group, tensors' dtypes and sizes, roots), the C wrapper notes the launch itself
// with what the proxy derived for that key (once per key) and runs the call with RecordFunction
// off where no other callback listens: a Python-API launch in a capture pays neither the
// process group's Work range nor a Python frame. Otherwise it keeps (label, line) for the
// thread while the call runs and the note made below takes them.

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include "shared.h"

#if __has_include(<torch/csrc/distributed/c10d/ParamCommsUtils.hpp>)
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>
#define AUTOANNOT_PARAM_COMMS 1
#else
#define AUTOANNOT_PARAM_COMMS 0
#endif

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------------------------------------
// What a launch is described by

// One argument of a launch: a value kept as is (group, ints, strings), a tensor's dtype and
// sizes (never the tensor: the capture's memory stays as the program left it), or a list.
struct Arg {
  enum Kind : uint8_t { kValue, kTensor, kList } kind = kValue;
  c10::IValue value;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<int64_t, 5> sizes;
  std::vector<Arg> items;
};

// torch's record of the launch (ParamCommsDebugInfo), as the profiler reads it.
struct Fields {
  std::string group_name, group_desc, collective;
  int rank = 0, world_size = 0, global_rank_start = 0, global_rank_stride = 0;
  int64_t in_nelems = 0, out_nelems = 0;
  c10::ScalarType dtype = c10::ScalarType::Byte;
  std::vector<int64_t> in_splits, out_splits, group_ranks;
};

// A kind of launch: its operator and what its metadata is read from, alike (its key). What a
// new kind is described by is kept until it is first drained, then let go (no group held).
struct Kind {
  uint64_t id;  // never reused: Python keeps what it derived by it
  std::string key;
  std::vector<Arg> args;
  std::unique_ptr<Fields> fields;
  std::atomic<bool> given{false};  // Python has its description (drained, or told)
};

// An operator of the table: its name, and which of its arguments its metadata is read from.
struct Op {
  std::string name;
  std::vector<size_t> read;
};

struct Note {
  uint64_t seq;
  uint64_t capture;
  const Op* op;
  std::shared_ptr<Kind> kind;
  // A Python-API launch handed off by its proxy: its label and call site (owned; taken by
  // drain()); null for a C++-origin launch.
  PyObject* label = nullptr;
  PyObject* site = nullptr;
  // A launch its proxy's C wrapper keyed and noted itself (op and kind null): what its ledger
  // entry holds, (annotation, kernels), as the proxy derived it for its key (owned; taken by
  // drain()).
  PyObject* noted_as = nullptr;
};

// The launch under way on this thread: its outermost observed operator.
struct Launch {
  int depth = 0;  // observed operators entered and not left on this thread
  const Op* op = nullptr;
  bool ignored = false;  // claimed by a proxy, tracing, or nobody asking
  uint64_t capture = 0;
  bool listening = false;
  int uncaught = 0;
  PyObject* label = nullptr;
  PyObject* site = nullptr;
  bool keyed = false;
  bool described = false;  // args holds its arguments
  std::string key;  // of its arguments, where they were given
  std::vector<Arg> args;  // where no key could be made
  bool has_args = false;
  std::unique_ptr<Fields> fields;
};

// The handed-off call running on this thread (see handoff_wrapper).
struct Pending {
  bool active = false;
  PyObject* label = nullptr;
  PyObject* site = nullptr;
};

thread_local Launch t_launch;
thread_local Pending t_pending;
thread_local int t_claimed = 0;  // calls a proxy annotates itself, running on this thread

std::mutex g_mutex;  // the notes, the kinds, the registration
// Never destroyed: at exit, after Python has finalized, a note's group must not be released.
std::vector<Note>& g_notes = *new std::vector<Note>();
std::unordered_map<std::string, std::shared_ptr<Kind>>& g_kinds =
    *new std::unordered_map<std::string, std::shared_ptr<Kind>>();
uint64_t g_kind_ids = 0;
// The operators observed, by name (written only while no callback is registered).
std::unordered_map<std::string_view, const Op*>& g_ops =
    *new std::unordered_map<std::string_view, const Op*>();

// The c10d operator of each eager collective name ("allreduce" -> "c10d::allreduce_"): what
// a launch seen only through its process group's record is labelled by.
std::unordered_map<std::string, std::string>& g_collective_ops =
    *new std::unordered_map<std::string, std::string>();
const Op* g_unknown_op = new Op{"c10d::unknown", {}};

const std::string& g_op_of_collective(const std::string& collective) {
  auto found = g_collective_ops.find(collective);
  return found != g_collective_ops.end() ? found->second : g_unknown_op->name;
}

std::atomic<uint64_t> g_seq{0};
std::atomic<uint64_t> g_noted{0};
std::atomic<bool> g_capturing{false};  // captures in progress: note their launches
std::atomic<bool> g_recording{false};  // recorders open: give Python each launch returned
std::atomic<bool> g_journaling{false};  // journals open: and each launch entered
std::atomic<bool> g_handoff{false};
std::atomic<uint64_t> g_test_capture{0};  // tests with no CUDA: every launch is in it
bool g_inputs = false;  // captures ask for operators' inputs too (tests with no NCCL)
bool g_registered = false;
bool g_registered_operators = false;
at::CallbackHandle g_handle = 0;
PyObject* g_listener = nullptr;  // Python: listener(when, op, kind, described, site)
PyObject* g_sites = nullptr;  // sites.SITES: id(code) -> (code, {f_lasti: "file:line"} or None)
PyObject* g_site_from = nullptr;  // site_from(frame) -> "file:line"
PyObject* g_library_files = nullptr;  // sites.LIBRARY_FILES: file name -> no call site there

// ---------------------------------------------------------------------------------------------
// The current stream's capture

// cuStreamGetCaptureInfo(stream, *status, *id): every driver since CUDA 10.1 exports it;
// looked up in the driver torch loaded (no CUDA headers needed: one build for CPU and CUDA).
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
// per stream and capture; forgotten when a capture begins or ends (forget_streams()).
std::mutex g_streams_mutex;
std::unordered_map<void*, uint64_t> g_streams;
std::atomic<uint64_t> g_streams_generation{1};

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

// ---------------------------------------------------------------------------------------------
// Describing a launch

bool holds_data(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.is_meta()) {
    return false;
  }
  auto keys = tensor.key_set();
  return !keys.has(c10::DispatchKey::Python) && !keys.has(c10::DispatchKey::Functionalize);
}

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

void describe(const c10::IValue& value, Arg& arg) {
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    arg.kind = Arg::kTensor;
    arg.dtype = tensor.scalar_type();
    arg.sizes.assign(tensor.sizes().begin(), tensor.sizes().end());
  } else if (value.isList()) {
    arg.kind = Arg::kList;
    for (const auto& item : value.toListRef()) {
      arg.items.emplace_back();
      describe(item, arg.items.back());
    }
  } else {
    arg.kind = Arg::kValue;
    arg.value = value;
  }
}

void describe_all(c10::ArrayRef<const c10::IValue> values, std::vector<Arg>& args) {
  args.clear();
  args.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    describe(values[i], args[i]);
  }
}

template <typename T>
void append(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void append_text(std::string& key, const std::string& text) {
  append(key, text.size());
  key.append(text);
}

// What of an argument decides its launch's metadata, as bytes; false where a value is of no
// kind kept (its launch is described in full).
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
    append_text(key, value.toStringRef());
  } else if (value.isObject() && value.toObjectRef().slots().size() == 1 &&
             value.toObjectRef().getSlot(0).isCapsule()) {
    // a bound C++ object (the ProcessGroup): the object itself (the boxed wrapper is new for
    // each call). Python forgets the kinds when a group it derived from is gone.
    key.push_back('G');
    append(key, static_cast<const void*>(value.toObjectRef().getSlot(0).toCapsule().get()));
  } else {
    return false;
  }
  return true;
}

bool args_key(const Op* op, c10::ArrayRef<const c10::IValue> args, std::string& key) {
  key.assign("A");
  append_text(key, op->name);
  for (size_t index : op->read) {
    if (index >= args.size() || !append_key(key, args[index])) {
      return false;
    }
  }
  return true;
}

void fields_key(const Op* op, const Fields& fields, std::string& key) {
  key.assign("F");
  append_text(key, op->name);
  append_text(key, fields.group_name);
  append_text(key, fields.group_desc);
  append_text(key, fields.collective);
  append(key, fields.rank);
  append(key, fields.world_size);
  append(key, fields.global_rank_start);
  append(key, fields.global_rank_stride);
  append(key, fields.in_nelems);
  append(key, fields.out_nelems);
  append(key, static_cast<int8_t>(fields.dtype));
  for (const auto* list : {&fields.in_splits, &fields.out_splits, &fields.group_ranks}) {
    append(key, list->size());
    for (int64_t value : *list) {
      append(key, value);
    }
  }
}

std::unique_ptr<Fields> param_comms_fields() {
#if AUTOANNOT_PARAM_COMMS
  auto* info = static_cast<torch::ParamCommsDebugInfo*>(
      c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PARAM_COMMS_INFO));
  if (info == nullptr) {
    return nullptr;
  }
  auto fields = std::make_unique<Fields>();
  fields->group_name = info->getProcessGroupName();
  fields->group_desc = info->getProcessGroupDesc();
  fields->collective = info->getCollectiveName();
  fields->rank = info->getRank();
  fields->world_size = info->getWorldSize();
  fields->global_rank_start = info->getGlobalRankStart();
  fields->global_rank_stride = info->getGlobalRankStride();
  fields->in_nelems = info->getInMessageNelems();
  fields->out_nelems = info->getOutMessageNelems();
  fields->dtype = info->getDType();
  fields->in_splits = info->getInputSplitSizes();
  fields->out_splits = info->getOutputSplitSizes();
  fields->group_ranks = info->getGroupRanks();
  return fields;
#else
  return nullptr;
#endif
}

// ---------------------------------------------------------------------------------------------
// To Python

py::object to_python(const Arg& arg) {
  switch (arg.kind) {
    case Arg::kTensor: {
      py::object dtype = py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(arg.dtype)));
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

py::list int_list(const std::vector<int64_t>& values) {
  py::list list;
  for (int64_t value : values) {
    list.append(py::int_(value));
  }
  return list;
}

// ("fields", {...}) or ("args", (...)): what Python derives the launch's metadata from.
py::object described(const std::vector<Arg>& args, const Fields* fields) {
  if (fields != nullptr) {
    py::dict record;
    record["group_name"] = fields->group_name;
    record["group_desc"] = fields->group_desc;
    record["collective"] = fields->collective;
    record["rank"] = fields->rank;
    record["world_size"] = fields->world_size;
    record["global_rank_start"] = fields->global_rank_start;
    record["global_rank_stride"] = fields->global_rank_stride;
    record["in_nelems"] = fields->in_nelems;
    record["out_nelems"] = fields->out_nelems;
    record["dtype"] = std::string(c10::toString(fields->dtype));
    record["in_splits"] = int_list(fields->in_splits);
    record["out_splits"] = int_list(fields->out_splits);
    record["group_ranks"] = int_list(fields->group_ranks);
    return py::make_tuple(py::str("fields"), record);
  }
  py::tuple values(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    values[i] = to_python(args[i]);
  }
  return py::make_tuple(py::str("args"), values);
}

// ---------------------------------------------------------------------------------------------
// The callback

// What the start callback hands the end callback of an observed operator (a marker: the end
// callback runs for every operator).
struct Observed : at::ObserverContext {};

void release_python(PyObject*& object) {
  if (object != nullptr) {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      Py_DECREF(object);
    }
    object = nullptr;
  }
}

// The kind of the launch under way (made under g_mutex where new).
std::shared_ptr<Kind> kind_of(Launch& launch) {
  std::string key;
  if (launch.fields) {
    fields_key(launch.op, *launch.fields, key);
  } else if (launch.keyed) {
    key = launch.key;
  } else {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto found = g_kinds.find(key);
  if (found != g_kinds.end()) {
    return found->second;
  }
  if (!launch.fields && !launch.described) {  // (its kind was forgotten meanwhile)
    return nullptr;
  }
  std::shared_ptr<Kind>& kind = g_kinds[key];
  {
    kind = std::make_shared<Kind>();
    kind->id = ++g_kind_ids;
    kind->key = key;
    if (launch.fields) {
      kind->fields = std::move(launch.fields);
    } else {
      kind->args = std::move(launch.args);
    }
  }
  return kind;
}

// Python's listener(when, op, kind id, described or None, site or None): 0 entered, 1 returned.
void tell_python(int when, const Launch& launch, const Kind* kind) {
  if (g_listener == nullptr || !Py_IsInitialized()) {
    return;
  }
  py::gil_scoped_acquire gil;
  try {
    py::object what = py::none();
    uint64_t id = 0;
    if (kind != nullptr) {
      id = kind->id;
      if (!kind->given.load()) {
        what = described(kind->args, kind->fields.get());
      }
    } else if (launch.has_args) {
      what = described(launch.args, nullptr);
    }
    py::object site = launch.site ? py::reinterpret_borrow<py::object>(launch.site)
                                  : py::none();
    py::object label = launch.label ? py::reinterpret_borrow<py::object>(launch.label)
                                    : py::none();
    py::object answer = py::reinterpret_borrow<py::object>(g_listener)(
        when, launch.op->name, id, what, site, label);
    if (kind != nullptr && answer.ptr() == Py_True) {  // Python keeps it by its id
      Kind* known = const_cast<Kind*>(kind);
      known->given.store(true);
      known->args.clear();  // (its group let go; the launch under way still holds it)
    }
  } catch (py::error_already_set& error) {
    error.discard_as_unraisable("autoannot's native observer: listener");
  }
}

// A launch seen through its process group's Work range alone (the callback asks for no
// operator, see update_registration()): noted where it goes into a capture, told to the
// journals (it is entered: the process group launches it next).
void work_seen() {
  if (t_claimed > 0) {
    return;
  }
  uint64_t capture = g_capturing.load(std::memory_order_relaxed) ? current_capture() : 0;
  bool journaling = g_journaling.load(std::memory_order_relaxed);
  if (capture == 0 && !journaling) {
    return;
  }
  Launch launch;
  launch.fields = param_comms_fields();
  if (!launch.fields) {  // a process group that records nothing of itself (gloo)
    return;
  }
  auto found = g_ops.find(std::string_view(g_op_of_collective(launch.fields->collective)));
  launch.op = found != g_ops.end() ? found->second : g_unknown_op;
  std::shared_ptr<Kind> kind = kind_of(launch);
  Pending& pending = t_pending;
  if (journaling) {
    launch.label = pending.label;
    launch.site = pending.site;
    tell_python(0, launch, kind.get());
    launch.label = launch.site = nullptr;  // (still the pending ones: not owned here)
  }
  if (capture == 0) {
    return;
  }
  Note note{0, capture, launch.op, kind, pending.label, pending.site};
  pending.label = pending.site = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    note.seq = g_seq.fetch_add(1) + 1;
    g_notes.push_back(std::move(note));
  }
  g_noted.fetch_add(1, std::memory_order_relaxed);
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const char* name = fn.name();
  Launch& launch = t_launch;
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    // A process group's Work for a launch ("nccl:all_reduce"), made just before it launches,
    // its record of the launch set for the thread (ProcessGroupNCCL)
    if (launch.depth > 0) {
      if (!launch.ignored && !launch.fields) {
        launch.fields = param_comms_fields();
      }
    } else if (g_capturing.load(std::memory_order_relaxed) ||
               g_journaling.load(std::memory_order_relaxed)) {
      work_seen();
    }
    return nullptr;
  }
  if (name[0] == 'r') {
    if (launch.depth > 0 && !launch.ignored && !launch.fields &&
        std::strcmp(name, "record_param_comms") == 0) {
      launch.fields = param_comms_fields();
    }
    return nullptr;
  }
  if (name[0] != 'c' && name[0] != '_') {
    return nullptr;
  }
  auto found = g_ops.find(std::string_view(name));
  if (found == g_ops.end()) {
    return nullptr;
  }
  if (launch.depth++ > 0) {  // inside a launch: the same launch
    return std::make_unique<Observed>();
  }
  launch.op = found->second;
  launch.fields.reset();
  launch.keyed = launch.has_args = launch.described = false;
  launch.capture = 0;
  launch.label = launch.site = nullptr;
  launch.ignored = t_claimed > 0;
  launch.listening = g_recording.load(std::memory_order_relaxed) ||
                     g_journaling.load(std::memory_order_relaxed);
  if (!launch.ignored) {
    if (g_capturing.load(std::memory_order_relaxed)) {
      launch.capture = current_capture();
    }
    launch.ignored = launch.capture == 0 && !launch.listening;
  }
  if (!launch.ignored && fn.needsInputs()) {
    auto inputs = fn.inputs();
    bool real = true;
    for (const auto& value : inputs) {
      real = real && holds_data(value);
    }
    if (!real) {  // tracing: nothing launches
      launch.ignored = true;
    } else if (args_key(launch.op, inputs, launch.key)) {
      launch.keyed = true;
      // (a new kind keeps its arguments: described here, moved into it at the end)
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_kinds.find(launch.key) == g_kinds.end()) {
        describe_all(inputs, launch.args);
        launch.described = true;
      }
    } else {
      describe_all(inputs, launch.args);
      launch.has_args = launch.described = true;
    }
  }
  if (!launch.ignored) {
    Pending& pending = t_pending;  // a handed-off call's label and line: taken
    launch.label = pending.label;
    launch.site = pending.site;
    pending.label = pending.site = nullptr;
    launch.uncaught = std::uncaught_exceptions();
    if (g_journaling.load(std::memory_order_relaxed) && (launch.keyed || launch.has_args)) {
      std::shared_ptr<Kind> kind = launch.keyed ? kind_of(launch) : nullptr;
      tell_python(0, launch, kind.get());
    }
  }
  return std::make_unique<Observed>();
}

// A handed-off launch not noted: its label and line go back to its proxy, which notes it
// after its call (or, where it raised, drops them).
void give_back(Launch& launch) {
  if (launch.label != nullptr) {
    t_pending.label = launch.label;
    t_pending.site = launch.site;
    launch.label = launch.site = nullptr;
  }
}

void finish(Launch& launch);

void on_end(const at::RecordFunction& /*fn*/, at::ObserverContext* context) {
  if (context == nullptr) {
    return;
  }
  Launch& launch = t_launch;
  if (--launch.depth > 0 || launch.ignored) {
    return;
  }
  finish(launch);
  launch.args.clear();  // (no group held past its launch)
  launch.fields.reset();
}

// The end of a launch's outermost operator: noted, told, or given back to its proxy.
void finish(Launch& launch) {
  if (std::uncaught_exceptions() > launch.uncaught) {  // it raised: it launched nothing
    give_back(launch);
    return;
  }
  if (!launch.fields && !launch.keyed && !launch.has_args) {
    // nothing to describe it by (no record_param_comms, no inputs asked for): a handed-off
    // call is noted by its proxy after it returns
    give_back(launch);
    return;
  }
  std::shared_ptr<Kind> kind = kind_of(launch);
  if (!kind && !launch.has_args) {  // (its kind forgotten meanwhile, undescribed)
    give_back(launch);
    return;
  }
  if (launch.listening && g_recording.load(std::memory_order_relaxed)) {
    tell_python(1, launch, kind.get());
  }
  if (launch.capture != 0) {
    Note note{0, launch.capture, launch.op, kind, launch.label, launch.site};
    launch.label = launch.site = nullptr;
    if (!kind) {  // described in full: a kind of its own, never kept
      note.kind = std::make_shared<Kind>();
      note.kind->args = std::move(launch.args);
    }
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      note.seq = g_seq.fetch_add(1) + 1;
      g_notes.push_back(std::move(note));
    }
    g_noted.fetch_add(1, std::memory_order_relaxed);
  } else {
    release_python(launch.label);
    release_python(launch.site);
  }
}

// Register the callback while something asks for launches, remove it after (under g_mutex).
//
// Captures and journals ask only for the process groups' Work ranges (USER_SCOPE): no operator
// pays anything, and a launch is described by torch's record of it (ProcessGroupNCCL).
// Recorders (and tests: set_capture_inputs) ask for the operators too, with their inputs:
// every operator then makes a RecordFunction while the callback is registered (but in the
// calls a proxy claims, see call_claimed).
void update_registration() {
  bool wanted = g_capturing.load() || g_recording.load() || g_journaling.load();
  bool operators = g_inputs || g_recording.load();
  if (g_registered && (!wanted || operators != g_registered_operators)) {
    at::removeCallback(g_handle);
    g_registered = false;
  }
  if (wanted && !g_registered) {
    std::unordered_set<at::RecordScope, std::hash<at::RecordScope>> scopes{
        at::RecordScope::USER_SCOPE};
    if (operators) {
      scopes.insert(at::RecordScope::FUNCTION);
    }
    g_handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                         .needsInputs(operators)
                                         .scopes(scopes));
    g_registered = true;
    g_registered_operators = operators;
  }
}

std::mutex g_registration_mutex;

void set_demand(bool capturing, bool recording, bool journaling) {
  std::lock_guard<std::mutex> lock(g_registration_mutex);
  g_capturing.store(capturing);
  g_recording.store(recording);
  g_journaling.store(journaling);
  update_registration();
}

// A forked child's demand (see observer.py): the switches alone. Registering or removing the
// callback takes torch's callback lock, which another thread of the parent may have held at
// fork() (a child hung on it, 1 fork in 40): the callback stays registered and asks nothing.
void set_demand_in_forked_child(bool journaling) {
  g_capturing.store(false);
  g_recording.store(false);
  g_journaling.store(journaling);
}

void set_capture_inputs(bool inputs) {
  std::lock_guard<std::mutex> lock(g_registration_mutex);
  g_inputs = inputs;
  update_registration();
}

// The operators to observe, each with the positions of the arguments its metadata is read
// from; only while no callback is registered (the callback reads the table unlocked).
void observe_ops(const std::vector<std::string>& names,
                 const std::vector<std::vector<size_t>>& read,
                 const std::unordered_map<std::string, std::string>& collective_ops) {
  std::lock_guard<std::mutex> lock(g_registration_mutex);
  TORCH_CHECK(!g_registered, "observe_ops: the callback is registered");
  g_ops.clear();
  g_collective_ops = collective_ops;
  for (size_t i = 0; i < names.size() && i < read.size(); ++i) {
    const Op* op = new Op{names[i], read[i]};  // (never freed: a note may point to it)
    g_ops[std::string_view(op->name)] = op;
  }
}

// The notes of one capture (all, for 0), in launch order, and whether any is to be derived:
// a launch a proxy's C wrapper noted comes as its ledger entry (label, annotation, kernels,
// site, seq); an observed one as (seq, op, kind, described, label, site): launches of one kind
// have one metadata; a kind's description is given the first time Python gets it (None after).
// -1: let every note go, returning none.
py::tuple drain(int64_t capture) {
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
  auto handed = [](PyObject* owned) {
    return owned ? py::reinterpret_steal<py::object>(owned) : py::none();
  };
  py::list out;
  bool derive = false;
  std::vector<std::shared_ptr<Kind>> unknown;  // new kinds of notes let go: not known after
  std::vector<std::vector<Arg>> dropped;  // what kinds described themselves by, Python's now
  for (auto& entry : taken) {
    py::object label = handed(entry.label), site = handed(entry.site);
    py::object noted_as = handed(entry.noted_as);
    entry.label = entry.site = entry.noted_as = nullptr;
    if (entry.op == nullptr) {  // noted by a proxy's C wrapper: its ledger entry
      if (capture >= 0) {
        py::tuple head = py::reinterpret_borrow<py::tuple>(noted_as);
        out.append(py::make_tuple(label, head[0], head[1], site, entry.seq));
      }
      continue;
    }
    derive = true;
    Kind* kind = entry.kind.get();
    if (capture < 0) {
      if (kind != nullptr && kind->id != 0 && !kind->given.load()) {
        unknown.push_back(entry.kind);
      }
      continue;
    }
    py::object what = py::none();
    if (kind->id == 0 || !kind->given.exchange(true)) {
      what = described(kind->args, kind->fields.get());
      if (kind->id != 0) {  // (its group let go, below)
        dropped.push_back(std::move(kind->args));
        kind->args.clear();
      }
    }
    out.append(py::make_tuple(entry.seq, entry.op->name, kind->id, what, label, site));
  }
  if (!unknown.empty()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& kind : unknown) {
      auto found = g_kinds.find(kind->key);
      if (found != g_kinds.end() && found->second == kind) {
        g_kinds.erase(found);
      }
    }
  }
  {  // notes and kinds let go here may hold the last reference to a group gone meanwhile:
     // its destructor joins its threads, which may want the GIL
    py::gil_scoped_release released;
    taken.clear();
    unknown.clear();
    dropped.clear();
  }
  return py::make_tuple(out, derive);
}

// A group Python derived kinds from is gone (its address may be taken by a new one), or Python
// lets go of what it derived: launches get new kinds from now on. `if_idle`: only where no
// note waits to be drained. Returns the first id a kind made from now on gets (every kind
// forgotten has a smaller one: Python lets go of those a generation later, once no launch
// under way can still hold one), or -1 where it forgot nothing.
int64_t forget_kinds(bool if_idle) {
  std::unordered_map<std::string, std::shared_ptr<Kind>> forgotten;
  int64_t boundary;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (if_idle && !g_notes.empty()) {
      return -1;
    }
    forgotten.swap(g_kinds);
    boundary = static_cast<int64_t>(g_kind_ids) + 1;
  }
  if (PyGILState_Check()) {  // (a kind may hold the last reference to the group gone: its
    py::gil_scoped_release released;  // destructor joins threads that may want the GIL)
    forgotten.clear();
  }
  return boundary;
}

// Whether this observer is the only callback operators would run on this thread now.
bool only_observer() {
  if (!g_registered_operators) {
    return false;  // (operators make no RecordFunction for it anyway)
  }
  auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION);
  if (!callbacks.has_value()) {
    return false;
  }
  for (const auto& pair : callbacks->callbacks_) {
    if (pair.start_ != &on_start) {
      return false;
    }
  }
  return true;
}

// call_claimed(function, args, kwargs): function(*args, **kwargs), the launches in it left to
// the caller (a proxy that annotates its own launch).
PyObject* call_claimed(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  if (count != 3 || !PyTuple_Check(args[1]) || (args[2] != Py_None && !PyDict_Check(args[2]))) {
    PyErr_SetString(PyExc_TypeError, "call_claimed(function, args: tuple, kwargs: dict|None)");
    return nullptr;
  }
  ++t_claimed;
  // Where this callback is the only one asking for operators (no profiler, no other
  // observer), the operators of the claimed call make no RecordFunction at all: it is the
  // proxy's launch, nothing here would look at them.
  std::optional<at::RecordFunctionGuard> quiet;
  if (only_observer()) {
    quiet.emplace(false);
  }
  PyObject* result = PyObject_Call(args[0], args[1], args[2] == Py_None ? nullptr : args[2]);
  quiet.reset();
  --t_claimed;
  return result;
}

PyMethodDef g_call_claimed = {"call_claimed", reinterpret_cast<PyCFunction>(call_claimed),
                              METH_FASTCALL, "function(*args, **kwargs), its launches claimed"};

// The caller's "file:line" as the recorder finds it: from its sites where every frame walked
// is known there, else site_from(frame). New reference; null on error.
PyObject* caller_site() {
  PyFrameObject* start = PyEval_GetFrame();  // borrowed: the proxy's caller (wrapt is C)
#if PY_VERSION_HEX >= 0x030B0000
  PyFrameObject* frame = start;
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    // Its file first (sites.LIBRARY_FILES: torch's, wrapt's, ours, the standard library's are
    // walked past), then a user file's code object (sites.SITES: id(code) -> (code, sites)).
    PyObject* library = g_library_files != nullptr
                            ? PyDict_GetItemWithError(g_library_files, code->co_filename)
                            : nullptr;
    if (library == Py_True) {
      Py_DECREF(code);
      PyFrameObject* back = PyFrame_GetBack(frame);
      Py_DECREF(frame);
      frame = back;
      continue;
    }
    PyObject* id = library == Py_False ? PyLong_FromVoidPtr(code) : nullptr;
    PyObject* entry = id ? PyDict_GetItemWithError(g_sites, id) : nullptr;
    Py_XDECREF(id);
    PyObject* sites = entry != nullptr && PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2 &&
                              PyTuple_GET_ITEM(entry, 0) == reinterpret_cast<PyObject*>(code)
                          ? PyTuple_GET_ITEM(entry, 1)
                          : nullptr;
    Py_DECREF(code);
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

// ---------------------------------------------------------------------------------------------
// A proxy's own launches, keyed in C (see metadata.key_fields: the same facts, the same order)

// One fact of a launch key, read from one argument.
struct KeyField {
  enum What : uint8_t { kGroup, kTensor, kRoot, kNone } what = kGroup;
  PyObject* name = nullptr;  // (owned) its keyword, or null
  Py_ssize_t position = -2;  // -1: by keyword only; -2: the row has no such parameter
  PyObject* fallback = nullptr;  // (owned) its default
  bool dtype = false, numel = false, first = false;
};

// One proxy's C wrapper: how it keys a call, and what its proxy derived for each key.
struct Handed {
  std::vector<KeyField> fields;
  bool keyed = false;  // its row keys calls (else: the observer's Work-range note)
  // (owned) () -> (c10d's _world or None, torch.Tensor, torch.nn.Parameter): asked at the first
  // call keyed (the wrapper is made while torch is still importing)
  PyObject* key_context = nullptr;
  bool resolved = false;
  PyObject* world = nullptr;  // (owned) c10d's _world: its _default_pg is the default group
  PyObject* tensor_type = nullptr;  // (owned) torch.Tensor
  PyObject* parameter_type = nullptr;  // (owned) torch.nn.Parameter
  std::unordered_map<std::string, PyObject*> known;  // key -> (annotation, kernels) (owned)
  // (owned, or null) ring_ids(args, kwargs) -> (kind id, group slot) in the ring attached to
  // the writer, of the launch the Python wrapper just wrote there, or None; and what it told,
  // by key, for the writer's attach `ring_generation` (kNotTheWriters: Python writes them)
  PyObject* ring_ids = nullptr;
  uint64_t ring_generation = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> ring_known;
};

// The proxies' ring path (set_proxies_ring): on while one ring with files is the only thing
// open (no capture, recorder or coalescing block); `inside` is the agent's state.inside
// (owned; with the GIL).
std::atomic<bool> g_proxies_ring{false};
PyObject* g_proxies_inside = nullptr;
std::atomic<uint64_t> g_proxies_written{0};  // (tests, benchmarks: written with no Python)

// Keyed launches run with RecordFunction off (nobody else listening), for tests and probes.
std::atomic<uint64_t> g_quiet_calls{0};

// Every proxy's C wrapper (they live as long as the process: proxies are cached).
std::vector<Handed*>& g_handed = *new std::vector<Handed*>();

// What a call passes for `field` (borrowed), or null with an error set.
PyObject* argument_of(const KeyField& field, PyObject* args, PyObject* kwargs) {
  if (field.position == -2) {
    return Py_None;
  }
  if (kwargs != nullptr && field.name != nullptr) {
    PyObject* given = PyDict_GetItemWithError(kwargs, field.name);
    if (given != nullptr || PyErr_Occurred()) {
      return given;
    }
  }
  if (field.position >= 0) {
    return PyTuple_GET_SIZE(args) > field.position ? PyTuple_GET_ITEM(args, field.position)
                                                   : field.fallback;
  }
  return Py_None;
}

// The call's launch key (as the proxy's key_of makes it); false where it makes none.
bool key_of_call(const Handed& handed, PyObject* args, PyObject* kwargs, std::string& key) {
  key.clear();
  auto put = [&key](int64_t value) {
    key.append(reinterpret_cast<const char*>(&value), sizeof(value));
  };
  for (const KeyField& field : handed.fields) {
    PyObject* value = argument_of(field, args, kwargs);
    if (value == nullptr) {
      PyErr_Clear();
      return false;
    }
    switch (field.what) {
      case KeyField::kGroup: {
        if (value != Py_None) {
          put(reinterpret_cast<intptr_t>(value));
          break;
        }
        if (handed.world == nullptr) {
          return false;
        }
        static PyObject* const default_pg = PyUnicode_InternFromString("_default_pg");
        PyObject* group = PyObject_GetAttr(handed.world, default_pg);
        if (group == nullptr) {
          PyErr_Clear();
          return false;
        }
        bool none = group == Py_None;
        put(reinterpret_cast<intptr_t>(group));  // (torch's world holds it)
        Py_DECREF(group);
        if (none) {
          return false;
        }
        break;
      }
      case KeyField::kTensor: {
        PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(value));
        if (type != handed.tensor_type) {
          if ((PyList_CheckExact(value) || PyTuple_CheckExact(value)) &&
              PySequence_Fast_GET_SIZE(value) == 1) {
            value = PySequence_Fast_GET_ITEM(value, 0);
            type = reinterpret_cast<PyObject*>(Py_TYPE(value));
          }
          if (type != handed.tensor_type && type != handed.parameter_type) {
            return false;
          }
        }
        const at::Tensor& tensor = THPVariable_Unpack(value);
        if (field.first && tensor.is_meta()) {
          return false;
        }
        if (field.dtype) {
          put(static_cast<int64_t>(tensor.scalar_type()));
        }
        if (field.numel) {
          put(tensor.numel());
        }
        break;
      }
      case KeyField::kRoot: {
        if (value == Py_None) {
          put(0);
          put(0);
          break;
        }
        if (!PyLong_CheckExact(value)) {
          return false;
        }
        long long root = PyLong_AsLongLong(value);
        if (root == -1 && PyErr_Occurred()) {
          PyErr_Clear();
          return false;
        }
        put(1);
        put(root);
        break;
      }
      case KeyField::kNone:
        if (value != Py_None) {
          return false;
        }
        break;
    }
  }
  return true;
}

// Let go of what every proxy's wrapper knows (a group gone: its id may be taken again). GIL.
void forget_handed() {
  for (Handed* handed : g_handed) {
    handed->ring_known.clear();
    std::unordered_map<std::string, PyObject*> known;
    known.swap(handed->known);
    for (auto& entry : known) {
      Py_DECREF(entry.second);
    }
  }
}

// Whether no callback but this observer's would see an operator's or a Work's range on this
// thread now (no profiler, no other observer).
bool alone_in(at::RecordScope scope) {
  auto callbacks = at::getStepCallbacksUnlessEmpty(scope);
  if (!callbacks.has_value()) {
    return true;
  }
  for (const auto& pair : callbacks->callbacks_) {
    if (pair.start_ != &on_start) {
      return false;
    }
  }
  return true;
}

// What this call's launch is noted as, (annotation, kernels) (borrowed), derived by
// `noted_as(args, kwargs)` the first time its key is seen; null where the call makes no key or
// the proxy derives nothing.
// Whether the wrapper's key context is known (asked at its first keyed call).
bool resolved(Handed& handed) {
  if (!handed.resolved) {
    PyObject* context = PyObject_CallNoArgs(handed.key_context);
    if (context == nullptr || !PyTuple_Check(context) || PyTuple_GET_SIZE(context) != 3) {
      PyErr_Clear();
      Py_XDECREF(context);
      handed.keyed = false;  // (the Python wrapper annotates this proxy's launches)
      return false;
    }
    PyObject* world = PyTuple_GET_ITEM(context, 0);
    handed.world = world == Py_None ? nullptr : (Py_INCREF(world), world);
    handed.tensor_type = (Py_INCREF(PyTuple_GET_ITEM(context, 1)), PyTuple_GET_ITEM(context, 1));
    handed.parameter_type =
        (Py_INCREF(PyTuple_GET_ITEM(context, 2)), PyTuple_GET_ITEM(context, 2));
    Py_DECREF(context);
    handed.resolved = true;
  }
  return true;
}

PyObject* known_for(Handed& handed, PyObject* noted_as, PyObject* args, PyObject* kwargs) {
  if (!resolved(handed)) {
    return nullptr;
  }
  thread_local std::string key;
  if (!key_of_call(handed, args, kwargs, key)) {
    return nullptr;
  }
  auto found = handed.known.find(key);
  if (found != handed.known.end()) {
    return found->second;
  }
  PyObject* keywords = kwargs != nullptr ? (Py_INCREF(kwargs), kwargs) : PyDict_New();
  if (keywords == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* known = PyObject_CallFunctionObjArgs(noted_as, args, keywords, nullptr);
  Py_DECREF(keywords);
  if (known == nullptr || !PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != 2) {
    // (None: nothing derived; the Python wrapper says why, if anything)
    PyErr_Clear();
    Py_XDECREF(known);
    return nullptr;
  }
  if (handed.known.size() >= 4096) {
    for (auto& entry : handed.known) {
      Py_DECREF(entry.second);
    }
    handed.known.clear();
  }
  handed.known.emplace(key, known);
  return known;
}

// A keyed launch in a capture: the call, claimed (RecordFunction off where nobody else
// listens), then noted as its proxy derived it. New reference, or null with the call's error.
PyObject* call_and_note(PyObject* wrapped, PyObject* args, PyObject* kwargs, PyObject* label,
                        PyObject* known, PyObject* site, uint64_t capture) {
  std::optional<at::RecordFunctionGuard> quiet;
  if (alone_in(at::RecordScope::FUNCTION) && alone_in(at::RecordScope::USER_SCOPE)) {
    quiet.emplace(false);
    g_quiet_calls.fetch_add(1, std::memory_order_relaxed);
  }
  Pending& pending = t_pending;
  pending = Pending{true, nullptr, nullptr};
  ++t_claimed;
  PyObject* result = PyObject_Call(wrapped, args, kwargs);
  --t_claimed;
  pending = Pending{};
  quiet.reset();
  if (result == nullptr) {  // it raised: it launched nothing
    Py_DECREF(site);
    return nullptr;
  }
  Py_INCREF(label);
  Py_INCREF(known);
  Note note{0, capture, nullptr, nullptr, label, site, known};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    note.seq = g_seq.fetch_add(1) + 1;
    g_notes.push_back(std::move(note));
  }
  g_noted.fetch_add(1, std::memory_order_relaxed);
  return result;
}

// The proxies' ring path: a launch with one ring with files open, nothing else, written by the
// native writer as the Python wrapper writes it (``enter_kind``, ``returned``) with no Python
// code run: its key's ids in the ring (told by Python once a key and attach), the caller's
// site's id (told once a site), the call run as the Python wrapper runs it (state.inside marks
// the thread: the observers below leave its launch to it; claimed: the native observer's
// operators' callback too). A key not seen yet goes to the Python wrapper, then its ids are
// asked. Sets `handled` false where the Python wrapper is to run it.
PyObject* ring_call(Handed& handed, PyObject* self, PyObject* const* args, Py_ssize_t count,
                    PyObject* kwargs, bool& handled) {
  handled = false;
  PyObject* wrapped = args[0];
  if (autoannot_inside_a_call(g_proxies_inside)) {  // in a wrapped call: its launch
    handled = true;
    return PyObject_Call(wrapped, args[2], kwargs);
  }
  thread_local std::string key;
  if (!resolved(handed) || !key_of_call(handed, args[2], kwargs, key)) {
    PyErr_Clear();
    return nullptr;
  }
  uint64_t generation = autoannot_ring_generation();
  if (handed.ring_generation != generation) {
    handed.ring_known.clear();
    handed.ring_generation = generation;
  }
  auto found = handed.ring_known.find(key);
  if (found == handed.ring_known.end()) {  // Python writes it; then its ids are asked
    handled = true;
    std::string learned = key;  // (before the call: a call within it may key others)
    PyObject* result = PyObject_Vectorcall(PyTuple_GET_ITEM(self, 0), args, count, nullptr);
    if (result == nullptr || handed.ring_ids == nullptr) {
      return result;
    }
    PyObject* keywords = kwargs != nullptr ? (Py_INCREF(kwargs), kwargs) : PyDict_New();
    PyObject* told = keywords != nullptr
        ? PyObject_CallFunctionObjArgs(handed.ring_ids, args[2], keywords, nullptr) : nullptr;
    Py_XDECREF(keywords);
    std::pair<uint32_t, uint32_t> ids = autoannot_ids_told(told);  // (no error left: the
    Py_XDECREF(told);  // collective's result stands)
    uint64_t now = autoannot_ring_generation();  // (the ring may have been attached by it)
    if (handed.ring_generation != now || handed.ring_known.size() >= 4096) {
      handed.ring_known.clear();
      handed.ring_generation = now;
    }
    handed.ring_known.emplace(std::move(learned), ids);
    return result;
  }
  const std::pair<uint32_t, uint32_t> ids = found->second;  // (the site's id may call Python)
  if (ids.first == kNotTheWriters) {
    return nullptr;
  }
  uint32_t site = 0;
  if (!autoannot_ring_site(site)) {
    return nullptr;
  }
  PyObject* inside = g_proxies_inside;  // (held: the call may let the GIL go)
  PyObject* ident = inside != nullptr ? PyLong_FromUnsignedLong(PyThread_get_thread_ident())
                                      : nullptr;
  if (ident == nullptr || PyDict_SetItem(inside, ident, Py_True) != 0) {
    PyErr_Clear();
    Py_XDECREF(ident);
    return nullptr;
  }
  Py_INCREF(inside);
  if (!autoannot_ring_enter(ids.first, site, ids.second)) {
    PyDict_DelItem(inside, ident);
    PyErr_Clear();
    Py_DECREF(ident);
    Py_DECREF(inside);
    return nullptr;  // (no ring attached now: the Python wrapper's)
  }
  handled = true;
  ++t_claimed;  // (as call_claimed: the native observer's callback leaves it to us)
  std::optional<at::RecordFunctionGuard> quiet;
  if (only_observer()) {
    quiet.emplace(false);
  }
  PyObject* result = PyObject_Call(wrapped, args[2], kwargs);
  quiet.reset();
  --t_claimed;
  PyObject *type, *value, *traceback;  // (the call's exception, kept as it is)
  PyErr_Fetch(&type, &value, &traceback);
  if (PyDict_DelItem(inside, ident) != 0) {
    PyErr_Clear();
  }
  PyErr_Restore(type, value, traceback);
  Py_DECREF(ident);
  Py_DECREF(inside);
  autoannot_ring_returned(result == nullptr);
  g_proxies_written.fetch_add(1, std::memory_order_relaxed);
  return result;
}

// handoff_wrapper's call: self is (python_wrapper, label, note_in_capture, noted_as, handed);
// args are wrapt's (wrapped, instance, args, kwargs).
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
  if (g_proxies_ring.load(std::memory_order_relaxed)) {  // (attached at a first launch)
    auto* handed = static_cast<Handed*>(PyCapsule_GetPointer(PyTuple_GET_ITEM(self, 4), nullptr));
    if (handed != nullptr && handed->keyed) {
      bool handled = false;
      PyObject* result = ring_call(*handed, self, args, count, kwargs, handled);
      if (handled) {
        return result;
      }
    }
    PyErr_Clear();
    return PyObject_Vectorcall(python_wrapper, args, count, nullptr);
  }
  uint64_t capture = 0;
  if (!g_handoff.load(std::memory_order_relaxed) || g_sites == nullptr || t_claimed > 0 ||
      (capture = current_capture()) == 0) {
    return PyObject_Vectorcall(python_wrapper, args, count, nullptr);
  }
  auto* handed = static_cast<Handed*>(PyCapsule_GetPointer(PyTuple_GET_ITEM(self, 4), nullptr));
  if (handed != nullptr && handed->keyed) {
    PyObject* known = known_for(*handed, PyTuple_GET_ITEM(self, 3), args[2], kwargs);
    if (known == nullptr) {  // no key, or nothing derived: the Python wrapper annotates it
      return PyObject_Vectorcall(python_wrapper, args, count, nullptr);
    }
    PyObject* site = caller_site();
    if (site == nullptr) {
      PyErr_Clear();
      return PyObject_Vectorcall(python_wrapper, args, count, nullptr);
    }
    return call_and_note(wrapped, args[2], kwargs, PyTuple_GET_ITEM(self, 1), known, site,
                         capture);
  }
  PyErr_Clear();  // (no capsule: the Work range's note, below)
  PyObject* site = caller_site();
  if (site == nullptr) {  // the Python wrapper annotates it (and says why, if it fails too)
    PyErr_Clear();
    return PyObject_Vectorcall(python_wrapper, args, count, nullptr);
  }
  PyObject* label = PyTuple_GET_ITEM(self, 1);
  Py_INCREF(label);
  pending = Pending{true, label, site};
  PyObject* result = PyObject_Call(wrapped, args[2], kwargs);
  PyObject* left_label = pending.label;  // (not taken: nothing was noted)
  PyObject* left_site = pending.site;
  pending = Pending{};
  if (result != nullptr && left_label != nullptr) {
    // It returned, and the observer noted nothing of it (an op it could not describe, fake
    // tensors): the Python side notes it as its wrapper would have (said once if that fails).
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
                              METH_FASTCALL, "a proxy's wrapper handing launches to the observer"};

// Tests with no NCCL: a launch of `op` (an observed operator's name, no inputs) in which the
// process group records itself as ProcessGroupNCCL does (a ParamCommsDebugInfo for the thread,
// a record_param_comms RecordFunction, then its Work's range), on this thread, outside the
// dispatcher.
void launch_as_nccl(const std::string& op, std::string group_name, std::string group_desc,
                    std::string collective, int rank, int64_t in_nelems, int64_t out_nelems,
                    py::object dtype, std::vector<int64_t> in_splits,
                    std::vector<int64_t> out_splits, int global_rank_start,
                    int global_rank_stride, int world_size) {
#if AUTOANNOT_PARAM_COMMS
  at::ScalarType scalar = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
  py::gil_scoped_release released;
  std::vector<c10::IValue> none;
  RECORD_FUNCTION(op, none);
  auto info = std::make_shared<torch::ParamCommsDebugInfo>(
      std::make_tuple(group_name, group_desc), rank, std::move(collective), in_nelems,
      out_nelems, scalar, std::move(in_splits), std::move(out_splits), global_rank_start,
      global_rank_stride, world_size);
  c10::DebugInfoGuard debug_info(c10::DebugInfoKind::PARAM_COMMS_INFO, info);
  {
    std::vector<c10::IValue> params;
    RECORD_FUNCTION("record_param_comms", params);
  }
  at::RecordFunction work(at::RecordScope::USER_SCOPE);  // the Work's range ("nccl:...")
  if (work.isActive()) {
    work.before("nccl:" + info->getCollectiveName());
  }
#else
  throw std::runtime_error("this torch has no ParamCommsDebugInfo");
#endif
}

}  // namespace

PyObject* autoannot_caller_site() {
  if (g_sites == nullptr || g_site_from == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "no site resolver (set_site_resolver)");
    return nullptr;
  }
  return caller_site();
}

// ---------------------------------------------------------------------------------------------
// For the c10d kernels (ring_kernels.cpp): the table's operators, a launch's key, the thread's
// claims, and a new key's launch handed to Python.

const void* autoannot_table_op(const std::string& name) {
  auto found = g_ops.find(std::string_view(name));
  return found != g_ops.end() ? found->second : nullptr;
}

bool autoannot_launch_key(const void* op, c10::ArrayRef<const c10::IValue> inputs,
                          std::string& key) {
  for (const auto& value : inputs) {
    if (!holds_data(value)) {
      return false;  // (tracing: nothing launches)
    }
  }
  return args_key(static_cast<const Op*>(op), inputs, key);
}

bool autoannot_claimed() { return t_claimed > 0 || t_launch.depth > 0; }

void autoannot_claim(int delta) { t_claimed += delta; }

PyObject* g_kernel_entered = nullptr;  // (owned) entered(op, kind id, described, site)

void autoannot_set_kernel_entered(PyObject* entered) {
  Py_XDECREF(g_kernel_entered);
  g_kernel_entered = entered;
  Py_XINCREF(g_kernel_entered);
}

PyObject* autoannot_kernel_entered(const void* op, const std::string& key,
                                   c10::ArrayRef<const c10::IValue> inputs, PyObject* site) {
  if (g_kernel_entered == nullptr) {
    Py_RETURN_NONE;
  }
  Launch launch;  // (its kind: the observer's id for this key, described where new)
  launch.op = static_cast<const Op*>(op);
  launch.key = key;
  launch.keyed = true;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_kinds.find(key) == g_kinds.end()) {
      describe_all(inputs, launch.args);
      launch.described = true;
    }
  }
  std::shared_ptr<Kind> kind = kind_of(launch);
  if (!kind) {
    Py_RETURN_NONE;
  }
  PyObject* told = nullptr;
  try {
    py::object what = kind->given.load() ? py::none() : described(kind->args, nullptr);
    told = PyObject_CallFunction(g_kernel_entered, "sKOO", launch.op->name.c_str(),
                                 static_cast<unsigned long long>(kind->id), what.ptr(), site);
  } catch (py::error_already_set& error) {
    error.restore();
  }
  if (told != nullptr && told != Py_None && told != Py_False) {
    kind->given.store(true);  // Python keeps it by its id
    kind->args.clear();
  }
  return told;
}

// ---------------------------------------------------------------------------------------------
// fork(): a forked child has only the forking thread. A mutex another thread held at that
// moment would stay locked in the child for good (its first launch, or Python asking the
// observer anything, would hang): every mutex of the observer is taken before fork() and
// released on both sides after. None of them is taken while another is held.

void before_fork() {
  g_registration_mutex.lock();
  g_mutex.lock();
  g_streams_mutex.lock();
  autoannot_ring_hooks_before_fork();
}

void after_fork() {
  autoannot_ring_hooks_after_fork();
  g_streams_mutex.unlock();
  g_mutex.unlock();
  g_registration_mutex.unlock();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pthread_atfork(&before_fork, &after_fork, &after_fork);
  m.doc() = "autoannot's native observer: collective launches seen through torch's "
            "RecordFunction callbacks";
  m.attr("PARAM_COMMS") = bool(AUTOANNOT_PARAM_COMMS);
  m.def("observe_ops", &observe_ops);
  m.def("set_demand", &set_demand, py::arg("capturing"), py::arg("recording"),
        py::arg("journaling"));
  m.def("set_demand_in_forked_child", &set_demand_in_forked_child, py::arg("journaling"));
  m.def("set_capture_inputs", &set_capture_inputs);
  m.def("registered", []() { return g_registered; });
  m.def("demand", []() {
    return py::make_tuple(g_capturing.load(), g_recording.load(), g_journaling.load());
  });
  static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t), "a plain 64-bit counter");
  // How many launches have been noted, read by Python with no call (a launch the proxies
  // annotate in a capture takes its place among the notes by it).
  m.attr("order") = py::memoryview::from_buffer(
      reinterpret_cast<const uint64_t*>(&g_seq), {1}, {sizeof(uint64_t)});
  m.def("noted", []() { return g_noted.load(); });
  m.def("pending", []() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_notes.size();
  });
  m.def("forget_streams", &forget_streams);
  m.attr("call_claimed") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_call_claimed, nullptr, nullptr));
  m.def("claimed", []() { return t_claimed > 0; });
  m.def("current_capture", []() -> py::object {
    uint64_t id = current_capture();
    return id ? py::object(py::int_(id)) : py::none();
  });
  m.def("set_test_capture", [](uint64_t id) { g_test_capture.store(id); });
  m.def("handoff_wrapper", [](py::object python_wrapper, py::str label,
                              py::object note_in_capture, py::object noted_as,
                              py::object fields, py::object key_context, py::object ring_ids) {
    auto* handed = new Handed();  // (never freed: the proxy is kept for the process)
    handed->ring_ids = ring_ids.is_none() ? nullptr : ring_ids.inc_ref().ptr();
    if (!fields.is_none() && !noted_as.is_none()) {
      static const std::unordered_map<std::string, KeyField::What> whats{
          {"group", KeyField::kGroup}, {"tensor", KeyField::kTensor},
          {"root", KeyField::kRoot}, {"none", KeyField::kNone}};
      for (py::handle item : fields) {  // metadata.KeyField
        KeyField field;
        field.what = whats.at(item.attr("what").cast<std::string>());
        py::object name = item.attr("name");
        field.name = name.is_none() ? nullptr : name.inc_ref().ptr();
        field.position = item.attr("position").cast<Py_ssize_t>();
        field.fallback = py::object(item.attr("default")).release().ptr();
        field.dtype = item.attr("dtype").cast<bool>();
        field.numel = item.attr("numel").cast<bool>();
        field.first = item.attr("first").cast<bool>();
        handed->fields.push_back(field);
      }
      handed->keyed = true;
      handed->key_context = key_context.inc_ref().ptr();
    }
    g_handed.push_back(handed);
    py::object capsule = py::reinterpret_steal<py::object>(PyCapsule_New(handed, nullptr,
                                                                         nullptr));
    py::tuple self = py::make_tuple(python_wrapper, label, note_in_capture, noted_as, capsule);
    return py::reinterpret_steal<py::object>(
        PyCFunction_NewEx(&g_handoff_call, self.ptr(), nullptr));
  }, py::arg("python_wrapper"), py::arg("label"), py::arg("note_in_capture"),
     py::arg("noted_as"), py::arg("fields"), py::arg("key_context"),
     py::arg("ring_ids") = py::none(),
     "wrapt's wrapper for a Python-API collective: in a capture it notes its launches itself "
     "(keyed by fields, derived by noted_as once per key) or hands them to the observer; with "
     "one ring alone open (set_proxies_ring) it writes their records through the ring writer "
     "(ids told by ring_ids once per key); else it calls python_wrapper");
  m.def("set_proxies_ring", [](bool on, py::object inside) {
    Py_XDECREF(g_proxies_inside);
    g_proxies_inside = inside.is_none() ? nullptr : inside.inc_ref().ptr();
    g_proxies_ring.store(on && g_proxies_inside != nullptr);
  }, py::arg("on"), py::arg("inside"),
     "the proxies' C wrappers write their launches to the attached ring (on: one ring with "
     "files open, nothing else; inside: the agent's state.inside)");
  m.def("proxies_ring", []() { return g_proxies_ring.load(); });
  m.def("proxies_written", []() { return g_proxies_written.load(); },
        "(tests, benchmarks) the proxies' launches written to the ring with no Python call");
  m.def("forget_handed", &forget_handed, "the proxies' C wrappers let go of what they know");
  m.def("quiet_calls", []() { return g_quiet_calls.load(); });
  m.def("alone", []() {  // (tests, probes: whether only this observer listens now)
    return py::make_tuple(alone_in(at::RecordScope::USER_SCOPE),
                          alone_in(at::RecordScope::FUNCTION));
  });
  m.def("handed_known", []() {  // (tests: what the proxies' C wrappers keep)
    size_t known = 0;
    for (Handed* handed : g_handed) {
      known += handed->known.size();
    }
    return known;
  });
  m.def("set_handoff", [](bool on) { g_handoff.store(on); });
  m.def("handoff", []() { return g_handoff.load(); });
  m.def("set_site_resolver", [](py::dict sites, py::object site_from, py::dict library_files) {
    Py_XDECREF(g_sites);
    Py_XDECREF(g_site_from);
    Py_XDECREF(g_library_files);
    g_sites = sites.inc_ref().ptr();
    g_site_from = site_from.inc_ref().ptr();
    g_library_files = library_files.inc_ref().ptr();
  });
  m.def("set_listener", [](py::object listener) {
    Py_XDECREF(g_listener);
    g_listener = listener.is_none() ? nullptr : listener.inc_ref().ptr();
  });
  m.def("drain", &drain, py::arg("capture") = 0);
  m.def("forget_kinds", &forget_kinds, py::arg("if_idle") = false);
  m.def("kinds", []() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_kinds.size();
  });
  m.def("kinds_holding_arguments", []() {  // (tests: no group is held once Python knows it)
    std::lock_guard<std::mutex> lock(g_mutex);
    size_t holding = 0;
    for (const auto& entry : g_kinds) {
      holding += entry.second->args.empty() ? 0 : 1;
    }
    return holding;
  });
  m.def("launch_as_nccl", &launch_as_nccl);
  autoannot_add_ring_hooks(m);
  autoannot_add_ring_kernels(m);
  m.def("set_kernel_entered", [](py::object entered) {
    autoannot_set_kernel_entered(entered.is_none() ? nullptr : entered.ptr());
  }, py::arg("entered"), "the c10d kernels' new keys go to entered(op, kind, described, site)");
}
