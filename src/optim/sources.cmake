# Optimizers (the Optimizer seam; SGD, Adam, AdamW over ATen's fused kernels;
# CpuAdam/CpuAdamW over Torus's vectorised CPU kernel; the factory) and
# gradient clipping by a global norm. The CPU Adam kernel itself is free of
# LibTorch (torus_base), as is HostOffloadAdam over flat device buffers (the
# Neuron host optimizer); libtorus gives the kernel ATen's thread pool
# (cpu_adam.cpp).
target_sources(torus PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sgd.cpp
  ${CMAKE_CURRENT_LIST_DIR}/adam.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu_adam.cpp
  ${CMAKE_CURRENT_LIST_DIR}/factory.cpp
  ${CMAKE_CURRENT_LIST_DIR}/clip.cpp)
target_sources(torus_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cpu_adam_kernel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu_adam_scalar.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_offload_adam.cpp)

# The CPU Adam kernel's paths: one translation unit per ISA, each compiled
# for its own instruction set and chosen at run time (cpu_adam_kernel.cpp);
# none of them may contract a multiply and an add into an FMA, so that every
# path rounds exactly as the contract (Note [CPU Adam order]) says.
# They also skip the library's precompiled header: it would bring LibTorch's
# inline functions into a TU compiled for AVX-512, and the linker could keep
# that copy for callers on any CPU.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cpu_adam_scalar.cpp PROPERTIES
  COMPILE_OPTIONS "-ffp-contract=off" SKIP_PRECOMPILE_HEADERS ON)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
  target_sources(torus_base PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/cpu_adam_avx2.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu_adam_avx512.cpp)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cpu_adam_avx2.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-ffp-contract=off" SKIP_PRECOMPILE_HEADERS ON)
  # -Wno-maybe-uninitialized: GCC 12 warns inside its own AVX-512 headers
  # (the `__Y = __Y` placeholders of _mm512_undefined_ps), not about our code.
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cpu_adam_avx512.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mfma;-mf16c;-ffp-contract=off;-Wno-maybe-uninitialized"
    SKIP_PRECOMPILE_HEADERS ON)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cpu_adam_kernel.cpp PROPERTIES
    COMPILE_DEFINITIONS "TORUS_CPU_ADAM_X86=1")
endif()
