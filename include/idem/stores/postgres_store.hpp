// idem/stores/postgres_store.hpp: the PostgreSQL store (target idem::postgres, libpqxx 6.4).
//
//   idem::postgres_store s("postgresql://idem@db.internal:5432/payments", std::chrono::seconds(2));
//
// Here: the store's calls and its error table. Each concern behind them has its header in
// detail/pg/: schema.hpp (tables, versions, durability settings), batch_params.hpp and sql.hpp (how
// a batch is written), row_decoder.hpp (how every row read back is decoded and checked), lanes.hpp
// (pipelined commits), retention.hpp (prune), connection.hpp (deadlines, failure classification).
// Invariants kept here: a batch id commits once, whole or not at all; every call is bounded by
// call_deadline; every failure reaches the caller as one idem::error kind (the table in
// rethrow_translated); in sync mode nothing is acknowledged on a server that may lose it.
//
// Schema (schema.hpp): idempotent_record, idempotent_audit, idempotent_batch, idem_schema, created
// and versioned on open. Opening is idempotent and safe when several processes open one database
// at once; a database already at this version is only read (no DDL), so a store opens beside a
// running guard.
//
// apply(rows, batch_id) is one transaction, three round trips for a typical batch: BEGIN; one
// statement writing the batch id, every audit row and every record (fence-guarded upsert); COMMIT.
// A fourth statement runs when some record must keep its stored lease (detail/pg/sql.hpp).
// Rows travel as array parameters that unnest() takes apart on the server: bound parameters only,
// no SQL text is ever built from a key. The records end exactly as memory_store leaves them
// (detail/pg/batch_params.hpp: how a key's rows fold into one upsert). A batch id can commit once:
// applying a committed id again fails with store_error and writes nothing. committed(batch_id)
// resolves a commit_unknown by asking the server, waiting for the old session's COMMIT if it is
// still running.
//
// Lanes (pipelined commits): the store is a pipelined_store with `lanes` connections (default 1);
// lane 0 is its own, lane i > 0 a second store on the same URI opened at its first use with this
// store's settings. detail/pg/lanes.hpp says what they share and why the default is 1.
//
// Deadlines (connection.hpp, shared with global_guard's sessions). Every call is bounded by
// call_deadline: a watchdog thread (one per store) shuts the connection's socket down when a call
// runs past it, so a stopped server or a network dropping packets cannot block the flusher
// forever; the call throws store_unavailable (commit_unknown when COMMIT was in flight) and the next
// call reconnects. load() and scan_audit() stream for as long as rows keep coming: for them the
// deadline bounds each wait for progress, not the whole scan.
//
// Errors: store_unavailable when the server cannot be reached or answered too late (connection
// refused or lost, deadline passed, statement_timeout, server shutting down); commit_unknown when the
// connection broke during COMMIT (pqxx::in_doubt_error); store_error for any other SQL error;
// corrupt_record for a row that breaks the schema's rules (detail/pg/row_decoder.hpp). Every message
// names the store (its URI without password), the operation and the step.
//
// What PostgreSQL cannot hold. idem::key admits any byte >= 0x80, but PostgreSQL text must be valid
// UTF-8 (the connection uses client_encoding UTF8). accepts() declares that rule, so a guard answers
// such a key invalid_key at begin() and it never reaches the queue; apply() still refuses a batch
// holding one with rejected_row naming the key, before touching the server, and so does any row
// the server refuses with a data or integrity error (SQLSTATE class 22 or 23): the flusher then
// isolates that row and commits the others. biz_type (biz_type_of cuts at 32 bytes) is cut back to
// a UTF-8 boundary. Use a database with encoding UTF8: another server encoding refuses characters it
// cannot hold. The node written into the audit trail is cut to the 64 characters of its column.
//
// Durability (schema.hpp). check_sync_durability() (sync mode calls it at open) refuses fsync=off
// and synchronous_commit=off as configured on the server. Afterwards synchronous_commit is pinned on
// every connection, and fsync is read at every (re)connect and in every batch right before COMMIT:
// when it is off, apply() throws store_unavailable naming fsync and commits nothing.
//
// Failover (schema.hpp). A URI naming several hosts with target_session_attrs=read-write
// (postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write) reconnects to whichever is the
// primary after a failover; a batch in flight at the switch is commit_unknown, and committed()
// answers it from the new primary. failover_exposure() says what a failover can lose;
// require_synchronous_standby() refuses a server without a synchronous standby at open and
// afterwards (every reconnect and every batch, like fsync). A commit whose wait for the standby was
// cancelled is commit_unknown, and committed() confirms a committed batch with a write of its own,
// whose commit waits for the standby (detail/pg/sql.hpp, committed_barrier).
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
// connection, so they must not call back into this store (asserted); an exception a callback throws
// ends the scan (the connection is cut rather than drained) and reaches the caller unchanged.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <pqxx/pqxx>

