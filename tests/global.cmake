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
