// idem/stores/mysql_store.hpp: the MySQL / MariaDB store (target idem::mysql, MariaDB Connector/C).
//
//   idem::mysql_store s("mysql://idem@db.internal:3306/payments", std::chrono::seconds(2));
//
// Here: the store's calls and its error table. Each concern behind them has its header in
// detail/my/: connection.hpp (the URI, the session, deadlines, how a failure is classified),
// schema.hpp (tables, version, durability settings), sql.hpp (how a batch is written, the reads).
// Rows read back are decoded and checked by detail/rows/text_decoder.hpp, as PostgreSQL's are.
// Invariants kept here: a batch id commits once, whole or not at all; every call is bounded by
// call_deadline; every failure reaches the caller as one idem::error kind (rethrow_translated); in
// sync mode nothing is acknowledged on a server that may lose it.
//
// Schema (schema.hpp): idempotent_record, idempotent_audit, idempotent_batch, idem_schema, the
// PostgreSQL store's tables and columns in InnoDB. Opening is idempotent and safe when several
// processes open one database at once; a database already at this version is only read.
//
// apply(rows, batch_id) is one transaction in one round trip for a typical batch (sql.hpp says how,
// and why the records end exactly as memory_store leaves them). A batch id can commit once:
// applying a committed id again fails with store_error and writes nothing. committed(batch_id)
// resolves a commit_unknown: it ends the session that lost its answer on the server (found by the
// user lock each session holds, killed, and waited for), so that session can no longer commit, then
// reads the batch id with a locking read (bounded by the deadline: a server that cannot decide yet gives
// store_unavailable, and the flusher asks again).
//
// Deadlines: every wait on the server is bounded by call_deadline rounded up to whole seconds, and
// every wait for the server by one second more (connection.hpp says why). load() and scan_audit() stream rows as they come: for them the deadline bounds each
// wait for the next row, not the scan.
//
// Errors: store_unavailable when the server cannot be reached or answered too late (refused, lost,
// KILL CONNECTION, SIGSTOP past the deadline, shutting down), on a deadlock or a lock wait timeout
// (InnoDB undid the transaction: the flusher retries it), and while the server is read-only;
// commit_unknown when the session broke while the round trip holding COMMIT was in flight;
// rejected_row for a value a column cannot hold (a row larger than max_allowed_packet): the flusher
// isolates that row and commits the others; store_error for the rest (disk full, permissions, a
// batch id committed twice); corrupt_record for a row that breaks the schema's rules. Every message
// names the store (its URI without password), the operation and the step.
//
// What MySQL cannot hold: nothing idem::key admits is refused (keys are VARBINARY(128)); the node
// written into the audit trail is cut to the 64 bytes of its column.
//
// Durability (schema.hpp): check_sync_durability() (sync mode calls it at open) refuses
// innodb_flush_log_at_trx_commit other than 1, and sync_binlog other than 1 where a binary log is
// kept. Afterwards both are read at every (re)connect, and every batch checks them on the server
// right before COMMIT: while the server would lose a commit, nothing is committed and apply() throws
// store_unavailable naming the setting.
//
// Snapshot reads: snapshot_read(fn) runs fn inside one START TRANSACTION WITH CONSISTENT SNAPSHOT,
// READ ONLY, so every read fn makes sees one snapshot (`idem verify` on a live store).
//
// Thread-safety: like every store, one thread at a time. Not guaranteed: the callbacks of load()
// and scan_audit() run while the rows stream in, so they must not call back into this store
// (asserted); an exception a callback throws ends the scan (the session is cut) and reaches the
// caller unchanged.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/my/connection.hpp"
#include "idem/detail/my/schema.hpp"
#include "idem/detail/my/session_life.hpp"
#include "idem/detail/my/sql.hpp"
#include "idem/detail/rows/text_decoder.hpp"
#include "idem/store.hpp"

