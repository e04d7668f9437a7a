// The executors as the C ABI sees them. One answer to "can this executor run a layer here?", given alike by
// mokExecutorCompiled, mokExecutorSupportsDevice and mokLayerCreate (and mokLayerGetSizes), so a query never
// claims what creation then refuses.
#pragma once

#include "mok/mok.h"

namespace mok::api {

// Whether this libmok carries a layer for `executor` (an enumerator): only the host executor so far. Device code
// that is built in without a layer (cuda/: device queries, probes) does not count.
bool layer_compiled(mokExecutor_t executor);

// mokNotCompiled with a detail naming `func` and the `argument` that holds `executor`, and saying that it runs no
// layer in this libmok.
mokStatus_t not_compiled(mokExecutor_t executor, const char* argument, const char* func);

}  // namespace mok::api
