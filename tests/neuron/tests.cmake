# Neuron backend tests (Neuron builds only): the device, the comm backend and
# the program executor against the fake runtime (fake_nrt.cpp), which Torus
# opens exactly as it would open libnrt.so.1 (TORUS_NEURON_LIBRARY). Nothing
# here links against a Neuron SDK; contract.sh runs the same binaries against
# a real runtime on a trn1/trn2 host (not in CI).
if(NOT TORUS_WITH_NEURON)
  return()
endif()

# The fake runtime runs its collectives over MPI.
if(NOT TORUS_WITH_MPI)
  message(STATUS "Torus: the Neuron tests need MPI for the fake runtime's collectives (TORUS_WITH_MPI=ON); skipped")
  return()
endif()
# The fake, and the same fake without nrt_tensor_memset (as some runtimes lack it).
foreach(_lib torus_fake_nrt torus_fake_nrt_no_memset)
  add_library(${_lib} SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_nrt.cpp ${CMAKE_CURRENT_LIST_DIR}/fake_nrt_cc.cpp)
  target_include_directories(${_lib} PRIVATE ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_LIST_DIR})
  target_compile_options(${_lib} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_link_libraries(${_lib} PRIVATE Threads::Threads MPI::MPI_C)
  target_compile_definitions(${_lib} PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
endforeach()
target_compile_definitions(torus_fake_nrt_no_memset PRIVATE TORUS_FAKE_NRT_NO_MEMSET=1)
# A library lacking most of the API (not a Neuron runtime).
add_library(torus_fake_nrt_partial SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_nrt_partial.cpp)

add_executable(torus_neuron_device_tests ${CMAKE_CURRENT_LIST_DIR}/neuron_device_test.cpp
               ${CMAKE_CURRENT_LIST_DIR}/neff_program_test.cpp)
target_link_libraries(torus_neuron_device_tests PRIVATE torus_test_main torus_base)
add_dependencies(torus_neuron_device_tests torus_fake_nrt torus_fake_nrt_no_memset torus_fake_nrt_partial)

set(_fake "TORUS_NEURON_LIBRARY=$<TARGET_FILE:torus_fake_nrt>")
# One run per runtime configuration, each selecting its own test suite
# (neuron_device_test.cpp says which).
set(_available "NeuronDeviceBuild.*:NeuronDevice.*:NeffProgram.*")
set(_no_runtime "NeuronDeviceBuild.*:NeffProgramWithoutRuntime.*")
torus_add_test(NAME neuron_device TARGET torus_neuron_device_tests LABELS neuron
               ARGS --gtest_filter=${_available} ENV ${_fake})
torus_add_test(NAME neuron_device_no_memset TARGET torus_neuron_device_tests LABELS neuron
               ARGS --gtest_filter=NeuronDevice.Fills*
               ENV TORUS_NEURON_LIBRARY=$<TARGET_FILE:torus_fake_nrt_no_memset>)
torus_add_test(NAME neuron_device_visible_cores TARGET torus_neuron_device_tests LABELS neuron
               ARGS --gtest_filter=NeuronDeviceVisibleCores.* ENV ${_fake} NEURON_RT_VISIBLE_CORES=1-2)
torus_add_test(NAME neuron_device_oom TARGET torus_neuron_device_tests LABELS neuron
               ARGS --gtest_filter=NeuronDeviceOutOfMemory.* ENV ${_fake} TORUS_TEST_FAKE_NRT_CORE_BYTES=4194304)
torus_add_test(NAME neuron_device_alloc_fail TARGET torus_neuron_device_tests LABELS neuron
               ARGS --gtest_filter=NeuronDeviceAllocFail.* ENV ${_fake} TORUS_TEST_FAKE_NRT_FAIL_ALLOC_AFTER=2)
torus_add_test(NAME neuron_device_no_library TARGET torus_neuron_device_tests LABELS neuron
               ARGS --gtest_filter=${_no_runtime}:NeuronDeviceAbsent.*
               ENV TORUS_NEURON_LIBRARY=/nonexistent/libnrt.so.1)
torus_add_test(NAME neuron_device_partial_library TARGET torus_neuron_device_tests LABELS neuron
               ARGS --gtest_filter=${_no_runtime}:NeuronDevicePartial.*
               ENV TORUS_NEURON_LIBRARY=$<TARGET_FILE:torus_fake_nrt_partial>)
torus_add_test(NAME neuron_device_old_runtime TARGET torus_neuron_device_tests LABELS neuron
               ARGS --gtest_filter=${_no_runtime}:NeuronDeviceOldRuntime.*
               ENV ${_fake} TORUS_TEST_FAKE_NRT_VERSION=1.5.0)

# The comm backend on 2, 3 and 4 ranks (the fake's 4 NeuronCores: one per
# rank), then the faults on 3 ranks. Shares the conformance suite's fixture.
add_executable(torus_neuron_backend_tests ${CMAKE_CURRENT_LIST_DIR}/neuron_backend_test.cpp
               ${CMAKE_CURRENT_LIST_DIR}/host_offload_test.cpp
               ${PROJECT_SOURCE_DIR}/tests/backend/backend_fixture.cpp)
target_link_libraries(torus_neuron_backend_tests PRIVATE torus_test_main torus_base)
target_compile_definitions(torus_neuron_backend_tests PRIVATE TORUS_BACKEND_TESTS_STORE=$<BOOL:${TORUS_WITH_OFI}>)
add_dependencies(torus_neuron_backend_tests torus_fake_nrt)
foreach(n 2 3 4)
  torus_add_mpi_test(NAME neuron_backend_np${n} TARGET torus_neuron_backend_tests NP ${n} LABELS "neuron;backend"
                     ARGS --gtest_filter=-NeuronFaults.*
                     ENV ${_fake} TORUS_TEST_BACKEND=neuron TIMEOUT 300)
endforeach()
torus_add_mpi_test(NAME neuron_backend_hang_np3 TARGET torus_neuron_backend_tests NP 3 LABELS "neuron;backend"
                   ARGS --gtest_filter=NeuronFaults.ACollective*
                   ENV ${_fake} TORUS_TEST_BACKEND=neuron TORUS_TEST_FAKE_NRT_HANG_BYTES=3108 TIMEOUT 120)
torus_add_mpi_test(NAME neuron_backend_dead_peer_np3 TARGET torus_neuron_backend_tests NP 3 LABELS "neuron;backend"
                   ARGS --gtest_filter=NeuronFaults.ADeadPeer*
                   ENV ${_fake} TORUS_TEST_BACKEND=neuron TORUS_TEST_FAKE_NRT_DEAD_RANK=1
                       TORUS_TEST_FAKE_NRT_DEAD_BYTES=3108 TIMEOUT 120)

# The runtime contract (contract.sh): the calls it lists are the ones Torus
# resolves and the ones the tests exercise; one nrt_init and one nrt_close per
# process, nrt_close last, every tensor freed before it.
string(REPLACE ";" " " _mpiflags "${TORUS_TEST_MPIRUN_FLAGS}")
add_test(NAME neuron_contract
         COMMAND ${TORUS_PYTHON_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_contract.py --repo ${PROJECT_SOURCE_DIR}
                 --fake $<TARGET_FILE:torus_fake_nrt> --device $<TARGET_FILE:torus_neuron_device_tests>
                 --backend $<TARGET_FILE:torus_neuron_backend_tests> --mpiexec ${TORUS_MPIEXEC}
                 "--mpiflags=${_mpiflags}")
set_tests_properties(neuron_contract PROPERTIES TIMEOUT 300 LABELS "neuron;multirank")

# Everything `ctest -L neuron` needs (scripts/test.sh builds only this in the
# Neuron configuration).
add_custom_target(torus_neuron_checks DEPENDS torus_neuron_device_tests torus_neuron_backend_tests torus_fake_nrt
                                              torus_fake_nrt_no_memset torus_fake_nrt_partial)