namespace idem {

class mysql_store final : public store {
public:
    /// Connects to `uri` (mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE, or mariadb://) and creates
    /// or checks the schema. Throws idem::error: invalid_argument for a malformed URI or a
    /// non-positive deadline, store_unavailable when the server cannot be reached, store_error when
    /// the schema cannot be created or is newer than this library.
    explicit mysql_store(std::string uri, std::chrono::milliseconds call_deadline = std::chrono::seconds(5))
        : name_(detail::my::redact(uri)), ep_(detail::my::parse_uri(uri)), deadline_(call_deadline) {
        if (deadline_ <= std::chrono::milliseconds::zero())
            throw error(errc::invalid_argument, "mysql store " + name_ + ": call_deadline must be positive, got " +
                                                    std::to_string(deadline_.count()) + " ms");
        run("open", [&] { detail::my::ensure_schema(sess_, name_, step_); });
    }
    mysql_store(const mysql_store&) = delete;
    mysql_store& operator=(const mysql_store&) = delete;

    void apply(std::span<const store_row> rows, std::uint64_t batch_id) override {
        const std::string op = "apply batch " + std::to_string(batch_id);
        const std::string node = node_.substr(0, 64);  // node is VARBINARY(64)
        const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
        run(op, [&] {
            step_ = "build";
            detail::my::batch_text text;
            text.build(
                rows, batch_id, now_ms, node, durable_required_, budget_, [&](std::string_view k, const std::string& rule) {
                    throw rejected_row("mysql store " + name_ + ": " + op + ": key '" + key::printable(k) + "' " + rule);
                });
            const auto& queries = text.queries();
            in_txn_ = true;
            for (std::size_t i = 0; i < queries.size(); ++i) {
                const bool last = i + 1 == queries.size();
                step_ = last ? "write and commit" : "write";
                if (last) {
                    if (before_commit_) before_commit_();
                    committing_ = true;
                    commit_statement_ = text.commit_statement();
                    first_query_ = queries.size() == 1;
                } else {
                    first_query_ = i == 0;
                }
                sess_.run(queries[i]);
            }
            committing_ = false;
            in_txn_ = false;
        });
    }

    /// Resolves an in-doubt batch. First the session that lost its answer is ended on the server: a
    /// server that was stopped may not even have read that session's query yet, and would run it,
    /// COMMIT included, after a probe that found nothing. Every session of this store holds a user
    /// lock of a random name from its connect to its end (connect()), so IS_USED_LOCK names the old
    /// session's id exactly, never a reused id of another client's session after a server restart
    /// (a restart frees the lock). While it is held the session is killed (KILL CONNECTION) and the
    /// lock read again; once it is free the old transaction is final (committed, or rolled back by
    /// its end), and a locking read of the batch id answers exactly. Bounded by the call deadline: a
    /// session that has not ended by then gives store_unavailable (the flusher asks again).
    bool committed(std::uint64_t batch_id) override {
        bool done = false;
        run("committed(" + std::to_string(batch_id) + ")", [&] {
            if (!doubt_lock_.empty()) {
                step_ = "end the session that lost its answer (user lock " + doubt_lock_ + ")";
                std::string holder;
                if (!detail::my::end_lost_session(sess_, doubt_lock_, deadline_, &holder))
                    throw error(errc::store_unavailable, "mysql store " + name_ + ": committed(" + std::to_string(batch_id) +
                                                             "): the session " + holder +
                                                             " that lost its answer is still running; ask again");
                doubt_lock_.clear();
            }
            step_ = "locking read of idempotent_batch";
            in_txn_ = true;
            sess_.run("START TRANSACTION;SELECT COUNT(*) FROM idempotent_batch WHERE batch_id = " +
                          std::to_string(batch_id) + " LOCK IN SHARE MODE;ROLLBACK",
                      [&](int, detail::my::row_view r) { done = r[0] != "0"; });
            in_txn_ = false;
        });
        return done;
    }

    void load(const std::function<void(const stored_record&)>& fn) override {
        stored_record rec;
        scan("load", "select idempotent_record", std::string(detail::my::record_select),
             [&](const detail::rows::text_decoder& dec, detail::my::row_view r) {
                 dec.record(columns<detail::rows::record_columns>(r), rec);
                 fn(rec);
             });
    }

