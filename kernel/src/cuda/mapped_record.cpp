// The host-mapped error record (cuda/mapped_record.hpp).
#include "cuda/mapped_record.hpp"

#include <cstring>

namespace mok::cuda {

cudaError_t alloc_mapped(size_t bytes, MappedBlock* block) {
  *block = MappedBlock{};
  void* host = nullptr;
  // Portable: mapped for every device's context, whichever device the pass runs on.
  if (cudaError_t e = cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable); e != cudaSuccess)
    return e;
  std::memset(host, 0, bytes);
  void* device = nullptr;
  if (cudaError_t e = cudaHostGetDevicePointer(&device, host, 0); e != cudaSuccess) {
    cudaFreeHost(host);
    return e;
  }
  *block = MappedBlock{host, device};
  return cudaSuccess;
}

cudaError_t free_mapped(MappedBlock* block) {
  cudaError_t e = block->host ? cudaFreeHost(block->host) : cudaSuccess;
  *block = MappedBlock{};
  return e;
}

cudaError_t create_mapped_record(MappedRecord* record) {
  MappedBlock block;
  cudaError_t e = alloc_mapped(sizeof(core::ErrorRecord), &block);
  *record = MappedRecord{static_cast<core::ErrorRecord*>(block.host), static_cast<core::ErrorRecord*>(block.device)};
  return e;
}

cudaError_t destroy_mapped_record(MappedRecord* record) {
  MappedBlock block{record->host, record->device};
  *record = MappedRecord{};
  return free_mapped(&block);
}

void reset_mapped_record(const MappedRecord& record) {
  std::memset(static_cast<void*>(record.host), 0, sizeof(core::ErrorRecord));
}

bool read_mapped_record(const MappedRecord& record, core::ErrorRecord* copy) {
  return core::read_published_record(record.host, copy);
}

}  // namespace mok::cuda
