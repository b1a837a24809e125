# Finds UCC (Unified Collective Communication): an installed one, or the one scripts/build-ucc
# builds into .deps/ucc (CPU) / .deps/ucc-cuda (CUDA). Hints: UCC_ROOT (CMake or environment).
#   UCC_FOUND, UCC_INCLUDE_DIR, UCC_LIBRARY, UCC_CUDA (UCC has its CUDA memory components)
#   target UCC::ucc
# libucc carries the run path to its UCX (scripts/build-ucc links it so); consumers get UCC's own
# library folder in their build rpath from the imported location.
set(_ucc_hints ${UCC_ROOT} $ENV{UCC_ROOT})
if(MESHFUSE_HAVE_CUDA)
  list(APPEND _ucc_hints ${CMAKE_SOURCE_DIR}/.deps/ucc-cuda)
endif()
list(APPEND _ucc_hints ${CMAKE_SOURCE_DIR}/.deps/ucc)
find_path(UCC_INCLUDE_DIR ucc/api/ucc.h HINTS ${_ucc_hints} PATH_SUFFIXES include)
find_library(UCC_LIBRARY ucc HINTS ${_ucc_hints} PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(UCC REQUIRED_VARS UCC_LIBRARY UCC_INCLUDE_DIR)
if(UCC_FOUND)
  get_filename_component(_ucc_libdir ${UCC_LIBRARY} DIRECTORY)
  set(UCC_CUDA OFF)
  if(EXISTS ${_ucc_libdir}/ucc/libucc_mc_cuda.so)
    set(UCC_CUDA ON)
  endif()
  if(NOT TARGET UCC::ucc)
    add_library(UCC::ucc SHARED IMPORTED)
    set_target_properties(UCC::ucc PROPERTIES IMPORTED_LOCATION ${UCC_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${UCC_INCLUDE_DIR})
  endif()
endif()
mark_as_advanced(UCC_INCLUDE_DIR UCC_LIBRARY)
