# Optimizers on one process (against torch::optim, state, master weights,
# errors) and gradient clipping; clipping over 2 and 3 ranks under mpirun.
add_executable(torus_optim_tests ${CMAKE_CURRENT_LIST_DIR}/optimizer_test.cpp ${CMAKE_CURRENT_LIST_DIR}/clip_test.cpp)
target_link_libraries(torus_optim_tests PRIVATE torus_test_main torus)
torus_add_test(NAME optim_unit TARGET torus_optim_tests LABELS "optim" TIMEOUT 120)

add_executable(torus_optim_mpi_tests ${CMAKE_CURRENT_LIST_DIR}/clip_mpi_test.cpp)
target_link_libraries(torus_optim_mpi_tests PRIVATE torus_test_main torus)
foreach(_np 2 3)
  torus_add_mpi_test(NAME optim_clip_np${_np} TARGET torus_optim_mpi_tests NP ${_np} LABELS "optim" TIMEOUT 180)
endforeach()

# The CPU Adam kernel bit for bit against a scalar reference on every ISA path
# the CPU has, and CpuAdam/CpuAdamW against the ATen-fused Adam/AdamW.
add_executable(torus_cpu_adam_tests ${CMAKE_CURRENT_LIST_DIR}/cpu_adam_test.cpp)
target_link_libraries(torus_cpu_adam_tests PRIVATE torus_test_main torus)
torus_add_test(NAME optim_cpu_adam TARGET torus_cpu_adam_tests LABELS "optim" TIMEOUT 300)
