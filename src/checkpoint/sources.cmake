# The checkpoint layer. Free of LibTorch and in torus_base: the safetensors
# header and the checked file I/O; the format itself over host buffers
# (buffers.h) — the on-disk vocabulary (format.cpp), writing a rank's part
# (write_buffers.cpp), publishing and removing a checkpoint (publish.cpp),
# an opened checkpoint read and verified (stored.cpp) — and the flat states
# of buffer-level optimizers saved and loaded over a comm group
# (flat_state.cpp).
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/format.cpp
  ${CMAKE_CURRENT_LIST_DIR}/write_buffers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/publish.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stored.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flat_state.cpp)
# Sharded checkpoints over LibTorch tensors (checkpoint.h), one file each
# mechanism, on top of the above: dtype codes, writing a rank's tensors,
# opening a checkpoint, assembling slices from pieces (reading and
# verifying), listing directories, and plain safetensors files and export;
# memory-mapped safetensors files and Hugging Face weight directories
# (mapped_safetensors.h).
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/dtype_codes.cpp
  ${CMAKE_CURRENT_LIST_DIR}/write.cpp
  ${CMAKE_CURRENT_LIST_DIR}/manifest.cpp
  ${CMAKE_CURRENT_LIST_DIR}/assemble.cpp
  ${CMAKE_CURRENT_LIST_DIR}/listing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/export.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mapped_safetensors.cpp)
