// idem/postgres_store.hpp: the PostgreSQL store (target idem::postgres, libpqxx 6.4).
//
//   idem::postgres_store s("postgresql://idem@db.internal:5432/payments", std::chrono::seconds(2));
//
// Schema: the tables of detail/postgres_sql.hpp (idempotent_record, idempotent_audit,
// idempotent_batch, idem_schema), created and versioned on open. Opening is idempotent and safe when
// several processes open one database at once (a transaction-scoped advisory lock serialises the
// CREATE ... IF NOT EXISTS; a unique violation from a racing opener is retried). A database that
// already holds this version is only read (no DDL: its SHARE locks would wait for, and could
// deadlock with, a live writer's batch), so a store opens beside a running guard.
//
// apply(rows, batch_id) is one transaction, three round trips for a typical batch: BEGIN; one
// statement writing the batch id, every audit row and every record (fence-guarded upsert); COMMIT.
// A fourth statement runs when some record must keep its stored lease (detail/postgres_sql.hpp).
// Rows travel as array parameters that unnest() takes apart on the server: bound parameters only,
// no SQL text is ever built from a key. The records end exactly as memory_store leaves them (see
// params below for how a key's rows fold into one upsert). A batch id can commit once: applying a
// committed id again fails with store_error and writes nothing. committed(batch_id) resolves a
// commit_unknown by asking the server, waiting for the old session's COMMIT if it is still running.
//
// Lanes (pipelined commits). The store is a pipelined_store with `lanes` connections (default 1):
// lane 0 is its own connection, lane i > 0 a second postgres_store on the same URI, opened at its
// first use and carrying this store's settings (node, sync durability, remote_apply, test hook;
// no schema step: this store did it). A
// durable_guard's flush pipeline then keeps up to `lanes` batches in flight, one per connection,
// never two sharing a key (docs/pg_pipeline.md); PostgreSQL's group commit flushes their WAL
// together. lanes = 1 gives the single-connection flusher. Every other call uses lane 0. The
// default is 1 because on the 2-core machine of docs/pg_pipeline.md more lanes cut batches into
// more, smaller transactions and lost throughput (CPU, not commit latency, was the limit there);
// more lanes pay when the commit's latency (a remote server, a synchronous standby) is the limit.
//
// Deadlines (the connection layer of detail/pg_connection.hpp, shared with global_guard's
// sessions). libpq blocks in poll() for as long as the server does not answer: a server stopped
// with SIGSTOP, or a network that drops packets, would block the flusher forever, and neither
// statement_timeout (enforced by the stopped server) nor TCP keepalives (answered by the server's
// kernel) help. So every call is bounded by call_deadline through a watchdog thread (one per store):
// when a call runs past its deadline, the watchdog shuts down the connection's socket
// (shutdown(SHUT_RDWR)); libpq then fails at once, and the call throws store_unavailable, or
// commit_unknown when COMMIT was in flight. The next call reconnects. Second lines of defence:
// statement_timeout = call_deadline on the session, TCP keepalives and tcp_user_timeout in the
// connection string, and connect_timeout = max(2 s, call_deadline) (libpq's minimum is 2 s) for the
// connection handshake, during which the watchdog has no socket to cut (a call whose connect ran
// past its deadline is cut as soon as the socket exists).
// load() and scan_audit() stream for as long as rows keep coming: for them the deadline bounds each
// wait for progress, not the whole scan.
//
// Errors: store_unavailable when the server cannot be reached or answered too late (connection
// refused or lost, deadline passed, statement_timeout, server shutting down); commit_unknown when the
// connection broke during COMMIT (pqxx::in_doubt_error); store_error for any other SQL error;
// corrupt_record for a row that breaks the schema's rules. Every message names the store (its URI
// without password), the operation and the step.
//
// What PostgreSQL cannot hold. idem::key admits any byte >= 0x80, but PostgreSQL text must be valid
// UTF-8 (the connection uses client_encoding UTF8). accepts() declares that rule, so a guard answers
// such a key invalid_key at begin() and it never reaches the queue; apply() still refuses a batch
// holding one with rejected_row naming the key, before touching the server, and so does any row
// the server refuses with a data or integrity error (SQLSTATE class 22 or 23): the flusher then
// isolates that row and commits the others. biz_type (biz_type_of cuts at 32 bytes) is cut back to a UTF-8 boundary.
// Use a database with encoding UTF8: another server encoding refuses characters it cannot hold.
// The node written into the audit trail is cut to the 64 characters of its column.
//
// Durability. check_sync_durability() (a durable_guard in sync mode calls it at open) refuses
// fsync=off and synchronous_commit=off as configured on the server. It accepts on, local,
// remote_write and remote_apply: each of them waits for the primary's WAL flush before a commit is
// acknowledged, which is what a crash of this server needs (local, like on without a synchronous
// standby, does not survive the loss of the machine). Settings can change behind a running store, so
// they are also guarded afterwards:
//  - synchronous_commit is pinned on every connection (detail::pg::pin_durability: on, or
//    remote_apply when the server is configured with it; never weaker), in the round trip that sets
//    the session up. A reload of the server's configuration does not reach a session's own SET.
//  - fsync cannot be pinned. Once sync durability was required, every (re)connect reads it (same
//    round trip) and every apply() reads it inside the batch's transaction, right before COMMIT (the
//    main statement answers with it: no round trip of its own for a typical batch). When it is off, apply() throws store_unavailable
//    naming fsync and commits nothing: no acknowledgement rests on a commit the server may not have
//    flushed. The batch waits (the flusher retries) until fsync is on again.
//
// Snapshot reads: snapshot_read(fn) runs fn inside one REPEATABLE READ READ ONLY transaction, so the
// load(), scan_audit(), get() and audit() calls fn makes all see one snapshot (`idem verify` on a
// live store compares the audit trail with the records). Each call keeps its own deadline; the
// connection is not replaced inside the snapshot: a break there fails the rest of it with
// store_unavailable.
//
// Ordering: keys are COLLATE "C" (byte order), so scan_audit() orders keys as memory_store does.
//
// Thread-safety: like every store, one thread at a time (the flusher, or recovery before it). The
// watchdog thread touches only its own state and the socket. Progress: blocking, each call bounded as
// above. Not guaranteed: the callbacks of load() and scan_audit() run while a COPY is open on the
// connection, so they must not call back into this store; an exception a callback throws ends the
// scan (the connection is cut rather than drained) and reaches the caller unchanged.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <pqxx/pqxx>

