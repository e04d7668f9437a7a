// The error record of a device pass in host-mapped memory: core's ErrorRecord (core/protocol.hpp), allocated with
// cudaHostAlloc(cudaHostAllocMapped), written by the device (core::record_failure, which publishes at system
// scope) and read by the host at any time without synchronising with any stream (mok.h: mokLayerGetError).
#pragma once

#include <cuda_runtime_api.h>

#include "core/protocol.hpp"

namespace mok::cuda {

// Pinned host memory mapped into every device's address space; `device` is its address for kernels.
struct MappedBlock {
  void* host = nullptr;
  void* device = nullptr;
};

cudaError_t alloc_mapped(size_t bytes, MappedBlock* block);
cudaError_t free_mapped(MappedBlock* block);

struct MappedRecord {
  core::ErrorRecord* host = nullptr;
  core::ErrorRecord* device = nullptr;  // what a kernel's record_failure is given
};

// Allocates a zeroed record (no failure).
cudaError_t create_mapped_record(MappedRecord* record);
cudaError_t destroy_mapped_record(MappedRecord* record);
// Back to "no failure", between passes (no kernel may be writing it).
void reset_mapped_record(const MappedRecord& record);
// A copy of the record once its claimer has published it; false before (never waits: core::read_published_record).
bool read_mapped_record(const MappedRecord& record, core::ErrorRecord* copy);

}  // namespace mok::cuda
