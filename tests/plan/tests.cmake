# The planner (docs/plan.md): the ZeRO paper's memory table, the Megatron-LM
# SC21 configurations, ranking and request checks (single process), and the
# memory prediction against live tensor bytes on 2 ranks.
add_executable(torus_planner_tests ${CMAKE_CURRENT_LIST_DIR}/planner_test.cpp)
target_link_libraries(torus_planner_tests PRIVATE torus_test_main torus)
torus_add_test(NAME plan_planner TARGET torus_planner_tests LABELS "plan" TIMEOUT 300)

add_executable(torus_plan_memory_tests ${CMAKE_CURRENT_LIST_DIR}/plan_memory_test.cpp)
target_link_libraries(torus_plan_memory_tests PRIVATE torus_test_main torus)
# On mpi: the live bytes it measures are LibTorch's CPU allocator's, and on
# ofi (the default host backend) the DDP buckets come from shared host memory
# instead (docs/comm.md, "Shared host buffers"), out of that count.
torus_add_mpi_test(NAME plan_memory_np2 TARGET torus_plan_memory_tests NP 2 LABELS "plan" TIMEOUT 300
                   ENV TORUS_BACKEND=mpi)

# torus-plan's command line: --help, the ZeRO table, a plan as JSON.
torus_add_test(NAME plan_cli_help TARGET torus-plan ARGS --help LABELS "plan")
torus_add_test(NAME plan_cli_zero_table TARGET torus-plan ARGS --zero-table 7.5e9 LABELS "plan")
set_tests_properties(plan_cli_zero_table PROPERTIES PASS_REGULAR_EXPRESSION "1024 +120 +30.09 +15.1 +0.1172")
torus_add_test(NAME plan_cli_json TARGET torus-plan
               ARGS --hardware a100-80gb --nodes 2 --model gpt2 --global-batch 64 --precision bf16 --json --top 2
               LABELS "plan")
set_tests_properties(plan_cli_json PROPERTIES PASS_REGULAR_EXPRESSION "\"best\": {")
torus_add_test(NAME plan_cli_bad_hardware TARGET torus-plan ARGS --hardware tpu LABELS "plan")
set_tests_properties(plan_cli_bad_hardware PROPERTIES WILL_FAIL TRUE)

# torus-train --plan on 2 ranks (the choice printed, applied on every rank,
# the loss falls), a preset that does not divide the world refused, and
# torus-plan's JSON, --evaluate and nothing-fits paths.
add_test(NAME plan_train
         COMMAND ${TORUS_PYTHON_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/plan_train_test.py $<TARGET_FILE:torus-train>
                 $<TARGET_FILE:torus-plan> ${TORUS_MPIEXEC} ${TORUS_TEST_MPIRUN_FLAGS})
set_tests_properties(plan_train PROPERTIES TIMEOUT 600 LABELS "multirank;np2;plan;train" PROCESSORS 1)
