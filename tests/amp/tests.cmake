# Mixed precision: precision names, the loss scaler, unscaling, the autocast
# scope, and the cross-rank inf/NaN verdict on 1-4 ranks (one rank poisoned).
add_executable(torus_amp_tests ${CMAKE_CURRENT_LIST_DIR}/amp_test.cpp)
target_link_libraries(torus_amp_tests PRIVATE torus_test_main torus)
foreach(_np 1 2 3 4)
  torus_add_mpi_test(NAME amp_np${_np} TARGET torus_amp_tests NP ${_np} LABELS "amp" TIMEOUT 120)
endforeach()
