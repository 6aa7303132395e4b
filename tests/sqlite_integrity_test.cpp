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
//   Deleted*, Moved*, Replaced*, WalDeleted*, Reconnect*
//                    the file deleted, moved away or replaced under a running sync-mode guard: no
//                    success is acknowledged after that, the error names the path, and no new empty
//                    database is created at the path; what was acknowledged before a move is in the
//                    moved file.
//   SecondWriter*    a second process on the same file (fork + exec of this binary, which then runs
//                    one action, see child_main): refused at start in sync mode, refused at its first
//                    write in async mode, naming PATH.lock and the holder's pid; the first writer's
//                    records are untouched; a reader (verify) still works beside the writer.
//   ReadOnly*        as uid nobody (a forked child that drops root before exec): a read-only file or
//                    directory is refused at open with invalid_argument naming the path and reason.
// Needs root (to drop to nobody). FAILS, never skips, without it.
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "support/store_fixtures.hpp"

namespace {

using namespace std::chrono_literals;
using idem::errc;
using idem::record_state;
using idem::transition_cause;
using idem_test::row;

constexpr std::int64_t T0 = 1'700'000'000'000;

/// Runs `sql` on the file with a plain SQLite connection (what a damaged or hand-edited file holds).
using idem_test::sqlite_exec;

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
        rows.push_back(row({.key = k,
                            .from = record_state::processing,
                            .to = record_state::succeeded,
                            .cause = transition_cause::succeed,
                            .fence = 1,
                            .outcome = 7,
                            .at_ms = T0 + 1},
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

// ---- a second process: this binary, run again with IDEM_INTEGRITY_CHILD set ---------------------

/// "ok ..." or "error <errc message>: <what>".
std::string outcome_of(const std::function<std::string()>& fn) {
    try {
        return "ok " + fn();
    } catch (const idem::error& e) {
        return "error " + idem::make_error_code(e.kind()).message() + ": " + e.what();
    } catch (const std::exception& e) {
        return std::string("error other: ") + e.what();
    }
}

idem::store_options sync_options() {
    idem::store_options so;
    so.mode = idem::durability::sync;
    so.sync_timeout = 300ms;
    so.max_backoff = 20ms;
    return so;
}

/// The child's action, on the database IDEM_INTEGRITY_DB; its outcome goes to stdout.
///   open_at_open  a store with sqlite_lock::at_open
///   open          a store with the default options
///   sync_guard    a durable_guard in sync mode
///   async_guard   a durable_guard in async mode that claims and completes key CHILD_v1, then waits
///                 for the flusher to fail twice and reports its last error
///   reader        a default store: idem::verify and the number of records
std::string child_action(const std::string& action, const std::string& db) {
    if (action == "open_at_open")
        return outcome_of([&] {
            idem::sqlite_store st(db, idem::sqlite_options{.writer_lock = idem::sqlite_lock::at_open});
            return std::string("opened");
        });
    if (action == "open")
        return outcome_of([&] {
            idem::sqlite_store st(db, true);
            return std::string("opened");
        });
    if (action == "sync_guard")
        return outcome_of([&] {
            idem::durable_guard g(std::make_unique<idem::sqlite_store>(db, true), idem_test::durable_options(),
                                  sync_options());
            return std::string("started");
        });
    if (action == "async_guard")
        return outcome_of([&] {
            idem::store_options so;  // async mode; a short stop, since the rows can never commit
            so.sync_timeout = 300ms;
            so.max_backoff = 20ms;
            idem::durable_guard g(std::make_unique<idem::sqlite_store>(db, false), idem_test::durable_options(), so);
            auto r = g->begin(idem::key("CHILD_v1"));
            if (r.status == idem::begin_status::acquired) (void)r.ticket.succeed(1);
            const bool failed = idem_test::wait_for([&] { return g.snapshot().store_errors >= 2; });
            const std::string last = g.last_store_error();
            return std::string(failed ? "store errors: " : "no store error: ") + last;
        });
    if (action == "reader")
        return outcome_of([&] {
            idem::sqlite_store st(db, true);
            const auto report = idem::verify(st);
            return std::to_string(idem_test::load_all(st).size()) + " records, " + std::to_string(report.violations.size()) +
                   " violations";
        });
    return "error unknown action " + action;
}

/// Runs before main() in a child: performs the action and exits, so gtest never starts there.
const bool child_ran = [] {
    const char* action = std::getenv("IDEM_INTEGRITY_CHILD");
    const char* db = std::getenv("IDEM_INTEGRITY_DB");
    if (action == nullptr || db == nullptr) return false;
    const std::string out = child_action(action, db);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    std::_Exit(0);
}();

/// Runs `action` on `db` in a new process (fork, then exec of this binary), as uid `uid` when
/// given (root drops to it between fork and exec). Returns what the child printed, or why it
/// did not run.
std::string in_child(const std::string& action, const std::string& db, std::optional<uid_t> uid = std::nullopt,
                     gid_t gid = 0) {
    int out[2];
    if (::pipe(out) != 0) return "error pipe";
    const std::string env_action = "IDEM_INTEGRITY_CHILD=" + action, env_db = "IDEM_INTEGRITY_DB=" + db;
    const pid_t pid = ::fork();
    if (pid < 0) return "error fork";
    if (pid == 0) {
        ::dup2(out[1], 1);
        ::close(out[0]);
        ::close(out[1]);
        if (uid && (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(*uid) != 0)) ::_exit(3);
        char* argv[] = {const_cast<char*>("sqlite_integrity_test"), nullptr};
        char* envp[] = {const_cast<char*>(env_action.c_str()), const_cast<char*>(env_db.c_str()), nullptr};
        ::execve("/proc/self/exe", argv, envp);
        ::_exit(4);
    }
    ::close(out[1]);
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        text.append(buf, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return "error the child did not run (status " + std::to_string(status) + ")" + text;
    return text;
}

bool has(const std::string& text, const std::string& word) { return text.find(word) != std::string::npos; }

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
    for (const bad_value& c :
         {bad_value{"fencing_token", "'abc'", "'abc'"}, bad_value{"outcome", "'x7'", "'x7'"},
          bad_value{"lease_until", "1.5", "'1.5'"}, bad_value{"request_fingerprint", "x'00ff'", "blob"}}) {
        SCOPED_TRACE(c.column);
        sqlite_exec(db, std::string("UPDATE idempotent_record SET ") + c.column + " = " + c.sql_value +
                            " WHERE idempotent_key = 'TX1_PAY_v1'");
        {
            idem::sqlite_store st(db, true);
            expect_error("load", errc::corrupt_record, {db, "TX1_PAY_v1", c.column, c.shown},
                         [&] { idem_test::load_all(st); });
            expect_error("get", errc::corrupt_record, {"TX1_PAY_v1", c.column, c.shown},
                         [&] { (void)st.get("TX1_PAY_v1"); });
            EXPECT_TRUE(st.get("TX2_PAY_v1").has_value());  // the other rows still read
        }
        sqlite_exec(db,
                    std::string("UPDATE idempotent_record SET ") + c.column + " = 1 WHERE idempotent_key = 'TX1_PAY_v1'");
    }
    // max_fence() reads idem_schema.max_fence (schema 4), which every batch raised: a damaged value
    // there is corrupt_record too, never read as 0 (new fences would start below stored ones).
    sqlite_exec(db, "UPDATE idem_schema SET max_fence = 'abc'");
    {
        idem::sqlite_store st(db, true);
        expect_error("max_fence", errc::corrupt_record, {db, "idem_schema.max_fence", "'abc'"},
                     [&] { (void)st.max_fence(); });
    }
    sqlite_exec(db, "UPDATE idem_schema SET max_fence = 1");
    sqlite_exec(db, "UPDATE idempotent_audit SET fencing_token = 'abc' WHERE idempotent_key = 'TX2_PAY_v1'");
    idem::sqlite_store st(db, true);
    EXPECT_EQ(st.max_fence(), 1u);
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
        st.apply(
            std::vector{row({.key = k, .fence = F, .fingerprint = 9, .at_ms = T0, .lease_until_ms = T0 + 30'000}, ++seq)},
            ++batch);
        st.apply(std::vector{row({.key = k,
                                  .from = record_state::processing,
                                  .to = terminal,
                                  .cause = terminal == record_state::succeeded ? transition_cause::succeed
                                                                               : transition_cause::fail,
                                  .fence = F,
                                  .outcome = 42,
                                  .at_ms = T0 + 1},
                                 ++seq)},
                 ++batch);
        // What a second writer's recovery sends for a claim it saw PROCESSING: a doubt mark, then a
        // release, both with the claim's fence. Audited; the record keeps its terminal state.
        st.apply(std::vector{row({.key = k,
                                  .from = record_state::processing,
                                  .to = record_state::processing,
                                  .cause = transition_cause::doubt,
                                  .fence = F,
                                  .at_ms = T0 + 2,
                                  .lease_until_ms = T0 + 60'000},
                                 ++seq)},
                 ++batch);
        st.apply(std::vector{row({.key = k,
                                  .from = record_state::processing,
                                  .to = record_state::released,
                                  .cause = transition_cause::release,
                                  .fence = F,
                                  .at_ms = T0 + 3},
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
    st.apply(std::vector{row({.key = "TX_plain_v1",
                              .from = record_state::processing,
                              .to = record_state::released,
                              .cause = transition_cause::release,
                              .fence = F,
                              .at_ms = T0 + 1},
                             ++seq)},
             ++batch);
    EXPECT_EQ(st.get("TX_plain_v1")->state, record_state::released);
}

// ---- item 1: the file deleted, moved or replaced under a running guard -------------------------

/// A payment in sync mode: true when both the claim and the success were acknowledged.
bool pay(idem::durable_guard& g, std::size_t i) {
    auto r = g->begin(idem::key("TX" + std::to_string(i) + "_PAY_v1"));
    if (r.status != idem::begin_status::acquired) return false;
    return !r.ticket.succeed(i);
}

enum class fault { deleted, moved_away, replaced, wal_deleted };

/// Runs 40 acknowledged payments, applies the fault, then tries 10 more: none may be acknowledged,
/// and the flusher's error names the path and what happened.
void run_fault(fault f) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = dir.file("idem.db");
    const std::string moved = dir.file("moved.db");
    const std::string other = dir.file("other.db");
    if (f == fault::replaced) {
        idem::sqlite_store st(other, true);  // a valid database with no records
    }
    std::size_t acked_before = 0;
    {
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db, true), idem_test::durable_options(), sync_options());
        for (std::size_t i = 0; i < 40; ++i) acked_before += pay(g, i) ? 1 : 0;
        ASSERT_EQ(acked_before, 40u) << g.last_store_error();
        switch (f) {
            case fault::deleted: ASSERT_EQ(::unlink(db.c_str()), 0); break;
            case fault::moved_away:  // mv idem.db* elsewhere: the open files move with their names
                for (const char* suffix : {"", "-wal", "-shm"})
                    ASSERT_EQ(::rename((db + suffix).c_str(), (moved + suffix).c_str()), 0) << suffix;
                break;
            case fault::replaced: ASSERT_EQ(::rename(other.c_str(), db.c_str()), 0); break;
            case fault::wal_deleted: ASSERT_EQ(::unlink((db + "-wal").c_str()), 0); break;
        }
        std::size_t acked_after = 0;
        for (std::size_t i = 100; i < 110; ++i) acked_after += pay(g, i) ? 1 : 0;
        EXPECT_EQ(acked_after, 0u) << "payments acknowledged after the file was " << static_cast<int>(f)
                                   << " (0 deleted, 1 moved, 2 replaced, 3 WAL deleted)";
        // Several failed rounds, each with a reconnect: still nothing created at the path.
        const std::uint64_t until = g.snapshot().store_errors + 4;
        EXPECT_TRUE(idem_test::wait_for([&] { return g.snapshot().store_errors >= until; }));
        const std::string last = g.last_store_error();
        EXPECT_TRUE(has(last, db)) << last;
        EXPECT_TRUE(has(last, f == fault::wal_deleted ? "write-ahead log" : "deleted or replaced under the running process"))
            << last;
        if (f == fault::deleted || f == fault::moved_away) {
            EXPECT_FALSE(std::filesystem::exists(db)) << "a reconnect created a new database at " << db;
        }
    }
    if (f == fault::deleted || f == fault::moved_away) {
        // A restart on the path: PATH.lock records that a writer had a database here, so a new,
        // empty one (in which every acknowledged key would run again) is refused.
        try {
            idem::sqlite_store again(db, true);
            ADD_FAILURE() << "a restart created a new, empty database at " << db;
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), errc::invalid_argument) << e.what();
            EXPECT_TRUE(has(e.what(), db + ".lock") && has(e.what(), "missing")) << e.what();
        }
        EXPECT_FALSE(std::filesystem::exists(db)) << "the refused restart left a database at " << db;
        ASSERT_EQ(::unlink((db + ".lock").c_str()), 0);  // a new history, on purpose
        idem::sqlite_store fresh(db, true);
        EXPECT_TRUE(idem_test::load_all(fresh).empty());
    }
    if (f == fault::replaced) {
        // Nothing was written after the replacement. (The old file's write-ahead log was left at
        // the path, and SQLite reads it with the new file: what it holds was committed before.)
        idem::sqlite_store st(db, true);
        for (const auto& [k, r] : idem_test::load_all(st))
            EXPECT_LT(std::stoul(k.substr(2)), 100u) << k << " was written after the file was replaced";
    }
    if (f == fault::moved_away) {  // everything acknowledged is in the file that moved, and nothing else
        idem::sqlite_store st(moved, true);
        const auto records = idem_test::load_all(st);
        EXPECT_EQ(records.size(), 40u);
        for (const auto& [k, r] : records) EXPECT_EQ(r.state, record_state::succeeded) << k;
        EXPECT_TRUE(idem_test::verify_clean(st));
    }
}

TEST(SqliteIntegrity, DeletedFileStopsAcknowledgements) { run_fault(fault::deleted); }
TEST(SqliteIntegrity, MovedAwayFileStopsAcknowledgementsAndKeepsWhatWasAcknowledged) { run_fault(fault::moved_away); }
TEST(SqliteIntegrity, ReplacedFileStopsAcknowledgementsAndIsNotWritten) { run_fault(fault::replaced); }
TEST(SqliteIntegrity, WalDeletedStopsAcknowledgements) { run_fault(fault::wal_deleted); }

TEST(SqliteIntegrity, ReconnectRefusesToCreateANewDatabaseAndResumesWhenTheFileIsBack) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = dir.file("idem.db");
    const std::string aside = dir.file("aside.db");
    idem::sqlite_store st(db, true);
    std::uint64_t seq = 0;
    st.apply(std::vector{row({.key = "K1", .fence = 1, .at_ms = T0}, ++seq)}, 1);
    ASSERT_EQ(::rename(db.c_str(), aside.c_str()), 0);
    expect_error("apply after the file moved", errc::store_error, {db, "deleted or replaced under the running process"},
                 [&] { st.apply(std::vector{row({.key = "K2", .fence = 1, .at_ms = T0}, ++seq)}, 2); });
    expect_error("reconnect", errc::store_error, {db, "refusing to create a new, empty database"}, [&] { st.reconnect(); });
    expect_error("apply after the refused reconnect", errc::store_error, {db, "refusing to create"},
                 [&] { st.apply(std::vector{row({.key = "K3", .fence = 1, .at_ms = T0}, ++seq)}, 3); });
    EXPECT_FALSE(std::filesystem::exists(db)) << "a new database was created at " << db;
    // The same file back at the path: the store resumes.
    ASSERT_EQ(::rename(aside.c_str(), db.c_str()), 0);
    st.apply(std::vector{row({.key = "K4", .fence = 1, .at_ms = T0}, ++seq)}, 4);
    EXPECT_TRUE(st.get("K1").has_value());
    EXPECT_FALSE(st.get("K2").has_value());
    EXPECT_TRUE(st.get("K4").has_value());
}

// ---- item 4: one writer per file ---------------------------------------------------------------

TEST(SqliteIntegrity, SecondWriterProcessIsRefusedNamingTheLockAndTheHolder) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = dir.file("idem.db");
    const std::string me = "pid " + std::to_string(::getpid());
    idem::options o = idem_test::durable_options();
    o.lease = 1ms;  // the claim left open below has expired when the children start
    idem::durable_guard g(std::make_unique<idem::sqlite_store>(db, true), o, sync_options());
    for (std::size_t i = 0; i < 20; ++i) ASSERT_TRUE(pay(g, i)) << g.last_store_error();
    auto open_claim = g->begin(idem::key("TX_OPEN_PAY_v1"));  // in flight while the children run
    ASSERT_EQ(open_claim.status, idem::begin_status::acquired);
    ASSERT_TRUE(idem_test::wait_wall_past(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count() +
        2));

    const std::string sync_child = in_child("sync_guard", db);
    EXPECT_TRUE(has(sync_child, "error durable store unavailable")) << sync_child;
    for (const std::string& w : {db + ".lock", me, std::string("one writer at a time")})
        EXPECT_TRUE(has(sync_child, w)) << "no '" << w << "' in: " << sync_child;
    const std::string eager = in_child("open_at_open", db);
    EXPECT_TRUE(has(eager, "error durable store unavailable") && has(eager, me)) << eager;
    const std::string async_child = in_child("async_guard", db);
    EXPECT_TRUE(has(async_child, "ok store errors: ") && has(async_child, db + ".lock") && has(async_child, me))
        << async_child;
    // A reader (what idem verify and idem stats open) works beside the writer.
    const std::string reader = in_child("reader", db);
    EXPECT_TRUE(has(reader, "ok 21 records, 0 violations")) << reader;

    // The writer is untouched: nothing of the children's is in the store, every success and the
    // open claim are as the writer left them, and it keeps writing.
    ASSERT_TRUE(pay(g, 50)) << g.last_store_error();
    ASSERT_FALSE(open_claim.ticket.succeed(7));
    ASSERT_TRUE(g.flush(30s));
    idem::store& st = g.backing_store();
    EXPECT_FALSE(st.get("CHILD_v1").has_value());
    for (const auto& a : idem_test::scan_all(st)) EXPECT_EQ(a.node, st.node()) << "a row from another process: " << a.detail;
    EXPECT_EQ(st.get("TX_OPEN_PAY_v1")->state, record_state::succeeded);
    EXPECT_TRUE(idem_test::verify_clean(st));
}

TEST(SqliteIntegrity, WriterLockIsReleasedWhenTheWriterCloses) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = dir.file("idem.db");
    {
        idem::sqlite_store st(db, idem::sqlite_options{.writer_lock = idem::sqlite_lock::at_open});
        EXPECT_TRUE(has(in_child("open_at_open", db), "error durable store unavailable"));
        EXPECT_TRUE(has(in_child("open", db), "ok opened"));  // a store that may only read opens
    }
    EXPECT_EQ(in_child("open_at_open", db), "ok opened");
    EXPECT_EQ(in_child("sync_guard", db), "ok started");
}

// In one process too: the lock belongs to the open file, not to the process.
TEST(SqliteIntegrity, SecondStoreInTheSameProcessCannotWriteAndReadersDoNotDisturbTheWriter) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = dir.file("idem.db");
    idem::sqlite_store writer(db, true);
    std::uint64_t seq = 0;
    writer.apply(std::vector{row({.key = "W1", .fence = 1, .at_ms = T0}, ++seq)}, 1);
    {
        idem::sqlite_store reader(db, true);
        EXPECT_TRUE(reader.get("W1").has_value());
        EXPECT_TRUE(idem_test::verify_clean(reader));
        expect_error("second store's apply", errc::store_unavailable, {db + ".lock", "pid " + std::to_string(::getpid())},
                     [&] { reader.apply(std::vector{row({.key = "R1", .fence = 1, .at_ms = T0}, ++seq)}, 2); });
        expect_error("second store's sync check", errc::store_unavailable, {db + ".lock"},
                     [&] { reader.check_sync_durability(); });
        expect_error("a store that locks at open", errc::store_unavailable, {db + ".lock"},
                     [&] { idem::sqlite_store eager(db, idem::sqlite_options{.writer_lock = idem::sqlite_lock::at_open}); });
        sqlite3* plain = nullptr;  // and a plain SQLite reader, opened and closed
        ASSERT_EQ(sqlite3_open(db.c_str(), &plain), SQLITE_OK);
        sqlite3_exec(plain, "SELECT count(*) FROM idempotent_audit", nullptr, nullptr, nullptr);
        sqlite3_close(plain);
    }
    // Readers that came and went left the writer's files as they were.
    writer.apply(std::vector{row({.key = "W2", .fence = 1, .at_ms = T0}, ++seq)}, 3);
    writer.reconnect();
    writer.apply(std::vector{row({.key = "W3", .fence = 1, .at_ms = T0}, ++seq)}, 4);
    EXPECT_EQ(idem_test::load_all(writer).size(), 3u);
}

// A store that read the file, then finds the lock free when it first writes, must not write if
// another writer committed in between: what it read (a guard's recovery) is out of date.
TEST(SqliteIntegrity, StoreThatReadBeforeAnotherWriterCommittedNeverWrites) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string db = dir.file("idem.db");
    { idem::sqlite_store init(db, true); }
    idem::sqlite_store late(db, true);
    (void)idem_test::load_all(late);
    std::uint64_t seq = 0;
    {
        idem::sqlite_store other(db, true);
        other.apply(std::vector{row({.key = "O1", .fence = 1, .at_ms = T0}, ++seq)}, 1);
    }
    for (int attempt = 0; attempt < 2; ++attempt)
        expect_error("apply of the store that read first", errc::store_unavailable, {db, "another writer committed"},
                     [&] { late.apply(std::vector{row({.key = "L1", .fence = 1, .at_ms = T0}, ++seq)}, 2); });
    idem::sqlite_store fresh(db, true);  // a store opened now reads the current state: it may write
    fresh.apply(std::vector{row({.key = "F1", .fence = 1, .at_ms = T0}, ++seq)}, 3);
    EXPECT_FALSE(fresh.get("L1").has_value());
}