#include "idem/detail/pipeline_core.hpp"
#include "idem/detail/batch_fold.hpp"
#include "idem/detail/pg_connection.hpp"
#include "idem/detail/postgres_sql.hpp"
#include "idem/detail/record_rules.hpp"
#include "idem/store.hpp"

namespace idem {

class postgres_store final : public store, public pipelined_store {
public:
    /// Connections a durable_guard's flusher commits on at once, unless the constructor says.
    static constexpr std::size_t default_lanes = 1;

    /// Connects to `uri` (postgresql://user@host:port/db, or a libpq key=value string, taken as is
    /// plus the deadline options it does not set itself) and creates or checks the schema.
    /// `lanes` (>= 1): connections the flush pipeline may commit on at once (opened when first used).
    /// Throws idem::error: invalid_argument for a non-positive deadline or zero lanes,
    /// store_unavailable when the server cannot be reached, store_error when the schema cannot be
    /// created or is newer than this library.
    explicit postgres_store(std::string uri, std::chrono::milliseconds call_deadline = std::chrono::seconds(5),
                            std::size_t lanes = default_lanes)
        : uri_(std::move(uri)), name_(detail::pg::redact(uri_)), deadline_(call_deadline) {
        if (deadline_ <= std::chrono::milliseconds::zero())
            throw error(errc::invalid_argument, "postgres store " + name_ + ": call_deadline must be positive, got " +
                                                    std::to_string(deadline_.count()) + " ms");
        if (lanes == 0) throw error(errc::invalid_argument, "postgres store " + name_ + ": lanes must be at least 1");
        lane_stores_.resize(lanes - 1);
        conninfo_ = detail::pg::session_conninfo(uri_, deadline_, "idem");
        run("open", [&] { create_schema(); });
    }
    ~postgres_store() override {
        watchdog_.watch(-1);
        notices_.reset();
    }
    postgres_store(const postgres_store&) = delete;
    postgres_store& operator=(const postgres_store&) = delete;

    /// Whether PostgreSQL text can hold this key (valid UTF-8). A key that fails makes apply() throw.
    [[nodiscard]] static bool accepts_key(std::string_view key) noexcept { return detail::pg::valid_utf8(key); }

    /// The guard's question before a claim: a key that is not valid UTF-8 is answered invalid_key
    /// at begin(), so it never reaches the flush queue.
    [[nodiscard]] bool accepts(const key& k, std::string* why = nullptr) const noexcept override {
        if (accepts_key(k.view())) return true;
        if (why != nullptr) {
            try {
                *why = "key '" + key::printable(k.view()) + "' is not valid UTF-8; PostgreSQL text cannot hold it";
            } catch (...) {  // no memory for the message: the answer stands without it
            }
        }
        return false;
    }

