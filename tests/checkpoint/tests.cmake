# The checkpoint format, LibTorch-free: the safetensors header reader and
# writer (round trips, a fixed corpus of malformed headers, files of the
# Python safetensors package both ways) and the checked file I/O (SHA-256,
# O_EXCL, an injected full disk, mmap, durable rename).
add_executable(torus_checkpoint_format_tests
  ${CMAKE_CURRENT_LIST_DIR}/safetensors_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_io_test.cpp)
target_link_libraries(torus_checkpoint_format_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME checkpoint_format TARGET torus_checkpoint_format_tests LABELS "checkpoint" TIMEOUT 60
               ENV TORUS_PYTHON=${TORUS_PYTHON_EXECUTABLE})

# The sharded checkpoint layer (checkpoint_test.cpp, single process, ranks
# emulated): resharding of TP boxes and ZeRO ranges, corruption of every
# kind, an injected full disk, export.
add_executable(torus_checkpoint_tests ${CMAKE_CURRENT_LIST_DIR}/checkpoint_test.cpp)
target_link_libraries(torus_checkpoint_tests PRIVATE torus_test_main torus)
torus_add_test(NAME checkpoint_unit TARGET torus_checkpoint_tests LABELS "checkpoint" TIMEOUT 120)

# Whole runs through the training loop (resume_test.cpp), by world size:
# np1 keep-last with a failing save, --resume auto past a corrupt
# checkpoint, --init-from; np4 bit-identical resume in the same layout;
# np8 resharding across layouts and ZeRO stages.
add_executable(torus_checkpoint_resume_tests ${CMAKE_CURRENT_LIST_DIR}/resume_test.cpp)
target_link_libraries(torus_checkpoint_resume_tests PRIVATE torus_test_main torus)
foreach(_case "1:Policy.*:Resume.AutoSkips*:Resume.InitFrom*" "4:Resume.SameLayout*" "8:Reshard.*")
  string(FIND "${_case}" ":" _colon)
  string(SUBSTRING "${_case}" 0 ${_colon} _np)
  math(EXPR _from "${_colon} + 1")
  string(SUBSTRING "${_case}" ${_from} -1 _filter)
  torus_add_mpi_test(NAME checkpoint_resume_np${_np} TARGET torus_checkpoint_resume_tests NP ${_np}
                     ARGS --gtest_filter=${_filter} LABELS "checkpoint;train" TIMEOUT 600)
endforeach()

# SIGKILL of every rank (mpirun -np 2 torus-train, a save every step) at 20
# random moments: the newest complete checkpoint always verifies, never goes
# back, and the run resumes from it to completion (sigkill_test.py).
add_test(NAME checkpoint_sigkill COMMAND ${TORUS_PYTHON_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/sigkill_test.py ${PROJECT_BINARY_DIR})
set_tests_properties(checkpoint_sigkill PROPERTIES TIMEOUT 400 LABELS "checkpoint;multirank" ENVIRONMENT "TORUS_LOG_LEVEL=warn" PROCESSORS 2)

# Hugging Face weights in and out (hf_test.cpp): the mapped reader,
# config.json of both families, GPT-2 into a Torus model with GPT-2's logits,
# export and import back, the Llama mapping; np2 the same directory into tp2,
# pp2 and dp2 ZeRO-3.
add_executable(torus_hf_tests ${CMAKE_CURRENT_LIST_DIR}/hf_test.cpp)
target_link_libraries(torus_hf_tests PRIVATE torus_test_main torus)
torus_add_mpi_test(NAME hf_np1 TARGET torus_hf_tests NP 1 ARGS --gtest_filter=-HfLayouts.* LABELS "checkpoint"
                   TIMEOUT 120)
torus_add_mpi_test(NAME hf_np2 TARGET torus_hf_tests NP 2 ARGS --gtest_filter=HfLayouts.* LABELS "checkpoint"
                   TIMEOUT 120)
