# Activation recompute: recompute::run, the GPT under every policy, the
# end-of-backward callback rule and policy parsing (one process); TP, SP and
# DDP (2 ranks); and the pipeline trainer for every schedule (2 ranks, pp2).
add_executable(torus_recompute_tests ${CMAKE_CURRENT_LIST_DIR}/recompute_test.cpp)
target_link_libraries(torus_recompute_tests PRIVATE torus_test_main torus)
torus_add_test(NAME recompute_unit TARGET torus_recompute_tests LABELS "recompute" TIMEOUT 180)

add_executable(torus_recompute_parallel_tests ${CMAKE_CURRENT_LIST_DIR}/recompute_parallel_test.cpp)
target_link_libraries(torus_recompute_parallel_tests PRIVATE torus_test_main torus)
torus_add_mpi_test(NAME recompute_parallel_np2 TARGET torus_recompute_parallel_tests NP 2 LABELS "recompute;parallel"
                   TIMEOUT 240)

add_executable(torus_recompute_pipeline_tests ${CMAKE_CURRENT_LIST_DIR}/recompute_pipeline_test.cpp)
target_link_libraries(torus_recompute_pipeline_tests PRIVATE torus_test_main torus)
foreach(_schedule gpipe 1f1b interleaved zb-h1)
  string(REPLACE "-" "" _name "${_schedule}")
  torus_add_mpi_test(NAME recompute_pipeline_${_name} TARGET torus_recompute_pipeline_tests NP 2
                     ENV TORUS_TEST_SCHEDULE=${_schedule} LABELS "recompute;pipeline" TIMEOUT 300)
endforeach()