// ---- item 5: read-only file or directory, as a user who is not root ----------------------------

TEST(SqliteIntegrity, ReadOnlyFileOrDirectoryIsRefusedAtOpenForANonRootUser) {
    ASSERT_EQ(::geteuid(), 0u) << "this test drops from root to uid nobody: run it as root";
    const passwd* nobody = ::getpwnam("nobody");
    ASSERT_NE(nobody, nullptr) << "no user 'nobody'";
    const uid_t uid = nobody->pw_uid;
    const gid_t gid = nobody->pw_gid;
    idem_test::temp_dir top("idem-integrity");
    ASSERT_EQ(::chmod(top.path().c_str(), 0755), 0);
    auto make_dir = [&](const std::string& name, bool nobody_owns) {
        const std::string d = top.file(name);
        EXPECT_EQ(::mkdir(d.c_str(), 0755), 0);
        if (nobody_owns) {
            EXPECT_EQ(::chown(d.c_str(), uid, gid), 0);
        }
        return d;
    };
    auto make_db = [&](const std::string& d, bool nobody_owns, mode_t mode) {
        const std::string db = d + "/idem.db";
        fill(db, 2);
        for (const char* suffix : {"", ".lock"})
            if (std::filesystem::exists(db + suffix)) {
                if (nobody_owns) {
                    EXPECT_EQ(::chown((db + suffix).c_str(), uid, gid), 0);
                }
                EXPECT_EQ(::chmod((db + suffix).c_str(), mode), 0);
            }
        return db;
    };
    struct case_ {
        std::string name, db;
        std::vector<std::string> words;
    };
    std::vector<case_> cases;
    {
        const std::string d = make_dir("ro_dir_no_file", false);
        cases.push_back(
            {"read-only directory, no database yet", d + "/idem.db", {"no permission to create files in directory " + d}});
    }
    {
        const std::string d = make_dir("ro_dir", false);
        cases.push_back({"read-only directory, a writable database without its -wal/-shm",
                         make_db(d, true, 0644),
                         {"no permission to create the -wal", d}});
        std::filesystem::remove(d + "/idem.db.lock");  // the lock file too must be created beside it
    }
    {
        const std::string d = make_dir("ro_file", true);
        cases.push_back({"writable directory, read-only database file (mode 0444)",
                         make_db(d, true, 0444),
                         {"no permission to read and write the file"}});
    }
    {
        const std::string d = make_dir("root_file", true);
        cases.push_back({"writable directory, database file owned by root (mode 0644)",
                         make_db(d, false, 0644),
                         {"no permission to read and write the file"}});
    }
    for (const case_& c : cases) {
        SCOPED_TRACE(c.name);
        const std::string got = in_child("open", c.db, uid, gid);
        EXPECT_TRUE(has(got, "error invalid argument")) << got;
        EXPECT_TRUE(has(got, "sqlite:" + c.db + ": ")) << got;
        for (const auto& w : c.words) EXPECT_TRUE(has(got, w)) << "no '" << w << "' in: " << got;
    }
    // The control: the same user opens a database in a directory it may write.
    const std::string ok = make_db(make_dir("writable", true), true, 0644);
    EXPECT_EQ(in_child("open", ok, uid, gid), "ok opened");
    EXPECT_EQ(in_child("sync_guard", ok, uid, gid), "ok started");
}

}  // namespace

