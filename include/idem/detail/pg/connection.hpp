// idem/detail/pg/connection.hpp: what every PostgreSQL connection of idem shares: postgres_store's
// (and its lanes') and a global guard's sessions (global/pg_session.hpp). Deadlines, the connection
// options, the session set-up, how a failure is classified, and the node identity.
//
// Invariants
//   * Every call is bounded. libpq blocks in poll() for as long as the server does not answer (a
//     server stopped with SIGSTOP, a network dropping packets), and neither statement_timeout
//     (enforced by the stopped server) nor TCP keepalives (answered by its kernel) help. So a
//     watchdog thread (pg_watchdog, one per connection owner) shuts the socket down
//     (shutdown(SHUT_RDWR)) when a call runs past its deadline; libpq then fails at once, and the
//     call reports the connection lost. Second lines of defence, set by session_conninfo() and
//     session_setup(): statement_timeout = the deadline, TCP keepalives and tcp_user_timeout, and
//     connect_timeout = max(2 s, deadline) (libpq's minimum is 2 s) for the handshake, during which
//     the watchdog has no socket to cut: a call whose connect ran past its deadline is cut as soon
//     as the socket exists.
//   * The watchdog never shuts down a descriptor it does not own: it holds its own dup() of libpq's
//     socket, so the number cannot be reused by an unrelated file while watched; shutdown() acts on
//     the socket itself, so libpq's descriptor sees it too.
//   * A broken connection stays broken (inhibit_reactivation): the owner reconnects, and watches the
//     new socket, itself.
//   * Every (re)connect pins synchronous_commit for the session (schema.hpp's pin_durability: on, or
//     remote_apply when the server is configured with it; never weaker) and reads fsync in the same
//     round trip (session_setup()); what to do with fsync=off is the owner's.
//   * One classification (classify()) of every failure, into the kinds below; each owner maps the
//     kinds onto its own answer (postgres_store: exceptions; global_session: a result code) in one
//     table at its classify call, so the two cannot drift apart on what "lost" or "in doubt" means.
//
// Watchdog wake-up. pg_watchdog::wake::on_arm (postgres_store: a call per batch, at most a few per
// second per connection) wakes the thread at each arm(), so a hung call is cut at its deadline.
// wake::periodic (global_session: a batcher makes hundreds of calls a second, and two context
// switches per call would cost more than the call) only writes two fields under the mutex at arm()
// and disarm(); the thread checks every deadline / 8 (1 ms .. 250 ms), so a hung call is cut up to
// that much late.
//
// Node identity: detail::default_node() (node_identity.hpp), the one format of every store and guard.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <pqxx/pqxx>

#include "idem/detail/assert.hpp"
#include "idem/detail/node_identity.hpp"
#include "idem/detail/pg/schema.hpp"
#include "idem/detail/pg/sql.hpp"
#include "idem/error.hpp"

namespace idem::detail::pg {

/// Cuts a connection's socket when a call overruns its deadline (see the header). All state is under
/// m_, except progress_.
class pg_watchdog {
public:
    enum class wake : std::uint8_t {
        on_arm,    ///< arm() wakes the thread: a hung call is cut at its deadline
        periodic,  ///< the thread checks every `budget` / 8 (1 ms .. 250 ms); arm() never wakes it
    };

    explicit pg_watchdog(wake mode = wake::on_arm, std::chrono::milliseconds budget = std::chrono::milliseconds(0))
        : mode_(mode),
          budget_(budget),
          tick_(std::clamp<std::chrono::milliseconds>(budget / 8, std::chrono::milliseconds(1),
                                                      std::chrono::milliseconds(250))),
          thread_([this] { run(); }) {}
    ~pg_watchdog() {
        {
            std::lock_guard lk(m_);
            stop_ = true;
        }
        cv_.notify_one();
        thread_.join();
        if (fd_ >= 0) ::close(fd_);
    }
    pg_watchdog(const pg_watchdog&) = delete;
    pg_watchdog& operator=(const pg_watchdog&) = delete;

