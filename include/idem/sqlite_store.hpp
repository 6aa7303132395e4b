// idem/sqlite_store.hpp: the embedded default store (target idem::sqlite; links libsqlite3).
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
#pragma once

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <string_view>
#include <vector>

#include "idem/detail/batch_fold.hpp"
#include "idem/detail/record_rules.hpp"
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
          lock_when_(opts.writer_lock) {
        std::string why;
        if (!check_path(path_, opts.allow_temporary, &why))
            throw error(errc::invalid_argument,
                        temporary_ ? why + "; to ask for a temporary database, use sqlite_store::temporary() or "
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
        return path.empty() || path == ":memory:";
    }

    /// Whether `path` may name this store's database (the rules in the header comment; the file
    /// system is not consulted). On refusal fills *why (if given) with the path and the rule.
    static bool check_path(std::string_view path, bool allow_temporary, std::string* why = nullptr) {
        const bool nul = path.find('\0') != std::string_view::npos;
        auto refuse = [&](const std::string& rule) {
            if (why) *why = "sqlite path '" + (nul ? key::printable(path) : std::string(path)) + "' " + rule;
            return false;
        };
        if (nul) return refuse("holds a NUL byte; SQLite would open the path cut at that byte");
        if (path.starts_with("file:"))
            return refuse(
                "begins with 'file:', so SQLite may read it as a URI, whose parameters (mode=memory, vfs=memdb, "
                "nolock=1, immutable=1, ...) drop durability or locking; this store opens plain paths only (write "
                "'./" + std::string(path) + "' for a file of that name)");
        if (allow_temporary) return true;
        if (path.empty())
            return refuse("is empty, which makes SQLite create a temporary database that it deletes when the store "
                          "closes: nothing would survive a reopen; name a database file");
        if (path == ":memory:")
            return refuse("makes SQLite create an in-memory database that is gone when the store closes: nothing "
                          "would survive a reopen; name a database file");
        return true;
    }
    ~sqlite_store() override { close(); }

    /// Another connection to the file, for reads beside this writer (WAL: readers never wait for
    /// a writer). It never takes the writer lock: it never writes. nullptr for a temporary
    /// database (a second connection would see another one).
    std::unique_ptr<store> open_reader() override {
        if (temporary_) return nullptr;
        return std::make_unique<sqlite_store>(path_, sqlite_options{full_sync_, busy_timeout_, false,
                                                                    sqlite_lock::on_first_write});
    }  // then lock_fd_ closes, which releases the writer lock
    sqlite_store(const sqlite_store&) = delete;
    sqlite_store& operator=(const sqlite_store&) = delete;

    static constexpr int schema_version = 3;

    void apply(std::span<const store_row> rows, std::uint64_t batch_id) override {
        ensure_open();
        ensure_writer();
        check_file("before the batch");
        exec("BEGIN IMMEDIATE", "begin batch");
        std::int64_t sequence = next_sequence_;
        try {
            sqlite3_stmt* b = batch_stmt_;
            sqlite3_reset(b);
            sqlite3_bind_int64(b, 1, static_cast<std::int64_t>(batch_id));
            sqlite3_bind_int64(b, 2, rows.empty() ? 0 : rows.back().at_ms);
            step_done(b, "insert batch id");
            // One audit row per row; then one upsert per key with the batch's fold
            // (detail/batch_fold.hpp), its guard in the statement (the stored record is in the file).
            const detail::batch_fold fold = detail::fold_batch(rows);
            std::vector<std::int64_t> previous(fold.keys.size(), -1);  // each key's latest audit row; -1: not read yet
            for (std::size_t i = 0; i < rows.size(); ++i) {
                const store_row& r = rows[i];
                const auto k = r.t.k.view();
                std::int64_t& prev = previous[fold.key_of[i]];
                if (prev < 0) prev = last_audit(k);  // the chain audit() follows
                sqlite3_stmt* a = audit_stmt_;
                sqlite3_reset(a);
                sqlite3_bind_text(a, 1, k.data(), static_cast<int>(k.size()), SQLITE_STATIC);
                sqlite3_bind_text(a, 2, status_text(r.t.from), -1, SQLITE_STATIC);
                sqlite3_bind_text(a, 3, status_text(r.t.to), -1, SQLITE_STATIC);
                sqlite3_bind_int64(a, 4, static_cast<std::int64_t>(r.t.fence));
                sqlite3_bind_text(a, 5, node_.data(), static_cast<int>(node_.size()), SQLITE_STATIC);
                sqlite3_bind_int64(a, 6, r.at_ms);
                char detail[48];
                const int n = std::snprintf(detail, sizeof detail, "%s outcome=%llu", to_string(r.t.cause),
                                            static_cast<unsigned long long>(r.t.outcome));
                if (r.t.payload.empty()) {
                    sqlite3_bind_text(a, 7, detail, n, SQLITE_TRANSIENT);
                } else {  // the payload's length and hash, not its bytes (store_rows.hpp, payload_detail)
                    const std::string with = std::string(detail, static_cast<std::size_t>(n)) + payload_detail(r.t.payload);
                    sqlite3_bind_text(a, 7, with.data(), static_cast<int>(with.size()), SQLITE_TRANSIENT);
                }
                sqlite3_bind_int64(a, 8, sequence);
                sqlite3_bind_int64(a, 9, prev);
                step_done(a, "insert audit row");
                prev = sequence++;
            }
            for (std::size_t f = 0; f < fold.keys.size(); ++f) {
                const detail::key_fold& kf = fold.keys[f];
                const store_row& last = *kf.last;
                const store_row* claim = kf.proc;
                const auto k = kf.key();
                sqlite3_stmt* u = upsert_stmt_;
                sqlite3_reset(u);
                const std::string biz = biz_type_of(k);
                sqlite3_bind_text(u, 1, k.data(), static_cast<int>(k.size()), SQLITE_STATIC);
                sqlite3_bind_text(u, 2, biz.data(), static_cast<int>(biz.size()), SQLITE_TRANSIENT);
                sqlite3_bind_text(u, 3, status_text(last.t.to), -1, SQLITE_STATIC);
                sqlite3_bind_int64(u, 4, static_cast<std::int64_t>(last.t.fence));
                sqlite3_bind_int64(u, 5, claim ? claim->lease_until_ms : 0);
                sqlite3_bind_int64(u, 6, static_cast<std::int64_t>(last.t.outcome));
                sqlite3_bind_int64(u, 7, static_cast<std::int64_t>(claim ? claim->t.fingerprint : 0));
                sqlite3_bind_int64(u, 8, last.at_ms);
                sqlite3_bind_int(u, 9, claim ? 1 : 0);
                sqlite3_bind_int64(u, 10, kf.first->at_ms);
                sqlite3_bind_int64(u, 11, previous[f]);
                sqlite3_bind_int64(u, 12, claim ? static_cast<std::int64_t>(claim->t.fence) : 0);
                // A blob with its length, never text: NUL and invalid UTF-8 round-trip byte for byte.
                // (A null pointer would bind NULL, which the NOT NULL column refuses: none is x''.)
                const std::string_view payload = last.t.payload;
                if (payload.empty()) sqlite3_bind_zeroblob(u, 13, 0);
                else sqlite3_bind_blob64(u, 13, payload.data(), payload.size(), SQLITE_STATIC);
                step_done(u, "upsert record");
            }
            sqlite3_reset(sequence_stmt_);
            sqlite3_bind_int64(sequence_stmt_, 1, sequence);
            step_done(sequence_stmt_, "advance audit sequence");
            exec("COMMIT", "commit batch");
            next_sequence_ = sequence;
        } catch (...) {
            sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
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
        sqlite3_stmt* s = prepare("SELECT 1 FROM idempotent_batch WHERE batch_id = ?1");
        sqlite3_bind_int64(s, 1, static_cast<std::int64_t>(batch_id));
        const int rc = sqlite3_step(s);
        sqlite3_finalize(s);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) fail(rc, "check batch id");
        return rc == SQLITE_ROW;
    }

    void load(const std::function<void(const stored_record&)>& fn) override {
        ensure_open();
        sqlite3_stmt* s = prepare(
            "SELECT idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, "
            "created_time, updated_time, payload FROM idempotent_record");
        try {
            int rc;
            while ((rc = sqlite3_step(s)) == SQLITE_ROW) fn(read_record(s));
            if (rc != SQLITE_DONE) fail(rc, "load records");
        } catch (...) {
            sqlite3_finalize(s);
            throw;
        }
        sqlite3_finalize(s);
    }

    std::optional<stored_record> get(std::string_view key) override {
        ensure_open();
        sqlite3_stmt* s = prepare(
            "SELECT idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, "
            "created_time, updated_time, payload FROM idempotent_record WHERE idempotent_key = ?1");
        sqlite3_bind_text(s, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
        std::optional<stored_record> out;
        try {
            const int rc = sqlite3_step(s);
            if (rc == SQLITE_ROW) out = read_record(s);
            else if (rc != SQLITE_DONE) fail(rc, "read record");
        } catch (...) {
            sqlite3_finalize(s);
            throw;
        }
        sqlite3_finalize(s);
        return out;
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
        const pruned_state pruned = read_pruned();
        std::int64_t at = last_audit(key);
        if (at == 0) {
            scan_audit_where("WHERE idempotent_key = ?1 ORDER BY sequence", key,
                             [&](const audit_entry& a, std::int64_t) { out.push_back(a); });
            return out;
        }
        const std::string_view by_sequence = "WHERE sequence = ?1";
        while (at != 0) {
            bool found = false;
            std::int64_t previous = 0;
            scan_audit_where(by_sequence, std::nullopt,
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
                                (pruned.sequence > 0 ? "; only rows below sequence " + std::to_string(pruned.sequence) +
                                                           " were pruned)"
                                                     : ")"));
            if (out.back().key != key)
                throw error(errc::corrupt_record, where() + row + " belongs to key '" + key::printable(out.back().key) + "'");
            if (previous < 0 || previous >= at)
                throw error(errc::corrupt_record, where() + row + " has previous = " + std::to_string(previous) +
                                                      "; it must be 0 or an earlier sequence");
            at = previous;
        }
        std::reverse(out.begin(), out.end());
        if (at == 0 && pruned.records_ms != prune_limits::keep_all && !out.empty()) {
            std::vector<audit_entry> earlier;  // an earlier life of the key, whose record was pruned
            scan_audit_where("WHERE idempotent_key = ?1 AND sequence < " + std::to_string(out.front().sequence) +
                                 " ORDER BY sequence",
                             key, [&](const audit_entry& a, std::int64_t) { earlier.push_back(a); });
            out.insert(out.begin(), earlier.begin(), earlier.end());
        }
        return out;
    }

    void scan_audit(const std::function<void(const audit_entry&)>& fn) override {
        ensure_open();
        scan_audit_where("ORDER BY idempotent_key, sequence", {}, [&](const audit_entry& a, std::int64_t) { fn(a); });
    }

    /// Runs fn (load, scan_audit, get, audit) in one read transaction on this connection: under WAL
    /// a deferred transaction keeps the snapshot of its first read until COMMIT, so a live store's
    /// records and audit trail are read as of one moment (idem verify on a store being written).
    void snapshot_read(const std::function<void()>& fn) override {
        ensure_open();
        if (sqlite3_get_autocommit(db_) == 0) return fn();  // already inside a transaction
        exec("BEGIN", "begin snapshot read");
        try {
            fn();
        } catch (...) {
            sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
            throw;
        }
        exec("COMMIT", "end snapshot read");
    }

    std::uint64_t max_fence() override {
        ensure_open();
        // MAX() orders text above every integer, so a damaged text fence would be the maximum.
        sqlite3_stmt* s = prepare("SELECT COALESCE(MAX(fencing_token), 0) AS fencing_token FROM idempotent_record");
        const int rc = sqlite3_step(s);
        std::uint64_t v = 0;
        try {
            if (rc == SQLITE_ROW) v = static_cast<std::uint64_t>(integer(s, 0, "the largest record fence"));
        } catch (...) {
            sqlite3_finalize(s);
            throw;
        }
        sqlite3_finalize(s);
        if (rc != SQLITE_ROW) fail(rc, "read max fence");
        return std::max(v, static_cast<std::uint64_t>(read_pruned().fence));
    }

    /// One short BEGIN IMMEDIATE transaction (see store::prune). Records: the oldest first by the
    /// index on updated_time, so a call reads only the rows it deletes (and any PROCESSING rows
    /// older than the bound); their largest fence is kept in idem_schema for max_fence(). Audit
    /// rows: a prefix of the table in sequence (rowid) order, up to the first row not older than
    /// the bound, deleted as one rowid range; idem_schema.pruned_sequence then says every chain link
    /// below it may be gone. The horizon moves forward only, in the same transaction.
    prune_result prune(const prune_limits& limits) override {
        ensure_open();
        ensure_writer();
        check_file("before a prune");
        prune_result out;
        const auto limit = static_cast<std::int64_t>(std::min<std::size_t>(limits.max_rows, INT64_MAX - 1));
        exec("BEGIN IMMEDIATE", "begin prune");
        try {
            pruned_state p = read_pruned();
            if (limits.records_before_ms != prune_limits::keep_all) {
                const std::string expired =
                    "idempotent_key IN (SELECT idempotent_key FROM idempotent_record WHERE updated_time < ?1 AND "
                    "status <> 'PROCESSING' ORDER BY updated_time LIMIT ?2)";
                statement f(*this, "SELECT COUNT(*), COALESCE(MAX(fencing_token), 0) FROM idempotent_record WHERE " +
                                       expired);
                statement d(*this, "DELETE FROM idempotent_record WHERE " + expired);
                statement m(*this, "SELECT EXISTS (SELECT 1 FROM idempotent_record WHERE updated_time < ?1 AND "
                                   "status <> 'PROCESSING')");
                for (sqlite3_stmt* q : {f.s, d.s, m.s}) sqlite3_bind_int64(q, 1, limits.records_before_ms);
                for (sqlite3_stmt* q : {f.s, d.s}) sqlite3_bind_int64(q, 2, limit);
                f.row("find expired records");
                out.records = static_cast<std::size_t>(sqlite3_column_int64(f.s, 0));
                p.fence = std::max(p.fence, integer(f.s, 1, "the largest fence of the expired records"));
                step_done(d.s, "delete expired records");
                m.row("look for more expired records");
                out.more = sqlite3_column_int64(m.s, 0) != 0;
                p.records_ms = std::max(p.records_ms, limits.records_before_ms);
            }
            if (limits.audit_before_ms != prune_limits::keep_all) {
                // The first limit + 1 rows in sequence order: the prefix older than the bound ends at
                // the first row that is not, or at the limit (then the next row says whether more).
                statement q(*this, "SELECT sequence, at_time FROM idempotent_audit ORDER BY sequence LIMIT ?1");
                sqlite3_bind_int64(q.s, 1, limit + 1);
                std::int64_t last = 0;
                int rc;
                while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
                    const std::int64_t seq = integer(q.s, 0, "an audit row");
                    if (integer(q.s, 1, "audit row " + std::to_string(seq)) >= limits.audit_before_ms) break;
                    if (out.audit_rows == limits.max_rows) {
                        out.more = true;
                        break;
                    }
                    last = seq;
                    ++out.audit_rows;
                }
                if (rc != SQLITE_ROW && rc != SQLITE_DONE) fail(rc, "find expired audit rows");
                if (last != 0) {
                    statement d(*this, "DELETE FROM idempotent_audit WHERE sequence <= ?1");
                    sqlite3_bind_int64(d.s, 1, last);
                    step_done(d.s, "delete expired audit rows");
                    p.sequence = std::max(p.sequence, last + 1);
                }
                p.audit_ms = std::max(p.audit_ms, limits.audit_before_ms);
            }
            statement w(*this, "UPDATE idem_schema SET records_horizon = ?1, audit_horizon = ?2, pruned_sequence = ?3, "
                               "pruned_fence = ?4");
            for (auto [i, v] : {std::pair{1, p.records_ms}, std::pair{2, p.audit_ms}}) {
                if (v == prune_limits::keep_all) sqlite3_bind_null(w.s, i);
                else sqlite3_bind_int64(w.s, i, v);
            }
            sqlite3_bind_int64(w.s, 3, p.sequence);
            sqlite3_bind_int64(w.s, 4, p.fence);
            step_done(w.s, "write the prune horizon");
            exec("COMMIT", "commit prune");
        } catch (...) {
            sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
            throw;
        }
        check_file("after a prune committed");
        return out;
    }

    prune_horizon horizon() override {
        ensure_open();
        const pruned_state p = read_pruned();
        return {p.records_ms, p.audit_ms};
    }

    /// Closes and reopens the connection (the writer lock stays held). A temporary database lives
    /// only as long as its connection, so while one is open it is kept (closing it would drop
    /// every record). A file store reopens only the file it opened first: when the path no longer
    /// names it, reconnect() refuses (store_error) instead of creating a new, empty database there.
    void reconnect() override {
        if (temporary_ && db_ != nullptr) return;
        close();
        open();
    }

    std::string name() const override { return "sqlite:" + path_; }

private:
    /// After a failed reconnect the handle is gone: reopen, so the caller sees the real cause.
    void ensure_open() {
        if (db_ == nullptr) open();
    }

    // ---- path identity: the path must keep naming the file this store opened -----------------

    [[nodiscard]] std::string lock_path() const { return path_ + ".lock"; }
    [[nodiscard]] std::string where() const { return "sqlite:" + path_ + ": "; }

    /// Notes, at each open, the identity of the database file (the first open's is kept for the
    /// store's life) and of its write-ahead log (SQLite makes a new one when the last connection
    /// closes and the next opens, so it is noted again). next_sequence at the first open is the
    /// baseline against which a store that writes later checks that nobody wrote meanwhile.
    void note_files(bool first) {
        struct stat st {};
        if (::stat(path_.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
            throw error(errc::store_error, where() + "the database file vanished while it was being opened");
        if (first) {
            file_dev_ = st.st_dev;
            file_ino_ = st.st_ino;
            identity_known_ = true;
            opened_sequence_ = next_sequence_;
        } else if (st.st_dev != file_dev_ || st.st_ino != file_ino_) {
            throw error(errc::store_error, where() + replaced_message("while it was being reopened"));
        }
        wal_known_ = ::stat((path_ + "-wal").c_str(), &st) == 0;
        wal_dev_ = st.st_dev;
        wal_ino_ = st.st_ino;
    }

    [[nodiscard]] static std::string replaced_message(const std::string& when) {
        return "the database file was deleted or replaced under the running process (" + when +
               "): the path no longer names the file this store opened, so a commit would go to a file that no "
               "restart finds; this store acknowledges nothing until the path names that file again";
    }

    /// A reopen (reconnect, or the next call after a failed one) must find the file it opened
    /// first. A missing file is not created again, and another file at the path is not used: either
    /// would put an empty or foreign history in place of the one the guard's memory reflects.
    /// Something that is not a regular file is left to SQLite's open and the configuration checks,
    /// which name it (a directory at the path, ...).
    void check_reopen() const {
        struct stat st {};
        if (::stat(path_.c_str(), &st) != 0) {
            const int e = errno;
            if (e == ENOENT || e == ENOTDIR)
                throw error(errc::store_error,
                            where() + replaced_message(std::string("found at reconnect: ") + std::strerror(e)) +
                                "; refusing to create a new, empty database in its place (that would drop the "
                                "history of every key)");
            return;  // unreachable for now: SQLite's open and the configuration checks say why
        }
        if (S_ISREG(st.st_mode) && (st.st_dev != file_dev_ || st.st_ino != file_ino_))
            throw error(errc::store_error, where() + replaced_message("found at reconnect: another file is at the path") +
                                               "; refusing to use it in place of the history this store opened");
    }

    /// What is wrong with the files under a writer, or "" when the path still names the database
    /// file it opened, its write-ahead log is the one it opened, and (for the writer) PATH.lock is
    /// the file it locked. Cheap: a few stat() calls, once before and once after each batch.
    /// `sticky` is set for faults that a later call cannot see heal (see check_file).
    [[nodiscard]] std::string file_fault(bool& sticky) const {
        sticky = false;
        struct stat st {};
        if (::stat(path_.c_str(), &st) != 0) {
            const int e = errno;
            if (e == ENOENT || e == ENOTDIR) return replaced_message(std::strerror(e));
            return "the database file cannot be reached (" + std::string(std::strerror(e)) + ")";
        }
        if (st.st_dev != file_dev_ || st.st_ino != file_ino_)
            return replaced_message("another file is at the path");
        int moved = 0;
        if (db_ && sqlite3_file_control(db_, "main", SQLITE_FCNTL_HAS_MOVED, &moved) == SQLITE_OK && moved != 0)
            return replaced_message("SQLite reports the file moved");
        if (wal_known_) {
            const std::string wal = path_ + "-wal";
            if (::stat(wal.c_str(), &st) != 0 || st.st_dev != wal_dev_ || st.st_ino != wal_ino_) {
                sticky = true;
                return "the write-ahead log " + wal +
                       " was deleted or replaced under the running process: the commits it held since the last "
                       "checkpoint are no longer reachable by the path, so this store acknowledges nothing more; "
                       "close it (its connection checkpoints the log it still holds into the database file when it "
                       "is the last one) and restart";
            }
        }
        if (writer_) {
            struct stat held {};
            if (::fstat(lock_fd_, &held) != 0 || ::stat(lock_path().c_str(), &st) != 0 || st.st_dev != held.st_dev ||
                st.st_ino != held.st_ino) {
                sticky = true;
                return "the writer lock file " + lock_path() +
                       " was deleted or replaced under the running process: another process could now lock the new "
                       "file and write beside this one, so this store acknowledges nothing more; restart it";
            }
        }
        return {};
    }

    /// Throws store_error when file_fault() finds something: the batch is not acknowledged. A
    /// missing or replaced database file is checked again at every call, so putting the file back
    /// (renaming it to the path) resumes; a lost write-ahead log or lock file is final for this store.
    void check_file(const char* when) {
        if (temporary_) return;
        if (!lost_.empty()) throw error(errc::store_error, lost_);
        bool sticky = false;
        const std::string fault = file_fault(sticky);
        if (fault.empty()) return;
        const std::string msg = where() + fault + " [" + when + "]";
        if (sticky) lost_ = msg;
        throw error(errc::store_error, msg);
    }

    // ---- one writer: PATH.lock -----------------------------------------------------------------

    /// Opens (creating it when missing) PATH.lock, the file whose lock marks the writer. Opened at
    /// the first open even by a store that may only read, so that a directory where it cannot be
    /// created is refused at open, not at the first write.
    void open_lock_file() {
        lock_fd_.reset(::open(lock_path().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
        if (lock_fd_ >= 0) return;
        const int e = errno;
        const std::string fault = configuration_fault(path_);
        throw error(fault.empty() ? errc::store_error : errc::invalid_argument,
                    where() + (fault.empty() ? "" : fault + "; ") + "cannot open the writer lock file " + lock_path() +
                        " (" + std::strerror(e) + ")");
    }

    /// A first open that finds no database file but a PATH.lock in which a writer recorded itself:
    /// the database this path held was deleted or moved (`rm PATH`). Creating a new one would start
    /// an empty history in which every key the old one recorded runs again, so this is refused,
    /// naming both files. Deleting PATH.lock as well starts a new history on purpose.
    void refuse_lost_database() const {
        struct stat st {};
        if (::stat(path_.c_str(), &st) == 0 || errno != ENOENT) return;
        const std::string who = holder();
        if (who.empty()) return;  // no writer ever wrote here: a new database is expected
        throw error(errc::invalid_argument,
                    where() + "the database file is missing, but " + lock_path() + " records a writer (" + who +
                        "): the database this path held was deleted or moved, and a new, empty one would let every "
                        "key it recorded run again. Put the file back, or delete " + lock_path() +
                        " too to start a new, empty history on purpose");
    }

    /// Who holds the lock, as the holder wrote it into PATH.lock ("pid N on host H"), or "".
    [[nodiscard]] std::string holder() const {
        char buf[160] = {};
        const auto n = ::pread(lock_fd_, buf, sizeof buf - 1, 0);
        std::string h(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
        h = h.substr(0, h.find('\n'));
        for (char& c : h)
            if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
        return h;
    }

    /// Takes the writer lock (flock, exclusive, non-blocking) or throws store_unavailable naming
    /// the holder. flock locks belong to the open file: a second store in the same process is
    /// refused like one in another process; the kernel drops the lock when the holder's process
    /// ends, however it ends (SIGKILL included), so a crashed writer never blocks its successor.
    /// The descriptor is close-on-exec: a program the holder runs does not inherit it.
    void take_writer_lock() {
        for (int attempt = 0;; ++attempt) {
            if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
                const int e = errno;
                if (e != EWOULDBLOCK && e != EINTR)
                    throw error(errc::store_error, where() + "cannot lock " + lock_path() + " (" + std::strerror(e) + ")");
                const std::string who = holder();
                throw error(errc::store_unavailable,
                            where() + "another store holds the writer lock " + lock_path() + " (" +
                                (who.empty() ? std::string("holder not recorded") : who) +
                                "); a database file has one writer at a time: two would run the same keys twice and "
                                "overwrite each other's records. Stop the other writer, or read with a store that "
                                "does not write (idem verify, idem stats)");
            }
            // The file locked must still be the one at the path: one deleted or replaced in between
            // would let another process lock the new file too.
            struct stat held {}, now {};
            if (::fstat(lock_fd_, &held) == 0 && ::stat(lock_path().c_str(), &now) == 0 && held.st_dev == now.st_dev &&
                held.st_ino == now.st_ino)
                break;
            lock_fd_.reset();
            if (attempt == 3)
                throw error(errc::store_unavailable, where() + "the writer lock file " + lock_path() +
                                                         " keeps being replaced while it is locked");
            open_lock_file();
        }
        char host[64] = {};
        if (::gethostname(host, sizeof host - 1) != 0) host[0] = '?';
        const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host + "\n";
        if (::ftruncate(lock_fd_, 0) == 0) (void)!::pwrite(lock_fd_, me.data(), me.size(), 0);
        writer_ = true;
    }

    /// Makes this store the writer before it writes. With sqlite_lock::on_first_write the lock is
    /// taken here; what the store read before then (a guard's recovery) must still be current, so
    /// when another writer committed since this store first opened the file (next_sequence moved),
    /// it refuses for good: acting on that older state could run a key twice.
    void ensure_writer() {
        if (temporary_ || writer_) return;
        if (!stale_.empty()) throw error(errc::store_unavailable, stale_);
        take_writer_lock();
        sqlite3_stmt* m = prepare("SELECT next_sequence FROM idem_schema");
        std::int64_t now = opened_sequence_;
        try {
            if (sqlite3_step(m) == SQLITE_ROW) now = integer(m, 0, "idem_schema");
        } catch (...) {
            sqlite3_finalize(m);
            throw;
        }
        sqlite3_finalize(m);
        if (now == opened_sequence_) return;
        writer_ = false;
        ::flock(lock_fd_, LOCK_UN);
        stale_ = where() + "another writer committed to the file after this store opened it (audit sequence " +
                 std::to_string(opened_sequence_) + " then, " + std::to_string(now) +
                 " now), so what this store read may be out of date; it will not write. Open a new store (restart "
                 "the process) once the other writer has stopped";
        throw error(errc::store_unavailable, stale_);
    }

    void open() {
        opening_ = true;
        struct end_opening {
            bool& flag;
            ~end_opening() { flag = false; }
        } end{opening_};
        const bool first = !identity_known_;
        if (!temporary_) {
            if (!lost_.empty()) throw error(errc::store_error, lost_);
            if (!first) check_reopen();
            if (lock_fd_ < 0) open_lock_file();
            if (first) refuse_lost_database();
            if (first && lock_when_ == sqlite_lock::at_open) take_writer_lock();
        }
        // Only the first open may create the file: a reopen that found nothing at the path would
        // otherwise start a new, empty history there.
        const int rc = sqlite3_open_v2(path_.c_str(), &db_,
                                       SQLITE_OPEN_READWRITE | (first ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX,
                                       nullptr);
        if (rc != SQLITE_OK) {
            std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
            close();
            raise(rc, "cannot open database: " + msg);
        }
        try {
            // SQLite falls back to read-only when it cannot open the file for writing; every batch
            // would then fail. Refuse here, where the cause can still be named.
            if (sqlite3_db_readonly(db_, "main") == 1)
                raise(SQLITE_READONLY,
                      std::string("cannot open database for writing: ") + sqlite3_errstr(SQLITE_READONLY));
            sqlite3_busy_timeout(db_, static_cast<int>(busy_timeout_.count()));
            sqlite3_extended_result_codes(db_, 1);
            exec("PRAGMA journal_mode=WAL", "enable WAL");
            exec(full_sync_ ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL", "set synchronous");
            exec("PRAGMA cache_size=-65536", "set cache size");
            // With random keys a batch dirties more pages than the default 1,000-page checkpoint
            // threshold, which then checkpointed (and fsynced) after every batch.
            exec("PRAGMA wal_autocheckpoint=16384", "set checkpoint threshold");
            exec("BEGIN IMMEDIATE", "begin schema");
            create_or_upgrade_schema();
            add_payload_column();
            exec("COMMIT", "commit schema");
            audit_stmt_ = prepare(
                "INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, "
                "detail, sequence, previous) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
            last_audit_stmt_ = prepare("SELECT last_audit FROM idempotent_record WHERE idempotent_key = ?1");
            // The next sequence is kept in idem_schema and advanced in each batch's transaction
            // (MAX(sequence) would do as well now that sequence is the rowid; version 1 needed it).
            sqlite3_stmt* m = prepare("SELECT next_sequence FROM idem_schema");
            int rc2 = sqlite3_step(m);
            try {
                next_sequence_ = rc2 == SQLITE_ROW ? integer(m, 0, "idem_schema") : 1;
            } catch (...) {
                sqlite3_finalize(m);
                throw;
            }
            sqlite3_finalize(m);
            // Each batch numbers its audit rows from here with ++: a counter no real history reaches
            // (2^62 transitions) can only come from a damaged file, and would overflow.
            if (next_sequence_ < 1 || next_sequence_ > (std::int64_t{1} << 62))
                throw error(errc::corrupt_record, "sqlite:" + path_ + ": idem_schema.next_sequence is " +
                                                      std::to_string(next_sequence_) +
                                                      "; it must be between 1 and 2^62 (damaged file?)");
            sequence_stmt_ = prepare("UPDATE idem_schema SET next_sequence = ?1");
            // The fence guard, per column rather than as the upsert's WHERE, because last_audit must
            // follow every audit row, also one whose record change the guard refuses: a lower fence
            // never overwrites a higher one, and at the same fence a terminal record (SUCCESS,
            // FAILED) is never taken back to PROCESSING or RELEASED.
            static constexpr const char* guard =
                "(idempotent_record.fencing_token < excluded.fencing_token "
                "OR (idempotent_record.fencing_token = excluded.fencing_token "
                "AND (idempotent_record.status NOT IN ('SUCCESS', 'FAILED') "
                "OR excluded.status IN ('SUCCESS', 'FAILED'))))";
            auto guarded = [](const char* column, const std::string& value) {
                return std::string(column) + " = CASE WHEN " + guard + " THEN " + value + " ELSE idempotent_record." +
                       column + " END";
            };
            const std::string upsert =
                "INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
                "request_fingerprint, created_time, updated_time, last_audit, payload) "
                "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?10, ?8, ?11, ?13) ON CONFLICT (idempotent_key) DO UPDATE SET " +
                guarded("status", "excluded.status") + ", " + guarded("fencing_token", "excluded.fencing_token") +
                ", " + guarded("outcome", "excluded.outcome") + ", " + guarded("payload", "excluded.payload") + ", " +
                // The claim's lease and fingerprint only when the claim's own fence (?12) reaches
                // the stored one (detail/batch_fold.hpp).
                guarded("lease_until", "CASE WHEN ?9 AND idempotent_record.fencing_token <= ?12 THEN excluded.lease_until "
                                       "ELSE idempotent_record.lease_until END") +
                ", " +
                guarded("request_fingerprint", "CASE WHEN ?9 AND idempotent_record.fencing_token <= ?12 THEN "
                                               "excluded.request_fingerprint ELSE idempotent_record.request_fingerprint END") +
                ", " + guarded("updated_time", "excluded.updated_time") + ", last_audit = excluded.last_audit";
            upsert_stmt_ = prepare(upsert.c_str());
            batch_stmt_ = prepare("INSERT INTO idempotent_batch (batch_id, committed_time) VALUES (?1, ?2)");
            if (!temporary_) note_files(first);
        } catch (...) {
            sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
            close();
            throw;
        }
    }

    void close() noexcept {
        for (sqlite3_stmt** s : {&audit_stmt_, &upsert_stmt_, &batch_stmt_, &sequence_stmt_, &last_audit_stmt_}) {
            sqlite3_finalize(*s);
            *s = nullptr;
        }
        if (db_) sqlite3_close_v2(db_);
        db_ = nullptr;
    }

    [[noreturn]] void fail(int rc, const char* step) const {
        raise(rc, std::string(step) + " failed: " + (db_ ? sqlite3_errmsg(db_) : "") + " (" + sqlite3_errstr(rc) +
                      ")");
    }

    /// Throws the error for SQLite result `rc`, with `cause` after the path. While opening, a
    /// failure to open or write the file is first checked against the file system: a
    /// configuration fault found there is invalid_argument (retrying cannot help), not an outage.
    [[noreturn]] void raise(int rc, const std::string& cause) const {
        const int primary = rc & 0xff;
        const std::string where = "sqlite:" + path_ + ": ";
        if (opening_ && !temporary_ &&
            (primary == SQLITE_CANTOPEN || primary == SQLITE_READONLY || primary == SQLITE_PERM ||
             primary == SQLITE_IOERR)) {
            const std::string fault = configuration_fault(path_);
            if (!fault.empty()) throw error(errc::invalid_argument, where + fault + " (SQLite: " + cause + ")");
        }
        // A damaged file is the same fault wherever it shows (open, recovery, a read, verify): data
        // the store cannot trust, not an outage a retry could end.
        if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB)
            throw error(errc::corrupt_record, where + "the database file is damaged or is not a SQLite database (" +
                                                  cause + ")");
        if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED || primary == SQLITE_CANTOPEN)
            throw error(errc::store_unavailable, where + cause);
        throw error(errc::store_error, where + cause);  // SQLITE_FULL (disk full), SQLITE_IOERR, ...
    }

    /// What in the file system keeps this process from opening `path` read-write in WAL mode
    /// (SQLite creates PATH-wal and PATH-shm beside it; this store, PATH.lock), or "" when nothing
    /// shows. Checked with
    /// faccessat(AT_EACCESS), so it reflects what the process can really do: root is refused too
    /// by a read-only file system or an immutable file.
    static std::string configuration_fault(const std::string& path) {
        auto denied = [](const std::string& p, int mode) {  // errno of the refusal, or 0
            return ::faccessat(AT_FDCWD, p.c_str(), mode, AT_EACCESS) == 0 ? 0 : errno;
        };
        auto because = [](int e) { return " (" + std::string(std::strerror(e)) + ")"; };
        const std::size_t slash = path.find_last_of('/');
        const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
        struct stat st {};
        if (::stat(path.c_str(), &st) == 0) {
            if (S_ISDIR(st.st_mode)) return "the path is a directory, not a database file";
            if (!S_ISREG(st.st_mode)) return "the path is not a regular file";
            if (const int e = denied(path, R_OK | W_OK)) return "no permission to read and write the file" + because(e);
            bool creates = false;  // a -wal or -shm file SQLite must create, or PATH.lock
            for (const char* suffix : {"-wal", "-shm", ".lock"}) {
                const std::string side = path + suffix;
                if (denied(side, F_OK) != 0) creates = true;
                else if (const int e = denied(side, R_OK | W_OK))
                    return "no permission to read and write " + side + because(e);
            }
            if (const int e = creates ? denied(dir, W_OK | X_OK) : 0)
                return "no permission to create the -wal, -shm and .lock files in directory " + dir + because(e);
            return {};
        }
        if (const int e = errno; e != ENOENT && e != ENOTDIR) return "the path cannot be reached" + because(e);
        if (::stat(dir.c_str(), &st) != 0) {
            const int e = errno;
            return e == ENOENT ? "directory " + dir + " does not exist"
                               : "directory " + dir + " cannot be reached" + because(e);
        }
        if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
        if (const int e = denied(dir, W_OK | X_OK))
            return "no permission to create files in directory " + dir + because(e);
        return {};
    }

    /// Inside the open's schema transaction: creates the current layout in an empty file, or
    /// upgrades a version 1 or 2 file in place, or refuses a version it does not know.
    ///
    /// Version 2 (why: random-order keys). Each batch appends its audit rows at the end of a table
    /// keyed by sequence (the rowid), instead of inserting them into a B-tree ordered by
    /// (key, sequence), and keeps no (biz_type, status) index: with keys that arrive in random
    /// order (client UUIDs) each of those dirtied about one page per row, so every commit wrote
    /// several pages per row to the log (docs/stores.md, "Layout"). A key's audit rows are chained:
    /// each names the key's previous row, and the record names the latest (last_audit), so
    /// audit(key) stays a few rowid lookups.
    ///
    /// Version 3 (why: pruning). idem_schema holds the prune horizon (records_horizon,
    /// audit_horizon; NULL: never pruned), pruned_sequence (audit rows below it may be gone, so a
    /// chain link below it is a trail's legal start) and pruned_fence (the largest fence of a pruned
    /// record, for max_fence()); an index on idempotent_record (updated_time) lets prune read only
    /// the records it deletes (docs/stores.md, "Pruning"). A version 2 file gains them in place.
    void create_or_upgrade_schema() {
        int version = 0;
        sqlite3_stmt* v = nullptr;
        if (sqlite3_prepare_v2(db_, "SELECT version FROM idem_schema", -1, &v, nullptr) == SQLITE_OK) {
            // The table exists (an empty file has none): it must hold one integer version.
            const int rc = sqlite3_step(v);
            try {
                if (rc == SQLITE_ROW) version = static_cast<int>(integer(v, 0, "idem_schema"));
            } catch (...) {
                sqlite3_finalize(v);
                throw;
            }
            sqlite3_finalize(v);
            if (rc == SQLITE_DONE)
                throw error(errc::corrupt_record, where() + "idem_schema has no version row (damaged file?)");
            if (rc != SQLITE_ROW) fail(rc, "read schema version");
            if (version == 0) version = -1;  // not a version any writer wrote
        }
        if (version == schema_version) return;
        if (version == 1) {
            upgrade_1_to_2();
            version = 2;
        }
        if (version == 2) {
            exec(version_3_changes, "upgrade schema 2 to 3");
            return;
        }
        if (version != 0)
            throw error(errc::store_error, where() + "schema version " + std::to_string(version) +
                                               " is not one this library reads (1 and 2, upgraded in place, or 3)");
        exec(R"SQL(
CREATE TABLE IF NOT EXISTS idem_schema (version INTEGER NOT NULL, next_sequence BIGINT NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS idempotent_record (
  idempotent_key      VARCHAR(128) PRIMARY KEY,
  biz_type            VARCHAR(32)  NOT NULL,
  status              VARCHAR(16)  NOT NULL CHECK (status IN ('PROCESSING','SUCCESS','FAILED','RELEASED')),
  fencing_token       BIGINT       NOT NULL,
  lease_until         BIGINT       NOT NULL,
  outcome             BIGINT       NOT NULL,
  request_fingerprint BIGINT       NOT NULL,
  created_time        BIGINT       NOT NULL,
  updated_time        BIGINT       NOT NULL,
  last_audit          BIGINT       NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotent_batch (batch_id BIGINT PRIMARY KEY, committed_time BIGINT NOT NULL);
INSERT INTO idem_schema (version) VALUES (2);
)SQL",
             "create schema");
        exec(audit_table_sql, "create audit table");
        exec(version_3_changes, "create schema (version 3)");
    }

    /// The payload column (response payloads: the bytes a completion records with its outcome),
    /// added to a file of any version that lacks it, so the schema version stays 3: ADD COLUMN with
    /// a constant default rewrites no row (SQLite reads the default for rows stored before it), so
    /// the migration costs the same on a file of any size, and runs once (a file that has the column
    /// is left alone). An older library opening a migrated file reads it without the column, and
    /// would keep a record's old payload when it writes that record again: do not go back to one.
    void add_payload_column() {
        statement q(*this, "SELECT COUNT(*) FROM pragma_table_info('idempotent_record') WHERE name = 'payload'");
        q.row("look for the payload column");
        if (sqlite3_column_int64(q.s, 0) != 0) return;
        exec("ALTER TABLE idempotent_record ADD COLUMN payload BLOB NOT NULL DEFAULT x''", "add the payload column");
    }

    /// Version 2 to 3: the prune columns of idem_schema and the updated_time index.
    static constexpr const char* version_3_changes = R"SQL(
ALTER TABLE idem_schema ADD COLUMN records_horizon BIGINT;
ALTER TABLE idem_schema ADD COLUMN audit_horizon BIGINT;
ALTER TABLE idem_schema ADD COLUMN pruned_sequence BIGINT NOT NULL DEFAULT 0;
ALTER TABLE idem_schema ADD COLUMN pruned_fence BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS idx_idempotent_record_updated ON idempotent_record (updated_time);
UPDATE idem_schema SET version = 3;
)SQL";

    /// Version 1 to 2 (see above): the audit table rebuilt in sequence order, with its chain.
    void upgrade_1_to_2() {
        exec(R"SQL(
ALTER TABLE idempotent_record ADD COLUMN last_audit BIGINT NOT NULL DEFAULT 0;
DROP INDEX IF EXISTS idx_idempotent_record_biz_status;
ALTER TABLE idempotent_audit RENAME TO idempotent_audit_v1;
)SQL",
             "upgrade schema 1 to 2");
        exec(audit_table_sql, "upgrade schema 1 to 2: create audit table");
        exec(R"SQL(
INSERT INTO idempotent_audit (sequence, previous, idempotent_key, from_status, to_status, fencing_token, node,
                              at_time, detail)
  SELECT sequence, COALESCE(LAG(sequence) OVER (PARTITION BY idempotent_key ORDER BY sequence), 0), idempotent_key,
         from_status, to_status, fencing_token, node, at_time, detail
  FROM idempotent_audit_v1 ORDER BY sequence;
UPDATE idempotent_record SET last_audit = COALESCE(
  (SELECT MAX(a.sequence) FROM idempotent_audit_v1 a WHERE a.idempotent_key = idempotent_record.idempotent_key), 0);
DROP TABLE idempotent_audit_v1;
UPDATE idem_schema SET version = 2;
)SQL",
             "upgrade schema 1 to 2: copy audit rows");
    }

    /// What idem_schema says of past prunes (version 3).
    struct pruned_state {
        std::int64_t records_ms = prune_limits::keep_all;
        std::int64_t audit_ms = prune_limits::keep_all;
        std::int64_t sequence = 0;  // audit rows below it may be gone
        std::int64_t fence = 0;     // the largest fence of a pruned record
    };
    pruned_state read_pruned() {
        statement s(*this, "SELECT records_horizon, audit_horizon, pruned_sequence, pruned_fence FROM idem_schema");
        if (const int rc = sqlite3_step(s.s); rc == SQLITE_DONE)
            throw error(errc::corrupt_record, where() + "idem_schema has no version row (damaged file?)");
        else if (rc != SQLITE_ROW)
            fail(rc, "read the prune horizon");
        pruned_state p;
        if (sqlite3_column_type(s.s, 0) != SQLITE_NULL) p.records_ms = integer(s.s, 0, "idem_schema");
        if (sqlite3_column_type(s.s, 1) != SQLITE_NULL) p.audit_ms = integer(s.s, 1, "idem_schema");
        p.sequence = integer(s.s, 2, "idem_schema");
        p.fence = integer(s.s, 3, "idem_schema");
        return p;
    }

    /// A prepared statement finalized at scope exit.
    struct statement {
        const sqlite_store& st;
        sqlite3_stmt* s;
        statement(sqlite_store& store, const std::string& sql) : st(store), s(store.prepare(sql.c_str())) {}
        ~statement() { sqlite3_finalize(s); }
        statement(const statement&) = delete;
        statement& operator=(const statement&) = delete;
        /// Steps to the one row the statement answers.
        void row(const char* step) const {
            if (const int rc = sqlite3_step(s); rc != SQLITE_ROW) st.fail(rc, step);
        }
    };

    static constexpr const char* audit_table_sql = R"SQL(
CREATE TABLE IF NOT EXISTS idempotent_audit (
  sequence       INTEGER      PRIMARY KEY,
  previous       BIGINT       NOT NULL,
  idempotent_key VARCHAR(128) NOT NULL,
  from_status    VARCHAR(16)  NOT NULL,
  to_status      VARCHAR(16)  NOT NULL,
  fencing_token  BIGINT       NOT NULL,
  node           VARCHAR(64)  NOT NULL,
  at_time        BIGINT       NOT NULL,
  detail         TEXT         NOT NULL
);
)SQL";

    /// The key's latest audit row (its record's last_audit), 0 when it has no record.
    std::int64_t last_audit(std::string_view key) {
        sqlite3_stmt* s = last_audit_stmt_;
        sqlite3_reset(s);
        sqlite3_bind_text(s, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
        const int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE) return 0;
        if (rc != SQLITE_ROW) fail(rc, "read the key's latest audit row");
        const std::int64_t at = integer(s, 0, "record '" + key::printable(key) + "'");
        sqlite3_reset(s);
        return at;
    }

    void exec(const char* sql, const char* step) {
        const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
        if (rc != SQLITE_OK) fail(rc, step);
    }

    sqlite3_stmt* prepare(const char* sql) {
        sqlite3_stmt* s = nullptr;
        const int rc = sqlite3_prepare_v2(db_, sql, -1, &s, nullptr);
        if (rc != SQLITE_OK) fail(rc, "prepare statement");
        return s;
    }

    void step_done(sqlite3_stmt* s, const char* step) {
        const int rc = sqlite3_step(s);
        if (rc != SQLITE_DONE) fail(rc, step);
    }

    static std::string text(sqlite3_stmt* s, int col) {
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, col));
        return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(s, col))) : std::string();
    }

    /// Integer column `col` of a row of `table`. The columns are declared BIGINT (integer affinity),
    /// so a value SQLite could not store as an integer (text such as 'abc', a real, a blob) stays
    /// what it is: reading it as 0 would hide the damage, so it is refused as corrupt_record naming
    /// the row, the column and the value.
    std::int64_t integer(sqlite3_stmt* s, int col, const std::string& row) const {
        return integer(s, col, [&] { return row; });
    }
    /// The same, naming the row only when it is refused (`row()` builds the name: recovery reads
    /// millions of rows and names none of them).
    template <class RowName>
        requires std::is_invocable_r_v<std::string, RowName>
    std::int64_t integer(sqlite3_stmt* s, int col, RowName&& row_name) const {
        const int type = sqlite3_column_type(s, col);
        if (type == SQLITE_INTEGER) [[likely]] return sqlite3_column_int64(s, col);
        const std::string row = row_name();
        const char* kind = type == SQLITE_TEXT ? "text" : type == SQLITE_FLOAT ? "a real number"
                                               : type == SQLITE_BLOB ? "a blob" : "NULL";
        std::string value = type == SQLITE_NULL ? std::string("NULL") : "'" + key::printable(text(s, col)) + "'";
        if (value.size() > 80) value = value.substr(0, 77) + "...";
        throw error(errc::corrupt_record, "sqlite:" + path_ + ": " + row + " has " + sqlite3_column_name(s, col) +
                                              " = " + value + " (" + kind + "); the column holds integers only");
    }

    stored_record read_record(sqlite3_stmt* s) const {
        stored_record r;
        r.key = text(s, 0);
        r.biz_type = text(s, 1);
        if (std::string why = detail::key_fault(r.key); !why.empty())
            throw error(errc::corrupt_record, "sqlite:" + path_ + ": " + why);
        const auto corrupt = [&](const std::string& rule) {
            return error(errc::corrupt_record, "sqlite:" + path_ + ": record '" + key::printable(r.key) + "': " + rule);
        };
        std::string why;
        const auto st = detail::checked_status(text(s, 2), true, &why);
        if (!st) throw corrupt(why);
        r.state = *st;
        const auto row = [&r] { return "record '" + key::printable(r.key) + "'"; };
        const std::int64_t fence = integer(s, 3, row);
        if (std::string bad = detail::fence_fault(fence); !bad.empty()) throw corrupt(bad);
        r.fence = static_cast<std::uint64_t>(fence);
        r.lease_until_ms = integer(s, 4, row);
        r.outcome = static_cast<std::uint64_t>(integer(s, 5, row));
        r.fingerprint = static_cast<std::uint64_t>(integer(s, 6, row));
        r.created_ms = integer(s, 7, row);
        r.updated_ms = integer(s, 8, row);
        // Read as a blob whatever its type (a text written by hand is its bytes); NULL, which no
        // writer of the NOT NULL column produces, is damage.
        if (sqlite3_column_type(s, 9) == SQLITE_NULL) throw corrupt("payload is NULL; the column holds bytes (x'' for none)");
        const auto* bytes = static_cast<const char*>(sqlite3_column_blob(s, 9));
        const auto size = static_cast<std::size_t>(sqlite3_column_bytes(s, 9));
        if (std::string bad = detail::payload_fault(size); !bad.empty()) throw corrupt(bad);
        if (size > 0) r.payload.assign(bytes, size);
        return r;
    }

    /// Calls fn(row, previous) for each audit row the clause selects; ?1 is bound to `key` or,
    /// without one, to `sequence`.
    template <class Fn>
    void scan_audit_where(std::string_view where, std::optional<std::string_view> key, Fn&& fn,
                          std::int64_t sequence = 0) {
        const std::string sql = std::string(
                                    "SELECT sequence, idempotent_key, from_status, to_status, fencing_token, node, "
                                    "at_time, detail, previous FROM idempotent_audit ") +
                                std::string(where);
        sqlite3_stmt* s = prepare(sql.c_str());
        if (key) sqlite3_bind_text(s, 1, key->data(), static_cast<int>(key->size()), SQLITE_TRANSIENT);
        else if (sequence != 0) sqlite3_bind_int64(s, 1, sequence);
        try {
            int rc;
            while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                audit_entry a;
                a.key = text(s, 1);
                a.sequence = integer(s, 0, "an audit row of key '" + key::printable(a.key) + "'");
                const std::string row =
                    "audit row " + std::to_string(a.sequence) + " (key '" + key::printable(a.key) + "')";
                std::string why;
                const auto from = detail::checked_status(text(s, 2), false, &why, "from_status");
                const auto to = from ? detail::checked_status(text(s, 3), false, &why, "to_status") : from;
                if (!from || !to)
                    throw error(errc::corrupt_record, "sqlite:" + path_ + ": " + row + " has an unknown status: " + why);
                a.from = *from;
                a.to = *to;
                a.fence = static_cast<std::uint64_t>(integer(s, 4, row));
                a.node = text(s, 5);
                a.at_ms = integer(s, 6, row);
                a.detail = text(s, 7);
                fn(a, integer(s, 8, row));
            }
            if (rc != SQLITE_DONE) fail(rc, "read audit trail");
        } catch (...) {
            sqlite3_finalize(s);
            throw;
        }
        sqlite3_finalize(s);
    }

    std::string path_;
    bool full_sync_;
    std::chrono::milliseconds busy_timeout_;
    bool temporary_;         // "" or ":memory:", accepted by explicit request
    sqlite_lock lock_when_;
    bool opening_ = false;   // inside open(): failures are checked for a configuration fault
    sqlite3* db_ = nullptr;
    sqlite3_stmt* audit_stmt_ = nullptr;
    sqlite3_stmt* upsert_stmt_ = nullptr;
    sqlite3_stmt* batch_stmt_ = nullptr;
    sqlite3_stmt* sequence_stmt_ = nullptr;
    sqlite3_stmt* last_audit_stmt_ = nullptr;
    std::int64_t next_sequence_ = 1;  // audit sequence: this store is the file's only writer
    // Path identity (file stores): the database file the first open found, the log of the latest.
    bool identity_known_ = false;
    dev_t file_dev_ = 0;
    ino_t file_ino_ = 0;
    bool wal_known_ = false;
    dev_t wal_dev_ = 0;
    ino_t wal_ino_ = 0;
    std::string lost_;   // set once a lost log or lock file is found: every write and reopen refuses
    // One writer: PATH.lock, open from the first open to the destructor; writer_ once locked.
    struct owned_fd {
        int fd = -1;
        owned_fd() = default;
        owned_fd(const owned_fd&) = delete;
        owned_fd& operator=(const owned_fd&) = delete;
        ~owned_fd() { reset(); }
        void reset(int to = -1) noexcept {
            if (fd >= 0) ::close(fd);
            fd = to;
        }
        operator int() const noexcept { return fd; }  // NOLINT: reads like the descriptor it is
    };
    owned_fd lock_fd_;  // closed after the connection (the destructor closes that first), also when the constructor throws
    bool writer_ = false;
    std::int64_t opened_sequence_ = 0;  // next_sequence at the first open
    std::string stale_;  // set when another writer committed before this store took the lock
};

}  // namespace idem
