# The installed package, used by an outside project (examples/consumer).
add_test(NAME package_consumer
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/consumer_test.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR} ${TORUS_MPIEXEC})
set_tests_properties(package_consumer PROPERTIES TIMEOUT 600 LABELS "package;multirank")
