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

# The ofi backend on Neuron device memory ("ofi-neuron", Note [Device
# buffers] in src/comm/ofi/device_ops.cpp) over the tcp provider on 2 and 3
# ranks: moved through host memory (tcp offers no FI_HMEM registration of
# Neuron memory); over shm, which grants FI_HMEM but cannot register Neuron
# memory here (the probe's fallback); and on 2 ranks with the fake's device
# addresses registered as host memory (TORUS_OFI_HMEM=as-host: the zero-copy
# point-to-point path).
if(TORUS_WITH_OFI)
  add_executable(torus_ofi_neuron_tests ${CMAKE_CURRENT_LIST_DIR}/ofi_neuron_test.cpp
                 ${PROJECT_SOURCE_DIR}/tests/backend/backend_fixture.cpp)
  target_link_libraries(torus_ofi_neuron_tests PRIVATE torus_test_main torus_base ${CMAKE_DL_LIBS})
  add_dependencies(torus_ofi_neuron_tests torus_fake_nrt)
  set(_ofi_neuron ${_fake} TORUS_TEST_BACKEND=ofi-neuron FI_PROVIDER=tcp FI_TCP_IFACE=lo)
  foreach(n 2 3)
    torus_add_mpi_test(NAME ofi_neuron_np${n} TARGET torus_ofi_neuron_tests NP ${n} LABELS "neuron;backend"
                       ARGS --gtest_filter=-OfiNeuronFaults.*
                       ENV ${_ofi_neuron} TORUS_TEST_OFI_ZERO_COPY=0 TIMEOUT 300)
  endforeach()
  # shm grants FI_HMEM, but registering Neuron memory fails without the
  # runtime inside libfabric: the probe falls back to host copies.
  torus_add_mpi_test(NAME ofi_neuron_shm_np2 TARGET torus_ofi_neuron_tests NP 2 LABELS "neuron;backend"
                     ARGS --gtest_filter=-OfiNeuronFaults.*
                     ENV ${_fake} TORUS_TEST_BACKEND=ofi-neuron FI_PROVIDER=shm TORUS_TEST_OFI_ZERO_COPY=0 TIMEOUT 300)
  torus_add_mpi_test(NAME ofi_neuron_zero_copy_np2 TARGET torus_ofi_neuron_tests NP 2 LABELS "neuron;backend"
                     ARGS --gtest_filter=OfiNeuron.*:-OfiNeuronFaults.*
                     ENV ${_ofi_neuron} TORUS_OFI_HMEM=as-host TORUS_TEST_OFI_ZERO_COPY=1 TIMEOUT 300)
  torus_add_mpi_test(NAME ofi_neuron_copy_fault_np3 TARGET torus_ofi_neuron_tests NP 3 LABELS "neuron;backend"
                     ARGS --gtest_filter=OfiNeuronFaults.*
                     ENV ${_ofi_neuron} TORUS_TEST_FAKE_NRT_READ_FAIL_BYTES=4004 TORUS_TEST_FAKE_NRT_READ_FAIL_RANK=1
                         TIMEOUT 120)
  set(_ofi_neuron_checks torus_ofi_neuron_tests)
endif()

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
                                              torus_fake_nrt_no_memset torus_fake_nrt_partial ${_ofi_neuron_checks})
