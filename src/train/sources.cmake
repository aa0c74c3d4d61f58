# Utilities of a training run that need no LibTorch (torus_base): the option
# table (CLI11), LR schedule, byte corpus and batch sampler, memory-mapped
# token datasets (.tok, Megatron .bin/.idx) and their sampler, metrics (JSON
# Lines through nlohmann-json, step line, progress), TensorBoard event files.
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/run_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_presets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lr_schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/corpus.cpp
  ${CMAKE_CURRENT_LIST_DIR}/token_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensorboard.cpp)