    void apply(std::span<const store_row> rows, std::uint64_t batch_id) override {
        const std::string op = "apply batch " + std::to_string(batch_id);
        if (!detail::pg::valid_utf8(node_))
            throw error(errc::store_error, "postgres store " + name_ + ": " + op + ": node '" + key::printable(node_) +
                                               "' is not valid UTF-8; PostgreSQL text cannot hold it");
        // node is VARCHAR(64); the default hostname:pid can be longer (a 63-byte hostname).
        const std::string node(detail::pg::utf8_truncate(node_, 64));
        params p;
        p.build(rows, [&](std::string_view k, const char* rule) {
            throw rejected_row("postgres store " + name_ + ": " + op + ": key '" + key::printable(k) + "' " + rule);
        });
        const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
        run(op, [&] {
            step_ = "begin";
            pqxx::work w(*conn_);
            step_ = "write batch id, audit rows and records";
            const auto main = w.exec_prepared(
                std::string(detail::pg::apply_main_name), static_cast<std::int64_t>(batch_id), now_ms, p.a_key.str(),
                p.a_from.str(), p.a_to.str(), p.a_fence.str(), p.a_at.str(), p.a_detail.str(), node, p.l_key.str(),
                p.l_fence.str(), p.l_lease.str(), p.l_fp.str(), p.x.key.str(), p.x.biz.str(), p.x.status.str(),
                p.x.fence.str(), p.x.lease.str(), p.x.outcome.str(), p.x.fp.str(), p.x.created.str(), p.x.updated.str(),
                p.x.payload.str());
            // Sync mode reads fsync right before COMMIT: the main statement's answer when it was
            // the last statement, else one more read after the class-Y records.
            std::string fsync = main[0][0].c_str();
            if (!p.y.key.empty()) {
                step_ = "write records that keep their lease";
                w.exec_prepared(std::string(detail::pg::apply_keep_lease_name), p.y.key.str(), p.y.biz.str(),
                                p.y.status.str(), p.y.fence.str(), p.y.lease.str(), p.y.outcome.str(), p.y.fp.str(),
                                p.y.created.str(), p.y.updated.str(), p.y.payload.str());
                if (durable_required_) {
                    step_ = "check fsync";
                    fsync = w.exec(std::string(detail::pg::fsync_now))[0][0].c_str();
                }
            }
            step_ = "check fsync";
            if (durable_required_ && fsync == "off") refuse_fsync();
            step_ = "commit";
            committing_ = true;
            if (before_commit_) before_commit_();
            w.commit();
            committing_ = false;
        });
    }

    /// Resolves an in-doubt batch. Not a plain SELECT: the COMMIT of the batch may still be running
    /// in the old session. A speculative INSERT of the batch id waits for any transaction holding
    /// that id uncommitted, then conflicts (committed) or not (never committed; rolled back here).
    /// Bounded by the call deadline: a server that cannot decide yet gives store_unavailable.
    bool committed(std::uint64_t batch_id) override {
        bool done = false;
        run("committed(" + std::to_string(batch_id) + ")", [&] {
            step_ = "probe idempotent_batch";
            pqxx::work w(*conn_);
            const auto r = w.exec_prepared(std::string(detail::pg::committed_name), static_cast<std::int64_t>(batch_id));
            done = r.empty();
            w.abort();
        });
        return done;
    }

    void load(const std::function<void(const stored_record&)>& fn) override {
        namespace sql = detail::pg;
        std::exception_ptr from_fn;
        run("load", [&] {
            step_ = "copy idempotent_record";
            std::optional<pqxx::work> own;
            pqxx::transaction_base& w = snap_ ? *snap_ : own.emplace(*conn_);
            w.exec("SET LOCAL statement_timeout = 0");  // the watchdog bounds each wait for rows instead
            pqxx::stream_from s(w, std::string(sql::load_query));
            std::string line;
            std::array<std::string, sql::load_columns> f;
            stored_record rec;
            while (s.get_raw_line(line)) {
                watchdog_.progress();
                try {
                    if (!sql::split_copy_line(line, f)) bad_copy_line(line);
                    rec.key = std::move(f[0]);
                    check_key(rec.key);
                    rec.biz_type = std::move(f[1]);
                    rec.state = checked_state(rec.key, f[2], true);
                    rec.fence = checked_fence(rec.key, int_field(line, f[3]));
                    rec.lease_until_ms = int_field(line, f[4]);
                    rec.outcome = static_cast<std::uint64_t>(int_field(line, f[5]));
                    rec.fingerprint = static_cast<std::uint64_t>(int_field(line, f[6]));
                    rec.created_ms = int_field(line, f[7]);
                    rec.updated_ms = int_field(line, f[8]);
                    checked_payload(rec.key, f[9], rec.payload, line);
                    fn(rec);
                } catch (...) {  // corrupt_record, or the callback's own exception: passed on unchanged
                    from_fn = std::current_exception();
                    abandon_stream();
                    return;
                }
            }
            s.complete();
            if (own) own->commit();
        });
        if (from_fn) std::rethrow_exception(from_fn);
    }

    std::optional<stored_record> get(std::string_view key) override {
        if (!detail::pg::valid_utf8(key)) return std::nullopt;  // such a key can have no row
        std::optional<stored_record> out;
        run("get", [&] {
            step_ = "select idempotent_record";
            std::optional<pqxx::nontransaction> own;
            pqxx::transaction_base& n = snap_ ? *snap_ : own.emplace(*conn_);
            const auto r = n.exec_prepared(std::string(detail::pg::get_name), std::string(key));
            if (r.empty()) return;
            const auto row = r[0];
            stored_record rec;
            rec.key = row[0].c_str();
            rec.biz_type = row[1].c_str();
            rec.state = checked_state(rec.key, row[2].c_str(), true);
            rec.fence = checked_fence(rec.key, row[3].as<std::int64_t>());
            rec.lease_until_ms = row[4].as<std::int64_t>();
            rec.outcome = static_cast<std::uint64_t>(row[5].as<std::int64_t>());
            rec.fingerprint = static_cast<std::uint64_t>(row[6].as<std::int64_t>());
            rec.created_ms = row[7].as<std::int64_t>();
            rec.updated_ms = row[8].as<std::int64_t>();
            const pqxx::field hex = row[9];
            checked_payload(rec.key, std::string_view(hex.c_str(), hex.size()), rec.payload, {});
            out = std::move(rec);
        });
        return out;
    }

