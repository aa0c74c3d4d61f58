# The device layer: the CPU device everywhere; the CUDA device's no-GPU errors
# on CPU machines; memory, streams and events when a GPU is present (skipped
# with the reason otherwise).
add_executable(torus_device_tests ${CMAKE_CURRENT_LIST_DIR}/device_test.cpp)
target_link_libraries(torus_device_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME device_unit TARGET torus_device_tests LABELS "device;gpu" TIMEOUT 120)

# The hardware table and the per-host peak cache (torus/device/hardware.h, peak_cache.h).
add_executable(torus_hardware_tests ${CMAKE_CURRENT_LIST_DIR}/hardware_test.cpp)
target_link_libraries(torus_hardware_tests PRIVATE torus_test_main torus_base)
torus_add_test(NAME device_hardware TARGET torus_hardware_tests LABELS "device;unit" TIMEOUT 60)
