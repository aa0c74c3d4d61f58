# Torch-free comm: store, bootstrap, Work, types, backend factory, the
# agreement of a group on a local step (agree.h).
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/types.cpp
  ${CMAKE_CURRENT_LIST_DIR}/work.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_server.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_protocol.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_token.cpp
  ${CMAKE_CURRENT_LIST_DIR}/agent_store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/launch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mesh_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend_registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shared_host.cpp
  ${CMAKE_CURRENT_LIST_DIR}/agree.cpp)
# The tensor-facing layer, and the client of torchrun's agent store (LibTorch's).
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/process_group.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d_agent_store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shared_host_allocator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_mesh.cpp)
