# Data parallelism: gradient buckets, the DDP wrapper and ZeRO (zero.cpp:
# construction and queries; zero_grads.cpp: the gradients' reduce-scatter;
# zero_params.cpp: the parameters' gathers and stage-3 block windows).
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/buckets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ddp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_grads.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_params.cpp)
