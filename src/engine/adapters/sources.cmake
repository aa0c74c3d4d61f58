# The model seam's adapters (the only files of the engine that name a model,
# with the memory estimate's activation formula), and Hugging Face weights in
# and out (engine/hf.h, docs/hf.md): config.json as a Torus model
# configuration, the memory-mapped weight source with the GPT-2/Llama name
# and layout mapping, and the export of a checkpoint.
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/gpt_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/llama_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_export.cpp)
