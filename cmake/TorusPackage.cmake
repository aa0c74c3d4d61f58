# `cmake --install` layout and the exported package: an outside project does
#   find_package(Torus CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE Torus::torus)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TORUS_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Torus)
set_target_properties(torus PROPERTIES INSTALL_RPATH "$ORIGIN;${TORUS_TORCH_DIR}/lib")
install(TARGETS torus EXPORT TorusTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/torus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/torus/config.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/torus)
install(EXPORT TorusTargets NAMESPACE Torus:: DESTINATION ${TORUS_CMAKE_INSTALL_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TorusConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/TorusConfig.cmake
                              INSTALL_DESTINATION ${TORUS_CMAKE_INSTALL_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/TorusConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/TorusConfig.cmake ${PROJECT_BINARY_DIR}/TorusConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/TorusTorch.cmake
        DESTINATION ${TORUS_CMAKE_INSTALL_DIR})
