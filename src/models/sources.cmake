# Reference models built from the parallel layers: the GPT and the
# Llama-family decoder.
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/gpt.cpp ${CMAKE_CURRENT_LIST_DIR}/llama.cpp)
