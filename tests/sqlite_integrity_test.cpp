// sqlite_integrity_test: the SQLite store under faults that come from outside the process, each
// against real database files.
//
//   Damaged*         a page of the file overwritten with garbage (a write at the page's offset):
//                    load, get, scan_audit, idem::verify and a durable_guard's recovery all report
//                    corrupt_record naming the file; a damaged header too, at open.
//   NonInteger*      an integer column holding text ('abc'), a real or a blob: corrupt_record
//                    naming the key, the column and the value (not "fencing_token 0").
//   TerminalRecord*  a record SUCCESS or FAILED at fence F is never taken back to PROCESSING or
//                    RELEASED by a later row of the same fence (a second writer's doubt mark).
#include <idem/durable.hpp>
#include <idem/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/store_fixtures.hpp"

namespace {

using namespace std::chrono_literals;
using idem::errc;
using idem::record_state;
using idem::transition_cause;
using idem_test::row;

constexpr std::int64_t T0 = 1'700'000'000'000;

/// Runs `sql` on the file with a plain SQLite connection (what a damaged or hand-edited file holds).
void raw_exec(const std::string& db, const std::string& sql) {
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(h, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << sql << ": " << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close(h);
}

/// Calls `call`, which must throw idem::error of kind `want` whose message holds every word.
void expect_error(const std::string& what, errc want, const std::vector<std::string>& words,
                  const std::function<void()>& call) {
    try {
        call();
        ADD_FAILURE() << what << ": no error";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), want) << what << ": " << idem::make_error_code(e.kind()).message() << ": " << e.what();
        for (const auto& w : words)
            EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << what << ": no '" << w << "' in: " << e.what();
    }
}

/// A store file with `n` keys, each claimed and completed (SUCCESS), closed (its WAL checkpointed
/// into the file, so the file alone holds everything).
void fill(const std::string& db, int n) {
    idem::sqlite_store st(db, true);
    std::vector<idem::store_row> rows;
    std::uint64_t seq = 0;
    for (int i = 0; i < n; ++i) {
        const std::string k = "TX" + std::to_string(i) + "_PAY_v1";
        rows.push_back(row({.key = k, .fence = 1, .at_ms = T0, .lease_until_ms = T0 + 30'000}, ++seq));
        rows.push_back(row({.key = k, .from = record_state::processing, .to = record_state::succeeded,
                            .cause = transition_cause::succeed, .fence = 1, .outcome = 7, .at_ms = T0 + 1},
                           ++seq));
    }
    idem_test::sort_like_flusher(rows);
    st.apply(rows, 1);
}

/// Overwrites page `page` (1-based) of the file with garbage. Returns "" or what failed.
std::string damage_page(const std::string& db, std::int64_t page) {
    sqlite3* h = nullptr;
    if (sqlite3_open(db.c_str(), &h) != SQLITE_OK) return "cannot open " + db;
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(h, "PRAGMA page_size", -1, &s, nullptr);
    const std::int64_t page_size = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_finalize(s);
    sqlite3_close(h);
    if (page_size <= 0) return "no page size";
    const int fd = ::open(db.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return "open " + db;
    const std::string garbage(static_cast<std::size_t>(page_size), '\xa5');
    const auto n = ::pwrite(fd, garbage.data(), garbage.size(), (page - 1) * page_size);
    ::fsync(fd);
    ::close(fd);
    return n == static_cast<ssize_t>(garbage.size()) ? "" : "short write";
}

/// The root page of a table (its B-tree's first page), from the schema.
std::int64_t root_page(const std::string& db, const std::string& table) {
    sqlite3* h = nullptr;
    if (sqlite3_open(db.c_str(), &h) != SQLITE_OK) return 0;
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(h, "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?1", -1, &s, nullptr);
    sqlite3_bind_text(s, 1, table.c_str(), -1, SQLITE_TRANSIENT);
    const std::int64_t page = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_finalize(s);
    sqlite3_close(h);
    return page;
}

/// A file of 300 completed keys in `dir` whose table `table` has its root page overwritten.
std::string damaged_file(const idem_test::temp_dir& dir, const std::string& table) {
    const std::string db = dir.file("idem.db");
    fill(db, 300);
    const std::int64_t page = root_page(db, table);
    EXPECT_GT(page, 1) << table;
    EXPECT_EQ(damage_page(db, page), "");
    return db;
}

// ---- item 7: corruption is corrupt_record, whoever reads it ------------------------------------

TEST(SqliteIntegrity, DamagedRecordPageIsCorruptRecordForLoadGetAndRecovery) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = damaged_file(dir, "idempotent_record");
    ASSERT_FALSE(::testing::Test::HasFailure());

    idem::sqlite_store st(db, true);
    expect_error("load", errc::corrupt_record, {db, "damaged"}, [&] { idem_test::load_all(st); });
    expect_error("get", errc::corrupt_record, {db, "damaged"}, [&] { (void)st.get("TX5_PAY_v1"); });
    expect_error("verify", errc::corrupt_record, {db, "damaged"}, [&] { (void)idem::verify(st); });
    expect_error("durable_guard recovery", errc::corrupt_record, {db, "damaged"}, [&] {
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db, true), idem_test::durable_options());
    });
}

TEST(SqliteIntegrity, DamagedAuditPageIsCorruptRecordForScanAuditAndVerify) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = damaged_file(dir, "idempotent_audit");
    ASSERT_FALSE(::testing::Test::HasFailure());

    idem::sqlite_store st(db, true);
    expect_error("scan_audit", errc::corrupt_record, {db, "damaged"}, [&] { idem_test::scan_all(st); });
    expect_error("audit", errc::corrupt_record, {db, "damaged"}, [&] { (void)st.audit("TX5_PAY_v1"); });
    // `idem verify` reads the audit trail first: the same damage, the same kind of error.
    expect_error("verify", errc::corrupt_record, {db, "damaged"}, [&] { (void)idem::verify(st); });
}

