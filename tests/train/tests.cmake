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

# The engine with half precision and its state (engine_precision_test.cpp),
# each case on the world size it needs — 8 ranks: an fp16 overflow on one
# rank of tp2 x pp2 x dp2; 1 rank: bf16/fp16 track f32 over 200 steps;
# 2 ranks: state_dict / load_state_dict.
add_executable(torus_engine_precision_tests ${CMAKE_CURRENT_LIST_DIR}/engine_precision_test.cpp)
target_link_libraries(torus_engine_precision_tests PRIVATE torus_test_main torus)
foreach(_case 1:HalfPrecision.* 2:EngineState.* 8:Fp16Overflow.*)
  string(REPLACE ":" ";" _pair "${_case}")
  list(GET _pair 0 _np)
  list(GET _pair 1 _filter)
  torus_add_mpi_test(NAME train_engine_np${_np} TARGET torus_engine_precision_tests NP ${_np}
                     ARGS --gtest_filter=${_filter} LABELS "train;precision" TIMEOUT 400)
endforeach()
