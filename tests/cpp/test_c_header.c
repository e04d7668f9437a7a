/* The layer's C ABI from C99: the header compiles with -pedantic, the initialisers fit their
 * structs, and a first call works. Exit status 0 on success. */
#include <stdio.h>

#include "mok/mok.h"

int main(void) {
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
  mokLayerError_t e = MOK_LAYER_ERROR_INIT;
  if (m.size != sizeof m || w.size != sizeof w || g.size != sizeof g || e.size != sizeof e) return 1;
  c.experts_per_rank = 2;
  c.hidden = 64;
  c.intermediate = 32;
  c.top_k = 2;
  c.max_tokens = 16;
  if (mokLayerGetSizes(&c, &s) != mokSuccess || s.peer_bytes == 0 || s.workspace_bytes == 0) {
    printf("mokLayerGetSizes: %s\n", mokGetLastError());
    return 1;
  }
  c.world = 0;
  return mokLayerGetSizes(&c, &s) == mokInvalidArgument ? 0 : 1;
}
