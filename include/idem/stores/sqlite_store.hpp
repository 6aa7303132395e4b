// idem/stores/sqlite_store.hpp: the embedded default store (target idem::sqlite; links libsqlite3).
//
// One database file in WAL mode. Each flush batch is one BEGIN IMMEDIATE ... COMMIT transaction
// with prepared statements and bound parameters only. synchronous=FULL when the pipeline runs in
// sync mode (a commit survives power loss), NORMAL in async mode (a commit survives a process
// crash; the last commits may roll back on power loss, which async mode already allows).
// Thread-safety: one thread at a time (the flusher); the connection is opened with
// SQLITE_OPEN_NOMUTEX.
//
// Paths. The path names one database file, created when missing. Refused with invalid_argument:
//   ""            SQLite makes a temporary on-disk database, deleted when the connection closes
//   ":memory:"    SQLite makes an in-memory database, gone when the connection closes
//   "file:..."    SQLite builds with URI filenames enabled read it as a URI, whose parameters
//                 (mode=memory, vfs=memdb, nolock=1, immutable=1, ...) drop durability or locking;
//                 this store opens plain paths only ("./file:x.db" names a file called "file:x.db")
//   a NUL byte    SQLite would open the path cut at that byte
// The first two are accepted when the caller asks for a temporary database explicitly:
// sqlite_store::temporary(), or sqlite_options::allow_temporary.
//
// Errors while opening (constructor, reconnect()): invalid_argument when the file system shows a
// configuration fault (a missing parent directory, a directory at the path, no permission to read
// and write the file or to create files beside it: PATH-wal, PATH-shm, PATH.lock; a read-only file
// system), naming the path and the fault; otherwise store_unavailable (busy, cannot open, the
// writer lock held elsewhere) or store_error, as for any call.
//
// The file under a running store. The store notes the identity (device, inode) of the file it
// first opened, and of its write-ahead log at each open, and checks them with stat() before and
// after each batch: a file deleted, moved away or replaced under the running process would take
// every later commit to a file no restart finds, so apply() and committed() throw store_error
// naming the path ("deleted or replaced under the running process") and nothing more is
// acknowledged (sync callers get store_unavailable; async rows stay queued). A reopen (reconnect())
// opens only that same file: it never creates a new, empty database where the old one was. Putting
// the file back at the path resumes; a deleted write-ahead log or PATH.lock is final for the store.
//
// One writer. A database file has one writer at a time, marked by an exclusive flock() on the
// sidecar file PATH.lock (created beside the database and left there), which records the holder
// ("pid N on host H"). The lock belongs to the open file, so a second store in the same process is
// refused like one in another process, and the kernel drops it when the holder exits, however it
// exits. A store takes it before its first write (sqlite_options::writer_lock): by default at
// check_sync_durability() (a sync-mode durable_guard, before recovery reads anything) or at the
// first apply(), so a store that only reads (idem verify, idem stats) never takes it and runs beside
// a live writer; with sqlite_lock::at_open, in the constructor. Refused: store_unavailable naming
// PATH.lock and the holder. A store that took the lock after reading must still be current: when
// another writer committed since it opened the file, it refuses to write for good (store_unavailable).
//
// Damage. Whichever call meets it (open, load, get, audit, scan_audit, apply), a damaged file
// (SQLITE_CORRUPT, SQLITE_NOTADB) is corrupt_record naming the path, and so is a row no writer of
// this store produces: a status outside the four, a key the guard would refuse, text or a real
// in an integer column (named with its key, column and value, never read as 0).
//
// Records. The upsert keeps a record whose stored fence is higher than the batch's, and at the
// same fence keeps a terminal record (SUCCESS, FAILED) from going back to PROCESSING or RELEASED:
// a late doubt mark or release of the same claim is audited, and the outcome stays.
//
// Where each concern lives (detail/sqlite/, namespace idem::detail::sqlite): paths.hpp (the path
// rules; the file-system checks are detail/files/path_rules.hpp, shared with rocksdb_store),
// connection.hpp (the handle and its error rules), file_identity.hpp (the files under a running
// store), writer_lock.hpp (PATH.lock), schema.hpp (tables, versions, upgrades), statements.hpp (the
// batch's statements and the row readers). This header holds the contract and the flow.
#pragma once

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/rows/batch_fold.hpp"
#include "idem/detail/sqlite/connection.hpp"
#include "idem/detail/sqlite/file_identity.hpp"
#include "idem/detail/sqlite/paths.hpp"
#include "idem/detail/sqlite/schema.hpp"
#include "idem/detail/sqlite/statements.hpp"
#include "idem/detail/sqlite/writer_lock.hpp"
#include "idem/key.hpp"
#include "idem/store.hpp"

