// tests/support/private_pg.hpp: a PostgreSQL server of a test's own, for tests that restart or crash
// it, so the tests sharing IDEM_TEST_PG_URI (ctest runs them in parallel) never see it go down.
// Everything goes through scripts/lib/postgres.sh (pg_start, pg_crash, pg_resume, pg_stop); the test
// target defines IDEM_SOURCE_DIR.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "lib_shell.hpp"

namespace idem_test {

/// scripts/lib/postgres.sh's pg_start (PG_BIN, a fresh data directory, a free loopback port, as the
/// postgres user when we are root), stopped and removed by the destructor. uri() is empty when it
/// did not start.
class private_server {
public:
    /// `extra_conf`: more lines of postgresql.conf (PG_EXTRA_CONF), e.g. "wal_level = logical".
    explicit private_server(const std::string& extra_conf = {}) {
        const std::string env = extra_conf.empty() ? "" : "PG_EXTRA_CONF='" + extra_conf + "' ";
        const std::string out = shell(env + "pg_start >&2 && printf '%s\\n%s\\n' \"$PG_URI\" \"$PG_DIR\"");
        const auto nl = out.find('\n');
        if (nl == std::string::npos) return;
        uri_ = out.substr(0, nl);
        dir_ = out.substr(nl + 1);
        while (!dir_.empty() && dir_.back() == '\n') dir_.pop_back();
    }
    ~private_server() {
        if (!dir_.empty()) (void)shell("PG_DIR='" + dir_ + "' pg_stop");
    }
    private_server(const private_server&) = delete;
    private_server& operator=(const private_server&) = delete;

    const std::string& uri() const { return uri_; }
    /// Restarts it in immediate mode (in-flight transactions are lost, unanswered commits happen);
    /// pg_ctl restart keeps its port and socket directory. True when it is back up.
    bool restart() {
        const std::string cmd = "pg_as_postgres \"$PG_BIN/pg_ctl\" -D '" + dir_ + "/data' -l '" + dir_ +
                                "/log' -m immediate -w -t 60 restart >/dev/null && echo restarted";
        return shell(cmd) == "restarted\n";
    }
    /// pg_crash: the postmaster and every backend die at once (`pg_ctl stop -m immediate`).
    bool crash() { return shell("PG_DIR='" + dir_ + "' pg_crash && echo crashed") == "crashed\n"; }
    /// pg_resume: started again on the same port and data after crash().
    bool resume() { return shell("PG_DIR='" + dir_ + "' pg_resume && echo resumed") == "resumed\n"; }

private:
    static std::string shell(const std::string& cmd) { return lib_shell("postgres.sh", cmd); }
    std::string uri_, dir_;
};

/// A failover pair of the test's own: a primary (scripts/lib/postgres.sh's pg_start) and a streaming
/// standby of it (pg_standby_start; synchronous unless `sync` is false). uri() names both hosts with
/// target_session_attrs=read-write, so a client finds whichever is the primary. crash() kills the
/// primary with SIGKILL (pg_kill); resume() promotes the standby (pg_promote): a failover, as a
/// failover manager would run it, but at once. Both are stopped and removed by the destructor.
class private_pair {
public:
    explicit private_pair(bool sync = true) {
        const std::string out = shell(std::string("pg_start >&2 && pg_standby_start ") + (sync ? "sync" : "") +
                                      " >&2 && printf '%s\\n%s\\n%s\\n%s\\n%s\\n' \"$PG_PAIR_URI\" \"$PG_DIR\" "
                                      "\"$STANDBY_DIR\" \"$PG_URI\" \"$STANDBY_URI\"");
        std::vector<std::string> lines;
        std::size_t at = 0;
        for (std::size_t nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1)
            lines.push_back(out.substr(at, nl - at));
        if (lines.size() != 5) return;
        uri_ = lines[0];
        dir_ = lines[1];
        standby_dir_ = lines[2];
        primary_uri_ = lines[3];
        standby_uri_ = lines[4];
    }
    ~private_pair() {
        if (!standby_dir_.empty()) (void)shell("STANDBY_DIR='" + standby_dir_ + "' pg_standby_stop");
        if (!dir_.empty()) (void)shell("PG_DIR='" + dir_ + "' pg_stop");
    }
    private_pair(const private_pair&) = delete;
    private_pair& operator=(const private_pair&) = delete;