    std::vector<audit_entry> audit(std::string_view key) override {
        std::vector<audit_entry> out;
        if (!detail::pg::valid_utf8(key)) return out;
        run("audit", [&] {
            step_ = "select idempotent_audit";
            std::optional<pqxx::nontransaction> own;
            pqxx::transaction_base& n = snap_ ? *snap_ : own.emplace(*conn_);
            const auto r = n.exec_prepared(std::string(detail::pg::audit_name), std::string(key));
            out.reserve(r.size());
            for (const auto& row : r) {
                audit_entry a;
                a.sequence = row[0].as<std::int64_t>();
                a.key = row[1].c_str();
                a.from = checked_state(a.key, row[2].c_str(), false, "from_status");
                a.to = checked_state(a.key, row[3].c_str(), false, "to_status");
                a.fence = static_cast<std::uint64_t>(row[4].as<std::int64_t>());
                a.node = row[5].c_str();
                a.at_ms = row[6].as<std::int64_t>();
                a.detail = row[7].c_str();
                out.push_back(std::move(a));
            }
        });
        return out;
    }

    void scan_audit(const std::function<void(const audit_entry&)>& fn) override {
        namespace sql = detail::pg;
        std::exception_ptr from_fn;
        run("scan_audit", [&] {
            step_ = "copy idempotent_audit";
            std::optional<pqxx::work> own;
            pqxx::transaction_base& w = snap_ ? *snap_ : own.emplace(*conn_);
            w.exec("SET LOCAL statement_timeout = 0");  // the watchdog bounds each wait for rows instead
            // Stream in index order rather than sort first: a sort of a large trail would produce no
            // row for longer than the deadline, and the watchdog would take that for a hang.
            w.exec("SET LOCAL enable_sort = off");
            pqxx::stream_from s(w, std::string(sql::scan_audit_query));
            std::string line;
            std::array<std::string, sql::scan_audit_columns> f;
            audit_entry a;
            while (s.get_raw_line(line)) {
                watchdog_.progress();
                try {
                    if (!sql::split_copy_line(line, f)) bad_copy_line(line);
                    a.sequence = int_field(line, f[0]);
                    a.key = std::move(f[1]);
                    a.from = checked_state(a.key, f[2], false, "from_status");
                    a.to = checked_state(a.key, f[3], false, "to_status");
                    a.fence = static_cast<std::uint64_t>(int_field(line, f[4]));
                    a.node = std::move(f[5]);
                    a.at_ms = int_field(line, f[6]);
                    a.detail = std::move(f[7]);
                    fn(a);
                } catch (...) {  // corrupt_record, or the callback's own exception: passed on unchanged
                    from_fn = std::current_exception();
                    abandon_stream();
                    return;
                }
            }
            s.complete();
            if (own) own->commit();
        });
        if (from_fn) std::rethrow_exception(from_fn);
    }

    /// Refuses fsync=off and synchronous_commit=off (see the header comment for what is accepted),
    /// then keeps refusing fsync=off on every connection and batch.
    void check_sync_durability() override {
        require_durability(" or open the durable_guard with store_options::mode = durability::async (acknowledged "
                           "before the commit)");
    }

    /// check_sync_durability() with the caller's alternative to fixing the server (appended to the
    /// message; empty: none). Throws idem::error(invalid_argument) naming the setting and the fix.
    void require_durability(const std::string& alternative) {
        std::string fsync, sync_commit;
        run("check sync durability", [&] {
            step_ = "read fsync and synchronous_commit";
            pqxx::nontransaction n(*conn_);
            const auto r = n.exec(std::string(detail::pg::durability_settings));
            fsync = r[0][0].c_str();
            sync_commit = r[0][1].c_str();
        });
        auto refuse = [&](const std::string& setting, const std::string& fix) {
            throw error(errc::invalid_argument, "sync durability refused: PostgreSQL at " + name_ + " runs with " +
                                                    setting + "; a commit acknowledged by it can be lost on a crash. Set " +
                                                    fix + " in the server's configuration" + alternative);
        };
        if (fsync == "off") refuse("fsync=off", "fsync=on");
        if (sync_commit == "off") refuse("synchronous_commit=off", "synchronous_commit=on");
        durable_required_ = true;
        for (auto& l : lane_stores_)
            if (l) l->durable_required_ = true;
    }

    /// Runs fn inside one REPEATABLE READ READ ONLY transaction: every load(), scan_audit(), get()
    /// and audit() it makes reads the same snapshot. A nested call just runs fn.
    void snapshot_read(const std::function<void()>& fn) override {
        if (snap_ != nullptr) return fn();
        std::unique_ptr<pqxx::transaction<pqxx::repeatable_read, pqxx::read_only>> t;
        run("snapshot read", [&] {
            step_ = "begin repeatable read, read only";
            t = std::make_unique<pqxx::transaction<pqxx::repeatable_read, pqxx::read_only>>(*conn_);
        });
        snap_ = t.get();
        auto end = [&](bool quiet) {
            try {
                run("snapshot read", [&] {  // snap_ still set: run() does not reconnect under it
                    step_ = "end";
                    t->abort();  // read only: nothing to commit
                });
            } catch (...) {
                snap_ = nullptr;
                t.reset();
                if (!quiet) throw;
                return;
            }
            snap_ = nullptr;
            t.reset();
        };
        try {
            fn();
        } catch (...) {
            end(/*quiet=*/true);  // fn's exception wins
            throw;
        }
        end(/*quiet=*/false);
    }

