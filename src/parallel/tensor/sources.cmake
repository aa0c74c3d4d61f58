# Tensor and sequence parallelism: region mappings, layers, vocab-parallel
# cross entropy, RNG streams and layout-independent sharding.
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mappings.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cross_entropy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sharding.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weight_grad.cpp)
