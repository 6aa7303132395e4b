// sqlite_fault_test: real disk faults under the SQLite store, in sync mode (where "acknowledged"
// means "committed").
//
//   DiskFull*     the database lives on a 1 MB tmpfs; a durable guard runs payments until the
//                 store reports errors. The error names the file and the disk-full condition
//                 (SQLite's "database or disk is full"); begin/succeed answer store_unavailable,
//                 never OK, for what could not commit; after the tmpfs grows (remount,size=64m)
//                 the flusher resumes and everything acknowledged is in the store.
//   IoError*      the database and its WAL get the immutable attribute (chattr +i: even root
//                 cannot write them), which makes SQLite fail with SQLITE_IOERR_WRITE and, on
//                 reopen, SQLITE_READONLY. Same checks. Also at the store level: apply() names the
//                 file, and after a failed reconnect the next call still says what is wrong.
// These need root (mount, chattr) and an ext4/xfs/btrfs /tmp. They FAIL, never skip, without them.
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <string>

#include <sqlite3.h>
#include <sys/stat.h>
#include <cstdio>

#include "support/store_fixtures.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::durability;
using idem::errc;
using idem::record_state;
using idem_test::verify_clean;
using idem_test::wait_for;

/// Long keys (100 bytes), so a small disk fills after a few hundred payments.
idem::key big_key(std::size_t i) {
    std::string k = "TX" + std::to_string(i) + "_FAULT_v1_";
    k.resize(100, 'p');
    return idem::key(k);
}

/// What the guard acknowledged: claims (fence) and successes (outcome).
struct acked {
    std::map<std::string, std::uint64_t> claims, successes;
    std::size_t refused = 0;  // begin or succeed answered store_unavailable
};

/// Runs payments from `from` until the first store_unavailable (or `to`). Returns the next index.
std::size_t pay_until_refused(idem::durable_guard& g, std::size_t from, std::size_t to, acked& a) {
    std::size_t i = from;
    for (; i < to; ++i) {
        const auto k = big_key(i);
        auto r = g->begin(k);
        if (r.status == begin_status::store_unavailable) {
            ++a.refused;
            EXPECT_FALSE(r.ticket.valid()) << "a claim that could not commit was granted";
            return i + 1;
        }
        EXPECT_EQ(r.status, begin_status::acquired) << k.str();
        if (r.status != begin_status::acquired) return i + 1;
        a.claims[k.str()] = r.fence;
        const std::error_code ec = r.ticket.succeed(i);
        if (ec == errc::store_unavailable) {
            ++a.refused;
            return i + 1;
        }
        EXPECT_FALSE(ec) << k.str() << ": " << ec.message();
        a.successes[k.str()] = i;
    }
    return i;
}

/// The distinct errors the flusher reports over its next `rounds` failures (each retry round is
/// an apply and a reconnect), or until the deadline.
std::set<std::string> collect_errors(idem::durable_guard& g, std::uint64_t rounds = 8,
                                     std::chrono::nanoseconds timeout = 20s) {
    std::set<std::string> seen;
    const std::uint64_t until = g.snapshot().store_errors + rounds;
    wait_for(
        [&] {
            const std::string e = g.last_store_error();
            if (!e.empty()) seen.insert(e);
            return g.snapshot().store_errors >= until;
        },
        timeout);
    return seen;
}

std::string joined(const std::set<std::string>& s) {
    std::string out;
    for (auto& e : s) out += "\n  " + e;
    return out;
}

bool any_contains(const std::set<std::string>& s, const std::string& what) {
    for (auto& e : s)
        if (e.find(what) != std::string::npos) return true;
    return false;
}

/// Everything acknowledged is in the store: successes as SUCCESS with their outcome, claims with
/// at least their fence. Then idem::verify.
void expect_acknowledged_in(const std::string& db, const acked& a) {
    idem::sqlite_store st(db);
    std::size_t bad = 0;
    for (auto& [k, outcome] : a.successes) {
        const auto r = st.get(k);
        if ((!r || r->state != record_state::succeeded || r->outcome != outcome) && ++bad <= 5)
            ADD_FAILURE() << idem::key::printable(k) << ": acknowledged SUCCESS outcome " << outcome << ", the store has "
                          << (r ? std::string(idem::to_string(r->state)) + " outcome " + std::to_string(r->outcome)
                                : std::string("nothing"));
    }
    for (auto& [k, fence] : a.claims) {
        const auto r = st.get(k);
        if ((!r || r->fence < fence) && ++bad <= 5)
            ADD_FAILURE() << idem::key::printable(k) << ": acknowledged claim fence " << fence << " is not in the store";
    }
    EXPECT_EQ(bad, 0u);
    EXPECT_TRUE(verify_clean(st));
}

