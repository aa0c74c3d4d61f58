# Optimizers and optimizer-side utilities on tensors: fused AdamW, gradient
# clipping by a global norm.
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/adamw.cpp
  ${CMAKE_CURRENT_LIST_DIR}/clip.cpp)
