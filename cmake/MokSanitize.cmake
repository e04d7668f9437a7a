# MOK_SANITIZE: build everything (library and tests) under a sanitizer.
#   ""        none
#   "thread"  ThreadSanitizer: the host executor's workers and ranks as threads
#   "address" AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer (enum checks included); every UBSan
#             report is fatal (-fno-sanitize-recover), so a test cannot print one and still pass
set(MOK_SANITIZE "" CACHE STRING "Sanitizer for the whole build: '', 'thread' or 'address'")
set_property(CACHE MOK_SANITIZE PROPERTY STRINGS "" thread address)

if(MOK_SANITIZE STREQUAL "")
  return()
elseif(MOK_SANITIZE STREQUAL "thread")
  set(_mok_sanitize_flags -fsanitize=thread)
elseif(MOK_SANITIZE STREQUAL "address")
  set(_mok_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=all)
else()
  message(FATAL_ERROR "MOK_SANITIZE must be '', 'thread' or 'address', not '${MOK_SANITIZE}'")
endif()

if(MOK_ENABLE_CUDA)
  message(WARNING "MOK_SANITIZE=${MOK_SANITIZE} instruments host code only; device code is not sanitized")
endif()
foreach(_mok_flag IN LISTS _mok_sanitize_flags ITEMS -fno-omit-frame-pointer)
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:${_mok_flag}>)  # one flag per genex: a list would split it
endforeach()
add_link_options(${_mok_sanitize_flags})
# libmok links with --no-undefined; the sanitizer runtime resolves at load time from the executable.
