# The nccl comm backend. The watchdog policy and the EFA start-up check are
# free of CUDA and NCCL and build everywhere (their tests run on any machine);
# the backend itself builds with TORUS_WITH_NCCL.
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/watchdog.cpp
  ${CMAKE_CURRENT_LIST_DIR}/efa_check.cpp)
if(TORUS_WITH_NCCL)
  target_sources(torus_base PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/nccl_comm.cpp
    ${CMAKE_CURRENT_LIST_DIR}/nccl_work.cpp
    ${CMAKE_CURRENT_LIST_DIR}/nccl_backend.cpp)
  target_include_directories(torus_base PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(torus_base PUBLIC ${NCCL_LIBRARY})
  torus_register_backend(nccl)
endif()
