// mysql_store_test: the MySQL/MariaDB store under the faults the other stores were drilled with,
// each on a MariaDB of the test's own (tests/support/private_mysql.hpp) where it kills, stops or
// reconfigures the server:
//   * the server SIGKILLed and restarted under a sync durable guard (the shared crash drill);
//   * the server stopped (SIGSTOP): every call returns within the deadline as store_unavailable
//     or commit_unknown, and committed() decides the batch once the server runs again;
//   * the session killed (KILL CONNECTION) right before COMMIT: commit_unknown, resolved exactly;
//   * a lock wait past the deadline (another session holds the record): the batch is undone and
//     answered store_unavailable; the same batch id commits afterwards; likewise a deadlock whose
//     victim is the batch;
//   * a read-only server: store_unavailable naming it, nothing written; writes resume after;
//   * durability: sync mode refuses innodb_flush_log_at_trx_commit=2 at open, and a batch
//     commits nothing while it is 2 afterwards;
//   * a row larger than max_allowed_packet: rejected_row naming the key; a batch larger than the
//     packet (rows that fit) commits whole over several round trips;
//   * a full disk (the data directory on a small tmpfs, filled): batches fail, none that committed
//     is lost, the failed one is decided by committed(), writing resumes once there is room;
//   * a malformed URI: invalid_argument naming the rule.
#include <idem/stores/mysql_store.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/my_database.hpp"
#include "support/private_mysql.hpp"
#include "support/server_crash_drill.hpp"
#include "support/store_fixtures.hpp"

namespace {

using namespace std::chrono_literals;
using idem::errc;
using idem::record_state;
using idem_test::row;

constexpr std::int64_t T0 = 1'700'000'000'000;

std::vector<idem::store_row> claim_batch(const std::string& prefix, int n, std::size_t payload = 0) {
    std::vector<idem::store_row> rows;
    for (int i = 0; i < n; ++i) {
        idem::store_row r = row({.key = prefix + std::to_string(i) + "_PAY_v1", .fence = 7, .at_ms = T0}, 0);
        rows.push_back(r);
    }
    (void)payload;
    idem_test::sort_like_flusher(rows);
    return rows;
}

/// Runs SQL on the private server as its test user ("" or the server's message).
using idem_test::my_exec;
const auto admin = [](const std::string& uri, const std::string& sql, const idem::detail::my::row_fn& on_row = {}) {
    return my_exec(uri, sql, on_row);
};

#define IDEM_PRIVATE_MYSQL(srv)   \
    idem_test::private_mysql srv; \
    ASSERT_FALSE(srv.uri().empty()) << "cannot start the test's own MariaDB with scripts/lib/mariadb.sh"

TEST(MysqlServerCrash, FlusherRidesThroughAServerKillAndNothingAcknowledgedIsLost) {
    IDEM_PRIVATE_MYSQL(srv);
    idem_test::server_crash_drill(srv, [&] { return std::make_unique<idem::mysql_store>(srv.uri(), 2s); });
}

TEST(MysqlStore, AStoppedServerAnswersWithinTheDeadlineAndTheBatchIsDecidedAfter) {
    IDEM_PRIVATE_MYSQL(srv);
    idem::mysql_store s(srv.uri(), 1s);
    s.apply(claim_batch("A", 3), 1);
    ASSERT_TRUE(srv.signal_server(SIGSTOP));
    bool unknown = false;
    try {
        s.apply(claim_batch("B", 3), 2);
        ADD_FAILURE() << "a batch committed on a stopped server";
    } catch (const idem::commit_unknown& e) {
        unknown = true;
        EXPECT_NE(std::string(e.what()).find("committed(batch_id)"), std::string::npos) << e.what();
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::store_unavailable) << e.what();
    }
    // Reads too are bounded.
    try {
        (void)s.get("A0_PAY_v1");
        ADD_FAILURE() << "a read answered from a stopped server";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::store_unavailable) << e.what();
    }
    ASSERT_TRUE(srv.signal_server(SIGCONT));
    // The server decides: the batch's COMMIT was sent (unknown) but the stopped server never ran
    // it; either way committed() now answers from the server, and agrees with the rows.
    const bool done = s.committed(2);
    EXPECT_EQ(s.get("B0_PAY_v1").has_value(), done) << "committed() disagrees with the records";
    if (!done) s.apply(claim_batch("B", 3), 2);
    EXPECT_TRUE(s.committed(2));
    EXPECT_EQ(s.get("B2_PAY_v1")->state, record_state::processing);
    std::printf("[ idem    ] the stopped server's batch was %s\n", unknown ? "in doubt" : "refused before COMMIT");
}

