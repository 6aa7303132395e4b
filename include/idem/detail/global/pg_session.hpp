// idem/detail/global/pg_session.hpp: one PostgreSQL connection of a global guard (the PostgreSQL
// arbiter of arbiter.hpp), every call bounded; the statements are pg_sql.hpp's.
//
// The connection layer is detail/pg/connection.hpp's, shared with postgres_store: deadlines (a watchdog,
// statement_timeout, keepalives), connection options, session set-up, failure classification. The
// watchdog runs in wake::periodic mode: a batcher makes a call per batch, hundreds per second, and
// waking a thread twice per call would add two context switches to each; the price is that a hung
// call is cut up to deadline / 8 late.
//
// Where postgres_store throws, a session returns what happened (arbiter.hpp's results): transient
// covers serialization failures (40001) and deadlock victims (40P01); in_doubt is a connection that
// broke while a commit was in flight (a COMMIT, or an autocommit write marked with committing(true)).
// Every batch is one autocommit statement, so a batch costs one round trip, its commit included.
//
// Durability: every (re)connect pins synchronous_commit for the session (on, or remote_apply when the
// server is configured with it; detail::pg::pin_durability) and reads fsync in the same round trip.
// fsync=off refuses the connection: the call answers transient, naming fsync in last_error(), and
// every later call connects (and checks) again, so nothing is acknowledged on a server that may lose
// its commits, and work resumes once fsync=on is configured and reloaded. the coordinator refuses
// fsync=off and synchronous_commit=off at open. With `standby` (global_options::
// require_synchronous_standby) a (re)connect to a server whose synchronous_standby_names is empty is
// refused the same way. A commit whose wait for the synchronous standby was cancelled answers
// in_doubt (detail/pg/schema.hpp says why), and batch_committed() confirms a committed batch with a
// write of its own, whose commit waits for the standby (pg_sql.hpp, batch_committed_barrier).
//
// Thread-safety: one thread at a time. Progress: blocking; each call bounded by call_deadline
// (plus connect_timeout while connecting).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <memory>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <pqxx/pqxx>

#include "idem/detail/global/arbiter.hpp"
#include "idem/detail/global/pg_sql.hpp"
#include "idem/detail/pg/sql.hpp"
#include "idem/detail/pg/row_decoder.hpp"
#include "idem/store_rows.hpp"
#include "idem/detail/pg/connection.hpp"

namespace idem::detail::global {

class pg_session final : public global_session {
public:
    /// `conninfo` is used as given plus the deadline options it does not set (as postgres_store).
    /// `ordered`: also prepare the ordered-versions claim statements (their table must exist).
    /// `standby`: refuse to commit while the server names no synchronous standby.
    pg_session(const std::string& conninfo, std::string name, std::chrono::milliseconds deadline, std::string application,
               bool standby, bool ordered = false)
        : ordered_(ordered),
          standby_(standby),
          name_(std::move(name)),
          conninfo_(pg::session_conninfo(conninfo, deadline, application)),
          deadline_(deadline),
          watchdog_(pg::pg_watchdog::wake::periodic, deadline) {}
    ~pg_session() override {
        watchdog_.watch(-1);
        notices_.reset();
    }

    /// Runs body(connection). Call committing(true) right before COMMIT (or before an autocommit
    /// statement that writes) so that a break there is reported as in_doubt. The text of the last failure is in last_error().
    result run(const char* op, const std::function<void(pqxx::connection&)>& body) {
        watchdog_.arm();
        committing_ = false;
        try {
            if (need_reconnect_ || !conn_ || !conn_->is_open()) connect();
            (void)notices_->take_sync_wait_cancelled();  // what an earlier call left is not this one's
            body(*conn_);
        } catch (...) {
            const bool fired = watchdog_.disarm();
            return classify(op, fired);
        }
        if (watchdog_.disarm()) need_reconnect_ = true;
        if (notices_->take_sync_wait_cancelled()) {  // committed on the primary only, maybe
            need_reconnect_ = true;
            last_error_ = "postgres " + name_ + ": " + op + ": " + std::string(pg::sync_wait_cancelled_text);
            return result::in_doubt;
        }
        return result::ok;
    }

