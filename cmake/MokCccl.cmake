# CCCL (libcu++): core/ uses cuda::atomic_ref on host and device alike. The CUDA toolkit carries it;
# a host-only build looks for a toolkit's headers too, then for the nvidia-cuda-cccl wheel in the
# Python that runs the build (pip's build environment installs it: python/pyproject.toml), or takes
# MOK_CCCL_INCLUDE_DIR. Not found: a fatal error, unless MOK_CCCL_OPTIONAL is set (then the caller checks).
if(NOT CUDAToolkit_FOUND)  # a CUDA build has found it already
  find_package(CUDAToolkit QUIET)
endif()
if(NOT MOK_CCCL_INCLUDE_DIR AND Python_EXECUTABLE)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import nvidia, os; print(';'.join(os.path.join(p, 'cu13', 'include', 'cccl') for p in nvidia.__path__))"
    OUTPUT_VARIABLE _mok_wheel_cccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_path(MOK_CCCL_INCLUDE_DIR cuda/atomic
  HINTS ${CUDAToolkit_INCLUDE_DIRS}/cccl ${CUDAToolkit_INCLUDE_DIRS} $ENV{CUDA_HOME}/include/cccl
        $ENV{CONDA_PREFIX}/include/cccl $ENV{CONDA_PREFIX}/targets/x86_64-linux/include/cccl ${_mok_wheel_cccl}
  DOC "include dir holding cuda/atomic (CCCL libcu++)")
unset(_mok_wheel_cccl)
if(NOT MOK_CCCL_INCLUDE_DIR AND NOT MOK_CCCL_OPTIONAL)
  message(FATAL_ERROR "CCCL not found: set MOK_CCCL_INCLUDE_DIR to the dir holding cuda/atomic "
                      "(pip install nvidia-cuda-cccl==13.0.85 provides it under nvidia/cu13/include/cccl)")
endif()

