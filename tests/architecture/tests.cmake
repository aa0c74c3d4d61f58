# The layer rules of docs/architecture.md: no include goes up a layer.
add_test(NAME architecture_layers
         COMMAND ${TORUS_PYTHON_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_layers.py ${PROJECT_SOURCE_DIR})
set_tests_properties(architecture_layers PROPERTIES TIMEOUT 60 LABELS "unit;architecture")