    /// The value of `setting` in this store's own session (current_setting(); for operators and
    /// tests, e.g. the pinned synchronous_commit). Throws like every call.
    [[nodiscard]] std::string session_setting(const std::string& setting) {
        std::string v;
        run("session setting " + setting, [&] {
            step_ = "current_setting";
            std::optional<pqxx::nontransaction> own;
            pqxx::transaction_base& n = snap_ ? *snap_ : own.emplace(*conn_);
            v = n.exec_params("SELECT current_setting($1)", setting)[0][0].c_str();
        });
        return v;
    }

    /// Drops the connection and opens a new one (bounded like every call).
    void reconnect() override {
        need_reconnect_ = true;
        run("reconnect", [] {});
    }

    // ---- pipelined_store: lane 0 is this store's connection, lane i its i-th lane store ----------
    [[nodiscard]] std::size_t lanes() const noexcept override { return lane_stores_.size() + 1; }
    void apply_on(std::size_t lane, std::span<const store_row> rows, std::uint64_t batch_id) override {
        lane_store(lane).apply(rows, batch_id);
    }
    [[nodiscard]] bool committed_on(std::size_t lane, std::uint64_t batch_id) override {
        return lane_store(lane).committed(batch_id);  // any session can probe idempotent_batch
    }
    void reconnect_on(std::size_t lane) override {
        if (lane == 0 || lane_stores_.at(lane - 1)) lane_store(lane).reconnect();  // an unopened lane opens on use
    }

    [[nodiscard]] std::string name() const override { return name_; }

    std::uint64_t max_fence() override {
        std::uint64_t m = 0;
        run("max_fence", [&] {
            step_ = "select max(fencing_token)";
            pqxx::nontransaction n(*conn_);
            const auto r = n.exec(std::string(detail::pg::max_fence));
            if (!r[0][0].is_null())  // undo the sign-bit flip that made the max unsigned
                m = static_cast<std::uint64_t>(r[0][0].as<std::int64_t>()) ^ (std::uint64_t{1} << 63);
        });
        return m;
    }

    /// The server's clock (Unix ms): what global scope stamps its rows with (detail/global_sql.hpp,
    /// "Time"), so a bound on them must be taken from it, not from this machine's clock.
    std::int64_t server_now_ms() {
        std::int64_t now = 0;
        run("server_now_ms", [&] {
            step_ = "select statement_timestamp()";
            pqxx::nontransaction n(*conn_);
            now = n.exec(std::string(detail::pg::server_now_ms))[0][0].as<std::int64_t>();
        });
        return now;
    }

    /// One transaction (detail/postgres_sql.hpp, prune_records ... prune_horizon): the oldest
    /// expired records by the updated_time index, then a prefix of the audit table in sequence
    /// order up to the first row not older than the bound, deleted as one range of its primary
    /// key (docs/stores.md, "Pruning", says why not partitions), and the horizon, forward only.
    prune_result prune(const prune_limits& limits) override {
        namespace sql = detail::pg;
        prune_result out;
        const auto limit = static_cast<std::int64_t>(std::min<std::size_t>(limits.max_rows, INT64_MAX - 1));
        auto bound = [](std::int64_t v) { return v == prune_limits::keep_all ? std::optional<std::int64_t>() : v; };
        run("prune", [&] {
            out = {};
            step_ = "begin";
            pqxx::work w(*conn_);
            std::optional<std::int64_t> fence;
            if (limits.records_before_ms != prune_limits::keep_all) {
                step_ = "delete expired records";
                const auto r = w.exec_params(std::string(sql::prune_records), limits.records_before_ms, limit);
                out.records = r[0][0].as<std::size_t>();
                if (!r[0][1].is_null())  // undo the sign-bit flip
                    fence = static_cast<std::int64_t>(static_cast<std::uint64_t>(r[0][1].as<std::int64_t>()) ^
                                                      (std::uint64_t{1} << 63));
                step_ = "look for more expired records";
                out.more = w.exec_params(std::string(sql::prune_more_records), limits.records_before_ms)[0][0].as<bool>();
            }
            if (limits.audit_before_ms != prune_limits::keep_all) {
                step_ = "read the head of the audit table";
                const auto head = w.exec_params(std::string(sql::prune_audit_head), limit + 1);
                std::int64_t last = 0;
                for (const auto& row : head) {
                    if (row[1].as<std::int64_t>() >= limits.audit_before_ms) break;
                    if (out.audit_rows == limits.max_rows) {
                        out.more = true;
                        break;
                    }
                    last = row[0].as<std::int64_t>();
                    ++out.audit_rows;
                }
                if (last != 0) {
                    step_ = "delete expired audit rows";
                    w.exec_params(std::string(sql::prune_audit), last);
                }
            }
            step_ = "write the prune horizon";
            w.exec_params(std::string(sql::prune_horizon), bound(limits.records_before_ms),
                          bound(limits.audit_before_ms), fence);
            step_ = "commit";
            w.commit();
        });
        return out;
    }

