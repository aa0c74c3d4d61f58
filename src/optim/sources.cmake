# Optimizers (the Optimizer seam; SGD, Adam, AdamW over ATen's fused kernels;
# the factory) and gradient clipping by a global norm.
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sgd.cpp
  ${CMAKE_CURRENT_LIST_DIR}/adam.cpp
  ${CMAKE_CURRENT_LIST_DIR}/factory.cpp
  ${CMAKE_CURRENT_LIST_DIR}/clip.cpp)
