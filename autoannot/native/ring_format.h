// Made by autoannot/base/ring_format.py (c_header()), where the layout is said once.
// Not to be edited: change ring_format.py and write this file anew (its test says how).
#pragma once

#include <cstddef>
#include <cstdint>

constexpr uint64_t kRingHeaderBytes = 64;  // HEADER_BYTES
constexpr uint64_t kRingCountAt = 16;  // COUNT_AT
constexpr uint64_t kRingReturnedAt = 16;  // RETURNED_AT
constexpr int64_t kRingFailed = -1;  // FAILED

// One record, as RECORD packs it ("<qqqqIII4x"), little-endian.
struct AutoannotRecord {
  int64_t seq;
  int64_t entered_ns;
  int64_t returned_ns;
  int64_t finished_ns;
  uint32_t kind;
  uint32_t site;
  uint32_t finished_thread;
  uint32_t pad;
};
static_assert(sizeof(AutoannotRecord) == 48, "ring_format.RECORD's size");
static_assert(offsetof(AutoannotRecord, seq) == 0, "ring_format.RECORD: seq");
static_assert(offsetof(AutoannotRecord, entered_ns) == 8, "ring_format.RECORD: entered_ns");
static_assert(offsetof(AutoannotRecord, returned_ns) == 16, "ring_format.RECORD: returned_ns");
static_assert(offsetof(AutoannotRecord, finished_ns) == 24, "ring_format.RECORD: finished_ns");
static_assert(offsetof(AutoannotRecord, kind) == 32, "ring_format.RECORD: kind");
static_assert(offsetof(AutoannotRecord, site) == 36, "ring_format.RECORD: site");
static_assert(offsetof(AutoannotRecord, finished_thread) == 40, "ring_format.RECORD: finished_thread");
static_assert(offsetof(AutoannotRecord, pad) == 44, "ring_format.RECORD: pad");
