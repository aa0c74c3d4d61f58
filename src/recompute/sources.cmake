# Activation recompute: policies, and the reentrant autograd function that
# replays a forward in backward.
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/policy.cpp ${CMAKE_CURRENT_LIST_DIR}/recompute.cpp)