idem::store_options sync_options() {
    idem::store_options so;
    so.mode = durability::sync;
    so.sync_timeout = 300ms;
    so.max_backoff = 20ms;
    return so;
}

TEST(SqliteFault, DiskFullIsReportedAndNothingAcknowledgedIsLost) {
    idem_test::tmpfs_mount fs("1m");
    ASSERT_TRUE(fs.ok()) << fs.error() << " (this test mounts a 1 MB tmpfs: run it as root)";
    const std::string db = fs.file("idem.db");
    acked a;
    {
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db, true), idem_test::durable_options(1u << 14),
                              sync_options());
        std::size_t next = pay_until_refused(g, 0, 20'000, a);
        ASSERT_EQ(a.refused, 1u) << "1 MB never filled after " << next << " payments";
        std::cout << "[ idem    ] disk full after " << a.successes.size() << " acknowledged payments\n";
        EXPECT_GT(g.snapshot().store_errors, 0u);
        const auto errors = collect_errors(g);
        std::cout << "[ idem    ] errors reported while the disk was full:" << joined(errors) << '\n';
        EXPECT_TRUE(any_contains(errors, "database or disk is full"))
            << "no error names the disk-full condition:" << joined(errors);
        for (auto& e : errors) {
            EXPECT_NE(e.find(db), std::string::npos) << "the error does not name the file: " << e;
            EXPECT_EQ(e.find("misuse"), std::string::npos)
                << "an error reports API misuse instead of the fault (a call on a connection that failed to "
                   "reopen): "
                << e;
        }

        // While the disk is full, a payment is refused, never acknowledged.
        next = pay_until_refused(g, next, next + 5, a);
        EXPECT_EQ(a.refused, 2u);

        // Space comes back: the flusher resumes on its own and new payments commit.
        ASSERT_EQ(fs.resize("64m"), "");
        ASSERT_TRUE(g.flush(30s)) << "the flusher did not resume: " << g.last_store_error();
        const std::size_t before = a.successes.size();
        pay_until_refused(g, next, next + 50, a);
        EXPECT_EQ(a.refused, 2u) << "refused after the disk had space again: " << g.last_store_error();
        EXPECT_EQ(a.successes.size(), before + 50);
        ASSERT_TRUE(g.flush(30s));
    }
    expect_acknowledged_in(db, a);
}

TEST(SqliteFault, IoErrorFromAnUnwritableFileIsReportedAndNothingAcknowledgedIsLost) {
    idem_test::temp_dir dir("idem-fault");
    const std::string db = dir.file("idem.db");
    acked a;
    {
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db, true), idem_test::durable_options(), sync_options());
        std::size_t next = pay_until_refused(g, 0, 30, a);
        ASSERT_EQ(a.successes.size(), 30u);
        for (const char* f : {"", "-wal"})
            ASSERT_EQ(idem_test::set_immutable(db + f, true), "")
                << "cannot set the immutable attribute (needs root and ext4/xfs/btrfs under /tmp)";
        next = pay_until_refused(g, next, next + 30, a);
        ASSERT_EQ(a.refused, 1u) << "the store never failed";
        const auto errors = collect_errors(g);
        std::cout << "[ idem    ] errors reported while the file was unwritable:" << joined(errors) << '\n';
        EXPECT_TRUE(any_contains(errors, "disk I/O error") || any_contains(errors, "readonly"))
            << "no error says what failed:" << joined(errors);
        for (auto& e : errors) {
            EXPECT_NE(e.find(db), std::string::npos) << "the error does not name the file: " << e;
            EXPECT_EQ(e.find("misuse"), std::string::npos)
                << "an error reports API misuse instead of the fault (a call on a connection that failed to "
                   "reopen): "
                << e;
        }
        for (const char* f : {"", "-wal"}) ASSERT_EQ(idem_test::set_immutable(db + f, false), "");
        ASSERT_TRUE(g.flush(30s)) << "the flusher did not resume: " << g.last_store_error();
        const std::size_t before = a.successes.size();
        pay_until_refused(g, next, next + 20, a);
        EXPECT_EQ(a.successes.size(), before + 20) << g.last_store_error();
        ASSERT_TRUE(g.flush(30s));
    }
    expect_acknowledged_in(db, a);
}

