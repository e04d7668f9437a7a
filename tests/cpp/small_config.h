/* A small layer config every executor can size: the C tests (c_checks.h) and the C++ ones share it. C99 and C++. */
#ifndef MOK_TESTS_SMALL_CONFIG_H
#define MOK_TESTS_SMALL_CONFIG_H

#include "mok/mok.h"

static inline mokLayerConfig_t small_config(void) {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  c.experts_per_rank = 2;
  c.hidden = 16;
  c.intermediate = 8;
  c.top_k = 2;
  c.max_tokens = 4;
  c.expert_padding = 8;
  c.minibatch = 16;
  c.macrobatch = 32;
  return c;
}

#endif
