# The `mpi` host backend over Open MPI (TORUS_WITH_MPI): the progress engine
# (mpi_runtime), the Backend (mpi_backend) and the bootstrap helpers.
# OMPI_SKIP_MPICXX keeps Open MPI's deprecated C++ bindings (which need
# libmpi_cxx) out of every C++ file that includes <mpi.h>.
if(TORUS_WITH_MPI)
  target_sources(torus_base PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/mpi_runtime.cpp
    ${CMAKE_CURRENT_LIST_DIR}/mpi_backend.cpp
    ${CMAKE_CURRENT_LIST_DIR}/mpi_bootstrap.cpp)
  target_link_libraries(torus_base PUBLIC MPI::MPI_C)
  target_compile_definitions(torus_base PUBLIC OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  target_link_libraries(torus PRIVATE MPI::MPI_C)
  target_compile_definitions(torus PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  torus_register_backend(mpi)
endif()