    /// Watches `sock` (libpq's descriptor; -1 watches nothing) from now on. A call already past its
    /// deadline (a slow connect, which connect_timeout bounds) gets the new socket cut at the next
    /// check: at once with wake::on_arm.
    void watch(int sock) {
        const int mine = sock >= 0 ? ::fcntl(sock, F_DUPFD_CLOEXEC, 0) : -1;
        {
            std::lock_guard lk(m_);
            if (fd_ >= 0) ::close(fd_);
            fd_ = mine;
        }
        if (mode_ == wake::on_arm) cv_.notify_one();
    }
    /// A call starts: it must end, or make progress, within `budget`.
    void arm(std::chrono::milliseconds budget) {
        {
            std::lock_guard lk(m_);
            budget_ = budget;
            arm_locked();
        }
        if (mode_ == wake::on_arm) cv_.notify_one();
    }
    /// A call starts, with the last budget given (at construction, or to arm(budget)).
    void arm() {
        {
            std::lock_guard lk(m_);
            arm_locked();
        }
        if (mode_ == wake::on_arm) cv_.notify_one();
    }
    /// The call ended. Returns whether the watchdog cut the socket during it.
    bool disarm() {
        std::lock_guard lk(m_);
        armed_ = false;
        return fired_;
    }
    /// A streaming call got another row: push the deadline out. Relaxed: the watchdog only
    /// compares the count for change; a stale read costs at most one more budget of waiting.
    void progress() noexcept { progress_.fetch_add(1, std::memory_order_relaxed); }
    /// Cuts the socket now (abandoning a COPY in flight is faster than draining it).
    void cut() {
        std::lock_guard lk(m_);
        if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    }

private:
    void arm_locked() {
        // A zero budget would cut every call at once: the owners refuse a non-positive deadline.
        IDEM_ASSERT(budget_ > std::chrono::milliseconds::zero(), "a watched call has a positive budget");
        deadline_ = std::chrono::steady_clock::now() + budget_;
        seen_ = progress_.load(std::memory_order_relaxed);  // relaxed: see progress()
        armed_ = true;
        fired_ = false;
    }

    /// Under m_: the armed call is past its deadline with no progress: cut, and say so.
    bool overdue(std::chrono::steady_clock::time_point now) {
        const auto p = progress_.load(std::memory_order_relaxed);  // relaxed: see progress()
        if (p != seen_) {
            seen_ = p;
            deadline_ = now + budget_;
            return false;
        }
        return true;
    }

    void run() {
        std::unique_lock lk(m_);
        while (!stop_) {
            if (mode_ == wake::periodic) {
                cv_.wait_for(lk, tick_);
                const auto now = std::chrono::steady_clock::now();
                if (armed_ && !fired_ && fd_ >= 0 && now >= deadline_ && overdue(now)) {
                    ::shutdown(fd_, SHUT_RDWR);
                    fired_ = true;
                }
                continue;
            }
            if (!armed_ || fired_) {
                cv_.wait(lk);
                continue;
            }
            const auto now = std::chrono::steady_clock::now();
            if (now < deadline_) {
                cv_.wait_until(lk, deadline_);
                continue;
            }
            if (!overdue(now)) continue;
            if (fd_ < 0) {  // no socket yet (connecting): cut the one watch() installs next
                cv_.wait(lk);
                continue;
            }
            ::shutdown(fd_, SHUT_RDWR);
            fired_ = true;
        }
    }