namespace idem {

/// When a sqlite_store takes its database's writer lock.
enum class sqlite_lock : std::uint8_t {
    on_first_write,  ///< at check_sync_durability() (a sync-mode durable_guard, before recovery) or the first apply()
    at_open,         ///< in the constructor: a second writer is refused before it reads anything
};

/// Prints the enumerator's name ("on_first_write", "at_open"); a value outside the enum as
/// "sqlite_lock(N)".
inline std::ostream& operator<<(std::ostream& os, sqlite_lock l) {
    switch (l) {
        case sqlite_lock::on_first_write: return os << "on_first_write";
        case sqlite_lock::at_open: return os << "at_open";
    }
    return os << "sqlite_lock(" << static_cast<unsigned>(l) << ')';
}

/// How a sqlite_store opens its database.
struct sqlite_options {
    /// synchronous=FULL (a commit survives power loss) instead of NORMAL (a commit survives a
    /// process crash). Sync durability mode wants FULL.
    bool full_sync = true;
    /// How long a statement waits for another connection's lock before failing with SQLITE_BUSY.
    std::chrono::milliseconds busy_timeout{5000};
    /// Accept "" and ":memory:", the paths for which SQLite makes a temporary database. Such a
    /// store keeps nothing once it is destroyed: a guard over it recovers nothing after a restart,
    /// whatever its durability mode. Off by default: those paths are refused as invalid_argument.
    bool allow_temporary = false;
    /// When the store takes the database's writer lock (see "One writer" above): at its first write
    /// (the default, so that read-only users such as `idem verify` and `idem stats` never take it
    /// and run beside a live writer), or at open, so that a second writer is refused by the
    /// constructor, before it reads anything.
    sqlite_lock writer_lock = sqlite_lock::on_first_write;
};

class sqlite_store final : public store {
public:
    /// Opens (creating if needed) the database file at `path` and its schema. Throws idem::error:
    /// invalid_argument for a path that names no durable file (see the paths above) or a
    /// configuration fault (missing directory, directory at the path, no permission), naming the
    /// path and the rule; store_unavailable / store_error naming the path and SQLite's message.
    explicit sqlite_store(std::string path, bool full_sync = true,
                          std::chrono::milliseconds busy_timeout = std::chrono::milliseconds(5000))
        : sqlite_store(std::move(path), sqlite_options{full_sync, busy_timeout, false}) {}

    /// The same, with every option by name; with `opts.allow_temporary` the temporary paths "" and
    /// ":memory:" are accepted too.
    sqlite_store(std::string path, const sqlite_options& opts)
        : path_(std::move(path)),
          full_sync_(opts.full_sync),
          busy_timeout_(opts.busy_timeout),
          temporary_(is_temporary_path(path_)),
          lock_when_(opts.writer_lock),
          lock_(path_),
          conn_(path_, temporary_),
          files_(path_) {
        std::string why;
        if (!check_path(path_, opts.allow_temporary, &why))
            throw error(errc::invalid_argument,
                        temporary_ ? why +
                                         "; to ask for a temporary database, use sqlite_store::temporary() or "
                                         "sqlite_options::allow_temporary"
                                   : why);
        open();
    }

    /// An explicitly temporary store: an in-memory database (":memory:") that is dropped when the
    /// store is destroyed. For tests and demos that want the SQLite code path without a file; a
    /// guard over it keeps nothing across a restart, whatever its durability mode.
    [[nodiscard]] static std::unique_ptr<sqlite_store> temporary() {
        return std::make_unique<sqlite_store>(":memory:", sqlite_options{.full_sync = false, .allow_temporary = true});
    }

    /// True for the paths SQLite turns into a temporary database: "" and ":memory:".
    [[nodiscard]] static bool is_temporary_path(std::string_view path) noexcept {
        return detail::sqlite::is_temporary_path(path);
    }

