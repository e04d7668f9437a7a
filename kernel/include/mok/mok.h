/*
 * libmok C ABI. Stable, C-callable, for C++ trainers that do not use Python.
 *
 * Conventions (as in nccl.h):
 *  - every call returns a mokStatus_t; mokGetStatusString() names it and mokGetLastError() gives the
 *    thread-local detail of this thread's last failed call (which argument, which rule);
 *  - option structs start with a `size` field stamped by their MOK_*_INIT macro, so the library can
 *    grow a struct without breaking callers built against an older header;
 *  - objects are opaque handles.
 */
#ifndef MOK_H_
#define MOK_H_

#include <stddef.h>
#include <stdint.h>

#include "mok/mok_version.h"

#if defined(__GNUC__)
#define MOK_API __attribute__((visibility("default")))
#else
#define MOK_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------ */
typedef enum {
  mokSuccess = 0,
  mokInvalidArgument = 1, /* an argument breaks a documented rule; nothing was written */
  mokInvalidUsage = 2,    /* calls in the wrong order, or a handle in the wrong state */
  mokNotCompiled = 3,     /* the requested executor was not built into this libmok */
  mokNoDevice = 4,        /* no usable GPU or driver on this machine */
  mokUnsupported = 5,     /* the device or configuration is not supported by the executor */
  mokCudaError = 6,       /* a CUDA runtime call failed; the detail names it */
  mokSystemError = 7,     /* an OS call failed (shared memory, threads); the detail names it */
  mokOutOfMemory = 8,
  mokTimeout = 9,         /* a bounded wait on another worker or rank ran out */
  mokPeerAbort = 10,      /* another rank or worker aborted the pass */
  mokInternalError = 11,
  mokNumStatus = 12
} mokStatus_t;

/* A static string naming the status ("mokSuccess: no error", ...); never NULL. */
MOK_API const char* mokGetStatusString(mokStatus_t status);
/* Detail of this thread's last failed call, "" if none; valid until the thread's next mok call. */
MOK_API const char* mokGetLastError(void);

/* ---- version ----------------------------------------------------------------------------- */
/* The version of the loaded library, as MOK_VERSION (compare with the header's MOK_VERSION). */
MOK_API mokStatus_t mokGetVersion(int* version);

/* ---- executors and devices --------------------------------------------------------------- */
typedef enum {
  mokExecutorHost = 0,     /* CPU threads; always compiled */
  mokExecutorSm100 = 1,    /* Blackwell sm_100a / sm_103a persistent kernel */
  mokExecutorPortable = 2, /* any sm_80+ GPU (later) */
  mokNumExecutors = 3
} mokExecutor_t;

/* "host", "sm100", "portable"; NULL for an unknown value. */
MOK_API const char* mokExecutorName(mokExecutor_t executor);
/* *compiled = 1 when this libmok carries the executor's code. */
MOK_API mokStatus_t mokExecutorCompiled(mokExecutor_t executor, int* compiled);
/* The CUDA architectures the device code was compiled for, e.g. "100a;103a"; "" without CUDA. */
MOK_API const char* mokCudaArchitectures(void);

typedef struct {
  size_t size;               /* sizeof(mokDeviceInfo_t), set by MOK_DEVICE_INFO_INIT */
  int device_count;          /* visible CUDA devices (0 when there is no GPU or no driver) */
  int device;                /* the device described below, -1 if none */
  int cc_major, cc_minor;    /* compute capability */
  int multiprocessors;
  int driver_version;        /* CUDA driver API version, 0 without a driver */
  int runtime_version;       /* CUDA runtime version libmok was linked with */
  size_t total_memory;       /* bytes */
  char name[256];
} mokDeviceInfo_t;
#define MOK_DEVICE_INFO_INIT {sizeof(mokDeviceInfo_t), 0, -1, 0, 0, 0, 0, 0, 0, {0}}

/*
 * Describe CUDA device `device`. Without a GPU or driver: mokNoDevice, with device_count 0 and the
 * driver and runtime versions filled in as far as they are known. Without CUDA: mokNotCompiled.
 */
MOK_API mokStatus_t mokGetDeviceInfo(int device, mokDeviceInfo_t* info);
/*
 * *supported = 1 when `executor` can run on CUDA device `device` (its code carries an image that
 * the device loads). The host executor supports device -1 (the CPU). Never fails for a missing GPU:
 * *supported = 0 and the status says why (mokNoDevice, mokNotCompiled, mokUnsupported).
 */
MOK_API mokStatus_t mokExecutorSupportsDevice(mokExecutor_t executor, int device, int* supported);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOK_H_ */
