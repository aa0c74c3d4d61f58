# The checkpoint layer. The safetensors header and the checked file I/O are
# free of LibTorch and go into torus_base.
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_io.cpp)
# Sharded checkpoints over LibTorch tensors (checkpoint.h), one file each
# mechanism: the shared on-disk vocabulary (format.cpp), dtype codes, writing
# a rank's part, the manifest (publishing and opening), assembling slices
# from pieces (reading and verifying), listing directories, and plain
# safetensors files and export; memory-mapped safetensors files and Hugging
# Face weight directories (mapped_safetensors.h).
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/format.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dtype_codes.cpp
  ${CMAKE_CURRENT_LIST_DIR}/write.cpp
  ${CMAKE_CURRENT_LIST_DIR}/manifest.cpp
  ${CMAKE_CURRENT_LIST_DIR}/assemble.cpp
  ${CMAKE_CURRENT_LIST_DIR}/listing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/export.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mapped_safetensors.cpp)