    /// Whether `path` may name this store's database (the rules in the header comment; the file
    /// system is not consulted). On refusal fills *why (if given) with the path and the rule.
    static bool check_path(std::string_view path, bool allow_temporary, std::string* why = nullptr) {
        return detail::sqlite::check_path(path, allow_temporary, why);
    }
    ~sqlite_store() override { close(); }  // then lock_ closes PATH.lock, which releases the writer lock

    /// Another connection to the file, for reads beside this writer (WAL: readers never wait for
    /// a writer). It never takes the writer lock: it never writes. nullptr for a temporary
    /// database (a second connection would see another one).
    std::unique_ptr<store> open_reader() override {
        if (temporary_) return nullptr;
        return std::make_unique<sqlite_store>(path_,
                                              sqlite_options{full_sync_, busy_timeout_, false, sqlite_lock::on_first_write});
    }
    sqlite_store(const sqlite_store&) = delete;
    sqlite_store& operator=(const sqlite_store&) = delete;

    static constexpr int schema_version = detail::sqlite::schema_version;

    void apply(std::span<const store_row> rows, std::uint64_t batch_id) override {
        ensure_open();
        ensure_writer();
        // next_sequence_ numbers the file's audit rows only while this store is its one writer.
        IDEM_ASSERT(temporary_ || lock_.held(), "a store writes only while it holds the writer lock (ensure_writer)");
        check_file("before the batch");
        conn_.exec("BEGIN IMMEDIATE", "begin batch");
        std::int64_t sequence = next_sequence_;
        try {
            sqlite3_stmt* b = stmts_.batch;
            sqlite3_reset(b);
            sqlite3_bind_int64(b, 1, static_cast<std::int64_t>(batch_id));
            sqlite3_bind_int64(b, 2, rows.empty() ? 0 : rows.back().at_ms);
            conn_.step_done(b, "insert batch id");
            // One audit row per row, chained to the key's previous one; then one upsert per key with
            // the batch's fold (detail/rows/batch_fold.hpp), its guard in the statement (the stored
            // record is in the file). A key whose first row is a claim from ABSENT is usually new
            // to the file: its record is inserted first (nothing happens when the file holds it,
            // say an expired record not pruned yet), which also says its chain starts here
            // (previous 0), so a new key costs one B-tree descent instead of a read of its latest
            // audit row and an upsert. Row i's audit row is sequence + i (rows are written in order).
            const detail::rows::batch_fold fold = detail::rows::fold_batch(rows);
            IDEM_ASSERT(fold.key_of.size() == rows.size(), "the fold names the key of every row of the batch");
            std::vector<std::int64_t> previous(fold.keys.size(), -1);  // each key's latest audit row; -1: not read yet
            std::vector<std::int64_t> last_row(fold.keys.size(), 0);   // each key's last audit row of this batch
            for (std::size_t i = 0; i < rows.size(); ++i) last_row[fold.key_of[i]] = sequence + static_cast<std::int64_t>(i);
            std::vector<char> inserted(fold.keys.size(), 0);
            for (std::size_t f = 0; f < fold.keys.size(); ++f)
                if (fold.keys[f].first->t.from == record_state::absent &&
                    detail::sqlite::insert_new_record(conn_, stmts_.insert_new, fold.keys[f], last_row[f])) {
                    inserted[f] = 1;
                    previous[f] = 0;  // no record before this batch: the chain starts here
                }
            for (std::size_t i = 0; i < rows.size(); ++i) {
                std::int64_t& prev = previous[fold.key_of[i]];
                if (prev < 0)
                    prev = detail::sqlite::last_audit(conn_, stmts_.last_audit,
                                                      rows[i].t.k.view());  // the chain audit() follows
                detail::sqlite::insert_audit(conn_, stmts_.audit, rows[i], node_, sequence, prev);
                prev = sequence++;
            }
            for (std::size_t f = 0; f < fold.keys.size(); ++f) {
                IDEM_ASSERT(previous[f] == last_row[f], "a key's record points at the audit row its batch wrote last");
                if (!inserted[f]) detail::sqlite::upsert_record(conn_, stmts_.upsert, fold.keys[f], previous[f]);
            }
            std::uint64_t fence = 0;
            for (const store_row& r : rows) fence = std::max(fence, r.t.fence);
            sqlite3_reset(stmts_.sequence);
            sqlite3_bind_int64(stmts_.sequence, 1, sequence);
            sqlite3_bind_int64(stmts_.sequence, 2, static_cast<std::int64_t>(fence));
            conn_.step_done(stmts_.sequence, "advance audit sequence");
            conn_.exec("COMMIT", "commit batch");
            next_sequence_ = sequence;
        } catch (...) {
            conn_.rollback();
            throw;
        }
        // Checked again after the commit: a batch that committed into a file the path no longer
        // names is reported as failed, so its rows stay pending and are never acknowledged.
        check_file("after the batch committed");
    }

