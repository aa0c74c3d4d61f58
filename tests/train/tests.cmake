# Utilities of a training run (LibTorch-free, single process): the option
# table, LR schedule, corpus and batch sampler, token datasets (.tok,
# Megatron .bin/.idx) and their sampler, metrics formatting and JSON Lines,
# TensorBoard event files.
add_executable(torus_train_utils_tests
  ${CMAKE_CURRENT_LIST_DIR}/run_config_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lr_schedule_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/corpus_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/token_data_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensorboard_test.cpp)
target_link_libraries(torus_train_utils_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME train_utils TARGET torus_train_utils_tests LABELS "train" TIMEOUT 60)

# The engine's single-process parts: model FLOPs against a hand count, the
# peak table and measurement, the forward-only schedule, the model registry.
add_executable(torus_engine_tests ${CMAKE_CURRENT_LIST_DIR}/engine_test.cpp)
target_link_libraries(torus_engine_tests PRIVATE torus_test_main torus)
torus_add_test(NAME train_engine_unit TARGET torus_engine_tests LABELS "train" TIMEOUT 120)

# The engine with half precision and its state (engine_precision_test.cpp),
# each case on the world size it needs — 8 ranks: an fp16 overflow on one
# rank of tp2 x pp2 x dp2; 1 rank: bf16/fp16 track f32 over 200 steps;
# 2 ranks: state_dict / load_state_dict.
add_executable(torus_engine_precision_tests ${CMAKE_CURRENT_LIST_DIR}/engine_precision_test.cpp)
target_link_libraries(torus_engine_precision_tests PRIVATE torus_test_main torus)
foreach(_case 1:HalfPrecision.* 2:EngineState.* 8:Fp16Overflow.*)
  string(REPLACE ":" ";" _pair "${_case}")
  list(GET _pair 0 _np)
  list(GET _pair 1 _filter)
  torus_add_mpi_test(NAME train_engine_np${_np} TARGET torus_engine_precision_tests NP ${_np}
                     ARGS --gtest_filter=${_filter} LABELS "train;precision" TIMEOUT 400)
endforeach()

# ZeRO stages 1-3 against plain data parallelism (zero_test.cpp), by world
# size: np2 dp2 (+ recompute, CPU offload, bf16, an fp16 overflow on one dp rank), np3
# dp3, np4 dp4 / tp2 x dp2 with SP / pp2 x dp2 with 1F1B, ZB-H1 and
# interleaved.
add_executable(torus_zero_tests ${CMAKE_CURRENT_LIST_DIR}/zero_test.cpp)
target_link_libraries(torus_zero_tests PRIVATE torus_test_main torus)
foreach(_case "2:Zero.MatchesDataParallelOnDp:Zero.RecomputeGathersAgain:Zero.Offload*:Zero.BFloat16*:Zero.Fp16*:Zero.Bad*"
              "3:Zero.MatchesDataParallelOnDp" "4:Zero.MatchesDataParallelOnDp:Zero.TensorParallel*:Zero.Pipeline*")
  string(FIND "${_case}" ":" _colon)
  string(SUBSTRING "${_case}" 0 ${_colon} _np)
  math(EXPR _rest "${_colon} + 1")
  string(SUBSTRING "${_case}" ${_rest} -1 _filter)
  torus_add_mpi_test(NAME train_zero_np${_np} TARGET torus_zero_tests NP ${_np}
                     ARGS --gtest_filter=${_filter} LABELS "train;zero" TIMEOUT 600)
endforeach()

# Each data rank reads only its rows (local_batch_test.cpp): local_rows
# covers the batch once over the data ranks, and LocalBatch trains bit for
# bit as the whole batch in dp4, tp2 x dp2 and pp2 x dp2.
add_executable(torus_local_batch_tests ${CMAKE_CURRENT_LIST_DIR}/local_batch_test.cpp)
target_link_libraries(torus_local_batch_tests PRIVATE torus_test_main torus)
torus_add_mpi_test(NAME train_local_batch_np4 TARGET torus_local_batch_tests NP 4 LABELS "train" TIMEOUT 300)

# The memory estimate and pre-check against closed forms from the GPT's
# dimensions (ZeRO stages 0-3 at N = 2 and 4, offload, dtypes, TP/SP,
# pipeline stages, recompute), the pre-check's refusal and --force, and the
# ZeRO options TrainLoop hands the trainer. Single process, no ZeRO needed.
add_executable(torus_memory_plan_tests ${CMAKE_CURRENT_LIST_DIR}/memory_plan_test.cpp)
target_link_libraries(torus_memory_plan_tests PRIVATE torus_test_main torus)
torus_add_test(NAME train_memory_plan TARGET torus_memory_plan_tests LABELS "train" TIMEOUT 60)

# ZeRO memory per rank in live tensor bytes against the ZeRO paper's
# formulas plus the stated buffers (within 10%), and ZeRO-3's construction
# below the replica's size: the benchmark's own --check, on a 1M model.
# On mpi: on ofi (the default host backend) the DDP buckets of ZeRO-0 come
# from shared host memory, which the live-byte count does not see.
torus_add_mpi_test(NAME train_zero_memory_np2 TARGET torus_bench_zero NP 2
                   ARGS --sizes 1M --steps 1 --warmup 0 --check LABELS "train;zero" TIMEOUT 300
                   ENV TORUS_BACKEND=mpi)