    std::optional<stored_record> get(std::string_view key) override {
        std::optional<stored_record> out;
        run("get", [&] {
            step_ = "select idempotent_record";
            const detail::rows::text_decoder dec = decoder();
            sess_.run(std::string(detail::my::record_select) + " WHERE idempotent_key = " + detail::my::literal(key),
                      [&](int, detail::my::row_view r) {
                          dec.record(columns<detail::rows::record_columns>(r), out.emplace());
                      });
        });
        return out;
    }

    std::vector<audit_entry> audit(std::string_view key) override {
        std::vector<audit_entry> out;
        run("audit", [&] {
            step_ = "select idempotent_audit";
            out.clear();
            const detail::rows::text_decoder dec = decoder();
            sess_.run(std::string(detail::my::audit_select) + " WHERE idempotent_key = " + detail::my::literal(key) +
                          " ORDER BY sequence",
                      [&](int, detail::my::row_view r) {
                          dec.audit(columns<detail::rows::audit_columns>(r), out.emplace_back());
                      });
        });
        return out;
    }

    void scan_audit(const std::function<void(const audit_entry&)>& fn) override {
        audit_entry a;
        scan("scan_audit", "select idempotent_audit",
             std::string(detail::my::audit_select) + " ORDER BY idempotent_key, sequence",
             [&](const detail::rows::text_decoder& dec, detail::my::row_view r) {
                 dec.audit(columns<detail::rows::audit_columns>(r), a);
                 fn(a);
             });
    }

    /// Refuses innodb_flush_log_at_trx_commit != 1 (and sync_binlog != 1 with a binary log), then
    /// keeps checking them at every connect and in every batch.
    void check_sync_durability() override {
        require_durability(
            "; or open the durable_guard with store_options::mode = durability::async (acknowledged before the "
            "commit)");
    }

    /// check_sync_durability() with the caller's alternative to fixing the server (appended to the
    /// message; empty: none). Throws idem::error(invalid_argument) naming the setting and the fix.
    void require_durability(const std::string& alternative) {
        detail::my::durability d;
        run("check sync durability", [&] {
            step_ = "read innodb_flush_log_at_trx_commit and sync_binlog";
            d = detail::my::read_durability(sess_);
        });
        if (const std::string fault = detail::my::durability_fault(d); !fault.empty())
            throw error(errc::invalid_argument, "mysql store " + name_ +
                                                    ": sync mode acknowledges a decision once it is durable, but " + fault +
                                                    alternative);
        durable_required_ = true;
    }

    /// The server's clock, Unix milliseconds (what global scope stamps its rows with:
    /// detail/global/my_sql.hpp), so a prune's bounds are judged on the clock the rows carry.
    std::int64_t server_now_ms() {
        std::int64_t now = 0;
        run("server_now_ms", [&] {
            step_ = "select the server's clock";
            sess_.run(detail::my::server_now_ms, [&](int, detail::my::row_view r) {
                if (!detail::rows::parse_int(r[0], now))
                    decoder().surprise("the server's clock came back as '" + std::string(r[0]) + "'");
            });
        });
        return now;
    }

    /// Runs fn inside one consistent-snapshot, read-only transaction: every load(), scan_audit(),
    /// get() and audit() it makes reads the same snapshot. A nested call just runs fn.
    void snapshot_read(const std::function<void()>& fn) override {
        if (snap_) return fn();
        run("snapshot read", [&] {
            step_ = "start transaction with consistent snapshot, read only";
            sess_.run("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY");
        });
        snap_ = true;
        auto end = [&](bool quiet) {
            try {
                run("snapshot read", [&] {  // snap_ still set: run() does not reconnect under it
                    step_ = "end";
                    sess_.run("ROLLBACK");  // read only: nothing to commit
                });
            } catch (...) {
                snap_ = false;
                if (!quiet) throw;
                return;
            }
            snap_ = false;
        };
        try {
            fn();
        } catch (...) {
            end(/*quiet=*/true);  // fn's exception wins
            throw;
        }
        end(/*quiet=*/false);
    }

    /// Drops the session and opens a new one (bounded like every call).
    void reconnect() override {
        need_reconnect_ = true;
        run("reconnect", [] {});
    }

    [[nodiscard]] std::string name() const override { return name_; }