    prune_horizon horizon() override {
        prune_horizon h;
        run("horizon", [&] {
            step_ = "select idem_schema";
            std::optional<pqxx::nontransaction> own;
            pqxx::transaction_base& n = snap_ ? *snap_ : own.emplace(*conn_);
            const auto r = n.exec(std::string(detail::pg::horizon));
            if (r.empty()) return;
            if (!r[0][0].is_null()) h.records_ms = r[0][0].as<std::int64_t>();
            if (!r[0][1].is_null()) h.audit_ms = r[0][1].as<std::int64_t>();
        });
        return h;
    }

    /// The server process of the current connection (0 when disconnected): for operators and tests.
    [[nodiscard]] int backend_pid() const noexcept { return conn_ ? conn_->backendpid() : 0; }
    [[nodiscard]] std::chrono::milliseconds call_deadline() const noexcept { return deadline_; }

    /// Test hook: runs right before COMMIT is sent (to pause the server at the worst moment).
    void set_before_commit_hook_for_testing(std::function<void()> hook) {
        for (auto& l : lane_stores_)
            if (l) l->before_commit_ = hook;
        before_commit_ = std::move(hook);
    }

private:
    /// The store that commits on `lane`, opened on first use with this store's settings. Only that
    /// lane's flusher thread calls this for lane > 0 (lane_stores_ never changes size).
    /// Another session on the same database for reads beside the writer (its settings, no schema
    /// step; it connects at its first call).
    std::unique_ptr<store> open_reader() override { return std::unique_ptr<store>(new postgres_store(lane_of{}, *this)); }

    postgres_store& lane_store(std::size_t lane) {
        if (lane == 0) return *this;
        std::unique_ptr<postgres_store>& l = lane_stores_.at(lane - 1);
        if (!l) {
            l.reset(new postgres_store(lane_of{}, *this));
        }
        return *l;
    }

    struct lane_of {};
    /// A lane of `first`: its settings, and no schema step. This store created or checked the schema
    /// already, and CREATE INDEX IF NOT EXISTS takes a SHARE lock on its table even when the index
    /// exists, which would deadlock with another lane's batch. It connects at its first call.
    postgres_store(lane_of, const postgres_store& first)
        : uri_(first.uri_), name_(first.name_), conninfo_(first.conninfo_), deadline_(first.deadline_),
          durable_required_(first.durable_required_), keep_remote_apply_(first.keep_remote_apply_),
          before_commit_(first.before_commit_) {
        node_ = first.node_;
    }

    /// The bound parameters of one apply(): array literals, one per column.
    ///
    /// How a key's rows fold into one record write: detail/batch_fold.hpp (the fold every store
    /// writes). The upsert holds its guard against the stored fence S; lease_until and
    /// request_fingerprint come from P, the chain's last PROCESSING row, written iff P's fence >= S
    /// or on insert. postgres_sql.hpp's classes X (P's fence == F, the chain's last fence) and Y
    /// (the rest) put that into SQL. biz_type is biz_type_of(key), cut back to a UTF-8 boundary.
    struct params {
        struct records {
            detail::pg::array_literal key, biz, status, fence, lease, outcome, fp, created, updated, payload;
        };
        detail::pg::array_literal a_key, a_from, a_to, a_fence, a_at, a_detail;  // audit rows
        detail::pg::array_literal l_key, l_fence, l_lease, l_fp;                 // Y keys with P below F
        records x, y;

        template <class Reject>
        void build(std::span<const store_row> rows, Reject&& reject) {
            const detail::batch_fold fold = detail::fold_batch(rows);
            for (const detail::key_fold& f : fold.keys)
                if (!detail::pg::valid_utf8(f.key()))
                    reject(f.key(), "is not valid UTF-8; PostgreSQL text cannot hold it (postgres_store::accepts_key)");
            a_key.reserve(rows.size() * 40);
            a_detail.reserve(rows.size() * 28);
            for (const store_row& r : rows) {
                a_key.add_text(r.t.k.view());
                a_from.add_text(status_text(r.t.from));
                a_to.add_text(status_text(r.t.to));
                a_fence.add_uint(r.t.fence);
                a_at.add_int(r.at_ms);
                a_detail.add_text(audit_detail(r.t));
            }
            for (const detail::key_fold& f : fold.keys) {
                const std::string_view k = f.key();
                if (f.last->t.to == record_state::absent)
                    reject(k, "would leave its record ABSENT; a record is PROCESSING, SUCCESS, FAILED or RELEASED");
                const bool class_x = f.proc && f.proc->t.fence == f.last->t.fence;
                records& r = class_x ? x : y;
                r.key.add_text(k);
                r.biz.add_text(detail::pg::utf8_prefix(biz_type_of(k)));
                r.status.add_text(status_text(f.last->t.to));
                r.fence.add_uint(f.last->t.fence);
                r.lease.add_int(f.proc ? f.proc->lease_until_ms : 0);
                r.outcome.add_uint(f.last->t.outcome);
                r.fp.add_uint(f.proc ? f.proc->t.fingerprint : 0);
                r.created.add_int(f.first->at_ms);
                r.updated.add_int(f.last->at_ms);
                r.payload.add_hex(f.last->t.payload);  // the chain's last row: as outcome (batch_fold.hpp)
                if (f.proc && !class_x) {
                    l_key.add_text(k);
                    l_fence.add_uint(f.proc->t.fence);
                    l_lease.add_int(f.proc->lease_until_ms);
                    l_fp.add_uint(f.proc->t.fingerprint);
                }
            }
        }
    };

