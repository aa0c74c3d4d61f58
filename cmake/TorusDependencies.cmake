# Finds every dependency, and stops configure with an install hint when an
# option is on but its dependency is missing. Minimum versions live here only.
include(FindPackageHandleStandardArgs)
find_package(PkgConfig)

set(_torus_setup_hint "run scripts/setup.sh, which installs every dependency")

function(torus_require found what hint)
  if(NOT ${found})
    message(FATAL_ERROR "Torus: ${what} not found. ${hint} (or ${_torus_setup_hint}).")
  endif()
endfunction()

if(TORUS_USE_CCACHE)
  find_program(TORUS_CCACHE ccache)
  if(TORUS_CCACHE)
    # The tensor-facing objects are compiled with a precompiled header:
    # ccache caches them only with these sloppiness settings (and GCC's
    # -fpch-preprocess, src/CMakeLists.txt); without them every one of
    # those objects is recompiled in every fresh clone.
    set(_torus_ccache ${CMAKE_COMMAND} -E env
        "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime" ${TORUS_CCACHE})
    set(CMAKE_C_COMPILER_LAUNCHER ${_torus_ccache})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${_torus_ccache})
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${TORUS_CCACHE})
  endif()
endif()

find_package(Threads REQUIRED)

find_package(fmt 9 CONFIG QUIET)
torus_require(fmt_FOUND "fmt (>= 9)" "Install it with: apt-get install libfmt-dev")

# JSON (metrics, configs, benchmark results) and the command line (the option
# table of a training run); both header-only.
find_package(nlohmann_json 3 CONFIG QUIET)
torus_require(nlohmann_json_FOUND "nlohmann-json (>= 3)" "Install it with: apt-get install nlohmann-json3-dev")
find_package(CLI11 2 CONFIG QUIET)
torus_require(CLI11_FOUND "CLI11 (>= 2)" "Install it with: apt-get install libcli11-dev")

find_package(OpenSSL 3 QUIET)
torus_require(OPENSSL_FOUND "OpenSSL (>= 3, for the store's HMAC-SHA-256)" "Install it with: apt-get install libssl-dev")

# LibTorch, from the pinned torch wheel.
include(TorusTorch)

if(TORUS_WITH_MPI)
  find_package(MPI COMPONENTS C QUIET)
  torus_require(MPI_C_FOUND "Open MPI (TORUS_WITH_MPI=ON)" "Install it with: apt-get install openmpi-bin libopenmpi-dev, or configure with -DTORUS_WITH_MPI=OFF")
endif()
# mpirun is used by the multi-rank tests even when the mpi backend is off.
find_program(TORUS_MPIEXEC NAMES mpirun mpiexec)

if(TORUS_WITH_OFI)
  if(PkgConfig_FOUND)
    pkg_check_modules(FABRIC IMPORTED_TARGET libfabric>=1.14)
  endif()
  torus_require(FABRIC_FOUND "libfabric (>= 1.14, TORUS_WITH_OFI=ON)" "Install it with: apt-get install libfabric-dev libfabric-bin, or configure with -DTORUS_WITH_OFI=OFF")
endif()

if(TORUS_WITH_CUDA AND TORUS_WITH_NEURON)
  message(FATAL_ERROR "Torus: TORUS_WITH_CUDA and TORUS_WITH_NEURON are mutually exclusive: the device backend is chosen at build time.")
endif()
if(TORUS_WITH_NCCL AND NOT TORUS_WITH_CUDA)
  message(FATAL_ERROR "Torus: TORUS_WITH_NCCL needs TORUS_WITH_CUDA=ON.")
endif()
# The Neuron backend needs nothing at build time: the runtime (libnrt.so.1)
# is opened with dlopen when first used (docs/neuron.md).
if(TORUS_WITH_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  torus_require(CMAKE_CUDA_COMPILER "the CUDA compiler nvcc (TORUS_WITH_CUDA=ON)" "Install the CUDA toolkit and put nvcc on PATH, or configure with -DTORUS_WITH_CUDA=OFF")
  set(CMAKE_CUDA_ARCHITECTURES ${TORUS_CUDA_ARCHITECTURES})
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()
if(TORUS_WITH_NCCL)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  set(NCCL_FOUND FALSE)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(NCCL_FOUND TRUE)
  endif()
  torus_require(NCCL_FOUND "NCCL (>= 2.18, TORUS_WITH_NCCL=ON)" "Install NCCL (libnccl-dev) or set NCCL_HOME, or configure with -DTORUS_WITH_NCCL=OFF")
endif()

if(TORUS_BUILD_PYTHON)
  # The interpreter that has torch (TorusTorch.cmake) is the one to build for.
  set(Python3_EXECUTABLE ${TORUS_PYTHON_EXECUTABLE})
  find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
  torus_require(Python3_FOUND "Python 3 development files (TORUS_BUILD_PYTHON=ON)" "Install python3-dev, or configure with -DTORUS_BUILD_PYTHON=OFF")
endif()

if(TORUS_BUILD_TESTS)
  find_package(GTest QUIET)
  torus_require(GTest_FOUND "GoogleTest (TORUS_BUILD_TESTS=ON)" "Install it with: apt-get install libgtest-dev libgmock-dev, or configure with -DTORUS_BUILD_TESTS=OFF")
  torus_require(TORUS_MPIEXEC "mpirun (multi-rank tests)" "Install it with: apt-get install openmpi-bin")
endif()

# fmt must resolve to the system fmt even in translation units that also see
# LibTorch's include directory (which bundles another fmt). A private include
# directory placed before LibTorch's holds a link to the system one.
get_target_property(_fmt_inc fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
set(TORUS_FMT_SHIM "${CMAKE_BINARY_DIR}/fmt_shim")
file(MAKE_DIRECTORY "${TORUS_FMT_SHIM}")
foreach(_d ${_fmt_inc})
  if(EXISTS "${_d}/fmt/format.h" AND NOT EXISTS "${TORUS_FMT_SHIM}/fmt")
    file(CREATE_LINK "${_d}/fmt" "${TORUS_FMT_SHIM}/fmt" SYMBOLIC)
  endif()
endforeach()
if(NOT EXISTS "${TORUS_FMT_SHIM}/fmt")
  file(CREATE_LINK "/usr/include/fmt" "${TORUS_FMT_SHIM}/fmt" SYMBOLIC)
endif()
