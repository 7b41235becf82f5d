# cmake -P script: install BUILD_DIR into WORK_DIR/prefix, check the installed headers are
# self-contained, build PROJECT_DIR (examples/minimal.cpp and a header check) against it, run both.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
# Every zrt header an installed header includes is installed too (the allowlist is closed).
set(inc ${WORK_DIR}/prefix/include)
file(GLOB_RECURSE headers RELATIVE ${inc} ${inc}/zrt/*)
foreach(h IN LISTS headers)
  file(STRINGS ${inc}/${h} lines REGEX "^#include [\"<]zrt/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include [\"<](zrt/[^\">]+)[\">].*" "\\1" dep "${line}")
    if(NOT EXISTS ${inc}/${dep})
      message(FATAL_ERROR "installed ${h} includes ${dep}, which is not installed")
    endif()
  endforeach()
endforeach()
list(LENGTH headers count)
message(STATUS "${count} installed headers, self-contained")
if(count GREATER 30)
  message(FATAL_ERROR "${count} installed headers: the surface a trainer links is at most 30 (../shared issue: keep it small)")
endif()
# A sanitized zrt is only linkable by a sanitized program (the runtime comes from the link flags).
set(flags "")
if(SANITIZE STREQUAL "address+undefined")
  set(flags "-fsanitize=address,undefined")
elseif(SANITIZE STREQUAL "thread")
  set(flags "-fsanitize=thread")
endif()
# A trainer needs MPI and nlohmann-json, nothing of zrt's own dependencies: the consumer configures and
# builds with CMake told not to find any of them (liburing, zstd and xxhash come through pkg-config).
run(${CMAKE_COMMAND} -S ${PROJECT_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=${flags}" -DMINIMAL_SOURCE=${MINIMAL_SOURCE}
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDA=ON -DCMAKE_DISABLE_FIND_PACKAGE_HDF5=ON
    -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON -DCMAKE_DISABLE_FIND_PACKAGE_ZSTD=ON -DCMAKE_DISABLE_FIND_PACKAGE_xxHash=ON)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
file(GLOB_RECURSE link_lines ${WORK_DIR}/build/CMakeFiles/*/link.txt)
foreach(f IN LISTS link_lines)
  file(READ ${f} line)
  if(line MATCHES "uring|zstd|xxhash|hdf5|cudart|nccl")
    message(FATAL_ERROR "the consumer links zrt's own dependency (${CMAKE_MATCH_0}): ${f}\n${line}")
  endif()
endforeach()
run(${WORK_DIR}/build/consumer)
# The example trains and checkpoints as a singleton MPI process, then resumes from its checkpoint.
run(${WORK_DIR}/build/minimal ${WORK_DIR}/minimal-ckpt)
run(${WORK_DIR}/build/minimal ${WORK_DIR}/minimal-ckpt)
# A CUDA build: a GPU trainer finds the gpu component (zrt::gpu, <zrt/gpu.h>), builds and runs.
if(GPU_PROJECT_DIR)
  run(${CMAKE_COMMAND} -S ${GPU_PROJECT_DIR} -B ${WORK_DIR}/gpu_build -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
      -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=${flags}")
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/gpu_build)
  run(${WORK_DIR}/gpu_build/gpu_consumer)
endif()
