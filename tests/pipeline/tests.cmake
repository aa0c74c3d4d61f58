# Pipeline parallelism. Schedule generators, validator and simulator are
# LibTorch-free (torus_base), single process.
add_executable(torus_pipeline_schedule_tests ${CMAKE_CURRENT_LIST_DIR}/schedule_test.cpp)
target_link_libraries(torus_pipeline_schedule_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME pipeline_schedule TARGET torus_pipeline_schedule_tests LABELS pipeline TIMEOUT 120)

# The executor on a toy f64 model against single-process autograd, 1-4 ranks.
add_executable(torus_pipeline_executor_tests ${CMAKE_CURRENT_LIST_DIR}/executor_test.cpp)
target_link_libraries(torus_pipeline_executor_tests PRIVATE torus_test_main torus)
foreach(_np 1 2 3 4)
  torus_add_mpi_test(NAME pipeline_executor_np${_np} TARGET torus_pipeline_executor_tests NP ${_np}
                     LABELS "pipeline" TIMEOUT 300)
endforeach()

# The 3D contract: the trainer in a layout against a single-process loop,
# for the GPT and the Llama.
# layout:ranks — TORUS_TEST_LAYOUT names the layout (gpt_3d_test.cpp).
add_executable(torus_gpt_3d_contract ${CMAKE_CURRENT_LIST_DIR}/gpt_3d_test.cpp)
target_link_libraries(torus_gpt_3d_contract PRIVATE torus_test_main torus)
foreach(_case pp1,1f1b:1 pp2,gpipe:2 pp2,1f1b:2 pp2,interleaved,v2:2 pp2,zb-h1,untied:2 pp4,gpipe:4 pp4,1f1b:4
              pp4,interleaved,v2:4 pp4,zb-h1:4 tp2,pp2,dp2,1f1b:8 tp2,pp2,dp2,interleaved,v2,sp:8
              tp2,pp2,dp2,zb-h1,sp,untied,m8:8
              # The Llama-family decoder: kv heads split (tp2) and replicated (tp4), SP, schedules, recompute, ZeRO.
              llama:1 llama,tp2,sp:2 llama,tp4:4 llama,tp4,sp:4 llama,pp2,1f1b:2 llama,pp2,zb-h1,untied:2
              llama,pp4,interleaved,v2:4 llama,dp2,z3,rc:2 llama,pp2,dp2,z2:4 llama,tp2,pp2,dp2,1f1b,sp,z1:8)
  string(REPLACE ":" ";" _pair "${_case}")
  list(GET _pair 0 _layout)
  list(GET _pair 1 _np)
  string(REPLACE "," "_" _name "${_layout}")
  string(REPLACE "-" "" _name "${_name}")
  # bf16 in 3D for the Llama. The GPT's bf16 contract is tests/models' gpt_contract_* (dp, tp, sp):
  # in 3D its zero-initialised biases, whose gradients are rounding noise under SP and TP, drift by
  # several lr in either direction (tp2,pp2,dp2,zb-h1,sp,untied,m8: blocks.5.proj.bias 0.51 against a
  # yardstick of 0.045, while the f32 contract holds it to 1e-4), so the per-weight yardstick does
  # not apply; the Llama has no biases.
  set(_filter "--gtest_filter=*")
  if(NOT _layout MATCHES "^llama")
    set(_filter "--gtest_filter=-GPT3DContract.BFloat16")
  endif()
  torus_add_mpi_test(NAME gpt_3d_${_name} TARGET torus_gpt_3d_contract NP ${_np} ARGS ${_filter}
                     ENV TORUS_TEST_LAYOUT=${_layout} LABELS "pipeline;contract" TIMEOUT 400)
endforeach()

# torus-train as a user meets it: --help, bad flags, a config file, and a
# TP=2 x PP=2 x DP=2 run on 8 ranks whose loss falls (metrics, log, plot).
add_test(NAME train_cli
         COMMAND ${TORUS_PYTHON_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/train_cli_test.py $<TARGET_FILE:torus-train>
                 ${TORUS_MPIEXEC} ${TORUS_TEST_MPIRUN_FLAGS} -x TORUS_LOG_LEVEL=warn)
set_tests_properties(train_cli PROPERTIES TIMEOUT 600 LABELS "multirank;np8;pipeline;train" PROCESSORS 1)

# A rank killed mid-run (plain processes over ofi, no mpirun): every other
# rank ends with a clear error within a bound, none hangs.
if(TORUS_WITH_OFI)
  add_test(NAME train_killed_rank
           COMMAND ${TORUS_PYTHON_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/killed_rank_test.py $<TARGET_FILE:torus-train>)
  set_tests_properties(train_killed_rank PROPERTIES TIMEOUT 240 LABELS "multirank;np4;pipeline;fault" PROCESSORS 1)
endif()

# A pipeline of precompiled programs (ProgramStage) under the executor, on 2
# ranks, against closed forms.
add_executable(torus_program_stage_tests ${CMAKE_CURRENT_LIST_DIR}/program_stage_test.cpp)
target_link_libraries(torus_program_stage_tests PRIVATE torus_test_main torus)
torus_add_mpi_test(NAME pipeline_program_stage_np2 TARGET torus_program_stage_tests NP 2 LABELS "pipeline"
                   TIMEOUT 120)
