# The 3D-parallel GPT trainer (TP x PP x DP over one DeviceMesh).
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/gpt_trainer.cpp)
