# Backend conformance suite: one multi-rank GoogleTest binary that runs
# against any host backend, chosen at run time by TORUS_TEST_BACKEND (see
# backend_fixture.h). Links torus_base only (no LibTorch).
# Order matters: gtest runs tests in link order, and the fault tests, which
# leave abandoned requests behind on their own groups, come last.
add_executable(torus_backend_tests
  ${CMAKE_CURRENT_LIST_DIR}/backend_fixture.cpp
  ${CMAKE_CURRENT_LIST_DIR}/collectives_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/all_to_all_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/p2p_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/split_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/invalid_args_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mpi_specific_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_test.cpp)
target_link_libraries(torus_backend_tests PRIVATE torus_test_main torus_base)
# The Store hook (backend_fixture.cpp) is compiled only into builds with a
# backend that needs a Store.
if(TORUS_WITH_OFI)
  target_compile_definitions(torus_backend_tests PRIVATE TORUS_BACKEND_TESTS_STORE=1)
else()
  target_compile_definitions(torus_backend_tests PRIVATE TORUS_BACKEND_TESTS_STORE=0)
endif()

if(TORUS_WITH_MPI)
  foreach(n 1 2 3 4)
    torus_add_mpi_test(NAME backend_mpi_np${n} TARGET torus_backend_tests NP ${n} LABELS "backend;mpi"
                       ENV TORUS_TEST_BACKEND=mpi TIMEOUT 300)
  endforeach()

  # Shutdown with an op in flight that can never complete (its own binary,
  # since it finalizes MPI).
  add_executable(torus_mpi_shutdown_tests ${CMAKE_CURRENT_LIST_DIR}/mpi_shutdown_test.cpp)
  target_link_libraries(torus_mpi_shutdown_tests PRIVATE torus_test_main torus_base)
  foreach(n 1 3)
    torus_add_mpi_test(NAME backend_mpi_shutdown_np${n} TARGET torus_mpi_shutdown_tests NP ${n}
                       LABELS "backend;mpi" TIMEOUT 60)
  endforeach()
endif()

# The randomized collective test (random_collectives.cpp, docs/testing.md):
# random ops, dtypes, sizes, groups and placements from a seed, each rank
# checking its results against an exact reference. One binary for every
# host backend; bounded runs here, large runs with
# tests/backend/random_collectives.py.
add_executable(torus_random_collectives
  ${CMAKE_CURRENT_LIST_DIR}/random_collectives.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random_cases.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random_op.cpp)
target_link_libraries(torus_random_collectives PRIVATE torus_base)
target_include_directories(torus_random_collectives BEFORE PRIVATE ${TORUS_FMT_SHIM})
target_compile_options(torus_random_collectives PRIVATE -Wall -Wextra)
