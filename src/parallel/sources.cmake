# Parallel modules shared by every dimension (ParallelGroups), and the
# end-of-backward callbacks that survive inner backward passes.
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/groups.cpp ${CMAKE_CURRENT_LIST_DIR}/backward_callback.cpp)
target_sources(torus_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/layout.cpp)
