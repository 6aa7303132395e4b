// regions_retry_test: detail::regions::retry_deadlocks, the retry of a replica-guard transaction that
// PostgreSQL chose as a deadlock's victim (SQLSTATE 40P01; found by takeover_test under load:
// rebuild_region's DROP TRIGGER against a writer of the same table). No server: the transaction is
// a function that throws what libpqxx throws.
//
//   AVictimRunsAgainUntilItCommits     two deadlocks, then the third run commits: 3 runs, no error
//   AVictimEveryTimeIsThrownAfterTheLastRun  5 runs, then the deadlock reaches the caller
//   OtherErrorsAreNotRetried           a lock timeout or any other error: 1 run, thrown as it is
#include <idem/detail/regions/names.hpp>

#include <gtest/gtest.h>

#include <pqxx/except>

#include <stdexcept>

namespace {

using idem::detail::regions::retry_deadlocks;

TEST(RetryDeadlocks, AVictimRunsAgainUntilItCommits) {
    int runs = 0;
    bool committed = false;
    retry_deadlocks([&] {
        if (++runs < 3) throw pqxx::deadlock_detected("ERROR:  deadlock detected");
        committed = true;
    });
    EXPECT_EQ(runs, 3);
    EXPECT_TRUE(committed);
}

TEST(RetryDeadlocks, AVictimEveryTimeIsThrownAfterTheLastRun) {
    int runs = 0;
    EXPECT_THROW(retry_deadlocks([&] {
                     ++runs;
                     throw pqxx::deadlock_detected("ERROR:  deadlock detected");
                 }),
                 pqxx::deadlock_detected);
    EXPECT_EQ(runs, 5);
    runs = 0;
    EXPECT_THROW(retry_deadlocks(
                     [&] {
                         ++runs;
                         throw pqxx::deadlock_detected("ERROR:  deadlock detected");
                     },
                     2),
                 pqxx::deadlock_detected);
    EXPECT_EQ(runs, 2);
}

TEST(RetryDeadlocks, OtherErrorsAreNotRetried) {
    int runs = 0;
    EXPECT_THROW(retry_deadlocks([&] {
                     ++runs;
                     throw pqxx::sql_error("ERROR:  canceling statement due to lock timeout", "DROP TRIGGER", "55P03");
                 }),
                 pqxx::sql_error);
    EXPECT_EQ(runs, 1);
    runs = 0;
    EXPECT_THROW(retry_deadlocks([&] {
                     ++runs;
                     throw std::runtime_error("connection lost");
                 }),
                 std::runtime_error);
    EXPECT_EQ(runs, 1);
}

}  // namespace