namespace {

// idem verify on a live SQLite store: the records and the audit trail are read in one snapshot
// (sqlite_store::snapshot_read: one read transaction under WAL). Read in two, a record committed
// between the two reads shows a state its trail does not reach yet: a false violation.
TEST(SqliteIntegrity, VerifyUnderWriteLoadReportsNoViolation) {
    idem_test::temp_dir dir("idem-integrity");
    const std::string path = dir.file("live.db");
    idem::options o;
    o.capacity = 1u << 20;
    o.maintenance_interval = {};
    idem::store_options so;  // async: acknowledged at once, flushed in batches behind
    so.max_batch = 64;
    idem::durable_guard g(std::make_unique<idem::sqlite_store>(path, false), o, so);
    // The writer gets a fixed number of new keys per run: unpaced, it filled the table on a fast
    // machine while verify ran on a slow one, and then made no batches at all.
    idem_test::paced_writer writer(g, "VL");
    idem::sqlite_store reader(path, false);  // reads only: it never takes the writer lock
    std::size_t runs = 0, violations = 0;
    std::string first;
    for (; runs < 25; ++runs) {
        // Each run overlaps new batches: wait for the writer's next commits first.
        const std::uint64_t batches = g.snapshot().flush_batches;
        writer.allow(4000);  // 8,000 transitions: at least 125 batches of 64, verify runs among them
        ASSERT_TRUE(idem_test::wait_for([&] { return g.snapshot().flush_batches >= batches + 2; }))
            << "the writer made no progress after " << writer.written() << " keys: " << g.last_store_error();
        const idem::verify_report rep = idem::verify(reader);
        violations += rep.violations.size();
        if (first.empty() && !rep.violations.empty()) first = rep.violations.front();
    }
    writer.stop();
    EXPECT_EQ(violations, 0u) << "in " << runs << " runs of verify during the write load; first: " << first;
    ASSERT_TRUE(g.flush(30s)) << g.last_store_error();
}

}  // namespace
