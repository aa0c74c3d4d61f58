# Data parallelism: gradient buckets and the DDP wrapper.
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/buckets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ddp.cpp)
