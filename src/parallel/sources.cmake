# Parallel modules shared by every dimension (ParallelGroups), the
# end-of-backward callbacks that survive inner backward passes, and the
# replay flag of activation recompute.
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/groups.cpp ${CMAKE_CURRENT_LIST_DIR}/backward_callback.cpp
                             ${CMAKE_CURRENT_LIST_DIR}/replay.cpp)
# The layout value and its field table (LibTorch-free).
target_sources(torus_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/layout.cpp)
