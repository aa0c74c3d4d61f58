# The layout planner (docs/plan.md): the hardware presets are free of
# LibTorch (torus_base: the option table lists them); the planner itself
# builds the model adapters and asks the memory estimate of the training
# engine (torus), so that a plan and a run's pre-check are one computation.
target_sources(torus_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/hardware.cpp)
target_sources(torus PRIVATE ${CMAKE_CURRENT_LIST_DIR}/planner.cpp ${CMAKE_CURRENT_LIST_DIR}/plan_layout.cpp)
