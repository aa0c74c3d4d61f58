# The checkpoint format, LibTorch-free: the safetensors header reader and
# writer (round trips, a fixed corpus of malformed headers, files of the
# Python safetensors package both ways) and the checked file I/O (SHA-256,
# O_EXCL, an injected full disk, mmap, durable rename).
add_executable(torus_checkpoint_format_tests
  ${CMAKE_CURRENT_LIST_DIR}/safetensors_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_io_test.cpp)
target_link_libraries(torus_checkpoint_format_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME checkpoint_format TARGET torus_checkpoint_format_tests LABELS "checkpoint" TIMEOUT 60)
