# libFuzzer targets. They need Clang (-fsanitize=fuzzer); with another compiler
# nothing here is built. Each also runs as a short, fixed-seed ctest; for a real
# campaign run the binary directly, e.g.
#   tests/torus_store_protocol_fuzz -max_total_time=600 -max_len=4096 corpus/
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # Compiled from the protocol sources directly, so that only the code under
  # test carries the fuzzer's instrumentation.
  add_executable(torus_store_protocol_fuzz
    ${CMAKE_CURRENT_LIST_DIR}/store_protocol_fuzz.cpp
    ${PROJECT_SOURCE_DIR}/src/comm/store_protocol.cpp
    ${PROJECT_SOURCE_DIR}/src/core/error.cpp)
  target_include_directories(torus_store_protocol_fuzz BEFORE PRIVATE ${TORUS_FMT_SHIM})
  target_include_directories(torus_store_protocol_fuzz PRIVATE
    ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include)
  target_compile_options(torus_store_protocol_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(torus_store_protocol_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(torus_store_protocol_fuzz PRIVATE fmt::fmt OpenSSL::Crypto)
  torus_add_test(NAME store_protocol_fuzz TARGET torus_store_protocol_fuzz
                 ARGS -runs=300000 -seed=1 -max_len=4096 LABELS store fuzz TIMEOUT 120)

  # The safetensors header reader, from its sources likewise.
  add_executable(torus_safetensors_fuzz
    ${CMAKE_CURRENT_LIST_DIR}/safetensors_fuzz.cpp
    ${PROJECT_SOURCE_DIR}/src/checkpoint/safetensors.cpp
    ${PROJECT_SOURCE_DIR}/src/core/error.cpp)
  target_include_directories(torus_safetensors_fuzz BEFORE PRIVATE ${TORUS_FMT_SHIM})
  target_include_directories(torus_safetensors_fuzz PRIVATE
    ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include)
  target_compile_options(torus_safetensors_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(torus_safetensors_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(torus_safetensors_fuzz PRIVATE fmt::fmt nlohmann_json::nlohmann_json)
  torus_add_test(NAME safetensors_fuzz TARGET torus_safetensors_fuzz
                 ARGS -runs=300000 -seed=1 -max_len=4096 LABELS checkpoint fuzz TIMEOUT 120)
endif()
