# The layout planner (docs/plan.md): the planner builds the model adapters
# and asks the memory estimate of the training engine (torus), so that a plan
# and a run's pre-check are one computation; plan_layout is --plan of a run.
# Its hardware presets are the device layer's table
# (include/torus/device/hardware.h).
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/planner.cpp ${CMAKE_CURRENT_LIST_DIR}/plan_layout.cpp)
