# run_consumer.cmake: install idem into a prefix, or configure, build and run one consumer project
# of idem on a given view of this machine (cmake -P script). Lists are passed with '|' between items
# (ctest would split a ';').
#
#   IDEM_INSTALL_FROM / IDEM_INSTALL_PREFIX      `cmake --install` this build tree into this prefix
#                                                (a fresh one); alone, that is all the script does
#   IDEM_CONSUMER_SOURCE / IDEM_CONSUMER_BINARY  the consumer project and a scratch build dir
#   IDEM_PREFIX                                  the consumer finds idem there, and nowhere else
#   IDEM_SOURCE_DIR                              the idem source tree (add_subdirectory consumers)
#   IDEM_COMPONENTS                              idem components the consumer asks for
#   IDEM_VIEW                                    when defined, the store libraries this machine
#                                                has (sqlite, postgres, rocksdb); the others are
#                                                hidden from the consumer's configure step:
#                                                  sqlite    CMAKE_DISABLE_FIND_PACKAGE_SQLite3
#                                                  rocksdb   CMAKE_DISABLE_FIND_PACKAGE_RocksDB
#                                                  postgres  PKG_CONFIG_LIBDIR = an empty directory
#                                                so a config that still looks for a hidden library
#                                                REQUIRED fails the test
#   IDEM_EXPECT_CONFIGURE_ERROR                  the configure step must fail, and its output must
#                                                contain each of these strings
#   IDEM_RUN_ENV                                 NAME=VALUE settings for running the consumer
#   IDEM_RUN_FORBID                              strings the consumer's output must not contain
#   IDEM_CMAKE_COMMAND, IDEM_GENERATOR, IDEM_MAKE_PROGRAM, IDEM_CXX_COMPILER  from the parent build
cmake_minimum_required(VERSION 3.20)

foreach(var IDEM_COMPONENTS IDEM_VIEW IDEM_EXPECT_CONFIGURE_ERROR IDEM_RUN_ENV IDEM_RUN_FORBID)
  if(DEFINED ${var})
    string(REPLACE "|" ";" ${var} "${${var}}")
  endif()
endforeach()

