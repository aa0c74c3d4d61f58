# The rendezvous store: protocol unit tests, client/server semantics, the
# security tests (authentication, admission under a flood, validation, the
# seeded fuzz storm), the token file of loopback jobs and the record published
# through torchrun's agent store.
add_executable(torus_store_tests
  ${CMAKE_CURRENT_LIST_DIR}/agent_store_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_protocol_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_security_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_token_test.cpp)
target_link_libraries(torus_store_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME store_protocol TARGET torus_store_tests ARGS --gtest_filter=StoreProtocol.* LABELS store TIMEOUT 60)
torus_add_test(NAME store_api TARGET torus_store_tests ARGS --gtest_filter=Store.* LABELS store TIMEOUT 120)
torus_add_test(NAME store_security TARGET torus_store_tests ARGS --gtest_filter=StoreSecurity.*:StoreFuzz.* LABELS store TIMEOUT 120)
torus_add_test(NAME store_token TARGET torus_store_tests ARGS --gtest_filter=StoreToken.* LABELS store TIMEOUT 60)
torus_add_test(NAME store_agent_record TARGET torus_store_tests ARGS --gtest_filter=AgentStore.* LABELS store TIMEOUT 60)

# A two-process loopback job without TORUS_JOB_TOKEN through the real
# bootstrap (ofi backend over shm; no launcher needed).
if(TORUS_WITH_OFI)
  add_executable(torus_bootstrap_token_rank ${CMAKE_CURRENT_LIST_DIR}/bootstrap_token_rank.cpp)
  target_link_libraries(torus_bootstrap_token_rank PRIVATE torus_base)
  target_include_directories(torus_bootstrap_token_rank BEFORE PRIVATE ${TORUS_FMT_SHIM})
  add_executable(torus_bootstrap_token_tests ${CMAKE_CURRENT_LIST_DIR}/bootstrap_token_test.cpp)
  target_link_libraries(torus_bootstrap_token_tests PRIVATE torus_test_main torus_base)
  target_compile_definitions(torus_bootstrap_token_tests PRIVATE
                             TORUS_BOOTSTRAP_TOKEN_RANK="$<TARGET_FILE:torus_bootstrap_token_rank>")
  add_dependencies(torus_bootstrap_token_tests torus_bootstrap_token_rank)
  torus_add_test(NAME store_bootstrap_token TARGET torus_bootstrap_token_tests LABELS "store;multirank" TIMEOUT 300)
endif()