    std::mutex m_;
    std::condition_variable cv_;
    const wake mode_;
    std::chrono::milliseconds budget_;
    const std::chrono::milliseconds tick_;
    int fd_ = -1;
    bool armed_ = false;
    bool fired_ = false;
    bool stop_ = false;
    std::chrono::steady_clock::time_point deadline_{};
    std::uint64_t seen_ = 0;
    std::atomic<std::uint64_t> progress_{0};
    std::thread thread_;  // last: starts after every member above is initialised
};

/// Swallows libpq notices and libpqxx warnings (they would go to stderr); errors arrive as exceptions.
/// Remembers one of them: the WARNING a backend sends when its wait for a synchronous standby was
/// cancelled or terminated ("canceling wait for synchronous replication ...", "canceling the wait
/// for synchronous replication and terminating connection ..."): the commit then returns as if it
/// succeeded, but it is on the primary only (schema.hpp), so the owner takes it as a commit in doubt.
/// The server's messages are matched in English, its default (lc_messages); a server configured to
/// speak another language sends them translated, and only the in-doubt probe's barrier then guards.
class quiet_notices final : public pqxx::errorhandler {
public:
    explicit quiet_notices(pqxx::connection_base& c) : pqxx::errorhandler(c) {}
    bool operator()(const char* msg) noexcept override {
        if (std::string_view(msg).find("wait for synchronous replication") != std::string_view::npos)
            sync_wait_cancelled_ = true;
        return false;
    }
    /// Whether a synchronous-replication wait was cancelled since the last call; clears it.
    bool take_sync_wait_cancelled() noexcept { return std::exchange(sync_wait_cancelled_, false); }

private:
    bool sync_wait_cancelled_ = false;  // the connection's thread only (libpq calls back inside its calls)
};

/// The message of a commit whose wait for a synchronous standby was cancelled (quiet_notices).
inline constexpr std::string_view sync_wait_cancelled_text =
    "the server cancelled this commit's wait for the synchronous standby (pg_cancel_backend or "
    "pg_terminate_backend): it committed on the primary and may be missing on the standby";


/// The connection string every idem connection uses: the caller's, plus the deadline options it
/// does not set itself (the caller's win): connect_timeout and keepalives_idle max(2 s, deadline),
/// keepalives (1 s interval, 3 probes), tcp_user_timeout = deadline, client_encoding UTF8 (keys are
/// checked as UTF-8 against it), and application_name.
[[nodiscard]] inline std::string session_conninfo(std::string conninfo, std::chrono::milliseconds deadline,
                                                  std::string_view application) {
    const auto secs = std::max<std::int64_t>(2, (deadline.count() + 999) / 1000);
    add_option(conninfo, "connect_timeout", std::to_string(secs));
    add_option(conninfo, "keepalives", "1");
    add_option(conninfo, "keepalives_idle", std::to_string(secs));
    add_option(conninfo, "keepalives_interval", "1");
    add_option(conninfo, "keepalives_count", "3");
    add_option(conninfo, "tcp_user_timeout", std::to_string(deadline.count()));
    add_option(conninfo, "client_encoding", "UTF8");
    add_option(conninfo, "application_name", application);
    return conninfo;
}

/// The session's settings after a (re)connect, in one round trip: statement_timeout = deadline,
/// warnings only, `extra` (more SET statements, each ending with "; "), then pin_durability().
/// Its one row holds the pinned synchronous_commit, then fsync.
[[nodiscard]] inline std::string session_setup(std::chrono::milliseconds deadline, bool keep_remote_apply,
                                               std::string_view extra = {}) {
    IDEM_ASSERT(extra.empty() || extra.ends_with("; "), "each extra SET statement ends with \"; \"");
    return "SET statement_timeout = " + std::to_string(deadline.count()) + "; SET client_min_messages = warning; " +
           std::string(extra) + pin_durability(keep_remote_apply);
}

/// What a failed call means (classify()).
enum class failure : std::uint8_t {
    in_doubt,    ///< a COMMIT was in flight when the connection broke: it may have committed
    lost,        ///< connection refused, lost or cut (deadline), or the server is shutting down or
                 ///< starting (SQLSTATE 08xxx, 57Pxx): reconnect
    cancelled,   ///< statement_timeout (57014): the connection is still usable
    contention,  ///< serialization failure (40001), deadlock victim (40P01), lock not available
                 ///< (55P03), too many connections (53300): nothing committed, try again
    data,        ///< the server refused what a row holds: data exception (22xxx), integrity (23xxx)
    client,      ///< not a server answer (a libpqxx usage or conversion error), connection open
    refused,     ///< any other SQL error (a bug, a schema problem)
    foreign,     ///< not even a std::exception ("unknown exception")
};

/// A failure classified, with its SQLSTATE (empty when none) and its text (trailing blanks cut;
/// "no answer within the call deadline of N ms; the connection was cut" when the watchdog fired).
struct classified {
    failure kind = failure::refused;
    std::string sqlstate;
    std::string text;
};

/// Classifies the exception being handled (call inside a catch block; ours, idem::error, must be
/// handled by the caller first). `fired`: the watchdog cut the socket during the call; `open`: the
/// connection is still open; `in_commit`: the caller marked a COMMIT (or an autocommit write) in
/// flight.
[[nodiscard]] inline classified classify(bool fired, bool open, bool in_commit, std::chrono::milliseconds deadline) {
    IDEM_ASSERT(std::current_exception() != nullptr, "classify() runs inside a catch block");
    classified c;
    const auto late = [&] {
        return "no answer within the call deadline of " + std::to_string(deadline.count()) + " ms; the connection was cut";
    };
    const auto trimmed = [](std::string s) {
        while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
        return s;
    };
    try {
        throw;
    } catch (const pqxx::in_doubt_error& e) {
        c.kind = failure::in_doubt;
        c.text = fired ? late() : trimmed(e.what());
        return c;
    } catch (const std::exception& e) {
        IDEM_ASSERT(dynamic_cast<const error*>(&e) == nullptr, "the caller handles idem::error before classify()");
        const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e);
        c.sqlstate = sql ? sql->sqlstate() : std::string();
        c.text = fired ? late() : trimmed(e.what());
        const std::string& s = c.sqlstate;
        const bool lost = fired || !open || dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr;
        if (in_commit && lost) c.kind = failure::in_doubt;
        else if (lost || s.starts_with("08") || s.starts_with("57P")) c.kind = failure::lost;
        else if (s == "57014") c.kind = failure::cancelled;
        else if (s == "40001" || s == "40P01" || s == "55P03" || s == "53300") c.kind = failure::contention;
        else if (s.starts_with("22") || s.starts_with("23")) c.kind = failure::data;
        else if (s.empty()) c.kind = failure::client;
        else c.kind = failure::refused;
        return c;
    } catch (...) {
        c.kind = failure::foreign;
        c.text = "unknown exception";
        return c;
    }
}

}  // namespace idem::detail::pg
