# Reference models built from the parallel layers.
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/gpt.cpp)
