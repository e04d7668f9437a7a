// A kernel's figures that cuobjdump does not report (the dynamic shared memory it asks for at launch), written into
// the binary as text: "FAMILY NAME shared=NNNNNNN threads=NNNN", which tests/library/test_library.py reads to hold
// each kernel to its budgets. A unit keeps its note with __attribute__((used)).
#pragma once

#include <cstddef>

namespace mok::cuda {

struct Note {
  char text[96];
};

constexpr void put_digits(char* at, int digits, size_t value) {
  for (int i = digits - 1; i >= 0; --i, value /= 10) at[i] = static_cast<char>('0' + value % 10);
}

// `family` ends in a space ("mok_gemm_bf16_sm100 ").
constexpr Note resource_note(const char* family, const char* name, size_t shared, unsigned threads) {
  Note n{};
  int at = 0;
  auto put = [&](const char* s) {
    while (*s && at < 80) n.text[at++] = *s++;
  };
  put(family);
  put(name);
  put(" shared=");
  put_digits(n.text + at, 7, shared);
  at += 7;
  put(" threads=");
  put_digits(n.text + at, 4, threads);
  return n;
}

}  // namespace mok::cuda
