# LibTorch 2.x from PyTorch's wheel in the project's .venv (scripts/setup.sh installs it), or any
# other through -DTorch_DIR / CMAKE_PREFIX_PATH / -DMEGADSL_PYTHON=<a python with torch>.
#
# Sets MEGADSL_PYTHON (the interpreter whose torch we build against: the Python module and its
# tests use the same one) and MEGADSL_WITH_CUDA (the LibTorch has CUDA and NCCL, and a CUDA
# toolkit is here to build against it).
if(NOT MEGADSL_PYTHON)
  find_program(MEGADSL_PYTHON NAMES python3 python
               HINTS ${PROJECT_SOURCE_DIR}/.venv/bin NO_DEFAULT_PATH)
  if(NOT MEGADSL_PYTHON)
    find_program(MEGADSL_PYTHON NAMES python3 python)
  endif()
endif()
if(NOT Torch_DIR AND MEGADSL_PYTHON)
  execute_process(COMMAND ${MEGADSL_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE megadsl_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE megadsl_torch_found ERROR_QUIET)
  if(megadsl_torch_found EQUAL 0)
    list(APPEND CMAKE_PREFIX_PATH ${megadsl_torch_prefix})
  endif()
endif()

# The wheel's LibTorch is built with CUDA: its CMake package then wants the CUDA toolkit. Without
# nvcc on this machine we still build the CPU path (the wheel's libraries load without a GPU).
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  find_package(CUDAToolkit)
  # Without it Caffe2's CMake try_run()s a program to ask the (absent) GPU its architecture.
  # megadsl compiles no kernels of its own; this only sets LibTorch's gencode flags.
  if(NOT TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "9.0")  # H100 / H200
  endif()
endif()
find_package(Torch REQUIRED)
message(STATUS "megadsl: LibTorch ${Torch_VERSION} from ${Torch_DIR}")

# The wheel carries its own CUDA runtime and NCCL (site-packages/nvidia/*, newer than the system
# toolkit's): link and run against those, the ones libtorch_cuda was built with, never a mix.
get_filename_component(megadsl_site_packages "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
set(MEGADSL_TORCH_LIBDIRS ${TORCH_INSTALL_PREFIX}/lib)
foreach(sub cu13/lib nccl/lib cudnn/lib nvshmem/lib cusparselt/lib)
  if(EXISTS ${megadsl_site_packages}/nvidia/${sub})
    list(APPEND MEGADSL_TORCH_LIBDIRS ${megadsl_site_packages}/nvidia/${sub})
  endif()
endforeach()
# Any other package's libraries there (another PyTorch lays them out per package: cufile/lib, ...).
file(GLOB megadsl_nvidia_libdirs LIST_DIRECTORIES true ${megadsl_site_packages}/nvidia/*/lib)
foreach(dir ${megadsl_nvidia_libdirs})
  if(IS_DIRECTORY ${dir} AND NOT dir IN_LIST MEGADSL_TORCH_LIBDIRS)
    list(APPEND MEGADSL_TORCH_LIBDIRS ${dir})
  endif()
endforeach()
if(TARGET torch::cudart AND EXISTS ${megadsl_site_packages}/nvidia/cu13/lib/libcudart.so.13)
  set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_LIBRARIES
               ${megadsl_site_packages}/nvidia/cu13/lib/libcudart.so.13)
endif()
string(REPLACE ";" ":" megadsl_libdir_path "${MEGADSL_TORCH_LIBDIRS}")
set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS
             "LINKER:-rpath-link,${megadsl_libdir_path}" "LINKER:-rpath,${megadsl_libdir_path}")

set(MEGADSL_WITH_CUDA OFF)
if(TARGET torch_cuda AND CUDAToolkit_FOUND)
  find_path(MEGADSL_NCCL_INCLUDE nccl.h
            HINTS ${megadsl_site_packages}/nvidia/nccl/include ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(MEGADSL_NCCL_INCLUDE)
    set(MEGADSL_WITH_CUDA ON)
  endif()
endif()
message(STATUS "megadsl: CUDA/NCCL path ${MEGADSL_WITH_CUDA}")
