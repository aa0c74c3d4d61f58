# CPU references of the CUDA kernels (kernels/cuda/): built in every
# configuration, so that the references and their tests run on every machine.
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cast_ref.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unscale_ref.cpp
  ${CMAKE_CURRENT_LIST_DIR}/adamw_ref.cpp)
