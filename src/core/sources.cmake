target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/error.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dtype.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reduce_op.cpp
  ${CMAKE_CURRENT_LIST_DIR}/logging.cpp
  ${CMAKE_CURRENT_LIST_DIR}/params.cpp
  ${CMAKE_CURRENT_LIST_DIR}/format.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_allocator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mapped_file.cpp)
# The CUDA runtime's check macro and error text (cuda_check.h), for the CUDA
# device and the kernel launchers.
if(TORUS_WITH_CUDA)
  target_sources(torus_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_check.cpp)
endif()