    /// Runs one store call: arms the watchdog, reconnects when needed, and turns every failure into
    /// idem::error (or commit_unknown) naming the store, `op` and the step.
    template <class F>
    void run(const std::string& op, F&& body) {
        watchdog_.arm(deadline_);
        committing_ = false;
        op_ = &op;
        try {
            if (need_reconnect_ || !conn_ || !conn_->is_open()) {
                if (snap_ != nullptr)  // the snapshot's transaction lives on this connection
                    throw error(errc::store_unavailable, "postgres store " + name_ + ": " + op +
                                                             ": the connection broke during a snapshot read; "
                                                             "the snapshot is gone (start the read again)");
                connect();
            }
            body();
        } catch (...) {
            const bool fired = watchdog_.disarm();
            rethrow_translated(op, fired);
        }
        if (watchdog_.disarm()) need_reconnect_ = true;  // cut after the work finished: reconnect next time
    }

    /// The failure being handled as this store's exception (pg_connection.hpp classifies; this is
    /// the store's table): in doubt -> commit_unknown; lost, cancelled -> store_unavailable; a row's
    /// data -> rejected_row (but a batch id committed twice -> store_error); the rest -> store_error.
    [[noreturn]] void rethrow_translated(const std::string& op, bool fired) {
        const bool in_commit = committing_;
        committing_ = false;
        const bool open = conn_ && conn_->is_open();
        if (fired || !open) need_reconnect_ = true;
        const std::string where = "postgres store " + name_ + ": " + op + ": " + step_ + ": ";
        try {
            throw;
        } catch (const error&) {
            throw;  // ours already (corrupt_record, ...)
        } catch (const std::exception&) {
            using detail::pg::failure;
            const detail::pg::classified c = detail::pg::classify(fired, open, in_commit, deadline_);
            switch (c.kind) {
                case failure::in_doubt:
                    throw commit_unknown(where + c.text +
                                         "; the batch may or may not have committed (resolve with committed(batch_id))");
                case failure::lost:
                case failure::cancelled: throw error(errc::store_unavailable, where + c.text);
                case failure::data:
                    if (c.sqlstate == "23505" && c.text.find("idempotent_batch_pkey") != std::string::npos)
                        throw error(errc::store_error, where + "this batch id already committed; a batch commits once (" +
                                                           c.text + ")");
                    // What a row holds, not an outage: the flusher isolates the row instead of
                    // retrying the batch forever.
                    throw rejected_row(where + c.text);
                case failure::contention:
                case failure::client:
                case failure::refused:
                case failure::foreign: break;
            }
            throw error(errc::store_error, where + c.text);
        }
    }

    void connect() {
        step_ = "connect";
        need_reconnect_ = true;  // until every step below passed
        watchdog_.watch(-1);
        notices_.reset();
        conn_.reset();
        conn_ = std::make_unique<pqxx::connection>(conninfo_);
        notices_ = std::make_unique<detail::quiet_notices>(*conn_);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        conn_->inhibit_reactivation(true);  // a broken connection stays broken: we reconnect, and watch the new socket
#pragma GCC diagnostic pop
        watchdog_.watch(conn_->sock());
        step_ = "set session";
        std::string fsync;
        {
            pqxx::nontransaction n(*conn_);
            const auto r = n.exec(detail::pg::session_setup(deadline_, keep_remote_apply_));
            keep_remote_apply_ = keep_remote_apply_ || std::string_view(r[0][0].c_str()) == "remote_apply";
            fsync = r[0][1].c_str();
        }
        if (durable_required_ && fsync == "off") refuse_fsync();
        namespace sql = detail::pg;
        conn_->prepare(std::string(sql::apply_main_name), std::string(sql::apply_main));
        conn_->prepare(std::string(sql::apply_keep_lease_name), std::string(sql::apply_keep_lease));
        conn_->prepare(std::string(sql::committed_name), std::string(sql::committed));
        conn_->prepare(std::string(sql::get_name), std::string(sql::get));
        conn_->prepare(std::string(sql::audit_name), std::string(sql::audit));
        need_reconnect_ = false;
    }

