# CUDA kernels (TORUS_WITH_CUDA). The .cu files hold kernels only and build in
# their own object library, because nvcc does not take the host warning flags
# of torus_base; their objects are linked wherever torus_base is. The host
# launchers (validation, batching, errors) are ordinary C++ in torus_base.
if(TORUS_WITH_CUDA)
  add_library(torus_cuda_kernels OBJECT
    ${CMAKE_CURRENT_LIST_DIR}/adamw_kernel.cu
    ${CMAKE_CURRENT_LIST_DIR}/unscale_kernel.cu
    ${CMAKE_CURRENT_LIST_DIR}/cast_kernel.cu)
  target_include_directories(torus_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  set_target_properties(torus_cuda_kernels PROPERTIES
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON
    CUDA_ARCHITECTURES "${TORUS_CUDA_ARCHITECTURES}"
    CUDA_RUNTIME_LIBRARY Shared
    POSITION_INDEPENDENT_CODE ON)
  # C++17: CMake before 3.26 has no C++20 switch for nvcc (and would otherwise
  # inherit the project's CXX_STANDARD 20); the kernel headers stay C++17.
  target_compile_options(torus_cuda_kernels PRIVATE -Xcompiler=-Wall -Xcompiler=-Wextra)
  target_link_libraries(torus_cuda_kernels INTERFACE $<TARGET_OBJECTS:torus_cuda_kernels>)
  target_link_libraries(torus_base PUBLIC torus_cuda_kernels)
  target_sources(torus_base PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/launch.cpp
    ${CMAKE_CURRENT_LIST_DIR}/adamw.cpp
    ${CMAKE_CURRENT_LIST_DIR}/unscale.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cast.cpp)
endif()
