target_sources(torus_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/reduce.cpp)
