# The rendezvous store: protocol unit tests, client/server semantics, and the
# security tests (authentication, validation, the seeded fuzz storm).
add_executable(torus_store_tests
  ${CMAKE_CURRENT_LIST_DIR}/store_protocol_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_security_test.cpp)
target_link_libraries(torus_store_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME store_protocol TARGET torus_store_tests ARGS --gtest_filter=StoreProtocol.* LABELS store TIMEOUT 60)
torus_add_test(NAME store_api TARGET torus_store_tests ARGS --gtest_filter=Store.* LABELS store TIMEOUT 120)
torus_add_test(NAME store_security TARGET torus_store_tests ARGS --gtest_filter=StoreSecurity.*:StoreFuzz.* LABELS store TIMEOUT 120)
