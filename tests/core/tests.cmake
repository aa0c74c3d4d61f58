# Single-process unit tests of core and the comm arithmetic (LibTorch-free).
add_executable(torus_core_tests ${CMAKE_CURRENT_LIST_DIR}/core_test.cpp ${CMAKE_CURRENT_LIST_DIR}/mesh_launch_test.cpp
                                ${CMAKE_CURRENT_LIST_DIR}/params_test.cpp
                                ${CMAKE_CURRENT_LIST_DIR}/reduce_kernels_test.cpp
                                ${CMAKE_CURRENT_LIST_DIR}/host_allocator_test.cpp
                                ${CMAKE_CURRENT_LIST_DIR}/mapped_file_test.cpp)
target_link_libraries(torus_core_tests PRIVATE torus_test_main torus_base)
# params_test.cpp reads docs/*.md and the sources to check the documented variables.
target_compile_definitions(torus_core_tests PRIVATE TORUS_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
torus_add_test(NAME core_unit TARGET torus_core_tests LABELS core TIMEOUT 120)