    std::uint64_t max_fence() override {
        std::uint64_t m = 0;
        run("max_fence", [&] {
            step_ = "select max(fencing_token)";
            sess_.run(detail::my::max_fence, [&](int, detail::my::row_view r) {
                if (!detail::rows::parse_uint64_bits(r[0], m))
                    decoder().surprise("max(fencing_token) came back as '" + key::printable(r[0]) + "'");
            });
        });
        return m;
    }

    /// One transaction: the oldest expired records (by the updated_time index, never PROCESSING
    /// ones), then a prefix of the audit table in sequence order up to the first row not older than
    /// the bound, and the horizon, forward only, with the largest fence removed.
    prune_result prune(const prune_limits& limits) override {
        prune_result out;
        run("prune", [&] {
            const std::string n1 = std::to_string(limits.max_rows + 1);
            out = {};
            in_txn_ = true;
            step_ = "begin, lock idem_schema";
            // idem_schema first: a global guard's claim batch reads the pruned fence under a shared
            // lock of it, so a prune and a claim of the same key never overlap
            // (detail/global/my_sql.hpp, claim_first).
            sess_.run("START TRANSACTION;SELECT version FROM idem_schema FOR UPDATE");
            std::uint64_t fence = 0;
            std::string sets;
            if (limits.records_before_ms != prune_limits::keep_all) {
                const std::string bound = std::to_string(limits.records_before_ms);
                step_ = "select expired records";
                std::string keys;
                std::size_t seen = 0;
                sess_.run(
                    "SELECT idempotent_key, fencing_token FROM idempotent_record WHERE status <> 'PROCESSING' "
                    "AND updated_time < " +
                        bound + " ORDER BY updated_time, idempotent_key LIMIT " + n1 + " FOR UPDATE",
                    [&](int, detail::my::row_view r) {
                        if (++seen > limits.max_rows) return;
                        if (!keys.empty()) keys += ',';
                        detail::my::append_literal(keys, r[0]);
                        std::uint64_t f = 0;
                        if (detail::rows::parse_uint64_bits(r[1], f)) fence = std::max(fence, f);
                    });
                out.more = seen > limits.max_rows;
                out.records = std::min(seen, limits.max_rows);
                if (!keys.empty()) {
                    step_ = "delete expired records";
                    sess_.run("DELETE FROM idempotent_record WHERE idempotent_key IN (" + keys + ")");
                }
                sets += "records_horizon = GREATEST(COALESCE(records_horizon, " + bound + "), " + bound + "), ";
            }
            if (limits.audit_before_ms != prune_limits::keep_all) {
                const std::int64_t bound = limits.audit_before_ms;
                step_ = "select the oldest audit rows";
                std::string last_seq;
                std::size_t prefix = 0;
                bool stopped = false;  // a row not older than the bound ended the prefix
                sess_.run("SELECT sequence, at_time FROM idempotent_audit ORDER BY sequence LIMIT " + n1 + " FOR UPDATE",
                          [&](int, detail::my::row_view r) {
                              if (stopped) return;
                              std::int64_t at = 0;
                              (void)detail::rows::parse_int(r[1], at);
                              if (at >= bound) {
                                  stopped = true;
                                  return;
                              }
                              if (prefix == limits.max_rows) {  // one more expired row than this call takes
                                  out.more = true;
                                  stopped = true;
                                  return;
                              }
                              ++prefix;
                              last_seq.assign(r[0]);
                          });
                out.audit_rows = prefix;
                if (prefix > 0) {
                    step_ = "delete the oldest audit rows";
                    sess_.run("DELETE FROM idempotent_audit WHERE sequence <= " + last_seq);
                }
                const std::string b = std::to_string(bound);
                sets += "audit_horizon = GREATEST(COALESCE(audit_horizon, " + b + "), " + b + "), ";
            }
            step_ = "move the horizon and commit";
            committing_ = true;
            commit_statement_ = 1;
            first_query_ = false;
            sess_.run("UPDATE idem_schema SET " + sets + "pruned_fence = GREATEST(pruned_fence, " + std::to_string(fence) +
                      ");COMMIT");
            committing_ = false;
            in_txn_ = false;
        });
        return out;
    }