# Runs a command, prints what it printed, and stops on failure unless OUTPUT/RESULT are asked for.
function(step what)
  cmake_parse_arguments(S "" "OUTPUT;RESULT;WORKING_DIRECTORY" "COMMAND" ${ARGN})
  if(NOT S_WORKING_DIRECTORY)
    set(S_WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  endif()
  execute_process(COMMAND ${S_COMMAND} WORKING_DIRECTORY "${S_WORKING_DIRECTORY}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("---- ${what}\n${out}")
  if(S_RESULT)
    set(${S_RESULT} "${rc}" PARENT_SCOPE)
    set(${S_OUTPUT} "${out}" PARENT_SCOPE)
  elseif(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}): ${S_COMMAND}")
  else()
    set(${S_OUTPUT} "${out}" PARENT_SCOPE)
  endif()
endfunction()

if(IDEM_INSTALL_FROM)
  file(REMOVE_RECURSE "${IDEM_INSTALL_PREFIX}")
  step("cmake --install" COMMAND "${IDEM_CMAKE_COMMAND}" --install "${IDEM_INSTALL_FROM}" --prefix "${IDEM_INSTALL_PREFIX}")
  foreach(f include/idem/idem.hpp include/idem/guard.hpp include/idem/detail/table/record_table.hpp)
    if(NOT EXISTS "${IDEM_INSTALL_PREFIX}/${f}")
      message(FATAL_ERROR "the install did not put ${f} under ${IDEM_INSTALL_PREFIX}")
    endif()
  endforeach()
endif()
if(NOT IDEM_CONSUMER_SOURCE)
  return()
endif()

file(REMOVE_RECURSE "${IDEM_CONSUMER_BINARY}")
file(MAKE_DIRECTORY "${IDEM_CONSUMER_BINARY}")
set(configure_args -S "${IDEM_CONSUMER_SOURCE}" -B "${IDEM_CONSUMER_BINARY}"
  "-DCMAKE_CXX_COMPILER=${IDEM_CXX_COMPILER}")
# Reuse Ninja when the parent build uses it; otherwise let CMake pick its default generator.
if(IDEM_GENERATOR MATCHES "Ninja")
  list(APPEND configure_args -G "${IDEM_GENERATOR}")
  if(IDEM_MAKE_PROGRAM)
    list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${IDEM_MAKE_PROGRAM}")
  endif()
endif()
if(IDEM_PREFIX)
  # Only the install prefix: the consumer must not find idem through the build tree.
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${IDEM_PREFIX}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
endif()
if(IDEM_SOURCE_DIR)
  list(APPEND configure_args "-DIDEM_SOURCE_DIR=${IDEM_SOURCE_DIR}")
endif()
if(IDEM_COMPONENTS)
  string(REPLACE ";" "," components "${IDEM_COMPONENTS}")  # a ';' would split the argument
  list(APPEND configure_args "-DIDEM_CONSUMER_COMPONENTS=${components}")
endif()

set(configure_env "")
if(DEFINED IDEM_VIEW)
  if(NOT "sqlite" IN_LIST IDEM_VIEW)
    list(APPEND configure_args -DCMAKE_DISABLE_FIND_PACKAGE_SQLite3=ON)
  endif()
  if(NOT "rocksdb" IN_LIST IDEM_VIEW)
    list(APPEND configure_args -DCMAKE_DISABLE_FIND_PACKAGE_RocksDB=ON)
  endif()
  if(NOT "postgres" IN_LIST IDEM_VIEW OR NOT "mysql" IN_LIST IDEM_VIEW)
    # pkg-config is there with only the .pc files of the view's libraries: libpqxx.pc without
    # libpqxx-dev missing, libmariadb.pc without libmariadb-dev missing.
    set(pcdir "${IDEM_CONSUMER_BINARY}-pkgconfig")
    file(REMOVE_RECURSE "${pcdir}")
    file(MAKE_DIRECTORY "${pcdir}")
    foreach(pair "postgres=libpqxx" "mysql=libmariadb")
      string(REPLACE "=" ";" pair "${pair}")
      list(GET pair 0 lib)
      list(GET pair 1 pc)
      if(lib IN_LIST IDEM_VIEW)
        execute_process(COMMAND pkg-config --variable pcfiledir ${pc} OUTPUT_VARIABLE pcfrom
                        OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
        if(NOT rc EQUAL 0)
          message(FATAL_ERROR "the view has ${lib}, but pkg-config finds no ${pc}.pc on this machine")
        endif()
        file(CREATE_LINK "${pcfrom}/${pc}.pc" "${pcdir}/${pc}.pc" SYMBOLIC)
      endif()
    endforeach()
    list(APPEND configure_env "PKG_CONFIG_LIBDIR=${pcdir}" "PKG_CONFIG_PATH=")
  endif()
  message(STATUS "machine view: has '${IDEM_VIEW}'; configure with ${configure_env}")
endif()

if(IDEM_EXPECT_CONFIGURE_ERROR)
  step("configure ${IDEM_CONSUMER_SOURCE} (must fail)"
    COMMAND "${IDEM_CMAKE_COMMAND}" -E env ${configure_env} "${IDEM_CMAKE_COMMAND}" ${configure_args}
    RESULT rc OUTPUT out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "the configure step succeeded; it had to fail")
  endif()
  foreach(expected IN LISTS IDEM_EXPECT_CONFIGURE_ERROR)
    string(FIND "${out}" "${expected}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the configure step failed, but its output does not say '${expected}'")
    endif()
  endforeach()
  return()
endif()

step("configure ${IDEM_CONSUMER_SOURCE}"
  COMMAND "${IDEM_CMAKE_COMMAND}" -E env ${configure_env} "${IDEM_CMAKE_COMMAND}" ${configure_args})
step("build" COMMAND "${IDEM_CMAKE_COMMAND}" --build "${IDEM_CONSUMER_BINARY}")
find_program(consumer NAMES consumer PATHS "${IDEM_CONSUMER_BINARY}" NO_DEFAULT_PATH NO_CACHE REQUIRED)
step("run ${consumer}" COMMAND "${IDEM_CMAKE_COMMAND}" -E env ${IDEM_RUN_ENV} "${consumer}"
  WORKING_DIRECTORY "${IDEM_CONSUMER_BINARY}" RESULT rc OUTPUT out)
foreach(forbidden IN LISTS IDEM_RUN_FORBID)
  string(FIND "${out}" "${forbidden}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "the consumer's output contains '${forbidden}'")
  endif()
endforeach()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed (${rc})")
endif()
