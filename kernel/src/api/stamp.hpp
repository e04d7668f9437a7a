// Struct stamps (mok.h, "struct stamps"): which layout of a stamped struct the caller passed. Every layout a
// struct has had is known here by its size, oldest first; an older caller's struct is read with defaults for the
// fields its layout lacks, and a struct larger than the newest layout (from a newer mok.h) is refused, naming the
// version it came from, instead of having its extra fields ignored.
#pragma once

#include <cstddef>
#include <cstring>

#include "mok/mok.h"

namespace mok::api {

// One stamped struct type: its C name, its MOK_*_INIT macro and the sizes of its layouts, oldest first.
struct StampedType {
  const char* name;
  const char* init;
  const size_t* layouts;
  int count;
  // Where each layout's fields end, when that is short of its sizeof (tail padding that a newer layout's
  // field fills: those bytes of an older caller's struct are not read); null: every layout's sizeof.
  const size_t* field_ends = nullptr;
};

// The bytes of a struct of layout `size` that hold its fields.
inline size_t fields_end(const StampedType& type, size_t size) {
  for (int i = 0; type.field_ends != nullptr && i < type.count; ++i)
    if (type.layouts[i] == size) return type.field_ends[i];
  return size;
}

// The layouts of every stamped struct of mok.h.
extern const StampedType kDeviceInfo, kLayerConfig, kLayerSizes, kLayerMemory, kLayerWeights, kLayerGrads, kLayerError,
    kSelftestOptions, kSelftestReport;

// The stamp of the caller's `arg` (not NULL, MOK_STRUCT_MAGIC, a layout of `type`); *size is its layout's size.
mokStatus_t check_stamp(const void* arg, const StampedType& type, const char* name, const char* func, size_t* size);

// The caller's struct as this libmok's layout: the bytes the caller's layout has, then `defaults`' fields.
template <class T>
mokStatus_t read_stamped(const T* arg, const StampedType& type, const T& defaults, const char* name, const char* func,
                         T* out) {
  size_t size = 0;
  if (mokStatus_t s = check_stamp(arg, type, name, func, &size); s != mokSuccess) return s;
  *out = defaults;
  std::memcpy(static_cast<void*>(out), arg, fields_end(type, size));
  return mokSuccess;
}

// Writes `value`'s fields into the caller's struct as far as its layout (`size`, from check_stamp) reaches,
// keeping the caller's stamp.
template <class T>
void write_stamped(T* arg, const T& value, size_t size) {
  constexpr size_t stamp = offsetof(mokLayerSizes_t, version) + sizeof(unsigned int);
  std::memcpy(reinterpret_cast<char*>(arg) + stamp, reinterpret_cast<const char*>(&value) + stamp, size - stamp);
}

}  // namespace mok::api
