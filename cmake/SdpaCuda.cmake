# Optional CUDA and cuDNN support (src/cuda/, src/cudnn/).
#
# SDPA_CUDA=AUTO (default) builds the CUDA parts when nvcc and the CUDA toolkit are found,
# ON requires them, OFF skips them. SDPA_CUDNN works the same way for the CUDNN_ATTENTION
# backend, which also needs cuDNN 9's headers (libcudnn.so.9 is loaded at run time) and
# the header-only cuDNN frontend (PyPI's nvidia-cudnn-frontend, unpacked by scripts/install_deps.sh into
# .deps/cudnn-frontend). A machine without a GPU still compiles and links every CUDA
# source; tests that need a device skip themselves at run time.

set(SDPA_CUDA AUTO CACHE STRING "Build the CUDA backends: AUTO, ON or OFF")
set_property(CACHE SDPA_CUDA PROPERTY STRINGS AUTO ON OFF)
set(SDPA_CUDNN AUTO CACHE STRING "Build the cuDNN backend (needs SDPA_CUDA): AUTO, ON or OFF")
set_property(CACHE SDPA_CUDNN PROPERTY STRINGS AUTO ON OFF)
set(SDPA_CUDNN_FRONTEND_DIR "${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend/include" CACHE PATH
    "Folder holding cudnn_frontend.h")

set(SDPA_HAVE_CUDA OFF)
set(SDPA_HAVE_CUDNN OFF)

if(NOT SDPA_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Ampere and Hopper (sm_90a: wgmma and the tensor-memory accelerator).
      set(CMAKE_CUDA_ARCHITECTURES 80 90a)
    endif()
    enable_language(CUDA)
    # The kernels include the library's C++20 headers, but CMake 3.25 knows no CUDA20
    # dialect for nvcc: targets declare CUDA_STANDARD 17, which compiles as C++20.
    set(CMAKE_CUDA17_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA17_EXTENSION_COMPILE_OPTION "-std=c++20")
    find_package(CUDAToolkit REQUIRED)
    set(SDPA_HAVE_CUDA ON)
  elseif(SDPA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SDPA_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()

if(SDPA_HAVE_CUDA AND NOT SDPA_CUDNN STREQUAL "OFF")
  # cuDNN comes with the toolkit here, or from PyPI's nvidia-cudnn-cu13 (torch's own copy).
  set(_sdpa_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT}
      ${CUDAToolkit_TARGET_DIR})
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_FOUND)
    execute_process(COMMAND "${Python3_EXECUTABLE}" -c
                    "import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__) if nvidia.cudnn.__file__ else list(nvidia.cudnn.__path__)[0])"
                    OUTPUT_VARIABLE _sdpa_py_cudnn OUTPUT_STRIP_TRAILING_WHITESPACE
                    ERROR_QUIET)
    list(APPEND _sdpa_cudnn_hints ${_sdpa_py_cudnn})
  endif()
  find_path(SDPA_CUDNN_INCLUDE_DIR cudnn.h HINTS ${_sdpa_cudnn_hints} PATH_SUFFIXES include)
  find_path(SDPA_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h HINTS ${SDPA_CUDNN_FRONTEND_DIR})
  if(SDPA_CUDNN_INCLUDE_DIR AND SDPA_CUDNN_FRONTEND_INCLUDE)
    set(SDPA_HAVE_CUDNN ON)
  elseif(SDPA_CUDNN STREQUAL "ON")
    message(FATAL_ERROR "SDPA_CUDNN=ON but cuDNN's headers (${SDPA_CUDNN_INCLUDE_DIR}) or the "
                        "cuDNN frontend (${SDPA_CUDNN_FRONTEND_INCLUDE}) were not found")
  endif()
endif()

message(STATUS "sdpa: CUDA ${SDPA_HAVE_CUDA}, cuDNN ${SDPA_HAVE_CUDNN}")
