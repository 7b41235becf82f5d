# Install: the public headers under include/zrt/ (<zrt/zrt.h> and what it includes; <zrt/gpu.h> in
# CUDA builds), libzrt.so, the CLI, and a CMake package so a trainer can `find_package(zrt)` and link
# `zrt::zrt` (and `zrt::gpu`: find_package(zrt COMPONENTS gpu)).
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

install(TARGETS zrt EXPORT zrtTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} INCLUDES DESTINATION include)
if(ZRT_HAVE_CUDA)  # its own export set: it names CUDA::cudart, which a CPU-only consumer does not have
  set_target_properties(zrt_gpu PROPERTIES EXPORT_NAME gpu)
  install(TARGETS zrt_gpu EXPORT zrtGpuTargets)
  install(EXPORT zrtGpuTargets NAMESPACE zrt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zrt)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/zrt.h DESTINATION include/zrt)
if(ZRT_HAVE_CUDA)
  install(FILES ${PROJECT_SOURCE_DIR}/gpu.h DESTINATION include/zrt)
endif()
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/zrt-mpirun DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT zrtTargets NAMESPACE zrt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zrt)
configure_package_config_file(cmake/zrtConfig.cmake.in ${PROJECT_BINARY_DIR}/zrtConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zrt)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zrtConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zrtConfig.cmake ${PROJECT_BINARY_DIR}/zrtConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zrt)
