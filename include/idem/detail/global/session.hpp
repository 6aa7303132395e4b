// idem/detail/global/session.hpp: one PostgreSQL connection of a global guard, every call bounded.
//
// The connection layer is detail/pg/connection.hpp's, shared with postgres_store: deadlines (a watchdog,
// statement_timeout, keepalives), connection options, session set-up, failure classification. The
// watchdog runs in wake::periodic mode: a batcher makes a call per batch, hundreds per second, and
// waking a thread twice per call would add two context switches to each; the price is that a hung
// call is cut up to deadline / 8 late.
//
// Where postgres_store throws, a session returns what happened, because its callers (the batchers of
// claim_batcher.hpp, completion_batcher.hpp, compensator.hpp) loop on it:
//
//   ok           the body ran to its end (a write is an autocommit statement, or a transaction
//                that ends with its COMMIT)
//   transient    nothing committed, try again: connection refused or lost, deadline, server
//                shutting down or starting, serialization failure (40001), deadlock victim (40P01)
//   in_doubt     the connection broke while a commit was in flight (a COMMIT, or an autocommit
//                write marked with committing(true)): the batch may have committed;
//                the caller resolves it with the batch id, never by a blind retry
//   fatal        the server refused the statement for another reason (a bug, a schema problem)
//
// Durability: every (re)connect pins synchronous_commit for the session (on, or remote_apply when the
// server is configured with it; detail::pg::pin_durability) and reads fsync in the same round trip.
// fsync=off refuses the connection: the call answers transient, naming fsync in last_error(), and
// every later call connects (and checks) again, so nothing is acknowledged on a server that may lose
// its commits, and work resumes once fsync=on is configured and reloaded. the coordinator refuses
// fsync=off and synchronous_commit=off at open.
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

#include "idem/detail/global/sql.hpp"
#include "idem/detail/pg/connection.hpp"

namespace idem::detail::global {

class global_session {
public:
    enum class result { ok, transient, in_doubt, fatal };

    /// `conninfo` is used as given plus the deadline options it does not set (as postgres_store).
    /// `ordered`: also prepare the ordered-versions claim statements (their table must exist).
    global_session(const std::string& conninfo, std::string name, std::chrono::milliseconds deadline,
                   std::string application, bool ordered = false)
        : ordered_(ordered),
          name_(std::move(name)),
          conninfo_(pg::session_conninfo(conninfo, deadline, application)),
          deadline_(deadline),
          watchdog_(pg::pg_watchdog::wake::periodic, deadline) {}
    ~global_session() {
        watchdog_.watch(-1);
        notices_.reset();
    }
    global_session(const global_session&) = delete;
    global_session& operator=(const global_session&) = delete;

    /// Runs body(connection). Call committing(true) right before COMMIT (or before an autocommit
    /// statement that writes) so that a break there is reported as in_doubt. The text of the last failure is in last_error().
    result run(const char* op, const std::function<void(pqxx::connection&)>& body) {
        watchdog_.arm();
        committing_ = false;
        try {
            if (need_reconnect_ || !conn_ || !conn_->is_open()) connect();
            body(*conn_);
        } catch (...) {
            const bool fired = watchdog_.disarm();
            return classify(op, fired);
        }
        if (watchdog_.disarm()) need_reconnect_ = true;
        return result::ok;
    }

    void committing(bool on) noexcept { committing_ = on; }
    [[nodiscard]] const std::string& last_error() const noexcept { return last_error_; }
    [[nodiscard]] int backend_pid() const noexcept { return conn_ && conn_->is_open() ? conn_->backendpid() : 0; }
    void drop() { need_reconnect_ = true; }

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
        if (ordered_) {
            conn_->prepare(std::string(sql::claim_ordered_name), sql::claim_ordered);
            conn_->prepare(std::string(sql::read_rows_ordered_name), sql::read_rows_ordered);
        }
        need_reconnect_ = false;
    }

    bool ordered_;
    std::string name_;
    std::string conninfo_;
    std::chrono::milliseconds deadline_;
    pg::pg_watchdog watchdog_;
    std::unique_ptr<pqxx::connection> conn_;
    std::unique_ptr<pg::quiet_notices> notices_;
    bool committing_ = false;
    bool need_reconnect_ = true;
    bool keep_remote_apply_ = false;  // the server was configured with remote_apply: keep pinning it
    std::string last_error_;
};

}  // namespace idem::detail::global
