# Locates LibTorch inside the installed torch wheel and defines the imported
# target torus::libtorch (headers + libtorch, libtorch_cpu, libc10). The
# wheel's own TorchConfig.cmake is not used: for a CUDA wheel it drags in the
# CUDA toolkit even for CPU-only builds. Shared with the installed package
# config (TorusConfig.cmake), so consumers find the same LibTorch.
if(TARGET torus::libtorch)
  return()
endif()
if(NOT TORUS_PYTHON_EXECUTABLE)
  find_program(TORUS_PYTHON_EXECUTABLE NAMES python3 python)
endif()
if(NOT TORUS_TORCH_DIR)
  execute_process(
    COMMAND "${TORUS_PYTHON_EXECUTABLE}" -c "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE _torch_out RESULT_VARIABLE _torch_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _torch_rc EQUAL 0)
    message(FATAL_ERROR "Torus: LibTorch not found: '${TORUS_PYTHON_EXECUTABLE} -c \"import torch\"' failed. Install the pinned torch wheel (pip install -r requirements.txt, or scripts/setup.sh), or set TORUS_TORCH_DIR to the torch package directory.")
  endif()
  string(REPLACE "\n" ";" _torch_out "${_torch_out}")
  list(GET _torch_out 0 _dir)
  list(GET _torch_out 1 _ver)
  list(GET _torch_out 2 _abi)
  set(TORUS_TORCH_DIR "${_dir}" CACHE PATH "torch package directory (holds include/ and lib/)")
  set(TORUS_TORCH_VERSION "${_ver}" CACHE STRING "torch version")
  set(TORUS_TORCH_CXX11_ABI "${_abi}" CACHE STRING "torch's _GLIBCXX_USE_CXX11_ABI")
endif()

# The C++ ABI of LibTorch must match this compiler's default, or every
# std::string crossing the boundary breaks at link or run time.
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_QUIET ON)
check_cxx_source_compiles("#include <string>
#if _GLIBCXX_USE_CXX11_ABI != ${TORUS_TORCH_CXX11_ABI}
#error mismatch
#endif
int main() { return 0; }" TORUS_TORCH_ABI_MATCHES)
unset(CMAKE_REQUIRED_QUIET)
if(NOT TORUS_TORCH_ABI_MATCHES)
  message(FATAL_ERROR "Torus: LibTorch at ${TORUS_TORCH_DIR} was built with _GLIBCXX_USE_CXX11_ABI=${TORUS_TORCH_CXX11_ABI}, which this compiler does not use by default. Install a torch wheel built with the matching ABI (the pinned version in requirements.txt).")
endif()

foreach(_lib c10 torch_cpu torch)
  find_library(TORUS_LIB_${_lib} NAMES ${_lib} PATHS "${TORUS_TORCH_DIR}/lib" NO_DEFAULT_PATH)
  if(NOT TORUS_LIB_${_lib})
    message(FATAL_ERROR "Torus: lib${_lib}.so not found under ${TORUS_TORCH_DIR}/lib; reinstall the torch wheel.")
  endif()
endforeach()

add_library(torus::libtorch INTERFACE IMPORTED GLOBAL)
target_include_directories(torus::libtorch SYSTEM INTERFACE
  "${TORUS_TORCH_DIR}/include" "${TORUS_TORCH_DIR}/include/torch/csrc/api/include")
target_link_libraries(torus::libtorch INTERFACE
  ${TORUS_LIB_torch} ${TORUS_LIB_torch_cpu} ${TORUS_LIB_c10})
target_compile_definitions(torus::libtorch INTERFACE _GLIBCXX_USE_CXX11_ABI=${TORUS_TORCH_CXX11_ABI})
# libtorch.so's dependencies resolve through its own RUNPATH; make our
# binaries find the torch libraries without LD_LIBRARY_PATH.
set_property(TARGET torus::libtorch PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath,${TORUS_TORCH_DIR}/lib")