    /// A sync-mode durable_guard calls this before recovery reads anything: it is where a store
    /// that will write takes the writer lock (sqlite_lock::on_first_write). Throws
    /// store_unavailable naming the holder when another store holds it.
    void check_sync_durability() override {
        ensure_open();
        ensure_writer();
    }

    bool committed(std::uint64_t batch_id) override {
        ensure_open();
        check_file("asked whether a batch committed");
        sqlite3_stmt* s = conn_.prepare("SELECT 1 FROM idempotent_batch WHERE batch_id = ?1");
        sqlite3_bind_int64(s, 1, static_cast<std::int64_t>(batch_id));
        const int rc = sqlite3_step(s);
        sqlite3_finalize(s);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) conn_.fail(rc, "check batch id");
        return rc == SQLITE_ROW;
    }

    void load(const std::function<void(const stored_record&)>& fn) override {
        ensure_open();
        const detail::sqlite::statement s(conn_, detail::sqlite::select_records);
        int rc;
        while ((rc = sqlite3_step(s.s)) == SQLITE_ROW) fn(detail::sqlite::read_record(conn_, s.s));
        if (rc != SQLITE_DONE) conn_.fail(rc, "load records");
    }

    std::optional<stored_record> get(std::string_view key) override {
        ensure_open();
        const detail::sqlite::statement s(conn_, std::string(detail::sqlite::select_records) + " WHERE idempotent_key = ?1");
        sqlite3_bind_text(s.s, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
        const int rc = sqlite3_step(s.s);
        if (rc == SQLITE_ROW) return detail::sqlite::read_record(conn_, s.s);
        if (rc != SQLITE_DONE) conn_.fail(rc, "read record");
        return std::nullopt;
    }

    /// The key's audit rows, found by following the chain from its record's last_audit back
    /// through each row's `previous` (one rowid lookup per row). A key with no record (or none
    /// that points at its history) is looked for by a scan of the whole audit table. On a pruned
    /// store a link below idem_schema.pruned_sequence is the trail's legal start (its rows were
    /// pruned), and once records were pruned the chain of a key claimed again starts afresh, so
    /// rows of its earlier life are looked for by a scan of the table below the chain.
    std::vector<audit_entry> audit(std::string_view key) override {
        ensure_open();
        std::vector<audit_entry> out;
        const detail::sqlite::pruned_state pruned = detail::sqlite::read_pruned(conn_);
        std::int64_t at = detail::sqlite::last_audit(conn_, stmts_.last_audit, key);
        if (at == 0) {
            scan_audit_rows("WHERE idempotent_key = ?1 ORDER BY sequence", key,
                            [&](const audit_entry& a, std::int64_t) { out.push_back(a); });
            return out;
        }
        const std::string_view by_sequence = "WHERE sequence = ?1";
        while (at != 0) {
            bool found = false;
            std::int64_t previous = 0;
            scan_audit_rows(
                by_sequence, std::nullopt,
                [&](const audit_entry& a, std::int64_t prev) {
                    found = true;
                    previous = prev;
                    out.push_back(a);
                },
                at);
            const std::string row = "audit row " + std::to_string(at) + " of key '" + key::printable(key) + "'";
            if (!found && at < pruned.sequence) break;  // pruned: the trail starts after it
            if (!found)
                throw error(errc::corrupt_record,
                            where() + row + " is missing (the key's chain of audit rows is broken" +
                                (pruned.sequence > 0
                                     ? "; only rows below sequence " + std::to_string(pruned.sequence) + " were pruned)"
                                     : ")"));
            if (out.back().key != key)
                throw error(errc::corrupt_record,
                            where() + row + " belongs to key '" + key::printable(out.back().key) + "'");
            if (previous < 0 || previous >= at)
                throw error(errc::corrupt_record, where() + row + " has previous = " + std::to_string(previous) +
                                                      "; it must be 0 or an earlier sequence");
            at = previous;
        }
        std::reverse(out.begin(), out.end());
        if (at == 0 && pruned.records_ms != prune_limits::keep_all && !out.empty()) {
            std::vector<audit_entry> earlier;  // an earlier life of the key, whose record was pruned
            scan_audit_rows("WHERE idempotent_key = ?1 AND sequence < " + std::to_string(out.front().sequence) +
                                " ORDER BY sequence",
                            key, [&](const audit_entry& a, std::int64_t) { earlier.push_back(a); });
            out.insert(out.begin(), earlier.begin(), earlier.end());
        }
        return out;
    }

    void scan_audit(const std::function<void(const audit_entry&)>& fn) override {
        ensure_open();
        scan_audit_rows("ORDER BY idempotent_key, sequence", {}, [&](const audit_entry& a, std::int64_t) { fn(a); });
    }

    /// Runs fn (load, scan_audit, get, audit) in one read transaction on this connection: under WAL
    /// a deferred transaction keeps the snapshot of its first read until COMMIT, so a live store's
    /// records and audit trail are read as of one moment (idem verify on a store being written).
    void snapshot_read(const std::function<void()>& fn) override {
        ensure_open();
        if (sqlite3_get_autocommit(conn_.handle()) == 0) return fn();  // already inside a transaction
        conn_.exec("BEGIN", "begin snapshot read");
        try {
            fn();
        } catch (...) {
            conn_.rollback();
            throw;
        }
        conn_.exec("COMMIT", "end snapshot read");
    }

    /// One row: idem_schema.max_fence, raised by every batch (schema version 4), and the largest
    /// fence of a pruned record.
    std::uint64_t max_fence() override {
        ensure_open();
        return static_cast<std::uint64_t>(
            std::max(detail::sqlite::read_max_fence(conn_), detail::sqlite::read_pruned(conn_).fence));
    }

    /// The claims in flight through the partial index of PROCESSING records (schema version 4).
    void load_claims(const std::function<void(const stored_record&)>& fn) override {
        ensure_open();
        const detail::sqlite::statement s(conn_, detail::sqlite::select_claims);
        int rc;
        while ((rc = sqlite3_step(s.s)) == SQLITE_ROW) fn(detail::sqlite::read_record(conn_, s.s));
        if (rc != SQLITE_DONE) conn_.fail(rc, "load the claims in flight");
    }

    /// The window's keys from the updated_time index alone (it holds the key: the table is WITHOUT
    /// ROWID), never the rows.
    void load_window_keys(std::int64_t since_ms, const std::function<void(std::string_view, std::int64_t)>& fn) override {
        ensure_open();
        const detail::sqlite::statement s(conn_, detail::sqlite::select_window_keys);
        sqlite3_bind_int64(s.s, 1, since_ms);
        int rc;
        while ((rc = sqlite3_step(s.s)) == SQLITE_ROW) {
            const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(s.s, 0));
            const auto n = static_cast<std::size_t>(sqlite3_column_bytes(s.s, 0));
            // A damaged time is corrupt_record, never read as 0 (which would leave the key out).
            fn(std::string_view(text == nullptr ? "" : text, n), conn_.integer(s.s, 1, "updated_time"));
        }
        if (rc != SQLITE_DONE) conn_.fail(rc, "load the window's keys");
    }

