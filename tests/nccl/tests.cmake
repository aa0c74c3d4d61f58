# The nccl backend. The watchdog policy and the EFA check run everywhere; the
# backend tests need TORUS_WITH_NCCL and skip, with the reason, without a GPU.
add_executable(torus_nccl_policy_tests ${CMAKE_CURRENT_LIST_DIR}/watchdog_test.cpp
                                       ${CMAKE_CURRENT_LIST_DIR}/efa_check_test.cpp)
target_link_libraries(torus_nccl_policy_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME nccl_policy TARGET torus_nccl_policy_tests LABELS nccl TIMEOUT 60)

if(TORUS_WITH_NCCL)
  # Ranks are threads, one per visible GPU (TORUS_TEST_NCCL_RANKS caps them).
  add_executable(torus_nccl_tests ${CMAKE_CURRENT_LIST_DIR}/nccl_backend_test.cpp)
  target_link_libraries(torus_nccl_tests PRIVATE torus_test_main torus_base)
  torus_add_test(NAME nccl_backend TARGET torus_nccl_tests LABELS "nccl;gpu" TIMEOUT 600)

  # One fault per process: an aborted communicator may poison the CUDA context.
  add_executable(torus_nccl_fault_tests ${CMAKE_CURRENT_LIST_DIR}/nccl_fault_test.cpp)
  target_link_libraries(torus_nccl_fault_tests PRIVATE torus_test_main torus_base)
  torus_add_test(NAME nccl_fault_missing_peer TARGET torus_nccl_fault_tests
                 ARGS --gtest_filter=NcclFault.MissingPeerTimesOutInit LABELS "nccl;gpu" TIMEOUT 120)
  torus_add_test(NAME nccl_fault_stalled_op TARGET torus_nccl_fault_tests
                 ARGS --gtest_filter=NcclFault.StalledOpTimesOutAndAborts LABELS "nccl;gpu" TIMEOUT 120)
endif()
