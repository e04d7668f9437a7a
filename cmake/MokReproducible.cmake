# Byte-identical release builds from any directory, at any time (docs/packaging.md says how to check):
# no absolute source or build paths, no temp names and no build-tree rpaths in the binaries.
# SOURCE_DATE_EPOCH (the last commit's time) is the caller's to set; the wheel's timestamps come from it.

# This file's parent is the repository root, whichever project includes it (the wheel's build starts
# from python/). The build-dir map comes last so that it wins when the build dir is inside the source.
get_filename_component(_mok_source_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(_mok_prefix_maps "-ffile-prefix-map=${_mok_source_root}/= -ffile-prefix-map=${CMAKE_BINARY_DIR}/=")
string(APPEND CMAKE_CXX_FLAGS " ${_mok_prefix_maps}")
string(APPEND CMAKE_C_FLAGS " ${_mok_prefix_maps}")

if(MOK_ENABLE_CUDA)
  # -objtemp: nvcc otherwise embeds tmpxft_<pid> names in .symtab.
  string(APPEND CMAKE_CUDA_FLAGS " -objtemp -Xcompiler=-ffile-prefix-map=${_mok_source_root}/="
                                 " -Xcompiler=-ffile-prefix-map=${CMAKE_BINARY_DIR}/=")
  # Line info and relocatable device code embed absolute source paths and module ids.
  if(CMAKE_BUILD_TYPE STREQUAL "Release")
    if(CMAKE_CUDA_FLAGS MATCHES "(^| )(-lineinfo|--generate-line-info|-G)( |$)")
      message(FATAL_ERROR "CMAKE_CUDA_FLAGS: a Release build must not carry -lineinfo or -G (they embed absolute "
                          "paths and break reproducibility); profile with CMAKE_BUILD_TYPE=RelWithDebInfo")
    endif()
    if(CMAKE_CUDA_SEPARABLE_COMPILATION)
      message(FATAL_ERROR "CMAKE_CUDA_SEPARABLE_COMPILATION: a Release build must not use relocatable device "
                          "code (its module ids are not reproducible)")
    endif()
  endif()
endif()

# A wheel's extension is linked with its install rpath ($ORIGIN): CMake otherwise links it with the
# build tree's path and patches it at install, leaving a path-length-dependent .dynstr behind. Only for
# wheels: the C++ tests run from the build tree and need its rpath.
if(SKBUILD)
  set(CMAKE_BUILD_WITH_INSTALL_RPATH ON CACHE BOOL "link with the install rpath (reproducible wheels)")
endif()
