// tests/support/private_pg.hpp: a PostgreSQL server of a test's own, for tests that restart or crash
// it, so the tests sharing IDEM_TEST_PG_URI (ctest runs them in parallel) never see it go down.
// Everything goes through scripts/lib/postgres.sh (pg_start, pg_crash, pg_resume, pg_stop); the test
// target defines IDEM_SOURCE_DIR.
#pragma once

#include <cstdio>
#include <string>

#include "lib_shell.hpp"

namespace idem_test {

/// scripts/lib/postgres.sh's pg_start (PG_BIN, a fresh data directory, a free loopback port, as the
/// postgres user when we are root), stopped and removed by the destructor. uri() is empty when it
/// did not start.
class private_server {
public:
    private_server() {
        const std::string out = shell("pg_start >&2 && printf '%s\\n%s\\n' \"$PG_URI\" \"$PG_DIR\"");
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


}  // namespace idem_test
