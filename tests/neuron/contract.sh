#!/usr/bin/env bash
# The Neuron runtime contract: runs Torus's Neuron tests against a REAL
# Neuron runtime on a trn1/trn2 host (not in CI, which runs them against the
# fake runtime). Build Torus with -DTORUS_WITH_NEURON=ON first, then:
#
#   tests/neuron/contract.sh [BUILD_DIR] [LIBNRT]
#
# BUILD_DIR defaults to build-neuron; LIBNRT to libnrt.so.1 on the library
# path (/opt/aws/neuron/lib). NEURON_RT_VISIBLE_CORES must leave at least 4
# NeuronCores to this job (the backend tests run one rank per core).
#
# These are exactly the runtime calls Torus makes (src/device/neuron/
# nrt_library.cpp resolves them; check_contract.py keeps this list, that
# file and what the tests exercise on the fake identical):
# CALLS: nrt_init nrt_close nrt_get_version nrt_get_total_nc_count
# CALLS: nrt_get_visible_nc_count nrt_tensor_allocate nrt_tensor_free
# CALLS: nrt_tensor_read nrt_tensor_write nrt_tensor_copy nrt_tensor_get_size
# CALLS: nrt_tensor_memset nrt_tensor_allocate_slice nrt_tensor_get_va
# CALLS: nrt_load nrt_unload nrt_execute nrt_allocate_tensor_set
# CALLS: nrt_destroy_tensor_set nrt_add_tensor_to_tensor_set
# CALLS: nrt_get_model_tensor_info nrt_free_model_tensor_info
# CALLS: nrt_cc_global_comm_init nrta_cc_prepare nrta_cc_schedule nrta_is_completed
#
# What differs on real hardware, and is therefore what this script checks:
# the declarations of nrt_api.h against the real ABI (status values, the
# nrt_version_t layout, argument order), the allocator over real device
# memory, and the host-driven collectives over NeuronLink/EFA. The fake's
# own tests (fault injection, the declarative test programs) are skipped:
# a real runtime runs only real NEFFs.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-neuron}
LIB=${2:-libnrt.so.1}
export TORUS_NEURON_LIBRARY="$LIB" TORUS_LOG_LEVEL=warn
: "${NEURON_RT_ROOT_COMM_ID:=127.0.0.1:$((40000 + RANDOM % 20000))}"
export NEURON_RT_ROOT_COMM_ID
tests="$BUILD/tests"
echo "== device (one process)"
# The runtime reports its own version and core count: only the tests that do
# not assume the fake's values run.
"$tests/torus_neuron_device_tests" \
  --gtest_filter='NeuronDevice.Copies*:NeuronDevice.Fills*:NeuronDevice.Refuses*Allocation:NeuronDevice.DeviceAddresses*:NeuronDevice.NicAddress*:NeuronDevice.CachingAllocator*:NeuronDevice.StreamsAndEvents*'
echo "== comm backend (2 and 4 ranks, one NeuronCore each)"
for np in 2 4; do
  mpirun --allow-run-as-root -np "$np" -x TORUS_NEURON_LIBRARY -x NEURON_RT_ROOT_COMM_ID -x TORUS_LOG_LEVEL \
    -x TORUS_TEST_BACKEND=neuron "$tests/torus_neuron_backend_tests" \
    --gtest_filter='NeuronCollectives*:NeuronBackend.WorksOnSubRanges*:NeuronBackend.BarrierAndSplit'
done
echo "== ofi on Neuron memory (2 ranks; point to point registers FI_HMEM_NEURON when the provider grants it)"
mpirun --allow-run-as-root -np 2 -x TORUS_NEURON_LIBRARY -x TORUS_LOG_LEVEL=info \
  -x TORUS_TEST_BACKEND=ofi-neuron "$tests/torus_ofi_neuron_tests" --gtest_filter='OfiNeuron*:-OfiNeuronFaults.*'
echo "contract: all checks passed against $LIB"