    /// One short BEGIN IMMEDIATE transaction (see store::prune). Records: the oldest first by the
    /// index on updated_time, so a call reads only the rows it deletes (and any PROCESSING rows
    /// older than the bound); their largest fence is kept in idem_schema for max_fence(). Audit
    /// rows: a prefix of the table in sequence (rowid) order, up to the first row not older than
    /// the bound, deleted as one rowid range; idem_schema.pruned_sequence then says every chain link
    /// below it may be gone. The horizon moves forward only, in the same transaction.
    prune_result prune(const prune_limits& limits) override {
        using detail::sqlite::statement;
        ensure_open();
        ensure_writer();
        check_file("before a prune");
        prune_result out;
        const auto limit = static_cast<std::int64_t>(std::min<std::size_t>(limits.max_rows, INT64_MAX - 1));
        conn_.exec("BEGIN IMMEDIATE", "begin prune");
        try {
            detail::sqlite::pruned_state p = detail::sqlite::read_pruned(conn_);
            if (limits.records_before_ms != prune_limits::keep_all) {
                const std::string expired =
                    "idempotent_key IN (SELECT idempotent_key FROM idempotent_record WHERE updated_time < ?1 AND "
                    "status <> 'PROCESSING' ORDER BY updated_time LIMIT ?2)";
                statement f(conn_,
                            "SELECT COUNT(*), COALESCE(MAX(fencing_token), 0) FROM idempotent_record WHERE " + expired);
                statement d(conn_, "DELETE FROM idempotent_record WHERE " + expired);
                statement m(conn_,
                            "SELECT EXISTS (SELECT 1 FROM idempotent_record WHERE updated_time < ?1 AND "
                            "status <> 'PROCESSING')");
                for (sqlite3_stmt* q : {f.s, d.s, m.s}) sqlite3_bind_int64(q, 1, limits.records_before_ms);
                for (sqlite3_stmt* q : {f.s, d.s}) sqlite3_bind_int64(q, 2, limit);
                f.row("find expired records");
                out.records = static_cast<std::size_t>(sqlite3_column_int64(f.s, 0));
                p.fence = std::max(p.fence, conn_.integer(f.s, 1, "the largest fence of the expired records"));
                conn_.step_done(d.s, "delete expired records");
                m.row("look for more expired records");
                out.more = sqlite3_column_int64(m.s, 0) != 0;
                p.records_ms = std::max(p.records_ms, limits.records_before_ms);
            }
            if (limits.audit_before_ms != prune_limits::keep_all) {
                // The first limit + 1 rows in sequence order: the prefix older than the bound ends at
                // the first row that is not, or at the limit (then the next row says whether more).
                statement q(conn_, "SELECT sequence, at_time FROM idempotent_audit ORDER BY sequence LIMIT ?1");
                sqlite3_bind_int64(q.s, 1, limit + 1);
                std::int64_t last = 0;
                int rc;
                while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
                    const std::int64_t seq = conn_.integer(q.s, 0, "an audit row");
                    if (conn_.integer(q.s, 1, "audit row " + std::to_string(seq)) >= limits.audit_before_ms) break;
                    if (out.audit_rows == limits.max_rows) {
                        out.more = true;
                        break;
                    }
                    last = seq;
                    ++out.audit_rows;
                }
                if (rc != SQLITE_ROW && rc != SQLITE_DONE) conn_.fail(rc, "find expired audit rows");
                if (last != 0) {
                    statement d(conn_, "DELETE FROM idempotent_audit WHERE sequence <= ?1");
                    sqlite3_bind_int64(d.s, 1, last);
                    conn_.step_done(d.s, "delete expired audit rows");
                    p.sequence = std::max(p.sequence, last + 1);
                }
                p.audit_ms = std::max(p.audit_ms, limits.audit_before_ms);
            }
            detail::sqlite::write_pruned(conn_, p);
            conn_.exec("COMMIT", "commit prune");
        } catch (...) {
            conn_.rollback();
            throw;
        }
        check_file("after a prune committed");
        return out;
    }

    prune_horizon horizon() override {
        ensure_open();
        const detail::sqlite::pruned_state p = detail::sqlite::read_pruned(conn_);
        return {p.records_ms, p.audit_ms};
    }

    /// Closes and reopens the connection (the writer lock stays held). A temporary database lives
    /// only as long as its connection, so while one is open it is kept (closing it would drop
    /// every record). A file store reopens only the file it opened first: when the path no longer
    /// names it, reconnect() refuses (store_error) instead of creating a new, empty database there.
    void reconnect() override {
        if (temporary_ && conn_.is_open()) return;
        close();
        open();
    }

    std::string name() const override { return "sqlite:" + path_; }

