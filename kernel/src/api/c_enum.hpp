// Enum arguments from C callers. A C enum object may hold any int, but in C++ loading an enum value
// outside the enum's range is undefined (UBSan's -fsanitize=enum reports it). So an enum parameter
// or field is read as the integer it holds, without an enum-typed load, checked, and only then
// converted to its enum type.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "mok/mok.h"

namespace mok::api {

static_assert(sizeof(mokStatus_t) == sizeof(int32_t) && sizeof(mokExecutor_t) == sizeof(int32_t) &&
                  sizeof(mokPrecision_t) == sizeof(int32_t) && sizeof(mokIndexType_t) == sizeof(int32_t) &&
                  sizeof(mokDataType_t) == sizeof(int32_t) && sizeof(mokActivation_t) == sizeof(int32_t),
              "the C enums of mok.h are int-sized");

// The integer stored in `value` (taken by reference: binding it loads nothing).
template <class Enum>
int32_t enum_bits(const Enum& value) {
  static_assert(std::is_enum_v<Enum> && sizeof(Enum) == sizeof(int32_t), "a C enum of mok.h");
  int32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Whether `bits` names one of the enumerators 0 .. count-1.
inline bool enum_in_range(int32_t bits, int32_t count) {
  return bits >= 0 && bits < count;
}

}  // namespace mok::api