    void committing(bool on) noexcept { committing_ = on; }
    [[nodiscard]] int backend_pid() const noexcept { return conn_ && conn_->is_open() ? conn_->backendpid() : 0; }
    void drop() override { need_reconnect_ = true; }

    // ---- the arbiter's statements (arbiter.hpp) ---------------------------------------------------

    result claim(std::int64_t batch_id, std::span<const claim_item> items, std::int64_t lease_ms, const std::string& node,
                 bool ordered, won_map& won) override {
        pg::array_literal keys, biz, fps, pairs, versions;
        for (const claim_item& c : items) {
            keys.add_text(c.k);
            biz.add_text(pg::utf8_prefix(biz_type_of(c.k)));
            fps.add_uint(c.fp);
            if (ordered) {
                pairs.add_text(c.pair);
                versions.add_uint(c.version);
            }
        }
        return run("claim batch", [&](pqxx::connection& conn) {
            won.clear();
            pqxx::nontransaction n(conn);
            committing(true);  // autocommit: the statement is its own COMMIT
            const auto res = ordered ? n.exec_prepared(std::string(sql::claim_ordered_name), batch_id, keys.str(), biz.str(),
                                                       fps.str(), lease_ms, node, pairs.str(), versions.str())
                                     : n.exec_prepared(std::string(sql::claim_name), batch_id, keys.str(), biz.str(),
                                                       fps.str(), lease_ms, node);
            committing(false);
            for (const auto& row : res)
                won[row[0].c_str()] = {static_cast<std::uint64_t>(row[1].as<std::int64_t>()),
                                       std::string_view(row[2].c_str()) == "RELEASED" ? record_state::released
                                                                                      : record_state::absent};
        });
    }

    result claimed_by_us(std::span<const std::string_view> keys, const std::string& detail, const std::string& node,
                         won_map& won) override {
        pg::array_literal ks;
        for (std::string_view k : keys) ks.add_text(k);
        return run("read own claims", [&](pqxx::connection& conn) {
            won.clear();
            pqxx::nontransaction n(conn);
            const auto res = n.exec_prepared(std::string(sql::claimed_by_us_name), ks.str(), detail, node);
            for (const auto& row : res)
                won[row[0].c_str()] = {static_cast<std::uint64_t>(row[1].as<std::int64_t>()), record_state::absent};
        });
    }

    result read_rows(std::span<const std::string_view> keys, std::span<const std::string_view> pairs, row_map& rows,
                     std::unordered_map<std::string, std::uint64_t>* newest) override {
        pg::array_literal ks, ps;
        for (std::string_view k : keys) ks.add_text(k);
        if (newest)
            for (std::string_view p : pairs) ps.add_text(p);
        return run("read claimed rows", [&](pqxx::connection& conn) {
            rows.clear();
            pqxx::nontransaction n(conn);
            const auto lr = newest ? n.exec_prepared(std::string(sql::read_rows_ordered_name), ks.str(), ps.str())
                                   : n.exec_prepared(std::string(sql::read_rows_name), ks.str());
            if (newest) newest->clear();
            for (const auto& row : lr) {
                if (newest) {
                    (*newest)[row[0].c_str()] = static_cast<std::uint64_t>(row[6].as<std::int64_t>());
                    if (row[1].is_null()) continue;  // no record
                }
                // postgres_store's decoder and rules: a corrupt row is corrupt_record, never a default.
                const pg::row_decoder dec("global guard", name_, "read claimed rows");
                const std::string_view k = pg::text(row[0]);
                row_read rr{dec.state(k, pg::text(row[1]), /*of_record=*/true),
                            dec.fence(k, pg::text(row[2])),
                            dec.uint64(k, pg::text(row[3]), "outcome"),
                            dec.uint64(k, pg::text(row[4]), "request_fingerprint"),
                            row[5].as<bool>(),
                            {}};
                dec.payload(k, pg::text(row[newest ? 7 : 6]), rr.payload);  // encode(payload, 'hex')
                rows[std::string(k)] = std::move(rr);
            }
        });
    }

