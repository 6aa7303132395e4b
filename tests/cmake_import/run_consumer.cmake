# run_consumer.cmake: configure, build and run one consumer project of idem (cmake -P script).
#
#   IDEM_CONSUMER_SOURCE / IDEM_CONSUMER_BINARY  the consumer project and a scratch build dir
#   IDEM_INSTALL_FROM / IDEM_INSTALL_PREFIX      optional: `cmake --install` this build tree into
#                                                this prefix first, and point the consumer at it
#   IDEM_SOURCE_DIR                              optional: the idem source tree (add_subdirectory)
#   IDEM_CMAKE_COMMAND, IDEM_GENERATOR, IDEM_MAKE_PROGRAM, IDEM_CXX_COMPILER  from the parent build
cmake_minimum_required(VERSION 3.20)

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE "${IDEM_CONSUMER_BINARY}")
set(configure_args -S "${IDEM_CONSUMER_SOURCE}" -B "${IDEM_CONSUMER_BINARY}"
  "-DCMAKE_CXX_COMPILER=${IDEM_CXX_COMPILER}")
# Reuse Ninja when the parent build uses it; otherwise let CMake pick its default generator.
if(IDEM_GENERATOR MATCHES "Ninja")
  list(APPEND configure_args -G "${IDEM_GENERATOR}")
  if(IDEM_MAKE_PROGRAM)
    list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${IDEM_MAKE_PROGRAM}")
  endif()
endif()

if(IDEM_INSTALL_FROM)
  file(REMOVE_RECURSE "${IDEM_INSTALL_PREFIX}")
  step("cmake --install" "${IDEM_CMAKE_COMMAND}" --install "${IDEM_INSTALL_FROM}" --prefix "${IDEM_INSTALL_PREFIX}")
  foreach(f include/idem/idem.hpp include/idem/guard.hpp include/idem/detail/engine.hpp)
    if(NOT EXISTS "${IDEM_INSTALL_PREFIX}/${f}")
      message(FATAL_ERROR "the install did not put ${f} under ${IDEM_INSTALL_PREFIX}")
    endif()
  endforeach()
  # Only the install prefix: the consumer must not find idem through the build tree.
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${IDEM_INSTALL_PREFIX}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
endif()
if(IDEM_SOURCE_DIR)
  list(APPEND configure_args "-DIDEM_SOURCE_DIR=${IDEM_SOURCE_DIR}")
endif()

step("configure ${IDEM_CONSUMER_SOURCE}" "${IDEM_CMAKE_COMMAND}" ${configure_args})
step("build" "${IDEM_CMAKE_COMMAND}" --build "${IDEM_CONSUMER_BINARY}")
find_program(consumer NAMES consumer PATHS "${IDEM_CONSUMER_BINARY}" NO_DEFAULT_PATH REQUIRED)
step("run ${consumer}" "${consumer}")