private:
    [[nodiscard]] std::string where() const { return detail::sqlite::where(path_); }

    /// After a failed reconnect the handle is gone: reopen, so the caller sees the real cause.
    void ensure_open() {
        if (!conn_.is_open()) open();
    }

    /// Throws store_error when the files under the store are not the ones it opened (a temporary
    /// database has none): detail/sqlite/file_identity.hpp.
    void check_file(const char* when) {
        if (!temporary_) files_.check(when, conn_.handle(), lock_);
    }

    /// Makes this store the writer before it writes. With sqlite_lock::on_first_write the lock is
    /// taken here; what the store read before then (a guard's recovery) must still be current, so
    /// when another writer committed since this store first opened the file (next_sequence moved),
    /// it refuses for good: acting on that older state could run a key twice.
    void ensure_writer() {
        if (temporary_ || lock_.held()) return;
        if (!stale_.empty()) throw error(errc::store_unavailable, stale_);
        lock_.take();
        const std::int64_t now = detail::sqlite::read_next_sequence(conn_).value_or(opened_sequence_);
        if (now == opened_sequence_) return;
        lock_.release();
        stale_ = where() + "another writer committed to the file after this store opened it (audit sequence " +
                 std::to_string(opened_sequence_) + " then, " + std::to_string(now) +
                 " now), so what this store read may be out of date; it will not write. Open a new store (restart "
                 "the process) once the other writer has stopped";
        throw error(errc::store_unavailable, stale_);
    }

    /// Opens the connection: at the first open the lock file (and, with sqlite_lock::at_open, the
    /// lock), the schema (created or upgraded), the statements, the audit sequence; then notes the
    /// files it opened. A reopen opens only the file the first open found.
    void open() {
        const detail::sqlite::connection::opening_scope opening(conn_);
        const bool first = !files_.known();
        if (!temporary_) {
            files_.refuse_if_lost();
            if (!first) files_.check_reopen();
            // A writer keeps PATH.lock open, and locked, from its first open to its destructor.
            IDEM_ASSERT(!lock_.held() || lock_.file_open(), "the writer lock stays held across a reopen");
            if (!lock_.file_open()) lock_.open_file();
            if (first) lock_.refuse_lost_database();
            if (first && lock_when_ == sqlite_lock::at_open) lock_.take();
        }
        // Only the first open may create the file: a reopen that found nothing at the path would
        // otherwise start a new, empty history there.
        conn_.open(first);
        try {
            conn_.configure(full_sync_, busy_timeout_);
            conn_.exec("BEGIN IMMEDIATE", "begin schema");
            detail::sqlite::create_or_upgrade_schema(conn_);
            detail::sqlite::add_payload_column(conn_);
            conn_.exec("COMMIT", "commit schema");
            stmts_.prepare(conn_);
            next_sequence_ = detail::sqlite::read_next_sequence(conn_).value_or(1);
            // Each batch numbers its audit rows from here with ++: a counter no real history reaches
            // (2^62 transitions) can only come from a damaged file, and would overflow.
            if (next_sequence_ < 1 || next_sequence_ > (std::int64_t{1} << 62))
                throw error(errc::corrupt_record, where() + "idem_schema.next_sequence is " +
                                                      std::to_string(next_sequence_) +
                                                      "; it must be between 1 and 2^62 (damaged file?)");
            if (!temporary_) {
                files_.note(first);
                // The baseline against which a store that writes later checks that nobody wrote meanwhile.
                if (first) opened_sequence_ = next_sequence_;
            }
        } catch (...) {
            conn_.rollback();
            close();
            throw;
        }
    }

    void close() noexcept {
        stmts_.finalize();  // before the handle: sqlite3_close_v2 would otherwise keep it open
        conn_.close();
    }

    /// Audit rows selected by `clause` (detail/sqlite/statements.hpp, scan_audit_rows).
    template <class Fn>
    void scan_audit_rows(std::string_view clause, std::optional<std::string_view> key, Fn&& fn, std::int64_t sequence = 0) {
        detail::sqlite::scan_audit_rows(conn_, clause, key, std::forward<Fn>(fn), sequence);
    }

    std::string path_;
    bool full_sync_;
    std::chrono::milliseconds busy_timeout_;
    bool temporary_;  // "" or ":memory:", accepted by explicit request
    sqlite_lock lock_when_;
    // Declared before the connection, so that PATH.lock closes after it, also when the constructor throws.
    detail::sqlite::writer_lock lock_;
    detail::sqlite::connection conn_;
    detail::sqlite::batch_statements stmts_;  // finalized before conn_ closes
    detail::sqlite::file_watch files_;        // the file and log first opened; a lost log or lock file
    std::int64_t next_sequence_ = 1;          // audit sequence: this store is the file's only writer
    std::int64_t opened_sequence_ = 0;        // next_sequence at the first open
    std::string stale_;                       // set when another writer committed before this store took the lock
};

}  // namespace idem
