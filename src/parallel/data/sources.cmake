# Data parallelism: gradient buckets, the DDP wrapper and ZeRO.
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/buckets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ddp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero.cpp)