    prune_horizon horizon() override {
        prune_horizon h;
        run("horizon", [&] {
            step_ = "select idem_schema";
            sess_.run(detail::my::horizon, [&](int, detail::my::row_view r) {
                std::int64_t v = 0;
                if (r[0].data() != nullptr && detail::rows::parse_int(r[0], v)) h.records_ms = v;
                if (r[1].data() != nullptr && detail::rows::parse_int(r[1], v)) h.audit_ms = v;
            });
        });
        return h;
    }

    /// The server's id of the current session (CONNECTION_ID(); 0 when disconnected): for operators
    /// and tests (KILL CONNECTION).
    [[nodiscard]] unsigned long session_id() const noexcept { return sess_.id(); }
    [[nodiscard]] std::chrono::milliseconds call_deadline() const noexcept { return deadline_; }

    /// Test hook: runs right before the round trip holding COMMIT is sent.
    void set_before_commit_hook_for_testing(std::function<void()> hook) { before_commit_ = std::move(hook); }

private:
    /// Another session on the same database for reads beside the writer (its settings, no schema
    /// step; it connects at its first call).
    std::unique_ptr<store> open_reader() override { return std::unique_ptr<store>(new mysql_store(reader_of{}, *this)); }
    struct reader_of {};
    mysql_store(reader_of, const mysql_store& first)
        : name_(first.name_), ep_(first.ep_), deadline_(first.deadline_), durable_required_(first.durable_required_) {
        node_ = first.node_;
    }

    [[nodiscard]] detail::rows::text_decoder decoder() const noexcept {
        return detail::rows::text_decoder("mysql store", name_, step_);
    }

    template <std::size_t N>
    [[nodiscard]] std::span<const std::string_view, N> columns(detail::my::row_view r) const {
        if (r.size() != N)
            decoder().surprise("a row came back with " + std::to_string(r.size()) + " columns, not " + std::to_string(N));
        return std::span<const std::string_view, N>(r.data(), N);
    }

    /// Streams the rows of `sql` to `each` (load, scan_audit). An exception of `each` (a corrupt row,
    /// the caller's callback) ends the scan, the session is cut, and it reaches the caller unchanged.
    template <class Each>
    void scan(const std::string& op, const char* step, const std::string& sql, Each&& each) {
        std::exception_ptr from_fn;
        run(op, [&] {
            step_ = step;
            const detail::rows::text_decoder dec = decoder();
            streaming_ = true;
            try {
                sess_.stream(sql, [&](int, detail::my::row_view r) {
                    try {
                        each(dec, r);
                    } catch (...) {
                        from_fn = std::current_exception();
                        throw;
                    }
                });
            } catch (...) {
                streaming_ = false;
                if (from_fn) return;  // the session cut itself (connection.hpp); the next call reconnects
                throw;
            }
            streaming_ = false;
        });
        if (from_fn) std::rethrow_exception(from_fn);
    }

    /// Runs one store call: reconnects when needed, and turns every failure into idem::error (or
    /// commit_unknown) naming the store, `op` and the step.
    template <class F>
    void run(const std::string& op, F&& body) {
        IDEM_ASSERT(!streaming_, "a load() or scan_audit() callback does not call back into its store");
        committing_ = false;
        in_txn_ = false;
        try {
            if (need_reconnect_ || !sess_.is_open()) {
                if (snap_)
                    throw error(errc::store_unavailable, "mysql store " + name_ + ": " + op +
                                                             ": the connection broke during a snapshot read; the "
                                                             "snapshot is gone (start the read again)");
                connect(op);
            }
            body();
        } catch (...) {
            rethrow_translated(op);
        }
    }

