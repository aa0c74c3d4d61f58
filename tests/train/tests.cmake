# Utilities of torus-train (LibTorch-free, single process): option parser,
# LR schedule, corpus and batch sampler, metrics formatting and JSON Lines,
# PNG plots.
add_executable(torus_train_utils_tests
  ${CMAKE_CURRENT_LIST_DIR}/options_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lr_schedule_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/corpus_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plot_test.cpp)
target_link_libraries(torus_train_utils_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME train_utils TARGET torus_train_utils_tests LABELS "train" TIMEOUT 60)
