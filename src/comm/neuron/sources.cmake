# The neuron comm backend (Neuron builds): host-driven collectives of the
# Neuron runtime, opened at run time with the Neuron device (src/device/neuron).
if(TORUS_WITH_NEURON)
  target_sources(torus_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/neuron_backend.cpp)
  torus_register_backend(neuron)
endif()