TEST(SqliteIntegrity, DamagedHeaderIsCorruptRecordAtOpen) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = dir.file("idem.db");
    fill(db, 10);
    ASSERT_EQ(damage_page(db, 1), "");
    expect_error("open", errc::corrupt_record, {db, "not a SQLite database"}, [&] { idem::sqlite_store st(db, true); });
}

TEST(SqliteIntegrity, NonIntegerValuesAreCorruptRecordsNamingKeyColumnAndValue) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = dir.file("idem.db");
    fill(db, 3);
    struct bad_value {
        const char* column;
        const char* sql_value;
        const char* shown;
    };
    for (const bad_value& c : {bad_value{"fencing_token", "'abc'", "'abc'"}, bad_value{"outcome", "'x7'", "'x7'"},
                               bad_value{"lease_until", "1.5", "'1.5'"},
                               bad_value{"request_fingerprint", "x'00ff'", "blob"}}) {
        SCOPED_TRACE(c.column);
        raw_exec(db, std::string("UPDATE idempotent_record SET ") + c.column + " = " + c.sql_value +
                         " WHERE idempotent_key = 'TX1_PAY_v1'");
        {
            idem::sqlite_store st(db, true);
            expect_error("load", errc::corrupt_record, {db, "TX1_PAY_v1", c.column, c.shown},
                         [&] { idem_test::load_all(st); });
            expect_error("get", errc::corrupt_record, {"TX1_PAY_v1", c.column, c.shown},
                         [&] { (void)st.get("TX1_PAY_v1"); });
            if (std::string(c.column) == "fencing_token")
                expect_error("max_fence", errc::corrupt_record, {c.column, c.shown}, [&] { (void)st.max_fence(); });
            EXPECT_TRUE(st.get("TX2_PAY_v1").has_value());  // the other rows still read
        }
        raw_exec(db, std::string("UPDATE idempotent_record SET ") + c.column + " = 1 WHERE idempotent_key = 'TX1_PAY_v1'");
    }
    raw_exec(db, "UPDATE idempotent_audit SET fencing_token = 'abc' WHERE idempotent_key = 'TX2_PAY_v1'");
    idem::sqlite_store st(db, true);
    expect_error("scan_audit", errc::corrupt_record, {db, "TX2_PAY_v1", "fencing_token", "'abc'"},
                 [&] { idem_test::scan_all(st); });
    expect_error("audit", errc::corrupt_record, {"TX2_PAY_v1", "fencing_token", "'abc'"},
                 [&] { (void)st.audit("TX2_PAY_v1"); });
}

