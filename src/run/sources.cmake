# A training run (include/torus/run/). Without LibTorch (torus_base): the
# option table (CLI11), model presets, LR schedule, byte corpus and batch
# sampler, memory-mapped token datasets (.tok, Megatron .bin/.idx) and their
# sampler, metrics (JSON Lines, step line, progress), TensorBoard event files.
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/run_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_presets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lr_schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/corpus.cpp
  ${CMAKE_CURRENT_LIST_DIR}/token_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensorboard.cpp)
# With LibTorch: the training loop, the data a run reads, the model registry
# and the MFU peak.
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/train_loop.cpp
  ${CMAKE_CURRENT_LIST_DIR}/run_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/peak_flops.cpp)
