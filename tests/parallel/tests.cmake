# Tensor/sequence-parallel layers and the data-parallel wrapper, on 1-4 ranks.
add_executable(torus_tp_tests ${CMAKE_CURRENT_LIST_DIR}/tp_layers_test.cpp)
target_link_libraries(torus_tp_tests PRIVATE torus_test_main torus)
foreach(_np 1 2 3 4)
  torus_add_mpi_test(NAME tp_layers_np${_np} TARGET torus_tp_tests NP ${_np} LABELS "parallel" TIMEOUT 240)
endforeach()

add_executable(torus_dp_tests ${CMAKE_CURRENT_LIST_DIR}/ddp_test.cpp)
target_link_libraries(torus_dp_tests PRIVATE torus_test_main torus)
# On the mpi host backend where built; the ofi runs (the default host
# backend) follow.
set(_ddp_mpi)
if(TORUS_WITH_MPI)
  set(_ddp_mpi TORUS_BACKEND=mpi)
endif()
foreach(_np 1 2 3 4)
  torus_add_mpi_test(NAME ddp_np${_np} TARGET torus_dp_tests NP ${_np} LABELS "parallel" TIMEOUT 240 ENV ${_ddp_mpi})
endforeach()
# The same on the ofi backend, where the buckets (shared host memory) take
# the zero-copy host path (forced from the smallest sizes: the test models
# are small).
if(TORUS_WITH_OFI)
  foreach(_np 2 3)
    torus_add_mpi_test(NAME ddp_ofi_np${_np} TARGET torus_dp_tests NP ${_np} LABELS "parallel;ofi" TIMEOUT 240
                       ENV TORUS_BACKEND=ofi FI_PROVIDER=shm TORUS_OFI_SHM_ZERO_COPY_BYTES=1 TORUS_OFI_SHM_EAGER_BYTES=0)
  endforeach()
endif()

# pytest tests of torus.parallel / torus.models, on every rank under mpirun.
if(TORUS_BUILD_PYTHON)
  foreach(_np 1 2 4)
    torus_add_mpi_test(NAME python_parallel_np${_np} NP ${_np} LABELS "python;parallel" TIMEOUT 300
                       COMMAND ${PROJECT_SOURCE_DIR}/tests/python/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                               ${PROJECT_SOURCE_DIR}/tests/python/test_parallel.py)
  endforeach()
endif()

# The same building blocks in bf16 and f16 against f64 on the rounded values,
# and under CPU autocast (tolerances: Note [Half-precision tolerances]).
add_executable(torus_tp_half_tests ${CMAKE_CURRENT_LIST_DIR}/tp_half_test.cpp)
target_link_libraries(torus_tp_half_tests PRIVATE torus_test_main torus)
foreach(_np 1 2 4)
  torus_add_mpi_test(NAME tp_half_np${_np} TARGET torus_tp_half_tests NP ${_np} LABELS "parallel;amp" TIMEOUT 240)
endforeach()

# The layout value and its field table (LibTorch-free).
add_executable(torus_layout_tests ${CMAKE_CURRENT_LIST_DIR}/layout_test.cpp)
target_link_libraries(torus_layout_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME layout TARGET torus_layout_tests LABELS "parallel")
