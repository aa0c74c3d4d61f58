# Backend conformance suite: one multi-rank GoogleTest binary that runs
# against any host backend, chosen at run time by TORUS_TEST_BACKEND (see
# backend_fixture.h). Links torus_base only (no LibTorch).
# Order matters: gtest runs tests in link order, and the fault tests, which
# leave abandoned requests behind on their own groups, come last.
set(_backend_test_sources
  ${CMAKE_CURRENT_LIST_DIR}/backend_fixture.cpp
  ${CMAKE_CURRENT_LIST_DIR}/collectives_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/all_to_all_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/p2p_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/split_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/invalid_args_test.cpp)
if(TORUS_WITH_MPI)
  # The mpi backend's own helpers, private to MPI builds.
  list(APPEND _backend_test_sources ${CMAKE_CURRENT_LIST_DIR}/mpi_specific_test.cpp)
endif()
list(APPEND _backend_test_sources ${CMAKE_CURRENT_LIST_DIR}/fault_test.cpp)
add_executable(torus_backend_tests ${_backend_test_sources})
target_link_libraries(torus_backend_tests PRIVATE torus_test_main torus_base)

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

  # Shutdown of a healthy job whose last rank releases MPI 12 s after the
  # others: MPI is still finalized everywhere (its own binary, likewise).
  add_executable(torus_mpi_late_shutdown_tests ${CMAKE_CURRENT_LIST_DIR}/mpi_late_shutdown_test.cpp)
  target_link_libraries(torus_mpi_late_shutdown_tests PRIVATE torus_test_main torus_base)
  torus_add_mpi_test(NAME backend_mpi_late_shutdown_np3 TARGET torus_mpi_late_shutdown_tests NP 3
                     LABELS "backend;mpi" TIMEOUT 60)

  # A peer killed mid-job (SIGKILL inside an all_reduce; repeated, since the
  # shutdown hang it guards against is intermittent) and a peer stopped
  # mid-job (SIGSTOP: alive but never coming back, deterministic), under
  # mpirun with recovery enabled, on every host backend that runs under
  # mpirun: every survivor fails the op with TimeoutError/CommError, and its
  # whole process, teardown included, exits with status 3 within deadline +
  # 30 s (killed_peer_test.py).
  add_executable(torus_killed_peer_check ${CMAKE_CURRENT_LIST_DIR}/killed_peer_check.cpp)
  target_link_libraries(torus_killed_peer_check PRIVATE torus_base)
  target_include_directories(torus_killed_peer_check BEFORE PRIVATE ${TORUS_FMT_SHIM})
  target_include_directories(torus_killed_peer_check PRIVATE ${PROJECT_SOURCE_DIR}/include
                             ${PROJECT_BINARY_DIR}/include)
  # backend:fault:repetitions
  set(_peer_fault_cases mpi:kill:5 mpi:stop:1)
  if(TORUS_WITH_OFI)
    list(APPEND _peer_fault_cases ofi:kill:2 ofi:stop:1)
  endif()
  foreach(_case ${_peer_fault_cases})
    string(REPLACE ":" ";" _fields "${_case}")
    list(GET _fields 0 _backend)
    list(GET _fields 1 _fault)
    list(GET _fields 2 _reps)
    set(_name backend_${_backend}_killed_peer)
    if(_fault STREQUAL "stop")
      set(_name backend_${_backend}_stopped_peer)
    endif()
    set(_env --env TORUS_LOG_LEVEL=warn)
    if(_backend STREQUAL "ofi")
      list(APPEND _env --env FI_PROVIDER=shm)
    endif()
    add_test(NAME ${_name}
             COMMAND ${TORUS_PYTHON_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/killed_peer_test.py
                     --exe $<TARGET_FILE:torus_killed_peer_check> --backend ${_backend} --fault ${_fault}
                     --ranks 3 --reps ${_reps} --deadline-ms 3000 --bound-s 30 ${_env}
                     -- ${TORUS_MPIEXEC} ${TORUS_TEST_MPIRUN_FLAGS})
    set_tests_properties(${_name} PROPERTIES TIMEOUT 200 PROCESSORS 1
                         LABELS "multirank;np3;backend;${_backend};fault")
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
  ${CMAKE_CURRENT_LIST_DIR}/random_op.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random_options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random_report.cpp)
