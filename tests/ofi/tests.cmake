# ofi backend tests.
#  * ofi_unit: transport unit tests (two forked processes on raw endpoints,
#    shm and tcp), every collective over injected topologies (one host,
#    several fake hosts), faults (killed peers, deadlines, teardown), same-
#    host liveness (provider marks, wedged endpoints), shared host buffers
#    and the zero-copy host path — forked ranks, no launcher needed.
#  * backend_ofi_*: the backend conformance suite (tests/backend) on the ofi
#    backend: shm provider with the host segment (the default setup), tcp on
#    loopback with every collective over the provider, and the provider's
#    own algorithms over shm with small pipeline chunks.
#  * ofi_netns_hosts: the suite across network namespaces (several "hosts"
#    on one machine) over tcp; skips where namespaces are not permitted.
if(TORUS_WITH_OFI)
  add_executable(torus_ofi_tests
    ${CMAKE_CURRENT_LIST_DIR}/fabric_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ofi_backend_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ofi_fault_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ofi_inline_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ofi_segment_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ofi_split_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ofi_size_check_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ofi_zero_copy_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/liveness_test.cpp)
  target_link_libraries(torus_ofi_tests PRIVATE torus_test_main torus_base)
  torus_add_test(NAME ofi_unit TARGET torus_ofi_tests LABELS ofi TIMEOUT 300)

  # One rank of the multi-host check, started by scripts/netns_hosts.sh.
  add_executable(torus_ofi_hosts_check ${CMAKE_CURRENT_LIST_DIR}/hosts_check.cpp)
  target_link_libraries(torus_ofi_hosts_check PRIVATE torus_base)
  target_include_directories(torus_ofi_hosts_check PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR}/src
                             ${PROJECT_SOURCE_DIR})
  target_include_directories(torus_ofi_hosts_check BEFORE PRIVATE ${TORUS_FMT_SHIM})
  # 2 hosts x 2 ranks and 3 hosts x 1 rank (hierarchical and flat across
  # hosts), the second over a shaped link. Exit 77 = namespaces not
  # permitted here: reported as skipped.
  add_test(NAME ofi_netns_hosts_2x2
           COMMAND ${PROJECT_SOURCE_DIR}/scripts/netns_hosts.sh -H 2 -r 2 -t 150 -- $<TARGET_FILE:torus_ofi_hosts_check>)
  add_test(NAME ofi_netns_hosts_3x1_shaped
           COMMAND ${PROJECT_SOURCE_DIR}/scripts/netns_hosts.sh -H 3 -r 1 -t 150 -R 2gbit -D 50us --
                   $<TARGET_FILE:torus_ofi_hosts_check>)
  set_tests_properties(ofi_netns_hosts_2x2 ofi_netns_hosts_3x1_shaped PROPERTIES
                       TIMEOUT 180 SKIP_RETURN_CODE 77 LABELS "multirank;ofi;netns" RUN_SERIAL TRUE
                       ENVIRONMENT "TORUS_LOG_LEVEL=warn")
  # Two ranks whose pids have different numbers of digits (shm addresses of
  # different lengths), in a private pid namespace as in a container.
  add_test(NAME ofi_pid_digits
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/pid_digits_test.sh $<TARGET_FILE:torus_ofi_hosts_check>)
  set_tests_properties(ofi_pid_digits PROPERTIES TIMEOUT 150 SKIP_RETURN_CODE 77 LABELS "multirank;ofi")

  if(TARGET torus_backend_tests AND TORUS_WITH_MPI)
    foreach(n 1 2 3 4)
      torus_add_mpi_test(NAME backend_ofi_shm_np${n} TARGET torus_backend_tests NP ${n} LABELS "backend;ofi"
                         ENV TORUS_TEST_BACKEND=ofi FI_PROVIDER=shm TIMEOUT 300)
      torus_add_mpi_test(NAME backend_ofi_tcp_np${n} TARGET torus_backend_tests NP ${n} LABELS "backend;ofi"
                         ENV TORUS_TEST_BACKEND=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo TORUS_OFI_HOST_SHM=0
                         TIMEOUT 300)
    endforeach()
    torus_add_mpi_test(NAME backend_ofi_shm_flat_np3 TARGET torus_backend_tests NP 3 LABELS "backend;ofi"
                       ENV TORUS_TEST_BACKEND=ofi FI_PROVIDER=shm TORUS_OFI_HOST_SHM=0 TORUS_OFI_CHUNK_BYTES=65536
                       TIMEOUT 300)
  endif()
endif()
