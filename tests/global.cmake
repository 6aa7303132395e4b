# scope::global (include/idem/global_guard.hpp) against a real PostgreSQL 15: IDEM_TEST_PG_URI must
# name a server (the tests FAIL when it is unset or unreachable; each test uses a fresh database).
# The restart tests start (and restart) a private server with scripts/lib/postgres.sh (PG_BIN), so
# the shared server never goes down under the tests ctest runs beside them. The test binary starts
# copies of itself as worker processes (argv[1] == "child"), so it has its own main().
# Included from tests/CMakeLists.txt when the idem::postgres target exists.
add_executable(global_test ${CMAKE_CURRENT_LIST_DIR}/global_test.cpp)
target_link_libraries(global_test PRIVATE idem::idem idem::postgres GTest::gtest)
target_include_directories(global_test PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR}/tools)  # tools/drill/
target_compile_options(global_test PRIVATE -Wall -Wextra -Werror=return-type)
target_compile_definitions(global_test PRIVATE IDEM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_test(NAME global_test COMMAND global_test)
# Label concurrency too: scripts/test reruns it under ThreadSanitizer (the batchers' hand-offs between
# callers and connections, the local table under 100 racing threads, the watchdogs; the child
# processes are the same instrumented binary). About 50 s there, 50 s here.
set_tests_properties(global_test PROPERTIES LABELS "postgres;concurrency" TIMEOUT 900 RESOURCE_LOCK private_pg)

# Ordered versions (options.ordered_versions) in scope::global: two guards as two nodes, one batch,
# a latch race across both, a restart. Uses IDEM_TEST_PG_URI only (fresh database per test).
add_executable(global_version_test ${CMAKE_CURRENT_LIST_DIR}/global_version_test.cpp)
target_link_libraries(global_version_test PRIVATE idem::idem idem::postgres GTest::gtest GTest::gtest_main)
target_compile_options(global_version_test PRIVATE -Wall -Wextra -Werror=return-type)
add_test(NAME global_version_test COMMAND global_version_test)
set_tests_properties(global_version_test PROPERTIES LABELS "postgres;concurrency" TIMEOUT 300)

# Response payloads in scope::global: two guards as two nodes, exact bytes (NUL, 0xFF, invalid
# UTF-8) replayed by begin/begin_wait/typed run, over-maximum refusals, a claim resetting the payload,
# a restart, a database from before payloads, racing runs on both nodes (a latch). Uses
# IDEM_TEST_PG_URI only (fresh database per test).
add_executable(global_payload_test ${CMAKE_CURRENT_LIST_DIR}/global_payload_test.cpp)
target_link_libraries(global_payload_test PRIVATE idem::idem idem::postgres GTest::gtest GTest::gtest_main)
target_compile_options(global_payload_test PRIVATE -Wall -Wextra -Werror=return-type)
add_test(NAME global_payload_test COMMAND global_payload_test)
set_tests_properties(global_payload_test PROPERTIES LABELS "postgres;concurrency" TIMEOUT 300)