    result complete(std::int64_t batch_id, std::span<const write_item> items, const std::string& node, bool compensation,
                    key_set& won) override {
        pg::array_literal keys, fences, states, outcomes, details, payloads;
        for (const write_item& it : items) {
            keys.add_text(it.k);
            fences.add_uint(it.fence);
            states.add_text(it.status);
            outcomes.add_uint(it.outcome);
            details.add_text(it.detail);
            payloads.add_hex(it.payload);
        }
        return run(compensation ? "compensation batch" : "completion batch", [&](pqxx::connection& conn) {
            won.clear();
            pqxx::nontransaction n(conn);
            committing(true);  // autocommit: the statement is its own COMMIT
            const auto res = n.exec_prepared(std::string(sql::complete_name), batch_id, keys.str(), fences.str(),
                                             states.str(), outcomes.str(), details.str(), node, compensation,
                                             payloads.str());
            committing(false);
            for (const auto& row : res) won.insert(row[0].c_str());
        });
    }

    result completed_before(std::span<const write_item> items, const std::string& node, key_set& before) override {
        pg::array_literal lk, lf, ls, ld;
        for (const write_item& it : items) {
            lk.add_text(it.k);
            lf.add_uint(it.fence);
            ls.add_text(it.status);
            ld.add_text(it.detail);
        }
        return run("completion check", [&](pqxx::connection& conn) {
            before.clear();
            pqxx::nontransaction n(conn);
            const auto res = n.exec_prepared(std::string(sql::completed_before_name), lk.str(), lf.str(), ls.str(), ld.str(),
                                             node);
            for (const auto& row : res) before.insert(row[0].c_str());
        });
    }

    result extend(std::span<const extend_item> items, key_set& renewed) override {
        pg::array_literal keys, fences, ms;
        for (const extend_item& it : items) {
            keys.add_text(it.k);
            fences.add_uint(it.fence);
            ms.add_int(it.ms);
        }
        return run("lease renewal", [&](pqxx::connection& conn) {
            renewed.clear();
            pqxx::nontransaction n(conn);
            const auto res = n.exec_prepared(std::string(sql::extend_name), keys.str(), fences.str(), ms.str());
            for (const auto& row : res) renewed.insert(row[0].c_str());
        });
    }

    result expired(std::size_t limit, std::vector<expired_row>& rows) override {
        return run("compensation scan", [&](pqxx::connection& c) {
            rows.clear();
            pqxx::nontransaction n(c);
            const auto res = n.exec_prepared(std::string(sql::expired_name), static_cast<std::int64_t>(limit));
            for (const auto& row : res)
                rows.push_back({row[0].c_str(), static_cast<std::uint64_t>(row[1].as<std::int64_t>()),
                                static_cast<std::uint64_t>(row[2].as<std::int64_t>())});
        });
    }

    /// The speculative insert of the batch id (pg_sql.hpp, batch_committed): it waits for a session
    /// still holding the id uncommitted, and finds it exactly when the batch committed.
    /// A batch found committed is confirmed by a write of this call's own (its commit waits for a
    /// synchronous standby when one is configured); a wait for it that was cancelled answers in_doubt,
    /// and the caller asks again.
    result batch_committed(std::int64_t batch_id, bool& committed) override {
        return run("resolve unknown commit", [&](pqxx::connection& c) {
            pqxx::work w(c);
            const auto res = w.exec_prepared(std::string(sql::batch_committed_name), batch_id);
            committed = res.empty();
            if (!committed) return w.abort();  // the speculative insert must not stay
            w.exec_prepared(std::string(sql::batch_committed_barrier_name), batch_id);
            w.commit();
        });
    }

