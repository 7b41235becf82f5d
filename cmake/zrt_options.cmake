# Compiler flags, sanitizers and the CUDA/NCCL auto-detection shared by every target.

# Warnings for our own targets (not imported ones): use zrt_add_warnings(target).
function(zrt_add_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
      -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough
      -Wno-missing-field-initializers>)  # designated initializers of option structs are idiomatic
  if(ZRT_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# Sanitizers apply to the whole build (gtest and our code must agree on the runtime).
if(ZRT_SANITIZE STREQUAL "address+undefined")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=undefined>")
  add_link_options(-fsanitize=address,undefined)
elseif(ZRT_SANITIZE STREQUAL "thread")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=thread)
elseif(ZRT_SANITIZE STREQUAL "fuzzer")
  # clang: libFuzzer's coverage everywhere, ASan + UBSan; the fuzz targets add -fsanitize=fuzzer (main).
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=address,undefined)
elseif(NOT ZRT_SANITIZE STREQUAL "")
  message(FATAL_ERROR "ZRT_SANITIZE must be '', 'address+undefined', 'thread' or 'fuzzer', got '${ZRT_SANITIZE}'")
endif()

# ---- CUDA -------------------------------------------------------------------------------------------
set(ZRT_HAVE_CUDA OFF)
if(NOT ZRT_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25's NVIDIA module stops at C++17; nvcc 12+ accepts -std=c++20.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(ZRT_HAVE_CUDA ON)
  elseif(ZRT_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZRT_WITH_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()

set(ZRT_HAVE_NCCL OFF)
if(ZRT_HAVE_CUDA AND NOT ZRT_WITH_NCCL STREQUAL "OFF")
  find_path(ZRT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(ZRT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(ZRT_NCCL_INCLUDE_DIR AND ZRT_NCCL_LIBRARY)
    set(ZRT_HAVE_NCCL ON)
  elseif(ZRT_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "ZRT_WITH_NCCL=ON but nccl.h / libnccl were not found")
  endif()
elseif(ZRT_WITH_NCCL STREQUAL "ON")
  message(FATAL_ERROR "ZRT_WITH_NCCL=ON needs CUDA")
endif()
message(STATUS "zrt: CUDA ${ZRT_HAVE_CUDA}, NCCL ${ZRT_HAVE_NCCL}, sanitize '${ZRT_SANITIZE}'")
