# scope::global (include/idem/global_guard.hpp) against a real PostgreSQL 15: IDEM_TEST_PG_URI must
# name a server (the tests FAIL when it is unset or unreachable; each test uses a fresh database).
# The restart tests start (and restart) a private server with scripts/lib/postgres.sh (PG_BIN), so
# the shared server never goes down under the tests ctest runs beside them. The test binary starts
# copies of itself as worker processes (argv[1] == "child"), so it has its own main().
# Included from tests/CMakeLists.txt when the idem::postgres target exists.
# Label concurrency too: scripts/test reruns it under ThreadSanitizer (the batchers' hand-offs between
# callers and connections, the local table under 100 racing threads, the watchdogs; the child
# processes are the same instrumented binary). About 50 s there, 50 s here (slow).
idem_test(global_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/global_test.cpp NO_MAIN LIBS idem::postgres
          LABELS postgres concurrency slow TIMEOUT 900 PROPERTIES RESOURCE_LOCK private_pg)
target_include_directories(global_test PRIVATE ${PROJECT_SOURCE_DIR}/tools)  # tools/drill/
target_compile_definitions(global_test PRIVATE IDEM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# The same binary with MariaDB as the arbiter (IDEM_GLOBAL_TEST_ARBITER=mysql, IDEM_TEST_MY_URI;
# restarts kill a private MariaDB with SIGKILL). Left out, by the filter: the tests written in
# PostgreSQL's own SQL (a server clock moved by a function on the search path, the in-doubt probes of
# PostgreSQL's single-statement batches, the plans of its completion and renewal statements), the
# PostgreSQL failover pair, and the option checks that need no server. MySQL's in-doubt
# resolution is exercised by the sessions ended while racing and by the restarts.
if(TARGET idem::mysql)
  target_link_libraries(global_test PRIVATE idem::mysql)
  add_test(NAME global_mysql_test COMMAND global_test
           --gtest_filter=-Global.PruneJudgesTheWindowOnTheServersClock:Global.InDoubtProbe*:Global.CompletionsAndRenewals*:Global.Failover*:GlobalOptions.*)
  # Not labelled concurrency: scripts/test rebuilds that label's tests under ThreadSanitizer by target
  # name, and this one has none of its own; the batchers' threads are the ones global_test covers.
  set_tests_properties(global_mysql_test PROPERTIES ENVIRONMENT IDEM_GLOBAL_TEST_ARBITER=mysql
                       LABELS "mysql;slow" TIMEOUT 900 RESOURCE_LOCK private_mysql)
endif()

# Ordered versions (options.ordered_versions) in scope::global: two guards as two nodes, one batch,
# a latch race across both, a restart. Uses IDEM_TEST_PG_URI only (fresh database per test).
idem_test(global_version_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/global_version_test.cpp LIBS idem::postgres
          LABELS postgres concurrency TIMEOUT 300)

# Response payloads in scope::global: two guards as two nodes, exact bytes (NUL, 0xFF, invalid
# UTF-8) replayed by begin/begin_wait/typed run, over-maximum refusals, a claim resetting the payload,
# a restart, a database from before payloads, racing runs on both nodes (a latch). Uses
# IDEM_TEST_PG_URI only (fresh database per test).
idem_test(global_payload_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/global_payload_test.cpp LIBS idem::postgres
          LABELS postgres concurrency TIMEOUT 300)