    /// Both hosts, the primary first; empty when the pair did not start.
    const std::string& uri() const { return uri_; }
    /// Each server on its own.
    const std::string& primary_uri() const { return primary_uri_; }
    const std::string& standby_uri() const { return standby_uri_; }
    /// The primary dies (SIGKILL to its postmaster and every backend).
    bool crash() { return shell("pg_kill '" + dir_ + "' && echo killed") == "killed\n"; }
    /// The standby is promoted; returns once it accepts writes.
    bool resume() { return shell("STANDBY_DIR='" + standby_dir_ + "' pg_promote && echo promoted") == "promoted\n"; }
    /// A shell command line doing crash() then resume(): a failover, for a program to run itself.
    std::string failover_command() const {
        return lib_shell_command("postgres.sh", "pg_kill '" + dir_ + "' && STANDBY_DIR='" + standby_dir_ + "' pg_promote");
    }
    /// Runs one statement on one server of the pair (primary_uri() or standby_uri()); its output.
    std::string psql(const std::string& server_uri, const std::string& sql) {
        const auto colon = server_uri.rfind(':'), slash = server_uri.rfind('/');
        return shell("pg_psql " + server_uri.substr(colon + 1, slash - colon - 1) + " \"" + sql + "\"");
    }
    /// SIGSTOP / SIGCONT to the standby's postmaster and every process of it: it stops answering
    /// (a synchronous primary's commits then wait).
    bool pause_standby(bool stop) {
        const std::string sig = stop ? "STOP" : "CONT";
        return shell("pm=$(head -1 '" + standby_dir_ + "/data/postmaster.pid') && kill -" + sig +
                     " $pm $(pgrep -P $pm) && echo ok") == "ok\n";
    }

private:
    static std::string shell(const std::string& cmd) { return lib_shell("postgres.sh", cmd); }
    std::string uri_, dir_, standby_dir_, primary_uri_, standby_uri_;
};

/// A pg_auto_failover formation of the test's own (scripts/lib/pgautofailover.sh): a monitor and two
/// nodes, a primary and a secondary the monitor keeps synchronous. uri() names both nodes with
/// target_session_attrs=read-write. crash() kills the primary's keeper and PostgreSQL (SIGKILL: its
/// machine died); resume() waits until the failover manager has promoted the secondary and it
/// accepts writes (nothing of the test promotes it). Stopped and removed by the destructor.
class private_formation {
public:
    private_formation() {
        const std::string out = shell("paf_start >&2 && printf '%s\\n%s\\n' \"$PAF_URI\" \"$PAF_DIR\"");
        const auto nl = out.find('\n');
        if (nl == std::string::npos) return;
        uri_ = out.substr(0, nl);
        dir_ = out.substr(nl + 1);
        while (!dir_.empty() && dir_.back() == '\n') dir_.pop_back();
    }
    ~private_formation() {
        if (!dir_.empty()) (void)shell(env() + "paf_stop");
    }
    private_formation(const private_formation&) = delete;
    private_formation& operator=(const private_formation&) = delete;

    const std::string& uri() const { return uri_; }
    /// The primary's keeper and PostgreSQL die at once.
    bool crash() { return !shell(env() + "paf_kill_primary").empty(); }
    /// The monitor promoted the secondary and it accepts writes (120 s at most).
    bool resume() { return !shell(env() + "paf_wait_writable 120").empty(); }
    /// "node_1:reported:assigned node_2:...", from the monitor.
    std::string state() { return shell(env() + "paf_state"); }

private:
    std::string env() const {
        return "PAF_DIR='" + dir_ + "'; PAF_URI='" + uri_ + "'; PAF_MONITOR_PORT=$(cat '" + dir_ + "/monitor.port'); ";
    }
    static std::string shell(const std::string& cmd) { return lib_shell("pgautofailover.sh", cmd); }
    std::string uri_, dir_;
};

}  // namespace idem_test
