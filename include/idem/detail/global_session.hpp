// idem/detail/global_session.hpp: one PostgreSQL connection of a global guard, every call bounded.
//
// The same deadline discipline as postgres_store (see the header comment of postgres_store.hpp): a
// watchdog shuts the socket down when a call overruns its deadline, statement_timeout and TCP
// keepalives back it up, and the next call reconnects. The watchdog here (lazy_watchdog) differs from
// postgres_store's socket_watchdog in one way: arming and disarming it only write two fields under a
// mutex, they never wake its thread, which instead checks every deadline / 8 (at most 250 ms). A
// batcher makes a call per batch, hundreds per second, and waking a thread twice per call would add
// two context switches to each. The price: a hung call is cut up to deadline / 8 late.
//
// Where postgres_store throws, a session returns what happened, because its callers (the batchers of
// global_engine.hpp) loop on it:
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
// its commits, and work resumes once fsync=on is configured and reloaded. global_engine refuses
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

#include "idem/detail/global_sql.hpp"
#include "idem/postgres_store.hpp"

namespace idem::detail {

/// Cuts a connection's socket when a call overruns its deadline; checks periodically (see above).
/// The thread holds its own dup() of the socket, so the number it shuts down is never reused by an
/// unrelated file while watched. All state is under m_.
class lazy_watchdog {
public:
    explicit lazy_watchdog(std::chrono::milliseconds budget)
        : budget_(budget),
          tick_(std::clamp<std::chrono::milliseconds>(budget / 8, std::chrono::milliseconds(1),
                                                      std::chrono::milliseconds(250))),
          thread_([this] { run(); }) {}
    ~lazy_watchdog() {
        {
            std::lock_guard lk(m_);
            stop_ = true;
        }
        cv_.notify_one();
        thread_.join();
        if (fd_ >= 0) ::close(fd_);
    }
    lazy_watchdog(const lazy_watchdog&) = delete;
    lazy_watchdog& operator=(const lazy_watchdog&) = delete;

    /// Watches `sock` (libpq's descriptor; -1: nothing). A call already past its deadline gets the new
    /// socket cut at the next check.
    void watch(int sock) {
        const int mine = sock >= 0 ? ::fcntl(sock, F_DUPFD_CLOEXEC, 0) : -1;
        std::lock_guard lk(m_);
        if (fd_ >= 0) ::close(fd_);
        fd_ = mine;
    }
    void arm() {
        std::lock_guard lk(m_);
        deadline_ = std::chrono::steady_clock::now() + budget_;
        armed_ = true;
        fired_ = false;
    }
    /// The call ended; whether its socket was cut meanwhile.
    bool disarm() {
        std::lock_guard lk(m_);
        armed_ = false;
        return fired_;
    }

private:
    void run() {
        std::unique_lock lk(m_);
        while (!stop_) {
            cv_.wait_for(lk, tick_);
            if (armed_ && !fired_ && fd_ >= 0 && std::chrono::steady_clock::now() >= deadline_) {
                ::shutdown(fd_, SHUT_RDWR);
                fired_ = true;
            }
        }
    }

    std::mutex m_;
    std::condition_variable cv_;
    const std::chrono::milliseconds budget_, tick_;
    int fd_ = -1;
    bool armed_ = false, fired_ = false, stop_ = false;
    std::chrono::steady_clock::time_point deadline_{};
    std::thread thread_;  // last: starts after every member above is initialised
};

class global_session {
public:
    enum class result { ok, transient, in_doubt, fatal };

