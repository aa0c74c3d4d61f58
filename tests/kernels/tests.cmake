# Kernel references (every build) and the CUDA kernels against them (CUDA
# builds; the GPU cases skip with the reason when no GPU is present).
add_executable(torus_kernel_ref_tests ${CMAKE_CURRENT_LIST_DIR}/ref_test.cpp)
target_link_libraries(torus_kernel_ref_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME kernels_ref TARGET torus_kernel_ref_tests LABELS kernels TIMEOUT 120)

if(TORUS_WITH_CUDA)
  add_executable(torus_cuda_kernel_tests ${CMAKE_CURRENT_LIST_DIR}/cuda_kernels_test.cpp)
  target_link_libraries(torus_cuda_kernel_tests PRIVATE torus_test_main torus_base)
  torus_add_test(NAME kernels_cuda TARGET torus_cuda_kernel_tests LABELS "kernels;gpu" TIMEOUT 300)

  # Not a test: measures each kernel's bandwidth against the GPU's (used by
  # tests/gpu/run.sh).
  add_executable(torus_kernel_bandwidth ${CMAKE_CURRENT_LIST_DIR}/kernel_bandwidth.cpp)
  target_link_libraries(torus_kernel_bandwidth PRIVATE torus_base)
  target_include_directories(torus_kernel_bandwidth PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src)
endif()
