# Mixed precision: precision modes, the loss scaler, inf/NaN detection across
# ranks and unscaling, the autocast scope.
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/autocast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_scaling.cpp
  ${CMAKE_CURRENT_LIST_DIR}/loss_scaler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/precision.cpp)