    result prepare(bool ordered) override {
        return run("create index", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            n.exec(std::string(sql::processing_index));
            if (ordered) n.exec(std::string(sql::version_table));
        });
    }

private:
    /// The failure being handled as a result (detail/pg/connection.hpp classifies; this is the session's
    /// table): in doubt, or a non-server error while committing -> in_doubt; lost, cancelled,
    /// contention -> transient; the rest -> fatal. Reconnect after anything but a server's answer
    /// on a live connection.
    result classify(const char* op, bool fired) {
        const bool in_commit = committing_;
        committing_ = false;
        const bool open = conn_ && conn_->is_open();
        if (fired || !open) need_reconnect_ = true;
        const std::string where = "postgres " + name_ + ": " + op + ": ";
        try {
            throw;
        } catch (const error& e) {  // ours: connect() refused the server's durability settings
            need_reconnect_ = true;
            last_error_ = where + e.what();
            return e.kind() == errc::store_unavailable ? result::transient : result::fatal;
        } catch (...) {
            using pg::failure;
            const pg::classified c = pg::classify(fired, open, in_commit, deadline_);
            last_error_ = where + c.text;
            switch (c.kind) {
                case failure::in_doubt: need_reconnect_ = true; return result::in_doubt;
                case failure::client: need_reconnect_ = true; return in_commit ? result::in_doubt : result::fatal;
                case failure::lost: need_reconnect_ = true; return result::transient;
                case failure::cancelled:
                case failure::contention: return result::transient;
                case failure::foreign: need_reconnect_ = true; return result::fatal;
                case failure::data:
                case failure::refused: return result::fatal;
            }
            return result::fatal;
        }
    }

    void connect() {
        need_reconnect_ = true;  // until every step below passed
        watchdog_.watch(-1);
        notices_.reset();
        conn_.reset();
        conn_ = std::make_unique<pqxx::connection>(conninfo_);
        notices_ = std::make_unique<pg::quiet_notices>(*conn_);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        conn_->inhibit_reactivation(true);  // a broken connection stays broken: we reconnect ourselves
#pragma GCC diagnostic pop
        watchdog_.watch(conn_->sock());
        {
            pqxx::nontransaction n(*conn_);
            const auto r = n.exec(
                pg::session_setup(deadline_, keep_remote_apply_, "SET default_transaction_isolation = 'read committed'; "));
            keep_remote_apply_ = keep_remote_apply_ || std::string_view(r[0][0].c_str()) == "remote_apply";
            if (std::string_view(r[0][1].c_str()) == "off")
                throw error(errc::store_unavailable,
                            "connect: the server now runs with fsync=off, so a commit it acknowledges can be lost on "
                            "a crash; nothing is acknowledged on it (calls wait until fsync=on is configured and "
                            "reloaded)");
            if (standby_ && std::string_view(r[0][2].c_str()).empty())
                throw error(errc::store_unavailable,
                            "connect: synchronous_standby_names is empty, so a commit would not wait for a standby "
                            "and a failover could lose it; nothing is acknowledged until a synchronous standby is "
                            "named again");
        }
        try {  // the statements' plans do not depend on the arrays' contents: plan them once
            pqxx::nontransaction n(*conn_);
            n.exec("SET plan_cache_mode = force_generic_plan");
        } catch (const pqxx::sql_error&) {
            // not PostgreSQL 12+ (or a compatible database without the setting): custom plans then
        }
        conn_->prepare(std::string(sql::claim_name), sql::claim);
        conn_->prepare(std::string(sql::read_rows_name), sql::read_rows);
        conn_->prepare(std::string(sql::claimed_by_us_name), std::string(sql::claimed_by_us));
        conn_->prepare(std::string(sql::complete_name), sql::complete);
        conn_->prepare(std::string(sql::completed_before_name), std::string(sql::completed_before));
        conn_->prepare(std::string(sql::extend_name), sql::extend);
        conn_->prepare(std::string(sql::expired_name), sql::expired);
        conn_->prepare(std::string(sql::batch_committed_name), std::string(sql::batch_committed));
        conn_->prepare(std::string(sql::batch_committed_barrier_name), std::string(sql::batch_committed_barrier));
        if (ordered_) {
            conn_->prepare(std::string(sql::claim_ordered_name), sql::claim_ordered);
            conn_->prepare(std::string(sql::read_rows_ordered_name), sql::read_rows_ordered);
        }
        need_reconnect_ = false;
    }

    bool ordered_;
    bool standby_;  // refuse to commit while the server names no synchronous standby
    std::string name_;
    std::string conninfo_;
    std::chrono::milliseconds deadline_;
    pg::pg_watchdog watchdog_;
    std::unique_ptr<pqxx::connection> conn_;
    std::unique_ptr<pg::quiet_notices> notices_;
    bool committing_ = false;
    bool need_reconnect_ = true;
    bool keep_remote_apply_ = false;  // the server was configured with remote_apply: keep pinning it
};

}  // namespace idem::detail::global
