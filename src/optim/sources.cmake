# Optimizer-side utilities on tensors: gradient clipping by a global norm.
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/clip.cpp)