    /// The failure being handled as this store's exception: the table in the header comment.
    [[noreturn]] void rethrow_translated(const std::string& op) {
        const bool in_commit = committing_;
        const bool in_txn = in_txn_;
        committing_ = false;
        in_txn_ = false;
        const std::string where = "mysql store " + name_ + ": " + op + ": " + step_ + ": ";
        try {
            throw;
        } catch (const error&) {
            roll_back(in_txn);
            throw;  // ours already (corrupt_record, rejected_row, ...)
        } catch (const detail::my::failure& f) {
            using detail::my::failure_kind;
            const failure_kind kind = detail::my::classify(f);
            if (kind == failure_kind::lost) {
                if (in_commit) doubt_lock_ = lock_name_;  // committed() ends that session before it probes
                sess_.close();
                need_reconnect_ = true;
                if (in_commit)
                    throw commit_unknown(where + f.text +
                                         "; the batch may or may not have committed (resolve with committed(batch_id))");
                throw error(errc::store_unavailable, where + f.text);
            }
            // The server answered: it stopped at the failing statement, before COMMIT, and the
            // transaction is still open (a deadlock has already undone it): roll it back.
            roll_back(in_txn);
            if (in_commit && f.statement == commit_statement_)
                throw commit_unknown(where + f.text + "; COMMIT itself failed (resolve with committed(batch_id))");
            switch (kind) {
                case failure_kind::contention:
                    throw error(errc::store_unavailable, where + f.text + " (the transaction was undone; retried)");
                case failure_kind::read_only:
                    throw error(errc::store_unavailable, where + "the server refuses writes (read-only): " + f.text);
                case failure_kind::durability:
                    throw error(errc::store_unavailable, where + f.text + "; nothing was committed");
                case failure_kind::data:
                    if (f.code == ER_DUP_ENTRY && first_query_ && f.statement == 1)
                        throw error(errc::store_error,
                                    where + "this batch id already committed; a batch commits once (" + f.text + ")");
                    throw rejected_row(where + f.text);
                case failure_kind::lost:
                case failure_kind::other: break;
            }
            throw error(errc::store_error, where + f.text);
        } catch (const std::exception& e) {
            roll_back(in_txn);
            throw error(errc::store_error, where + e.what());
        }
    }

    /// Ends a transaction a failed call left open; a session that cannot is dropped.
    void roll_back(bool in_txn) noexcept {
        if (!in_txn || !sess_.is_open() || snap_) return;
        try {
            sess_.run("ROLLBACK");
        } catch (...) {
            sess_.close();
            need_reconnect_ = true;
        }
    }

    void connect(const std::string& op) {
        step_ = "connect";
        need_reconnect_ = true;  // until every step below passed
        sess_.open(ep_, deadline_);
        step_ = "set session";
        const detail::my::session_settings set = detail::my::set_up(sess_, deadline_);
        const detail::my::durability& d = set.d;
        budget_ = set.budget;
        // A user lock of a random name, held by this session until it ends: committed() finds the
        // session by it after its answer was lost (detail/my/session_life.hpp).
        step_ = "take the session's user lock";
        lock_name_ = detail::my::take_life_lock(sess_);
        if (lock_name_.empty())  // without it, committed() could not find this session after a lost answer
            throw error(errc::store_unavailable,
                        "mysql store " + name_ + ": " + op + ": the server did not grant the session's user lock");
        if (durable_required_)
            if (const std::string fault = detail::my::durability_fault(d); !fault.empty())
                throw error(errc::store_unavailable, "mysql store " + name_ + ": " + op + ": " + step_ +
                                                         ": sync durability was required, but " + fault +
                                                         "; nothing is committed until it is");
        need_reconnect_ = false;
    }

    std::string name_;  // the URI without password
    detail::my::endpoint ep_;
    std::chrono::milliseconds deadline_;
    detail::my::session sess_;
    std::string step_ = "connect";
    std::size_t budget_ = 1 << 20;
    bool need_reconnect_ = true;
    bool committing_ = false;    // the round trip holding COMMIT is in flight
    std::string lock_name_;      // the user lock the current session holds for its life (connect())
    std::string doubt_lock_;     // the lock of a session lost with COMMIT in flight ("" when none)
    int commit_statement_ = -1;  // COMMIT's index among that round trip's statements
    bool first_query_ = false;   // the round trip in flight is the batch's first (its statement 1: the batch id)
    bool in_txn_ = false;        // a write transaction is open on the session
    bool streaming_ = false;     // load() or scan_audit() is in its callback
    bool snap_ = false;          // inside snapshot_read()
    bool durable_required_ = false;
    std::function<void()> before_commit_;
};

}  // namespace idem
