# Parallel modules shared by every dimension (ParallelGroups).
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/groups.cpp)
