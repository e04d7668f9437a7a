# Byte-identical builds from any directory: no absolute source paths and no temp names in the binaries.
string(APPEND CMAKE_CXX_FLAGS " -ffile-prefix-map=${CMAKE_SOURCE_DIR}/=")
string(APPEND CMAKE_C_FLAGS " -ffile-prefix-map=${CMAKE_SOURCE_DIR}/=")
if(MOK_ENABLE_CUDA)
  # -objtemp: nvcc otherwise embeds tmpxft_<pid> names in .symtab.
  string(APPEND CMAKE_CUDA_FLAGS " -objtemp -Xcompiler=-ffile-prefix-map=${CMAKE_SOURCE_DIR}/=")
endif()
