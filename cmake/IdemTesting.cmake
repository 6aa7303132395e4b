# cmake/IdemTesting.cmake: idem_test(), the one way a ctest test is registered in idem's build
# (tests/, verify/, ops/, tools/, examples/). Included from the root CMakeLists.txt when
# IDEM_BUILD_TESTS is on, after cmake/IdemWarnings.cmake. docs/internals/HACKING.md says how to run
# the tests by name and by label.
#
# idem_test(<name>
#           [SOURCES <src>...]        build the executable <name> from these: a GoogleTest program
#                                     (idem::idem, GTest::gtest and GTest::gtest_main, idem_warnings,
#                                     the calling directory on the include path)
#           [NO_MAIN]                 link GTest::gtest without GTest::gtest_main (the test has its own
#                                     main(): worker processes, command-line options)
#           [NO_GTEST]                link no GoogleTest at all (a plain program)
#           [LIBS <lib>...]           more libraries for the executable
#           [COMMAND <cmd> <arg>...]  what ctest runs. Default: the executable <name>. Without SOURCES
#                                     nothing is built: a script, a tool, another build's step
#           [WORKING_DIRECTORY <dir>]
#           [LABELS <label>...]       see below
#           [TIMEOUT <seconds>]       scaled by IDEM_TEST_TIMEOUT_SCALE (sanitizer builds run slower)
#           [PROPERTIES <prop> <value>...])  any other test property: RESOURCE_LOCK, FIXTURES_SETUP,
#                                     FIXTURES_REQUIRED, ENVIRONMENT, SKIP_RETURN_CODE, ...
#
# Labels. Every test has one of these three (the tiers of docs/internals/HACKING.md):
#   unit        runs in seconds to tens of seconds, as any user: the developer loop (`ctest -L unit`)
#   needs-root  mounts a tmpfs, sets the immutable attribute (chattr +i), drops to another uid:
#               fails, never skips, without root
#   slow        takes more than about 30 s on the 2-core CI machine (ctest -j2)
# A test given neither needs-root nor slow is labelled unit. The other labels say what a test needs
# or is about: postgres (IDEM_TEST_PG_URI), rocksdb, concurrency (rerun under ThreadSanitizer by
# scripts/test), docs, packaging, model, sim, fuzz, tool, example, ops, tsan.
find_package(GTest REQUIRED)

if(IDEM_SANITIZER)
  set(_idem_default_timeout_scale 3)
else()
  set(_idem_default_timeout_scale 1)
endif()
set(IDEM_TEST_TIMEOUT_SCALE ${_idem_default_timeout_scale} CACHE STRING
  "Multiplier of every test's TIMEOUT (default 3 in a sanitizer build, 1 otherwise)")

function(idem_test name)
  # PARSE_ARGV keeps an argument's semicolons (a shell script given to COMMAND sh -c).
  cmake_parse_arguments(PARSE_ARGV 1 T "NO_MAIN;NO_GTEST" "WORKING_DIRECTORY;TIMEOUT"
                        "SOURCES;LIBS;COMMAND;LABELS;PROPERTIES")
  if(T_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "idem_test(${name}): unexpected arguments: ${T_UNPARSED_ARGUMENTS}")
  endif()
  if(T_SOURCES)
    add_executable(${name} ${T_SOURCES})
    target_link_libraries(${name} PRIVATE idem::idem idem_warnings ${T_LIBS})
    if(NOT T_NO_GTEST)
      target_link_libraries(${name} PRIVATE GTest::gtest)
      if(NOT T_NO_MAIN)
        target_link_libraries(${name} PRIVATE GTest::gtest_main)
      endif()
    endif()
    target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  elseif(T_LIBS OR T_NO_MAIN OR T_NO_GTEST)
    message(FATAL_ERROR "idem_test(${name}): LIBS, NO_MAIN and NO_GTEST need SOURCES")
  elseif(NOT T_COMMAND)
    message(FATAL_ERROR "idem_test(${name}): give SOURCES (an executable) or COMMAND")
  endif()
  if(NOT T_COMMAND)
    set(T_COMMAND ${name})
  endif()
  if(T_WORKING_DIRECTORY)
    add_test(NAME ${name} COMMAND ${T_COMMAND} WORKING_DIRECTORY ${T_WORKING_DIRECTORY})
  else()
    add_test(NAME ${name} COMMAND ${T_COMMAND})
  endif()

  set(labels ${T_LABELS})
  if(NOT "needs-root" IN_LIST labels AND NOT "slow" IN_LIST labels AND NOT "unit" IN_LIST labels)
    list(APPEND labels unit)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${labels}")
  if(T_TIMEOUT)
    math(EXPR timeout "${T_TIMEOUT} * ${IDEM_TEST_TIMEOUT_SCALE}")
    set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout})
  endif()
  if(T_PROPERTIES)
    set_tests_properties(${name} PROPERTIES ${T_PROPERTIES})
  endif()
endfunction()
