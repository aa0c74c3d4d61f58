# Utilities of a training run (LibTorch-free, single process): the option
# table, LR schedule, corpus and batch sampler, metrics formatting and JSON
# Lines, TensorBoard event files.
add_executable(torus_train_utils_tests
  ${CMAKE_CURRENT_LIST_DIR}/run_config_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lr_schedule_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/corpus_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensorboard_test.cpp)
target_link_libraries(torus_train_utils_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME train_utils TARGET torus_train_utils_tests LABELS "train" TIMEOUT 60)

# The engine's single-process parts: model FLOPs against a hand count, the
# peak table and measurement, the forward-only schedule, the model registry.
add_executable(torus_engine_tests ${CMAKE_CURRENT_LIST_DIR}/engine_test.cpp)
target_link_libraries(torus_engine_tests PRIVATE torus_test_main torus)
torus_add_test(NAME train_engine_unit TARGET torus_engine_tests LABELS "train" TIMEOUT 120)
