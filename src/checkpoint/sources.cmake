# The checkpoint layer. The safetensors header and the checked file I/O are
# free of LibTorch and go into torus_base.
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_io.cpp)
# Sharded checkpoints over LibTorch tensors (checkpoint.h): writing,
# verifying, resharding, export; memory-mapped safetensors files and Hugging
# Face weight directories (mapped_safetensors.h).
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp ${CMAKE_CURRENT_LIST_DIR}/mapped_safetensors.cpp)
