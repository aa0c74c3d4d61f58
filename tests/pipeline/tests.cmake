# Pipeline parallelism. Schedule generators, validator and simulator are
# LibTorch-free (torus_base), single process.
add_executable(torus_pipeline_schedule_tests ${CMAKE_CURRENT_LIST_DIR}/schedule_test.cpp)
target_link_libraries(torus_pipeline_schedule_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME pipeline_schedule TARGET torus_pipeline_schedule_tests LABELS pipeline TIMEOUT 120)

# The executor on a toy f64 model against single-process autograd, 1-4 ranks.
add_executable(torus_pipeline_executor_tests ${CMAKE_CURRENT_LIST_DIR}/executor_test.cpp)
target_link_libraries(torus_pipeline_executor_tests PRIVATE torus_test_main torus)
foreach(_np 1 2 3 4)
  torus_add_mpi_test(NAME pipeline_executor_np${_np} TARGET torus_pipeline_executor_tests NP ${_np}
                     LABELS "pipeline" TIMEOUT 300)
endforeach()