// The store itself: each error names the file and the fault, including a call made after a
// reconnect that could not reopen the file (the path became a directory meanwhile).
TEST(SqliteFault, StoreErrorsNameTheFileAndTheFaultAfterAFailedReconnect) {
    idem_test::temp_dir dir("idem-fault");
    const std::string db = dir.file("idem.db");
    idem::sqlite_store st(db, true);
    std::uint64_t seq = 0;
    auto claim = [&](const std::string& k) {
        return std::vector<idem::store_row>{idem_test::row({.key = k, .fence = 1}, ++seq)};
    };
    st.apply(claim("first"), 1);

    auto expect_clear = [&](const char* step, std::initializer_list<const char*> causes, auto&& call) {
        try {
            call();
            ADD_FAILURE() << step << " succeeded";
        } catch (const idem::error& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find(db), std::string::npos) << step << " does not name the file: " << what;
            bool named = false;
            for (const char* c : causes) named = named || what.find(c) != std::string::npos;
            EXPECT_TRUE(named) << step << " does not say what failed: " << what;
            EXPECT_EQ(what.find("misuse"), std::string::npos) << step << " reports API misuse, not the fault: " << what;
        }
    };
    // An unwritable file (the WAL write fails with EPERM).
    for (const char* f : {"", "-wal"}) ASSERT_EQ(idem_test::set_immutable(db + f, true), "");
    expect_clear("apply on an immutable file", {"I/O error", "readonly"}, [&] { st.apply(claim("second"), 2); });
    for (const char* f : {"", "-wal"}) ASSERT_EQ(idem_test::set_immutable(db + f, false), "");

    // The file is moved away and its path is a directory: the reconnect cannot open it.
    ASSERT_EQ(::rename(db.c_str(), (db + ".moved").c_str()), 0);
    ASSERT_EQ(::mkdir(db.c_str(), 0700), 0);
    expect_clear("reconnect to a directory", {"unable to open"}, [&] { st.reconnect(); });
    expect_clear("apply after a failed reconnect", {"unable to open", "cannot open", "not open"},
                 [&] { st.apply(claim("third"), 3); });
    expect_clear("committed() after a failed reconnect", {"unable to open", "cannot open", "not open"},
                 [&] { (void)st.committed(3); });

    ASSERT_EQ(::rmdir(db.c_str()), 0);
    ASSERT_EQ(::rename((db + ".moved").c_str(), db.c_str()), 0);
    st.reconnect();
    st.apply(claim("fourth"), 4);
    EXPECT_TRUE(st.get("first").has_value());
    EXPECT_FALSE(st.get("second").has_value());
    EXPECT_FALSE(st.get("third").has_value());
    EXPECT_TRUE(st.get("fourth").has_value());
    EXPECT_TRUE(st.committed(4));
    EXPECT_FALSE(st.committed(2));
}

// A damaged file (findings F1 and F4 of docs/testing.md, found by fuzz_recovery): values no real
// history produces must be refused as corrupt_record naming the field, not overflow 64-bit
// arithmetic (undefined behaviour) during recovery or the next batch.
TEST(SqliteFault, DamagedTimesAndSequenceCounterAreRefusedAsCorruptRecords) {
    idem_test::temp_dir dir("idem-damaged");
    const std::string db = dir.file("idem.db");
    const auto now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    {
        idem::sqlite_store st(db, true);
        st.apply(std::vector<idem::store_row>{idem_test::row(
                     {.key = "TX1_PAY_v1", .fence = 1, .at_ms = now_ms, .lease_until_ms = now_ms + 30000}, 1)},
                 1);
    }
    auto set = [&](const std::string& sql) {
        sqlite3* h = nullptr;
        ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
        char* err = nullptr;
        EXPECT_EQ(sqlite3_exec(h, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
        sqlite3_free(err);
        sqlite3_close(h);
    };
    auto open_guard = [&] {
        idem::options o;
        o.capacity = 1024;
        o.maintenance_interval = {};
        return std::make_unique<idem::durable_guard>(std::make_unique<idem::sqlite_store>(db, true), o);
    };
    auto expect_corrupt = [&](const char* what, std::initializer_list<const char*> words, auto&& call) {
        try {
            call();
            ADD_FAILURE() << what << ": accepted";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), errc::corrupt_record) << what << ": " << e.what();
            for (const char* w : words)
                EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << what << ": no '" << w << "' in " << e.what();
        }
    };
    { auto g = open_guard(); }  // the healthy file recovers

    for (const char* column : {"lease_until", "updated_time"}) {
        for (const std::int64_t bad : {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min(),
                                       std::int64_t{now_ms + 200LL * 366 * 86400 * 1000}}) {
            SCOPED_TRACE(std::string(column) + " = " + std::to_string(bad));
            set("UPDATE idempotent_record SET " + std::string(column) + " = " + std::to_string(bad));
            expect_corrupt("recovery", {"TX1_PAY_v1", column}, [&] { auto g = open_guard(); });
            set("UPDATE idempotent_record SET lease_until = " + std::to_string(now_ms + 30000) +
                ", updated_time = " + std::to_string(now_ms));
        }
    }
    { auto g = open_guard(); }  // repaired: recovers again

    set("UPDATE idem_schema SET next_sequence = " + std::to_string(std::numeric_limits<std::int64_t>::max()));
    expect_corrupt("open with a damaged sequence counter", {"next_sequence", db.c_str()},
                   [&] { idem::sqlite_store st(db, true); });
}

}  // namespace