#include "idem/detail/assert.hpp"
#include "idem/detail/pg/batch_params.hpp"
#include "idem/detail/pg/connection.hpp"
#include "idem/detail/pg/lanes.hpp"
#include "idem/detail/pg/retention.hpp"
#include "idem/detail/pg/row_decoder.hpp"
#include "idem/detail/pg/schema.hpp"
#include "idem/detail/pg/sql.hpp"
#include "idem/pipelined_store.hpp"
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
        lanes_.reserve_lanes(lanes);
        conninfo_ = detail::pg::session_conninfo(uri_, deadline_, "idem");
        run("open", [&] { detail::pg::ensure_schema(*conn_, name_, step_); });
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
        detail::pg::batch_params p;
        p.build(rows, [&](std::string_view k, const char* rule) {
            throw rejected_row("postgres store " + name_ + ": " + op + ": key '" + key::printable(k) + "' " + rule);
        });
        const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
        run(op, [&] {
            step_ = "begin";
            pqxx::work w(*conn_);
            const auto now = p.write(w, static_cast<std::int64_t>(batch_id), now_ms, node, step_);
            step_ = "check fsync";
            if (durable_required_ && now.fsync == "off") detail::pg::refuse_fsync_off(name_, op, step_);
            step_ = "check synchronous_standby_names";
            if (standby_required_ && now.standby_names.empty()) detail::pg::refuse_no_standby(name_, op, step_);
            step_ = "commit";
            committing_ = true;
            if (before_commit_) before_commit_();
            (void)notices_->take_sync_wait_cancelled();  // what an earlier statement left is not this commit's
            w.commit();
            committing_ = false;
            if (notices_->take_sync_wait_cancelled())
                throw commit_unknown("postgres store " + name_ + ": " + op +
                                     ": commit: " + std::string(detail::pg::sync_wait_cancelled_text) +
                                     "; the batch may or may not be durable (resolve with committed(batch_id))");
        });
    }

    /// Resolves an in-doubt batch. Not a plain SELECT: the COMMIT of the batch may still be running
    /// in the old session. A speculative INSERT of the batch id waits for any transaction holding
    /// that id uncommitted, then conflicts (committed) or not (never committed; rolled back here).
    /// Bounded by the call deadline: a server that cannot decide yet gives store_unavailable.
    /// A batch found committed is confirmed by a write of this call's own (committed_barrier), whose
    /// commit waits for a synchronous standby when one is configured: "committed" is answered only
    /// once a failover can no longer take the batch back.
    bool committed(std::uint64_t batch_id) override {
        bool done = false;
        const std::string op = "committed(" + std::to_string(batch_id) + ")";
        run(op, [&] {
            step_ = "probe idempotent_batch";
            pqxx::work w(*conn_);
            const auto id = static_cast<std::int64_t>(batch_id);
            const auto r = w.exec_prepared(std::string(detail::pg::committed_name), id);
            done = r.empty();
            if (!done) return w.abort();
            step_ = "confirm on the synchronous standby";
            w.exec_prepared(std::string(detail::pg::committed_barrier_name), id);
            (void)notices_->take_sync_wait_cancelled();
            w.commit();
            if (notices_->take_sync_wait_cancelled())
                throw error(errc::store_unavailable, "postgres store " + name_ + ": " + op + ": " + step_ + ": " +
                                                         std::string(detail::pg::sync_wait_cancelled_text));
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
            const sql::row_decoder dec = decoder();
            std::string line;
            std::array<std::string, sql::record_columns> f;
            stored_record rec;
            const streaming_guard streaming(streaming_);
            while (s.get_raw_line(line)) {
                watchdog_.progress();
                try {
                    dec.record_line(line, f, rec);
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
            decoder().record(r[0], out.emplace());
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
            const detail::pg::row_decoder dec = decoder();
            for (const auto& row : r) dec.audit(row, out.emplace_back());
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
            const sql::row_decoder dec = decoder();
            std::string line;
            std::array<std::string, sql::audit_columns> f;
            audit_entry a;
            const streaming_guard streaming(streaming_);
            while (s.get_raw_line(line)) {
                watchdog_.progress();
                try {
                    dec.audit_line(line, f, a);
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
        require_durability(
            " or open the durable_guard with store_options::mode = durability::async (acknowledged "
            "before the commit)");
    }

    /// check_sync_durability() with the caller's alternative to fixing the server (appended to the
    /// message; empty: none). Throws idem::error(invalid_argument) naming the setting and the fix.
    void require_durability(const std::string& alternative) {
        detail::pg::durability d;
        run("check sync durability", [&] {
            step_ = "read fsync and synchronous_commit";
            d = detail::pg::read_durability(*conn_);
        });
        detail::pg::check_durability(d, name_, alternative);
        durable_required_ = true;
        lanes_.each_open([](postgres_store& l) { l.durable_required_ = true; });
    }

    /// Refuses a server on which a failover can lose an acknowledged commit (no synchronous standby:
    /// synchronous_standby_names empty) with idem::error(invalid_argument) naming the setting; from
    /// then on, every reconnect and every batch re-reads it, and an empty value refuses the commit
    /// (store_unavailable) until a standby is named again. Call it before the guard opens on the store.
    void require_synchronous_standby() {
        detail::pg::durability d;
        run("check synchronous standby", [&] {
            step_ = "read synchronous_standby_names";
            d = detail::pg::read_durability(*conn_);
        });
        detail::pg::check_synchronous_standby(d, name_);
        standby_required_ = true;
        lanes_.each_open([](postgres_store& l) { l.standby_required_ = true; });
    }

    /// What a failover of the server can lose, in words, as its settings say now (one round trip):
    /// with a synchronous standby, nothing acknowledged; without one, the commits within the
    /// replication lag. Programs print it at open (the idem tool does).
    [[nodiscard]] std::string failover_exposure() {
        detail::pg::durability d;
        run("read replication settings", [&] {
            step_ = "read synchronous_standby_names";
            d = detail::pg::read_durability(*conn_);
        });
        return detail::pg::failover_exposure(d);
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
    [[nodiscard]] std::size_t lanes() const noexcept override { return lanes_.count(); }
    void apply_on(std::size_t lane, std::span<const store_row> rows, std::uint64_t batch_id) override {
        lane_store(lane).apply(rows, batch_id);
    }
    [[nodiscard]] bool committed_on(std::size_t lane, std::uint64_t batch_id) override {
        return lane_store(lane).committed(batch_id);  // any session can probe idempotent_batch
    }
    void reconnect_on(std::size_t lane) override {
        if (lanes_.opened(lane)) lane_store(lane).reconnect();  // an unopened lane opens on use
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

    /// The server's clock (Unix ms): what global scope stamps its rows with (detail/global/pg_sql.hpp,
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

    /// One short transaction (detail/pg/retention.hpp): the oldest expired records by the
    /// updated_time index, then a prefix of the audit table in sequence order up to the first row
    /// not older than the bound, deleted as one range of its primary key, and the horizon, forward only.
    prune_result prune(const prune_limits& limits) override {
        prune_result out;
        run("prune", [&] {
            step_ = "begin";
            pqxx::work w(*conn_);
            out = detail::pg::prune_in(w, limits, step_);
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
            h = detail::pg::read_horizon(snap_ ? *snap_ : own.emplace(*conn_));
        });
        return h;
    }

    /// The server process of the current connection (0 when disconnected): for operators and tests.
    [[nodiscard]] int backend_pid() const noexcept { return conn_ ? conn_->backendpid() : 0; }
    [[nodiscard]] std::chrono::milliseconds call_deadline() const noexcept { return deadline_; }

    /// Test hook: runs right before COMMIT is sent (to pause the server at the worst moment).
    void set_before_commit_hook_for_testing(std::function<void()> hook) {
        lanes_.each_open([&](postgres_store& l) { l.before_commit_ = hook; });
        before_commit_ = std::move(hook);
    }

private:
    /// Another session on the same database for reads beside the writer (its settings, no schema
    /// step; it connects at its first call).
    std::unique_ptr<store> open_reader() override { return std::unique_ptr<store>(new postgres_store(lane_of{}, *this)); }

    /// The store that commits on `lane`, opened on first use with this store's settings (lanes.hpp).
    postgres_store& lane_store(std::size_t lane) {
        return lanes_.at(lane, *this, [&] { return std::unique_ptr<postgres_store>(new postgres_store(lane_of{}, *this)); });
    }

    struct lane_of {};
    /// A lane (or a reader) of `first`: its settings, and no schema step (lanes.hpp says why). It
    /// connects at its first call.
    postgres_store(lane_of, const postgres_store& first)
        : uri_(first.uri_),
          name_(first.name_),
          conninfo_(first.conninfo_),
          deadline_(first.deadline_),
          durable_required_(first.durable_required_),
          standby_required_(first.standby_required_),
          keep_remote_apply_(first.keep_remote_apply_),
          before_commit_(first.before_commit_) {
        node_ = first.node_;
    }

    /// Decodes the rows this store reads back (messages name the store and the current step).
    [[nodiscard]] detail::pg::row_decoder decoder() const noexcept {
        return detail::pg::row_decoder("postgres store", name_, step_);
    }

    /// Marks a COPY open on the connection while load() or scan_audit() hands rows to a callback.
    struct streaming_guard {
        explicit streaming_guard(bool& flag) noexcept : flag_(flag) { flag_ = true; }
        ~streaming_guard() { flag_ = false; }
        streaming_guard(const streaming_guard&) = delete;
        streaming_guard& operator=(const streaming_guard&) = delete;
        bool& flag_;
    };

    /// Runs one store call: arms the watchdog, reconnects when needed, and turns every failure into
    /// idem::error (or commit_unknown) naming the store, `op` and the step.
    template <class F>
    void run(const std::string& op, F&& body) {
        // A callback of load() or scan_audit() runs while a COPY is open on this connection: a call
        // back into the store would send a statement into the middle of the COPY.
        IDEM_ASSERT(!streaming_, "a load() or scan_audit() callback does not call back into its store");
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
            op_ = nullptr;
            const bool fired = watchdog_.disarm();
            rethrow_translated(op, fired);
        }
        op_ = nullptr;
        if (watchdog_.disarm()) need_reconnect_ = true;  // cut after the work finished: reconnect next time
    }

    /// The failure being handled as this store's exception (detail/pg/connection.hpp classifies; this is
    /// the store's table): in doubt -> commit_unknown; lost, cancelled -> store_unavailable; a row's
    /// data -> rejected_row (but a batch id committed twice -> store_error); the rest -> store_error.
    [[noreturn]] void rethrow_translated(const std::string& op, bool fired) {
        IDEM_ASSERT(std::current_exception() != nullptr, "rethrow_translated() runs inside a catch block");
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
                        throw error(errc::store_error,
                                    where + "this batch id already committed; a batch commits once (" + c.text + ")");
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
        IDEM_ASSERT(op_ != nullptr, "connect() runs inside run(), which names the operation for its messages");
        step_ = "connect";
        need_reconnect_ = true;  // until every step below passed
        watchdog_.watch(-1);
        notices_.reset();
        conn_.reset();
        conn_ = std::make_unique<pqxx::connection>(conninfo_);
        notices_ = std::make_unique<detail::pg::quiet_notices>(*conn_);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        conn_->inhibit_reactivation(true);  // a broken connection stays broken: we reconnect, and watch the new socket
#pragma GCC diagnostic pop
        watchdog_.watch(conn_->sock());
        step_ = "set session";
        std::string fsync, standby_names;
        {
            pqxx::nontransaction n(*conn_);
            const auto r = n.exec(detail::pg::session_setup(deadline_, keep_remote_apply_));
            keep_remote_apply_ = keep_remote_apply_ || std::string_view(r[0][0].c_str()) == "remote_apply";
            fsync = r[0][1].c_str();
            standby_names = r[0][2].c_str();
        }
        if (durable_required_ && fsync == "off") detail::pg::refuse_fsync_off(name_, *op_, step_);
        if (standby_required_ && standby_names.empty()) detail::pg::refuse_no_standby(name_, *op_, step_);
        namespace sql = detail::pg;
        conn_->prepare(std::string(sql::apply_main_name), std::string(sql::apply_main));
        conn_->prepare(std::string(sql::apply_keep_lease_name), std::string(sql::apply_keep_lease));
        conn_->prepare(std::string(sql::committed_name), std::string(sql::committed));
        conn_->prepare(std::string(sql::committed_barrier_name), std::string(sql::committed_barrier));
        conn_->prepare(std::string(sql::get_name), std::string(sql::get));
        conn_->prepare(std::string(sql::audit_name), std::string(sql::audit));
        need_reconnect_ = false;
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
    detail::pg::pg_watchdog watchdog_;  // wake::on_arm: a call per batch, cut right at its deadline
    std::unique_ptr<pqxx::connection> conn_;
    std::unique_ptr<detail::pg::quiet_notices> notices_;
    std::string step_ = "connect";
    const std::string* op_ = nullptr;  // the operation run() is in (for messages); null outside run()
    bool committing_ = false;
    bool need_reconnect_ = true;
    bool streaming_ = false;                  // a COPY is open: load() or scan_audit() is in its callback
    bool durable_required_ = false;           // check_sync_durability() passed: refuse fsync=off from then on
    bool standby_required_ = false;           // require_synchronous_standby() passed: refuse none from then on
    bool keep_remote_apply_ = false;          // the server was configured with remote_apply: keep pinning it
    pqxx::transaction_base* snap_ = nullptr;  // inside snapshot_read(): its transaction
    std::function<void()> before_commit_;
    detail::pg::lane_set<postgres_store> lanes_;  // lanes 1.., opened on first use (lanes.hpp)
};

}  // namespace idem
