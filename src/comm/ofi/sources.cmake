# The libfabric (ofi) host backend: transport, progress engine, collective
# algorithms, host shared-memory segment. LibTorch-free, so it lives in
# torus_base.
if(TORUS_WITH_OFI)
  target_sources(torus_base PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/fabric.cpp
    ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
    ${CMAKE_CURRENT_LIST_DIR}/engine_failure.cpp
    ${CMAKE_CURRENT_LIST_DIR}/engine_io.cpp
    ${CMAKE_CURRENT_LIST_DIR}/liveness.cpp
    ${CMAKE_CURRENT_LIST_DIR}/op_ctx.cpp
    ${CMAKE_CURRENT_LIST_DIR}/algo_reduce.cpp
    ${CMAKE_CURRENT_LIST_DIR}/algo_move.cpp
    ${CMAKE_CURRENT_LIST_DIR}/host_segment.cpp
    ${CMAKE_CURRENT_LIST_DIR}/host_collectives.cpp
    ${CMAKE_CURRENT_LIST_DIR}/host_one_round.cpp
    ${CMAKE_CURRENT_LIST_DIR}/host_zero_copy.cpp
    ${CMAKE_CURRENT_LIST_DIR}/host_stripes.cpp
    ${CMAKE_CURRENT_LIST_DIR}/peer_mappings.cpp
    ${CMAKE_CURRENT_LIST_DIR}/stream_copy.cpp
    ${CMAKE_CURRENT_LIST_DIR}/group_ops.cpp
    ${CMAKE_CURRENT_LIST_DIR}/device_ops.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ofi_options.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ofi_backend.cpp)
  target_link_libraries(torus_base PUBLIC PkgConfig::FABRIC)
  target_link_libraries(torus PRIVATE PkgConfig::FABRIC)
  torus_register_backend(ofi)  # and ofi-neuron where the Neuron device is registered
endif()
