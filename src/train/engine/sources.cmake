# The training engine (model, gradient-sync and optimizer seams; TP x PP x DP
# over one DeviceMesh), the training loop, its memory pre-check, the MFU
# peak, and the model adapters (the only files that name a model, with the
# pre-check's GPT activation formula).
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_step.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train_loop.cpp
  ${CMAKE_CURRENT_LIST_DIR}/run_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/memory_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/peak_flops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpointing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/../adapters/gpt_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/../adapters/llama_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/../adapters/registry.cpp)
