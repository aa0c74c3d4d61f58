# Mixture of experts: the layer in one process against plain references
# (moe_test.cpp), and the MoE GPT trained in expert-parallel layouts against
# one process (moe_layout_test.cpp).
add_executable(torus_moe_tests ${CMAKE_CURRENT_LIST_DIR}/moe_test.cpp)
target_link_libraries(torus_moe_tests PRIVATE torus_test_main torus)
torus_add_test(NAME moe_unit TARGET torus_moe_tests LABELS "moe" TIMEOUT 120)

add_executable(torus_moe_layout_tests ${CMAKE_CURRENT_LIST_DIR}/moe_layout_test.cpp)
target_link_libraries(torus_moe_layout_tests PRIVATE torus_test_main torus)
foreach(_case "2:MoELayouts.TwoRanks:MoELayouts.ExpertTpSplitsTheExperts:MoELayouts.ExpertTpNeedsDivisibleWidth" "4:MoELayouts.FourRanks:MoELayouts.ExpertTpUnderSgd:MoECheckpoint.*" "6:MoELayouts.SixRanks")
  string(FIND "${_case}" ":" _colon)
  string(SUBSTRING "${_case}" 0 ${_colon} _np)
  math(EXPR _rest "${_colon} + 1")
  string(SUBSTRING "${_case}" ${_rest} -1 _filter)
  torus_add_mpi_test(NAME moe_layouts_np${_np} TARGET torus_moe_layout_tests NP ${_np}
                     ARGS --gtest_filter=${_filter} LABELS "moe" TIMEOUT 600)
endforeach()
