# Optimizers on one process: fused AdamW against torch::optim::AdamW, clipping.
add_executable(torus_optim_tests ${CMAKE_CURRENT_LIST_DIR}/optim_test.cpp)
target_link_libraries(torus_optim_tests PRIVATE torus_test_main torus)
torus_add_test(NAME optim_unit TARGET torus_optim_tests LABELS "optim" TIMEOUT 120)