    void create_schema() {
        // A database that already holds this version is only checked: the DDL below takes SHARE
        // locks (CREATE INDEX IF NOT EXISTS does even when the index exists), which deadlock with
        // a live writer's batch holding the audit table and waiting for the record table, so a
        // second store opened beside a running guard (idem verify, a reader) must not run it.
        {
            step_ = "check schema";
            pqxx::work w(*conn_);
            // (Two statements: a name in a statement is resolved before it runs, so one statement
            // cannot read idem_schema only when it exists.)
            const bool exists = !w.exec("SELECT to_regclass('idem_schema')")[0][0].is_null();
            const int version = exists ? w.exec("SELECT COALESCE(max(version), 0) FROM idem_schema")[0][0].as<int>() : 0;
            // The payload column came without a version (postgres_sql.hpp): a current database
            // without it runs the DDL once.
            const bool payload = version == detail::pg::schema_version &&
                                 w.exec(std::string(detail::pg::payload_column_exists))[0][0].as<bool>();
            w.commit();
            if (payload) return;
        }
        for (int attempt = 0;; ++attempt) {
            try {
                step_ = "create schema";
                pqxx::work w(*conn_);
                w.exec(std::string(detail::pg::schema_lock));
                w.exec(std::string(detail::pg::schema_ddl));
                w.exec(std::string(detail::pg::schema_version_insert));
                const int v = w.exec(std::string(detail::pg::schema_version_select))[0][0].as<int>();
                w.commit();
                if (v != detail::pg::schema_version)
                    throw error(errc::store_error, "postgres store " + name_ + ": idem_schema says version " +
                                                       std::to_string(v) + "; this library reads version " +
                                                       std::to_string(detail::pg::schema_version) + " only");
                return;
            } catch (const pqxx::unique_violation&) {
                if (attempt == 2) throw;  // a racing opener without the lock (an older library): try again
            }
        }
    }

    [[noreturn]] void throw_corrupt(const std::string& k, const std::string& rule) const {
        throw error(errc::corrupt_record,
                    "postgres store " + name_ + ": corrupt row for key '" + key::printable(k) + "': " + rule);
    }
    /// The rules are record_rules.hpp's, shared by every store.
    record_state checked_state(const std::string& k, std::string_view text, bool of_record,
                               const char* column = "status") const {
        std::string why;
        const auto s = detail::checked_status(text, of_record, &why, column);
        if (!s) throw_corrupt(k, why);
        return *s;
    }
    std::uint64_t checked_fence(const std::string& k, std::int64_t fence) const {
        if (std::string why = detail::fence_fault(fence); !why.empty()) throw_corrupt(k, why);
        return static_cast<std::uint64_t>(fence);
    }
    [[noreturn]] void bad_copy_line(const std::string& line) const {
        throw error(errc::store_error, "postgres store " + name_ + ": " + step_ + ": unexpected COPY line '" +
                                          key::printable(line) + "'");
    }
    /// The payload column's hex text (encode(payload, 'hex')) into `out`: text that is not hex is a
    /// protocol surprise (bad_copy_line, or store_error for a get), a payload above the hard maximum
    /// a corrupt row naming the key.
    void checked_payload(const std::string& k, std::string_view hex, std::string& out, const std::string& line) const {
        if (std::string why = detail::payload_fault(hex.size() / 2); !why.empty()) throw_corrupt(k, why);
        if (detail::pg::from_hex(hex, out)) return;
        if (!line.empty()) bad_copy_line(line);
        throw error(errc::store_error, "postgres store " + name_ + ": " + step_ + ": the payload of key '" +
                                          key::printable(k) + "' came back as text that is not hex");
    }
    std::int64_t int_field(const std::string& line, const std::string& text) const {
        std::int64_t v = 0;
        if (!detail::pg::parse_int(text, v)) bad_copy_line(line);
        return v;
    }
    void check_key(const std::string& k) const {
        if (std::string why = detail::key_fault(k); !why.empty()) throw_corrupt(k, why);
    }

    /// Sync durability was required and the server now runs with fsync=off: nothing is committed.
    [[noreturn]] void refuse_fsync() const {
        throw error(errc::store_unavailable,
                    "postgres store " + name_ + ": " + (op_ ? *op_ : std::string("connect")) + ": " + step_ +
                        ": the server now runs with fsync=off, so a commit it acknowledges can be lost on a crash; "
                        "sync durability acknowledges nothing on it (batches wait until fsync=on is configured "
                        "and reloaded)");
    }

    /// A row was corrupt or the callback threw mid-COPY: cut the connection rather than drain the
    /// rest of the table (the next call reconnects).
    void abandon_stream() {
        watchdog_.cut();
        need_reconnect_ = true;
    }

    std::string uri_;
    std::string name_;  // the URI without password
    std::string conninfo_;
    std::chrono::milliseconds deadline_;
    detail::pg_watchdog watchdog_;  // wake::on_arm: a call per batch, cut right at its deadline
    std::unique_ptr<pqxx::connection> conn_;
    std::unique_ptr<detail::quiet_notices> notices_;
    std::string step_ = "connect";
    const std::string* op_ = nullptr;  // the operation run() is in (for messages); valid during run() only
    bool committing_ = false;
    bool need_reconnect_ = true;
    bool durable_required_ = false;   // check_sync_durability() passed: refuse fsync=off from then on
    bool keep_remote_apply_ = false;  // the server was configured with remote_apply: keep pinning it
    pqxx::transaction_base* snap_ = nullptr;  // inside snapshot_read(): its transaction
    std::function<void()> before_commit_;
    std::vector<std::unique_ptr<postgres_store>> lane_stores_;  // lanes 1.., opened on first use
};

}  // namespace idem
