/* The fuzz target's C side: a C caller may store any int in an enum field or argument (C enums are
   ints), which C++ cannot do without undefined behaviour of its own. These setters and calls let the
   C++ harness hand libmok exactly what a C trainer could, so UBSan's enum check judges the library. */
#include <stdint.h>

#include "mok/mok.h"

void fuzz_set_precision(mokLayerConfig_t* config, int value) {
  config->precision = (mokPrecision_t)value;
}

void fuzz_set_executor(mokLayerConfig_t* config, int value) {
  config->executor = (mokExecutor_t)value;
}

void fuzz_set_routing_scale(mokLayerConfig_t* config, int value) {
  config->routing_scale = (mokRoutingScale_t)value;
}

int fuzz_routing_scale(const mokLayerConfig_t* config) {
  return (int)config->routing_scale;
}

mokStatus_t fuzz_build_schedule(mokLayer_t layer, const void* topk_ids, int index_type, int num_tokens) {
  return mokLayerBuildSchedule(layer, topk_ids, (mokIndexType_t)index_type, num_tokens, NULL);
}

mokStatus_t fuzz_quantize(const void* src, int dtype, int64_t batch, int64_t rows, int64_t cols, uint8_t* rowwise_data,
                          uint8_t* rowwise_scales, uint8_t* colwise_data, uint8_t* colwise_scales) {
  return mokMxfp8Quantize(src, (mokDataType_t)dtype, batch, rows, cols, rowwise_data, rowwise_scales, colwise_data,
                          colwise_scales, NULL);
}
