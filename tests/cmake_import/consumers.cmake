# Packaging: consumers of an installed idem (find_package, by component), of the source tree
# (add_subdirectory), and a ThreadSanitizer user. Included from tests/CMakeLists.txt when
# IDEM_INSTALL is on.
#
# cmake_import_install (a fixture) installs this build tree into a fresh prefix; each consumer test
# then configures, builds and runs a small project against that prefix, in a fresh directory, with
# the same compiler and (when it is Ninja) the same generator. The machine view (IDEM_VIEW, see
# run_consumer.cmake) hides the store libraries the consumer did not ask for, so a package that
# still required one of them fails the test.
set(_idem_import_dir ${CMAKE_CURRENT_BINARY_DIR}/cmake_import)
set(_idem_import_src ${CMAKE_CURRENT_LIST_DIR})
set(_idem_import_prefix ${_idem_import_dir}/prefix)
set(_idem_import_args
  -DIDEM_CMAKE_COMMAND=${CMAKE_COMMAND}
  -DIDEM_GENERATOR=${CMAKE_GENERATOR}
  -DIDEM_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}
  -DIDEM_CXX_COMPILER=${CMAKE_CXX_COMPILER})

idem_test(cmake_import_install
  COMMAND ${CMAKE_COMMAND} ${_idem_import_args}
    -DIDEM_INSTALL_FROM=${PROJECT_BINARY_DIR} -DIDEM_INSTALL_PREFIX=${_idem_import_prefix}
    -P ${_idem_import_src}/run_consumer.cmake
  LABELS packaging PROPERTIES FIXTURES_SETUP idem_installed)

# idem_consumer_test(NAME SOURCE <dir> [VIEW libs...] [COMPONENTS c...] [EXPECT_CONFIGURE_ERROR s...]
#                    [RUN_ENV NAME=VALUE...] [RUN_FORBID s...] [LABELS l...])
# Each configures, builds and runs a project: those over about 30 s on the CI machine are LABELS slow.
function(idem_consumer_test name)
  cmake_parse_arguments(C "" "SOURCE" "VIEW;COMPONENTS;EXPECT_CONFIGURE_ERROR;RUN_ENV;RUN_FORBID;LABELS" ${ARGN})
  set(args ${_idem_import_args}
    -DIDEM_CONSUMER_SOURCE=${_idem_import_src}/${C_SOURCE}
    -DIDEM_CONSUMER_BINARY=${_idem_import_dir}/${name})
  if(C_SOURCE STREQUAL "add_subdirectory")
    list(APPEND args -DIDEM_SOURCE_DIR=${PROJECT_SOURCE_DIR})
  else()
    list(APPEND args -DIDEM_PREFIX=${_idem_import_prefix})
  endif()
  # An empty VIEW is a machine with none of the store libraries: "none" stands for it.
  if(C_VIEW)
    list(REMOVE_ITEM C_VIEW none)
    string(REPLACE ";" "|" v "${C_VIEW}")
    list(APPEND args "-DIDEM_VIEW=${v}")
  endif()
  foreach(kind COMPONENTS EXPECT_CONFIGURE_ERROR RUN_ENV RUN_FORBID)
    if(C_${kind})
      string(REPLACE ";" "|" v "${C_${kind}}")
      list(APPEND args "-DIDEM_${kind}=${v}")
    endif()
  endforeach()
  set(props "")
  if(NOT C_SOURCE STREQUAL "add_subdirectory")
    set(props PROPERTIES FIXTURES_REQUIRED idem_installed)
  endif()
  idem_test(${name} COMMAND ${CMAKE_COMMAND} ${args} -P ${_idem_import_src}/run_consumer.cmake
            LABELS packaging ${C_LABELS} TIMEOUT 300 ${props})
endfunction()

# The core alone, on a machine with none of the stores' libraries (nor libpqxx.pc).
idem_consumer_test(cmake_import_find_package SOURCE find_package VIEW none)
idem_consumer_test(cmake_import_add_subdirectory SOURCE add_subdirectory VIEW none)
# One component each, on a machine that has only that component's library.
idem_consumer_test(cmake_import_sqlite SOURCE find_package COMPONENTS sqlite VIEW sqlite)
idem_consumer_test(cmake_import_postgres SOURCE find_package COMPONENTS postgres VIEW postgres LABELS slow)
set(_idem_all sqlite postgres)
if(TARGET idem::rocksdb)
  idem_consumer_test(cmake_import_rocksdb SOURCE find_package COMPONENTS rocksdb VIEW rocksdb)
  list(APPEND _idem_all rocksdb)
endif()
if(TARGET idem::mysql)
  idem_consumer_test(cmake_import_mysql SOURCE find_package COMPONENTS mysql VIEW mysql)
  list(APPEND _idem_all mysql)
endif()
# Every component at once, on this machine as it is.
idem_consumer_test(cmake_import_all_components SOURCE find_package COMPONENTS ${_idem_all} LABELS slow)
# Components whose libraries are missing: find_package fails, naming each and its Debian package.
if(TARGET idem::mysql)
  idem_consumer_test(cmake_import_missing_component SOURCE find_package COMPONENTS sqlite postgres mysql VIEW none
    EXPECT_CONFIGURE_ERROR "component sqlite" "libsqlite3-dev" "component postgres" "libpqxx-dev"
                           "component mysql" "libmariadb-dev")
else()
  idem_consumer_test(cmake_import_missing_component SOURCE find_package COMPONENTS sqlite postgres VIEW none
    EXPECT_CONFIGURE_ERROR "component sqlite" "libsqlite3-dev" "component postgres" "libpqxx-dev")
endif()

# A ThreadSanitizer user: -fsanitize=thread -Wall -Wextra -Werror and nothing from idem (no
# -Wno-tsan, no suppressions: TSAN_OPTIONS is set here, replacing any the caller has), 100 threads
# through a durable SQLite guard, zero reports. Label tsan: scripts/test's main ctest run runs it
# (it builds its own instrumented consumer, so it needs no sanitizer build of idem).
idem_consumer_test(cmake_import_tsan SOURCE tsan VIEW sqlite
  RUN_ENV "TSAN_OPTIONS=halt_on_error=1 exitcode=66 second_deadlock_stack=1"
  RUN_FORBID "WARNING: ThreadSanitizer" LABELS tsan slow)
