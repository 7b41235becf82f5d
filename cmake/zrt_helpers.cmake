# Helpers for module CMakeLists: header install, unit tests, multi-rank tests.

# zrt_install_headers(folder header...): installs the named public headers of a source folder under
# include/zrt/<folder>/ (the same "zrt/<folder>/<file>.h" paths as in the tree). Only the headers a
# trainer needs are installed (docs/getting-started.md lists them); internals stay in the tree.
function(zrt_install_headers folder)
  foreach(h IN LISTS ARGN)
    install(FILES ${PROJECT_SOURCE_DIR}/${folder}/${h} DESTINATION include/zrt/${folder})
  endforeach()
endfunction()

# zrt_add_unit_test(name src... LIBS lib... [LABEL l]): a gtest binary beside the code; each TEST is a
# ctest test, labelled `unit` unless LABEL says otherwise.
function(zrt_add_unit_test name)
  cmake_parse_arguments(ARG "" "LABEL" "LIBS" ${ARGN})
  if(NOT ARG_LABEL)
    set(ARG_LABEL unit)
  endif()
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main zrt_test_support)
  zrt_add_warnings(${name})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS ${ARG_LABEL} TIMEOUT 600)
endfunction()

# zrt_add_mpi_test(name src... LIBS lib... [RANKS n...]): a gtest binary run under mpiexec once per
# world size (1..ZRT_MPIEXEC_MAX_RANKS by default), as ctest tests "<name>.np<N>".
function(zrt_add_mpi_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "LIBS;RANKS" ${ARGN})
  if(NOT ARG_RANKS)
    set(ARG_RANKS)
    foreach(n RANGE 1 ${ZRT_MPIEXEC_MAX_RANKS})
      list(APPEND ARG_RANKS ${n})
    endforeach()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} zrt_mpi_test_main zrt_test_support)
  zrt_add_warnings(${name})
  foreach(n IN LISTS ARG_RANKS)
    add_test(NAME ${name}.np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${ZRT_MPIEXEC_FLAGS} $<TARGET_FILE:${name}>)
    set_tests_properties(${name}.np${n} PROPERTIES
      LABELS mpi PROCESSORS ${n} TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "${ZRT_MPI_TEST_ENV}")
  endforeach()
endfunction()

# Open MPI on a small shared machine: oversubscribe, do not pin, yield when idle (ranks > cores),
# no CMA single-copy (refused in some containers), and allow root (CI runs as root).
set(ZRT_MPIEXEC_FLAGS --oversubscribe --bind-to none)
set(ZRT_MPI_TEST_ENV
  "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_rmaps_base_oversubscribe=1;ZRT_LOG_LEVEL=warn")
if(ZRT_SANITIZE STREQUAL "address+undefined")
  # Open MPI's plugins are dlclose()d at MPI_Finalize, so their leftovers show as "<unknown module>"
  # leaks that no suppression can name (with op-selection, hwloc and NCCL start-up allocations). Leak
  # checking stays on in the unit tests (same code, no MPI). Used by every test that launches MPI.
  list(APPEND ZRT_MPI_TEST_ENV "ASAN_OPTIONS=protect_shadow_gap=0:allocator_may_return_null=1:detect_leaks=0")
endif()
