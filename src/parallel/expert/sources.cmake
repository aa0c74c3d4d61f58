# Expert parallelism: the mixture-of-experts layer (router, drop policy,
# dispatch and combine over ep); its routing statistics need no LibTorch.
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/moe.cpp)
target_sources(torus_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/routing_stats.cpp)
