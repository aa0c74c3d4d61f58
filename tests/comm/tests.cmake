# Tensor-level ProcessGroup / DeviceMesh tests on 1–4 ranks on the mpi host
# backend where built (the ofi runs, the default otherwise, follow). The
# ofi-only file comes first: gtest runs tests in link order, and the last test
# leaves a group timed out.
set(_pg_mpi)
if(TORUS_WITH_MPI)
  set(_pg_mpi TORUS_BACKEND=mpi)
endif()
set(_pg_sources ${CMAKE_CURRENT_LIST_DIR}/process_group_test.cpp)
if(TORUS_WITH_OFI)
  list(PREPEND _pg_sources ${CMAKE_CURRENT_LIST_DIR}/process_group_ofi_test.cpp)
endif()
add_executable(torus_pg_tests ${_pg_sources})
target_link_libraries(torus_pg_tests PRIVATE torus_test_main torus)
foreach(_np 1 2 3 4)
  torus_add_mpi_test(NAME process_group_np${_np} TARGET torus_pg_tests NP ${_np} LABELS "comm" TIMEOUT 240
                     ARGS --gtest_filter=-ProcessGroupOnOfi.* ENV ${_pg_mpi})
endforeach()

# The shared host allocator in one process (no launcher).
add_executable(torus_shared_host_tests ${CMAKE_CURRENT_LIST_DIR}/shared_host_allocator_test.cpp)
target_link_libraries(torus_shared_host_tests PRIVATE torus_test_main torus)
torus_add_test(NAME shared_host_allocator TARGET torus_shared_host_tests LABELS "comm" TIMEOUT 120)
if(TORUS_WITH_OFI)
  # The tensor-level suite on ofi, where torus::init installs the shared host
  # allocator: large tensors take the zero-copy path.
  foreach(_np 2 3)
    torus_add_mpi_test(NAME process_group_ofi_np${_np} TARGET torus_pg_tests NP ${_np} LABELS "comm;ofi" TIMEOUT 240
                       ENV TORUS_BACKEND=ofi)
  endforeach()
endif()

# Rank 0's store server stays up for a late peer after a failure (its own
# binary: the Context is destroyed inside the test), on every host backend.
add_executable(torus_store_shutdown_tests ${CMAKE_CURRENT_LIST_DIR}/store_shutdown_test.cpp)
target_link_libraries(torus_store_shutdown_tests PRIVATE torus_test_main torus_base)
torus_add_mpi_test(NAME store_shutdown_np3 TARGET torus_store_shutdown_tests NP 3 LABELS "comm;store" TIMEOUT 60
                   ENV ${_pg_mpi})
if(TORUS_WITH_OFI)
  torus_add_mpi_test(NAME store_shutdown_ofi_np2 TARGET torus_store_shutdown_tests NP 2 LABELS "comm;store;ofi"
                     TIMEOUT 60 ENV TORUS_BACKEND=ofi)
endif()

# The backend registry and the default host backend, on 2 ranks: as is, and
# with a libfabric provider that does not exist (mpi is then the default).
add_executable(torus_backend_registry_tests ${CMAKE_CURRENT_LIST_DIR}/backend_registry_test.cpp)
target_link_libraries(torus_backend_registry_tests PRIVATE torus_test_main torus_base)
torus_add_mpi_test(NAME backend_registry_np2 TARGET torus_backend_registry_tests NP 2 LABELS "comm;backend"
                   TIMEOUT 60)
torus_add_mpi_test(NAME backend_registry_no_provider_np2 TARGET torus_backend_registry_tests NP 2
                   LABELS "comm;backend" TIMEOUT 60 ENV FI_PROVIDER=no-such-provider TORUS_TEST_OFI_UNUSABLE=1)
# The client of torchrun's agent store against an in-process c10d TCPStore
# server (one process); the end-to-end runs under torchrun are below.
add_executable(torus_agent_store_tests ${CMAKE_CURRENT_LIST_DIR}/agent_store_c10d_test.cpp)
target_link_libraries(torus_agent_store_tests PRIVATE torus_test_main torus)
torus_add_test(NAME agent_store_c10d TARGET torus_agent_store_tests LABELS "comm;store" TIMEOUT 120)

# Launched by torchrun, whose agent serves its own store at MASTER_ADDR:
# MASTER_PORT: torus-train under --standalone and --master-port on one node,
# under two agents joined by a c10d rendezvous (the multi-node form), and the
# README's Python snippet, also restarted by the agent (torchrun_test.py).
set(_torchrun_test ${TORUS_PYTHON_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/torchrun_test.py)
add_test(NAME torchrun_train_standalone
         COMMAND ${_torchrun_test} standalone ${TORUS_PYTHON_EXECUTABLE} $<TARGET_FILE:torus-train>)
add_test(NAME torchrun_train_multinode
         COMMAND ${_torchrun_test} multinode ${TORUS_PYTHON_EXECUTABLE} $<TARGET_FILE:torus-train>)
set_tests_properties(torchrun_train_standalone PROPERTIES TIMEOUT 480 LABELS "multirank;np2;comm;torchrun;train"
                     PROCESSORS 1)
set_tests_properties(torchrun_train_multinode PROPERTIES TIMEOUT 480 LABELS "multirank;np2;comm;torchrun;train"
                     PROCESSORS 1)
if(TORUS_BUILD_PYTHON)
  add_test(NAME torchrun_python_snippet
           COMMAND ${_torchrun_test} python ${TORUS_PYTHON_EXECUTABLE} $<TARGET_FILE:torus-train>
                   ${PROJECT_BINARY_DIR}/python)
  set_tests_properties(torchrun_python_snippet PROPERTIES TIMEOUT 330 LABELS "multirank;np2;comm;torchrun;python"
                       PROCESSORS 1)
endif()
