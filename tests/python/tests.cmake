# pytest tests of the Python bindings, on every rank under mpirun.
if(TORUS_BUILD_PYTHON)
  foreach(_np 1 2 4)
    torus_add_mpi_test(NAME python_comm_np${_np} NP ${_np} LABELS "python" TIMEOUT 300
                       COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                               ${CMAKE_CURRENT_LIST_DIR}/test_comm.py)
  endforeach()
endif()
