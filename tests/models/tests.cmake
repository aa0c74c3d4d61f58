# The reference GPT: single-process unit tests, and the correctness contract
# (every parallel layout trains like one process) under mpirun.
add_executable(torus_gpt_tests ${CMAKE_CURRENT_LIST_DIR}/gpt_test.cpp)
target_link_libraries(torus_gpt_tests PRIVATE torus_test_main torus)
torus_add_test(NAME gpt_unit TARGET torus_gpt_tests LABELS "models" TIMEOUT 180)

add_executable(torus_gpt_contract ${CMAKE_CURRENT_LIST_DIR}/gpt_layouts_test.cpp)
target_link_libraries(torus_gpt_contract PRIVATE torus_test_main torus)
# layout:ranks — TORUS_TEST_LAYOUT names the mesh; NP must equal dp x tp.
# Every layout runs the f32, f64 and bf16 contracts (GPTContract.*).
foreach(_case single:1 dp2:2 dp3:3 tp2:2 tp2,sp:2 tp2,dp2:4 tp4:4 tp2,dp2,sp:4)
  string(REPLACE ":" ";" _pair "${_case}")
  list(GET _pair 0 _layout)
  list(GET _pair 1 _np)
  string(REPLACE "," "_" _name "${_layout}")
  torus_add_mpi_test(NAME gpt_contract_${_name} TARGET torus_gpt_contract NP ${_np}
                     ENV TORUS_TEST_LAYOUT=${_layout} LABELS "models;contract" TIMEOUT 300)
endforeach()

# The GPT in bf16/f16 and under CPU autocast against the f32 model.
add_executable(torus_gpt_half_tests ${CMAKE_CURRENT_LIST_DIR}/gpt_half_test.cpp)
target_link_libraries(torus_gpt_half_tests PRIVATE torus_test_main torus)
torus_add_test(NAME gpt_half TARGET torus_gpt_half_tests LABELS "models;amp" TIMEOUT 180)

# The Llama-family decoder in one process: against a plain reference
# forward, rotary tables against closed forms, pipeline parts, TP shards,
# the presets' published sizes.
add_executable(torus_llama_tests ${CMAKE_CURRENT_LIST_DIR}/llama_test.cpp)
target_link_libraries(torus_llama_tests PRIVATE torus_test_main torus)
torus_add_test(NAME llama_unit TARGET torus_llama_tests LABELS "models" TIMEOUT 180)