TEST(MysqlStore, ASessionKilledBeforeCommitIsInDoubtAndResolvedExactly) {
    IDEM_PRIVATE_MYSQL(srv);
    idem::mysql_store s(srv.uri(), 2s);
    s.apply(claim_batch("A", 2), 1);
    const unsigned long victim = s.session_id();
    ASSERT_NE(victim, 0u);
    s.set_before_commit_hook_for_testing(
        [&] { ASSERT_EQ(admin(srv.uri(), "KILL CONNECTION " + std::to_string(victim)), ""); });
    EXPECT_THROW(s.apply(claim_batch("B", 2), 2), idem::commit_unknown);
    s.set_before_commit_hook_for_testing({});
    EXPECT_FALSE(s.committed(2)) << "the killed session's batch cannot have committed";
    EXPECT_FALSE(s.get("B0_PAY_v1").has_value());
    s.apply(claim_batch("B", 2), 2);
    EXPECT_TRUE(s.committed(2));
    // A batch id commits once.
    try {
        s.apply(claim_batch("C", 1), 2);
        ADD_FAILURE() << "batch id 2 committed twice";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::store_error) << e.what();
        EXPECT_NE(std::string(e.what()).find("commits once"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(s.get("C0_PAY_v1").has_value());
}

TEST(MysqlStore, ALockWaitPastTheDeadlineUndoesTheBatchWhichCommitsLater) {
    IDEM_PRIVATE_MYSQL(srv);
    idem::mysql_store s(srv.uri(), 1s);
    s.apply(claim_batch("A", 2), 1);
    // Another session holds A0's row.
    namespace my = idem::detail::my;
    my::session holder;
    holder.open(my::parse_uri(srv.uri()), 10s);
    holder.run("START TRANSACTION; SELECT * FROM idempotent_record WHERE idempotent_key = 'A0_PAY_v1' FOR UPDATE");
    auto rows = claim_batch("A", 2);
    for (auto& r : rows) r.t.fence = 8;
    try {
        s.apply(rows, 2);
        ADD_FAILURE() << "a batch committed over a held row lock";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::store_unavailable) << e.what();
        EXPECT_NE(std::string(e.what()).find("Lock wait timeout"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(s.committed(2));
    EXPECT_EQ(s.get("A1_PAY_v1")->fence, 7u) << "a part of the undone batch stayed";
    holder.run("ROLLBACK");
    s.apply(rows, 2);
    EXPECT_EQ(s.get("A0_PAY_v1")->fence, 8u);
}

TEST(MysqlStore, ADeadlockUndoesTheBatchWhichCommitsWhenRetried) {
    IDEM_PRIVATE_MYSQL(srv);
    idem::mysql_store s(srv.uri(), 5s);
    s.apply(claim_batch("A", 2), 1);  // A0 and A1 exist
    // Another session holds A1 and has written many rows (InnoDB undoes the transaction that wrote
    // fewer, so the batch is the victim); the batch locks A0, then waits for A1; the other session
    // then asks for A0: a deadlock.
    namespace my = idem::detail::my;
    my::session other;
    other.open(my::parse_uri(srv.uri()), 30s);
    other.run(
        "CREATE TABLE ballast (n INT PRIMARY KEY) ENGINE=InnoDB; START TRANSACTION; INSERT INTO ballast "
        "SELECT seq FROM seq_1_to_5000; SELECT * FROM idempotent_record WHERE idempotent_key = 'A1_PAY_v1' FOR UPDATE");
    auto rows = claim_batch("A", 2);
    for (auto& r : rows) r.t.fence = 8;
    std::string failure;
    std::thread batch([&] {
        try {
            s.apply(rows, 2);
        } catch (const idem::error& e) {
            failure = e.what();
            EXPECT_EQ(e.code(), errc::store_unavailable) << e.what();
        }
    });
    // Wait (bounded) until the batch waits for A1's lock: a condition on the server, not a sleep.
    std::string poll_error;
    const bool waiting = idem_test::wait_for(
        [&] {
            bool w = false;
            poll_error = admin(srv.uri(),
                               "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = "
                               "'INNODB_ROW_LOCK_CURRENT_WAITS'",
                               [&](int, my::row_view r) { w = r[0] != "0"; });
            return w;
        },
        20s);
    std::string other_error;
    if (waiting) {
        try {
            other.run("SELECT * FROM idempotent_record WHERE idempotent_key = 'A0_PAY_v1' FOR UPDATE");
        } catch (const my::failure& f) {
            other_error = f.text;
        }
    }
    try {
        other.run("ROLLBACK");
    } catch (...) {
    }
    batch.join();
    ASSERT_TRUE(waiting) << "the batch never waited for the other session's lock (the batch: " << failure
                         << "; the poll: " << poll_error << ")";
    ASSERT_FALSE(failure.empty()) << "the batch was not the deadlock's victim (the other session got: " << other_error
                                  << ")";
    EXPECT_NE(failure.find("Deadlock"), std::string::npos) << failure;
    EXPECT_FALSE(s.committed(2));
    EXPECT_EQ(s.get("A0_PAY_v1")->fence, 7u) << "a part of the undone batch stayed";
    s.apply(rows, 2);  // the flusher's retry
    EXPECT_EQ(s.get("A0_PAY_v1")->fence, 8u);
    EXPECT_EQ(s.get("A1_PAY_v1")->fence, 8u);
}

TEST(MysqlStore, AReadOnlyServerRefusesWritesNamingItAndWritesResumeAfter) {
    IDEM_PRIVATE_MYSQL(srv);
    // A user without READ ONLY ADMIN (the test user has every privilege, which bypasses read_only).
    ASSERT_EQ(admin(srv.uri(), "CREATE USER 'app'@'127.0.0.1'; GRANT ALL PRIVILEGES ON idem.* TO 'app'@'127.0.0.1'"), "");
    const std::string app = "mysql://app@" + srv.uri().substr(srv.uri().find('@') + 1);
    idem::mysql_store s(app, 2s);
    s.apply(claim_batch("A", 1), 1);
    ASSERT_EQ(admin(srv.uri(), "SET GLOBAL read_only = 1"), "");
    try {
        s.apply(claim_batch("B", 1), 2);
        ADD_FAILURE() << "a read-only server took a batch";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::store_unavailable) << e.what();
        EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.get("A0_PAY_v1").has_value()) << "reads go on on a read-only server";
    ASSERT_EQ(admin(srv.uri(), "SET GLOBAL read_only = 0"), "");
    EXPECT_FALSE(s.committed(2));
    s.apply(claim_batch("B", 1), 2);
    EXPECT_TRUE(s.get("B0_PAY_v1").has_value());
}

TEST(MysqlStore, SyncModeRefusesAServerThatWouldLoseACommit) {
    IDEM_PRIVATE_MYSQL(srv);
    idem::mysql_store s(srv.uri(), 2s);
    ASSERT_EQ(admin(srv.uri(), "SET GLOBAL innodb_flush_log_at_trx_commit = 2"), "");
    try {
        s.check_sync_durability();
        ADD_FAILURE() << "sync mode accepted innodb_flush_log_at_trx_commit = 2";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
        EXPECT_NE(std::string(e.what()).find("innodb_flush_log_at_trx_commit is 2"), std::string::npos) << e.what();
    }
    ASSERT_EQ(admin(srv.uri(), "SET GLOBAL innodb_flush_log_at_trx_commit = 1"), "");
    s.check_sync_durability();
    s.apply(claim_batch("A", 1), 1);
    // Weakened behind the running store: the batch's own check refuses before COMMIT.
    ASSERT_EQ(admin(srv.uri(), "SET GLOBAL innodb_flush_log_at_trx_commit = 2"), "");
    try {
        s.apply(claim_batch("B", 1), 2);
        ADD_FAILURE() << "a batch committed while the server would lose it";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::store_unavailable) << e.what();
        EXPECT_NE(std::string(e.what()).find("innodb_flush_log_at_trx_commit"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(s.committed(2));
    EXPECT_FALSE(s.get("B0_PAY_v1").has_value());
    ASSERT_EQ(admin(srv.uri(), "SET GLOBAL innodb_flush_log_at_trx_commit = 1"), "");
    s.apply(claim_batch("B", 1), 2);
    EXPECT_TRUE(s.committed(2));
}

TEST(MysqlStore, ARowLargerThanThePacketIsRejectedAndALargeBatchCommitsWhole) {
    IDEM_PRIVATE_MYSQL(srv);
    ASSERT_EQ(admin(srv.uri(), "SET GLOBAL max_allowed_packet = 1048576"), "");
    idem::mysql_store s(srv.uri(), 5s);
    // 24 completions of 100 KiB each: 4.8 MB of hex, several round trips of at most 1 MiB.
    std::vector<std::string> payloads;
    std::vector<idem::store_row> rows;
    for (int i = 0; i < 24; ++i) payloads.push_back(std::string(100 * 1024, static_cast<char>('a' + i)));
    for (int i = 0; i < 24; ++i) {
        idem::store_row r = row({.key = "P" + std::to_string(i) + "_PAY_v1",
                                 .to = record_state::succeeded,
                                 .cause = idem::transition_cause::succeed,
                                 .fence = 3,
                                 .outcome = static_cast<std::uint64_t>(i),
                                 .at_ms = T0},
                                0);
        r.t.payload = payloads[static_cast<std::size_t>(i)];
        rows.push_back(r);
    }
    idem_test::sort_like_flusher(rows);
    s.apply(rows, 1);
    for (int i = 0; i < 24; ++i) {
        const auto rec = s.get("P" + std::to_string(i) + "_PAY_v1");
        ASSERT_TRUE(rec.has_value()) << i;
        EXPECT_EQ(rec->payload, payloads[static_cast<std::size_t>(i)]) << i;
    }
    // One row of 1 MiB (the hard maximum) needs 2 MiB of hex: no statement can carry it.
    const std::string big(1 << 20, 'z');
    idem::store_row r = row({.key = "BIG_PAY_v1", .to = record_state::succeeded, .fence = 3, .at_ms = T0}, 0);
    r.t.payload = big;
    try {
        s.apply(std::vector<idem::store_row>{r}, 2);
        ADD_FAILURE() << "a row larger than max_allowed_packet was taken";
    } catch (const idem::rejected_row& e) {
        EXPECT_NE(std::string(e.what()).find("BIG_PAY_v1"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("max_allowed_packet"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(s.committed(2));
}

TEST(MysqlStore, AFullDiskRefusesBatchesAndLosesNoneThatCommitted) {
    // MariaDB's data directory on a 160 MiB tmpfs, filled with a ballast file. InnoDB cannot
    // extend its files: the batch fails (a full table, or the server aborts in its rollback, as
    // MariaDB 10.11 does); once the ballast is gone and the server runs again, every batch that
    // was acknowledged is there, and the failed one is decided by committed().
    idem_test::private_mysql srv(160);
    ASSERT_FALSE(srv.uri().empty()) << "cannot start the test's own MariaDB on a tmpfs (root needed)";
    const std::string fill(100 * 1024, 'f');
    const auto batch = [&](int id) {
        std::vector<idem::store_row> rows;
        for (int i = 0; i < 10; ++i) {
            idem::store_row r = row({.key = "D" + std::to_string(id) + "X" + std::to_string(i) + "_PAY_v1",
                                     .to = record_state::succeeded,
                                     .cause = idem::transition_cause::succeed,
                                     .fence = 3,
                                     .outcome = static_cast<std::uint64_t>(id),
                                     .at_ms = T0},
                                    0);
            r.t.payload = fill;
            rows.push_back(r);
        }
        idem_test::sort_like_flusher(rows);
        return rows;
    };
    std::vector<int> acked;
    int failed = 0;
    {
        idem::mysql_store s(srv.uri(), 2s);
        s.apply(batch(1), 1);
        acked.push_back(1);
        ASSERT_TRUE(srv.fill_disk());
        for (int id = 2; id <= 300 && failed == 0; ++id) {
            try {
                s.apply(batch(id), static_cast<std::uint64_t>(id));
                acked.push_back(id);
            } catch (const idem::error& e) {
                failed = id;
                EXPECT_TRUE(e.code() == errc::store_unavailable || e.code() == errc::store_error) << e.what();
                std::printf("[ idem    ] batch %d on a full disk: %s\n", id, e.what());
            }
        }
    }
    ASSERT_NE(failed, 0) << "300 batches of 1 MB committed on a full 160 MiB disk";
    ASSERT_TRUE(srv.free_disk());
    if (!srv.alive()) {
        ASSERT_TRUE(srv.resume()) << "MariaDB did not start again once the disk had room";
    }
    idem::mysql_store check(srv.uri(), 10s);
    for (const int id : acked) {
        EXPECT_TRUE(check.committed(static_cast<std::uint64_t>(id))) << "acknowledged batch " << id << " lost";
        const auto rec = check.get("D" + std::to_string(id) + "X9_PAY_v1");
        ASSERT_TRUE(rec.has_value()) << "acknowledged batch " << id << " lost its records";
        EXPECT_EQ(rec->payload, fill) << id;
    }
    EXPECT_EQ(check.committed(static_cast<std::uint64_t>(failed)),
              check.get("D" + std::to_string(failed) + "X0_PAY_v1").has_value())
        << "the failed batch is half there";
    // Writing resumes.
    check.apply(batch(1000), 1000);
    EXPECT_TRUE(check.committed(1000));
    std::printf("[ idem    ] %zu batches acknowledged before the disk was full\n", acked.size());
}

TEST(MysqlStore, ADatabaseOfANewerSchemaVersionIsRefusedNotWrittenOver) {
    idem_test::my_database db;
    std::string why;
    ASSERT_TRUE(db.create(&why)) << why;
    { idem::mysql_store first(db.uri()); }
    ASSERT_EQ(db.exec("UPDATE idem_schema SET version = 2"), "");
    try {
        idem::mysql_store s(db.uri());
        ADD_FAILURE() << "a database of schema version 2 was opened by a library that reads version 1";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::store_error) << e.what();
        EXPECT_NE(std::string(e.what()).find("version 2"), std::string::npos) << e.what();
    }
    std::string version;
    ASSERT_EQ(db.exec("SELECT version FROM idem_schema", [&](int, idem::detail::my::row_view r) { version = r[0]; }), "");
    EXPECT_EQ(version, "2") << "the refused open wrote over the schema";
}

TEST(MysqlStore, AMalformedUriIsRefusedNamingTheRule) {
    const auto refused = [](const std::string& uri, const std::string& rule) {
        try {
            idem::mysql_store s(uri);
            ADD_FAILURE() << uri << " was accepted";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
            EXPECT_NE(std::string(e.what()).find(rule), std::string::npos) << uri << ": " << e.what();
            EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << "the password leaked: " << e.what();
        }
    };
    refused("postgresql://idem@127.0.0.1/idem", "scheme");
    refused("mysql://idem:secret@127.0.0.1:3306", "no database");
    refused("mysql://127.0.0.1:3306/idem", "no USER@");
    refused("mysql://idem:secret@127.0.0.1:70000/idem", "port '70000'");
    refused("mysql://idem@:3306/idem", "host is empty");
    EXPECT_EQ(idem::detail::my::redact("mysql://idem:secret@db:3306/pay"), "mysql://idem@db:3306/pay");
}

}  // namespace
