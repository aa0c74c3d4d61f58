# The device layer: the CPU device always; the CUDA device with TORUS_WITH_CUDA,
# or the Neuron device with TORUS_WITH_NEURON (its runtime is opened at run
# time: nothing to link but libdl). Each kind registers itself
# (torus_register_device, Note [Device registration]).
# The CUDA runtime is linked as a shared library (libcudart.so), the same one
# LibTorch's CUDA build loads, so that streams and events cross between them.
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu_device.cpp)
torus_register_device(cpu)
if(TORUS_WITH_CUDA)
  target_sources(torus_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda/cuda_device.cpp)
  target_link_libraries(torus_base PUBLIC CUDA::cudart)
  torus_register_device(cuda)
endif()
if(TORUS_WITH_NEURON)
  target_sources(torus_base PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/neuron/nrt_library.cpp
    ${CMAKE_CURRENT_LIST_DIR}/neuron/neuron_memory.cpp
    ${CMAKE_CURRENT_LIST_DIR}/neuron/neuron_device.cpp
    ${CMAKE_CURRENT_LIST_DIR}/neuron/neff_program.cpp)
  target_link_libraries(torus_base PUBLIC ${CMAKE_DL_LIBS})
  torus_register_device(neuron)
else()
  # torus/device/neuron.h answers "not built".
  target_sources(torus_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/neuron/neuron_absent.cpp)
endif()

# The hardware table (include/torus/device/hardware.h): one JSON file, shared
# with torus-launch, embedded into the library as a string. Editing it
# re-runs the configure step.
set(TORUS_HARDWARE_TABLE ${PROJECT_SOURCE_DIR}/python/torus/launch/hardware.json)
file(READ ${TORUS_HARDWARE_TABLE} TORUS_HARDWARE_JSON)
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${TORUS_HARDWARE_TABLE})
configure_file(${CMAKE_CURRENT_LIST_DIR}/hardware_table.cpp.in ${PROJECT_BINARY_DIR}/src/device/hardware_table.cpp
               @ONLY)
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/hardware.cpp
  ${CMAKE_CURRENT_LIST_DIR}/peak_cache.cpp
  ${PROJECT_BINARY_DIR}/src/device/hardware_table.cpp)
