# CUTLASS 4.2's headers fetched at configure time: the nvidia-cutlass wheel on PyPI, pinned by sha256 (the same file the
# conda recipe and the Nix flake name; tests/packaging/test_conda_recipe.py holds the three to one pin), only its
# header tree unpacked. For the pip wheel's build (MOK_FETCH_CUTLASS, on in python/pyproject.toml), which has no
# nvidia-cutlass in its environment otherwise. Also a script, for the packaging test:
#   cmake -DMOK_CUTLASS_FETCH_DIR=<dir> [-DMOK_CUTLASS_URL=<url>] -P cmake/MokFetchCutlass.cmake
# prints the include directory, or fails naming the URL and why (a download error, another sha256).
set(MOK_CUTLASS_WHEEL_URL
    "https://files.pythonhosted.org/packages/21/6b/e86fc2fd536dd4b8bd2209aa31d7002610c501b0802337787eac9c9b328c/nvidia_cutlass-4.2.0.0-py3-none-any.whl")
set(MOK_CUTLASS_WHEEL_SHA256 "f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6")

# The include directory (cute/, cutlass/) unpacked under `dir` into `out`, downloading `url` once (kept in `dir`).
function(mok_fetch_cutlass url dir out)
  set(include "${dir}/cutlass_library/source/include")
  if(EXISTS "${include}/cutlass/gemm/collective/collective_builder.hpp")
    set(${out} "${include}" PARENT_SCOPE)
    return()
  endif()
  set(wheel "${dir}/nvidia_cutlass.whl")
  file(DOWNLOAD "${url}" "${wheel}" STATUS status TLS_VERIFY ON INACTIVITY_TIMEOUT 60 TIMEOUT 600)
  list(GET status 0 code)
  list(GET status 1 reason)
  if(code EQUAL 0)
    file(SHA256 "${wheel}" sha256)
    if(NOT sha256 STREQUAL MOK_CUTLASS_WHEEL_SHA256)
      set(code 1)
      set(reason "its sha256 is ${sha256}, not the pinned ${MOK_CUTLASS_WHEEL_SHA256}")
    endif()
  endif()
  if(NOT code EQUAL 0)
    file(REMOVE "${wheel}")
    message(FATAL_ERROR "MOK_FETCH_CUTLASS: no CUTLASS 4.2 headers from ${url}: ${reason} (install "
                        "nvidia-cutlass==4.2.0.0 with --no-deps, name MOK_CUTLASS_INCLUDE_DIR, or set "
                        "MOK_BUILD_GEMMS=OFF)")
  endif()
  file(ARCHIVE_EXTRACT INPUT "${wheel}" DESTINATION "${dir}" PATTERNS "cutlass_library/source/include/*")
  file(REMOVE "${wheel}")
  set(${out} "${include}" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT MOK_CUTLASS_FETCH_DIR)
    message(FATAL_ERROR "name the directory to unpack into: -DMOK_CUTLASS_FETCH_DIR=<dir>")
  endif()
  if(NOT MOK_CUTLASS_URL)
    set(MOK_CUTLASS_URL "${MOK_CUTLASS_WHEEL_URL}")
  endif()
  mok_fetch_cutlass("${MOK_CUTLASS_URL}" "${MOK_CUTLASS_FETCH_DIR}" include)
  message("${include}")
endif()
