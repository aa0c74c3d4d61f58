# The training engine (include/torus/engine/): the Trainer over the model,
# gradient-sync and optimizer seams (TP x PP x DP x EP over one DeviceMesh),
# its state and checkpoints, and the memory estimate.
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_step.cpp
  ${CMAKE_CURRENT_LIST_DIR}/memory_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpointing.cpp)
