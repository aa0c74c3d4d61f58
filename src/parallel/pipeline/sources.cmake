# Pipeline parallelism. Schedules, their validator and simulator are plain
# data and free of LibTorch (torus_base); the executor runs them on tensors.
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/simulate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/partition.cpp)
# The executor runs schedules on tensors through the ProcessGroup.
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/executor.cpp ${CMAKE_CURRENT_LIST_DIR}/program_stage.cpp)
