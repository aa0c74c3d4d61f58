# Tensor-level ProcessGroup / DeviceMesh tests on 1–4 ranks (host backend).
add_executable(torus_pg_tests ${CMAKE_CURRENT_LIST_DIR}/process_group_test.cpp)
target_link_libraries(torus_pg_tests PRIVATE torus_test_main torus)
foreach(_np 1 2 3 4)
  torus_add_mpi_test(NAME process_group_np${_np} TARGET torus_pg_tests NP ${_np} LABELS "comm" TIMEOUT 240)
endforeach()
