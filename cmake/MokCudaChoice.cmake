# MOK_ENABLE_CUDA: AUTO (the default) builds the device code if a CUDA compiler is found and a host-only libmok
# otherwise, saying which; ON requires one and fails naming nvcc and the switch (CMake's own "Failed to find nvcc"
# names neither); OFF never looks. The choice is set as a normal variable that shadows the cache entry, so every
# `if(MOK_ENABLE_CUDA)` after this file sees ON or OFF while the cache keeps what the user asked for.
string(TOUPPER "${MOK_ENABLE_CUDA}" _mok_cuda_request)
if(_mok_cuda_request STREQUAL "AUTO" OR MOK_ENABLE_CUDA)
  if(CMAKE_CUDA_COMPILER OR DEFINED ENV{CUDACXX})
    # A compiler the user named is used as named; enable_language's error names it if it is not there.
    set(_mok_cuda_compiler "${CMAKE_CUDA_COMPILER}$ENV{CUDACXX}")
  else()
    # CMake's own search for nvcc (PATH, $CUDA_PATH/bin, the system prefixes), handed on to enable_language so
    # that both agree on the compiler.
    find_program(MOK_NVCC nvcc HINTS "$ENV{CUDA_PATH}/bin" DOC "the nvcc MOK_ENABLE_CUDA found")
    if(MOK_NVCC)
      set(CMAKE_CUDA_COMPILER "${MOK_NVCC}" CACHE FILEPATH "CUDA compiler")
    endif()
    set(_mok_cuda_compiler "${MOK_NVCC}")
  endif()
endif()

if(_mok_cuda_request STREQUAL "AUTO")
  if(_mok_cuda_compiler)
    message(STATUS "libmok: CUDA compiler ${_mok_cuda_compiler}: building the CUDA device code "
                   "(MOK_ENABLE_CUDA=AUTO; OFF builds a host-only libmok)")
    set(MOK_ENABLE_CUDA ON)
  else()
    message(NOTICE "libmok: no CUDA compiler found (no nvcc on PATH or in $CUDA_PATH/bin, no CUDACXX): building "
                   "a host-only libmok, the C ABI and the CPU executor (MOK_ENABLE_CUDA=AUTO). For the device code "
                   "put CUDA 13.0's nvcc on PATH or in CUDACXX; -DMOK_ENABLE_CUDA=ON (pip: "
                   "-C cmake.define.MOK_ENABLE_CUDA=ON) makes a missing nvcc an error.")
    set(MOK_ENABLE_CUDA OFF)
  endif()
elseif(MOK_ENABLE_CUDA)
  if(NOT _mok_cuda_compiler)
    message(FATAL_ERROR "MOK_ENABLE_CUDA=${MOK_ENABLE_CUDA} but no CUDA compiler is found: nvcc is not on PATH or "
                        "in $CUDA_PATH/bin and neither CUDACXX nor CMAKE_CUDA_COMPILER names one. Put CUDA 13.0's "
                        "nvcc on PATH, set CUDACXX=<cuda>/bin/nvcc (`python3 tools/cuda_toolchain.py` installs the "
                        "pinned toolchain and prints <cuda>), or configure with -DMOK_ENABLE_CUDA=OFF (or AUTO) "
                        "for a host-only libmok.")
  endif()
  set(MOK_ENABLE_CUDA ON)
else()
  set(MOK_ENABLE_CUDA OFF)
endif()
unset(_mok_cuda_request)
unset(_mok_cuda_compiler)