target_link_libraries(torus_random_collectives PRIVATE torus_base)
target_include_directories(torus_random_collectives BEFORE PRIVATE ${TORUS_FMT_SHIM})
target_compile_options(torus_random_collectives PRIVATE -Wall -Wextra)
# Bounded runs, a few seconds each when every case passes: 300 cases of at
# most 256 KiB per buffer on 3, 5 and 6 ranks (oversubscribed) for mpi, ofi
# on shm, ofi on tcp over loopback (every collective over the provider) and
# ofi with an injected host map (hierarchical paths, uneven hosts for 3 and
# 5 ranks, interleaved for 6); the netns runs need root (skipped elsewhere).
set(_rc_args --cases 300 --max-bytes 256K --deadline-ms 5000)
if(TORUS_WITH_MPI)
  foreach(n 3 5 6)
    torus_add_mpi_test(NAME random_collectives_mpi_np${n} TARGET torus_random_collectives NP ${n} ARGS ${_rc_args}
                       LABELS "random;mpi" ENV TORUS_BACKEND=mpi TIMEOUT 300)
    if(TORUS_WITH_OFI)
      if(n EQUAL 6)
        set(_rc_hosts cyclic:2)
      else()
        set(_rc_hosts blocks:2)
      endif()
      torus_add_mpi_test(NAME random_collectives_ofi_shm_np${n} TARGET torus_random_collectives NP ${n}
                         ARGS ${_rc_args} LABELS "random;ofi" ENV TORUS_BACKEND=ofi FI_PROVIDER=shm TIMEOUT 300)
      torus_add_mpi_test(NAME random_collectives_ofi_tcp_np${n} TARGET torus_random_collectives NP ${n}
                         ARGS ${_rc_args} LABELS "random;ofi"
                         ENV TORUS_BACKEND=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo TORUS_OFI_HOST_SHM=0 TIMEOUT 300)
      torus_add_mpi_test(NAME random_collectives_ofi_hosts_np${n} TARGET torus_random_collectives NP ${n}
                         ARGS ${_rc_args} --hosts ${_rc_hosts} LABELS "random;ofi"
                         ENV TORUS_BACKEND=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo TIMEOUT 300)
    endif()
  endforeach()
  # Injected failures of every kind (wrong result, write outside a buffer,
  # hang, torus error, unclear std::exception, non-std exception) must each
  # count as a failed case and make the job exit non-zero.
  find_program(TORUS_RC_PYTHON NAMES python3)
  if(TORUS_WITH_OFI AND TORUS_RC_PYTHON)
    add_test(NAME random_collectives_selftest
             COMMAND ${TORUS_RC_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/random_collectives.py --selftest
                     --binary $<TARGET_FILE:torus_random_collectives> --timeout 120)
    set_tests_properties(random_collectives_selftest PROPERTIES TIMEOUT 180 LABELS "multirank;np3;random;ofi"
                         PROCESSORS 1)
  endif()
endif()
if(TORUS_WITH_OFI)
  foreach(_layout "2;2" "2;3")
    list(GET _layout 0 _h)
    list(GET _layout 1 _r)
    add_test(NAME random_collectives_netns_${_h}x${_r}
             COMMAND ${PROJECT_SOURCE_DIR}/scripts/netns_hosts.sh -H ${_h} -r ${_r} -t 240 --
                     $<TARGET_FILE:torus_random_collectives> ${_rc_args})
    set_tests_properties(random_collectives_netns_${_h}x${_r} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                         LABELS "multirank;ofi;netns;random" RUN_SERIAL TRUE ENVIRONMENT "TORUS_LOG_LEVEL=warn")
  endforeach()
endif()
