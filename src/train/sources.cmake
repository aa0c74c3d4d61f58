# Utilities of the torus-train executable (option parser, LR schedule, byte
# corpus and batch sampler, metrics, PNG plots). LibTorch-free (torus_base).
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lr_schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/corpus.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plot.cpp)