    /// `conninfo` is used as given plus the deadline options it does not set (as postgres_store).
    global_session(const std::string& conninfo, std::string name, std::chrono::milliseconds deadline,
                   std::string application)
        : name_(std::move(name)), deadline_(deadline), watchdog_(deadline) {
        conninfo_ = conninfo;
        const auto secs = std::max<std::int64_t>(2, (deadline_.count() + 999) / 1000);
        pg::add_option(conninfo_, "connect_timeout", std::to_string(secs));
        pg::add_option(conninfo_, "keepalives", "1");
        pg::add_option(conninfo_, "keepalives_idle", std::to_string(secs));
        pg::add_option(conninfo_, "keepalives_interval", "1");
        pg::add_option(conninfo_, "keepalives_count", "3");
        pg::add_option(conninfo_, "tcp_user_timeout", std::to_string(deadline_.count()));
        pg::add_option(conninfo_, "client_encoding", "UTF8");
        pg::add_option(conninfo_, "application_name", application);
    }
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
        } catch (const pqxx::in_doubt_error& e) {
            need_reconnect_ = true;
            last_error_ = where + e.what();
            return result::in_doubt;
        } catch (const std::exception& e) {
            const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e);
            const std::string state = sql ? sql->sqlstate() : std::string();
            const bool lost = fired || !open || dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr;
            last_error_ = where + (fired ? "no answer within the call deadline of " +
                                               std::to_string(deadline_.count()) + " ms; connection cut"
                                         : std::string(e.what()));
            while (!last_error_.empty() && (last_error_.back() == '\n' || last_error_.back() == ' '))
                last_error_.pop_back();
            if (in_commit && (lost || state.empty())) {
                need_reconnect_ = true;
                return result::in_doubt;
            }
            if (lost || state.starts_with("08") || state.starts_with("57P") || state == "57014" ||
                state == "40001" || state == "40P01" || state == "55P03" || state == "53300") {
                if (lost || state.starts_with("08") || state.starts_with("57P")) need_reconnect_ = true;
                return result::transient;
            }
            if (state.empty()) {  // not a server answer (a libpqxx usage or conversion error)
                need_reconnect_ = true;
                return result::fatal;
            }
            return result::fatal;
        } catch (...) {
            need_reconnect_ = true;
            last_error_ = where + "unknown exception";
            return result::fatal;
        }
    }

    void connect() {
        need_reconnect_ = true;  // until every step below passed
        watchdog_.watch(-1);
        notices_.reset();
        conn_.reset();
        conn_ = std::make_unique<pqxx::connection>(conninfo_);
        notices_ = std::make_unique<quiet_notices>(*conn_);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        conn_->inhibit_reactivation(true);  // a broken connection stays broken: we reconnect ourselves
#pragma GCC diagnostic pop
        watchdog_.watch(conn_->sock());
        {
            pqxx::nontransaction n(*conn_);
            const auto r = n.exec("SET statement_timeout = " + std::to_string(deadline_.count()) +
                                  "; SET client_min_messages = warning; SET default_transaction_isolation = "
                                  "'read committed'; " +
                                  pg::pin_durability(keep_remote_apply_));
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
        conn_->prepare(std::string(gsql::claim_name), gsql::claim);
        conn_->prepare(std::string(gsql::read_rows_name), gsql::read_rows);
        conn_->prepare(std::string(gsql::claimed_by_us_name), std::string(gsql::claimed_by_us));
        conn_->prepare(std::string(gsql::complete_name), gsql::complete);
        conn_->prepare(std::string(gsql::completed_before_name), std::string(gsql::completed_before));
        conn_->prepare(std::string(gsql::extend_name), gsql::extend);
        conn_->prepare(std::string(gsql::expired_name), gsql::expired);
        conn_->prepare(std::string(gsql::batch_committed_name), std::string(gsql::batch_committed));
        need_reconnect_ = false;
    }

    std::string name_;
    std::string conninfo_;
    std::chrono::milliseconds deadline_;
    lazy_watchdog watchdog_;
    std::unique_ptr<pqxx::connection> conn_;
    std::unique_ptr<quiet_notices> notices_;
    bool committing_ = false;
    bool need_reconnect_ = true;
    bool keep_remote_apply_ = false;  // the server was configured with remote_apply: keep pinning it
    std::string last_error_;
};

}  // namespace idem::detail
