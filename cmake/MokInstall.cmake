# install(): runtime component (libmok.so) and dev component (headers, CMake package, pkg-config).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS mok EXPORT mokTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(DIRECTORY kernel/include/mok DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
  FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/kernel/include/mok/mok_version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mok COMPONENT dev)

set(MOK_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mok)
install(EXPORT mokTargets NAMESPACE mok:: DESTINATION ${MOK_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(cmake/mokConfig.cmake.in ${PROJECT_BINARY_DIR}/mokConfig.cmake
  INSTALL_DESTINATION ${MOK_CMAKE_DIR})
# The same ABI as the SONAME: 0.x releases are compatible within their minor, later ones within their major.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_mok_compatibility SameMinorVersion)
else()
  set(_mok_compatibility SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mokConfigVersion.cmake
  COMPATIBILITY ${_mok_compatibility})
unset(_mok_compatibility)
install(FILES ${PROJECT_BINARY_DIR}/mokConfig.cmake ${PROJECT_BINARY_DIR}/mokConfigVersion.cmake
  DESTINATION ${MOK_CMAKE_DIR} COMPONENT dev)

# Relative install dirs stay relative to the .pc file's prefix (relocatable: conda); absolute ones (nixpkgs puts
# lib and include in different store paths) are written as they are.
foreach(_dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_dir}}")
    set(MOK_PC_${_dir} "${CMAKE_INSTALL_${_dir}}")
  else()
    set(MOK_PC_${_dir} "\${prefix}/${CMAKE_INSTALL_${_dir}}")
  endif()
endforeach()
configure_file(cmake/mok.pc.in ${PROJECT_BINARY_DIR}/mok.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/mok.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