// ---- item 4 (second part): a terminal record never goes back at its own fence ------------------

TEST(SqliteIntegrity, TerminalRecordIsNeverReplacedByANonTerminalRowOfTheSameFence) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = dir.file("idem.db");
    idem::sqlite_store st(db, true);
    std::uint64_t seq = 0, batch = 0;
    const std::uint64_t F = (std::uint64_t{1} << 32) | 1;
    for (const record_state terminal : {record_state::succeeded, record_state::failed}) {
        const std::string k = std::string("TX_") + idem::to_string(terminal) + "_v1";
        SCOPED_TRACE(k);
        st.apply(std::vector{row({.key = k, .fence = F, .fingerprint = 9, .at_ms = T0, .lease_until_ms = T0 + 30'000},
                                 ++seq)},
                 ++batch);
        st.apply(std::vector{row({.key = k, .from = record_state::processing, .to = terminal,
                                  .cause = terminal == record_state::succeeded ? transition_cause::succeed
                                                                               : transition_cause::fail,
                                  .fence = F, .outcome = 42, .at_ms = T0 + 1},
                                 ++seq)},
                 ++batch);
        // What a second writer's recovery sends for a claim it saw PROCESSING: a doubt mark, then a
        // release, both with the claim's fence. Audited; the record keeps its terminal state.
        st.apply(std::vector{row({.key = k, .from = record_state::processing, .to = record_state::processing,
                                  .cause = transition_cause::doubt, .fence = F, .at_ms = T0 + 2,
                                  .lease_until_ms = T0 + 60'000},
                                 ++seq)},
                 ++batch);
        st.apply(std::vector{row({.key = k, .from = record_state::processing, .to = record_state::released,
                                  .cause = transition_cause::release, .fence = F, .at_ms = T0 + 3},
                                 ++seq)},
                 ++batch);
        const auto r = st.get(k);
        ASSERT_TRUE(r.has_value());
        EXPECT_EQ(r->state, terminal);
        EXPECT_EQ(r->fence, F);
        EXPECT_EQ(r->outcome, 42u);
        EXPECT_EQ(st.audit(k).size(), 4u);
        // A higher fence still replaces it (a key claimed again after retention evicted it).
        st.apply(std::vector{row({.key = k, .fence = F + 1, .at_ms = T0 + 4, .lease_until_ms = T0 + 90'000}, ++seq)},
                 ++batch);
        EXPECT_EQ(st.get(k)->state, record_state::processing);
        EXPECT_EQ(st.get(k)->fence, F + 1);
    }
    // A same-fence completion of a PROCESSING record is still applied (the normal path).
    st.apply(std::vector{row({.key = "TX_plain_v1", .fence = F, .at_ms = T0}, ++seq)}, ++batch);
    st.apply(std::vector{row({.key = "TX_plain_v1", .from = record_state::processing, .to = record_state::released,
                              .cause = transition_cause::release, .fence = F, .at_ms = T0 + 1},
                             ++seq)},
             ++batch);
    EXPECT_EQ(st.get("TX_plain_v1")->state, record_state::released);
}

}  // namespace
