// tests/support/private_mysql.hpp: a MariaDB server of a test's own, for tests that kill, stop or
// reconfigure it (global settings), so the tests sharing IDEM_TEST_MY_URI never see it. Everything
// goes through scripts/lib/mariadb.sh (my_start, my_crash, my_resume, my_stop); the test target
// defines IDEM_SOURCE_DIR.
#pragma once

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>

#include "lib_shell.hpp"

#include <sys/types.h>

namespace idem_test {

class private_mysql {
public:
    /// tmpfs_mb > 0: the data directory is a tmpfs of that size (root only), for fill_disk().
    explicit private_mysql(int tmpfs_mb = 0) {
        const std::string env = tmpfs_mb > 0 ? "MY_TMPFS_MB=" + std::to_string(tmpfs_mb) + " " : "";
        const std::string out = shell(env + "my_start >&2 && printf '%s\\n%s\\n' \"$MY_URI\" \"$MY_DIR\"");
        const auto nl = out.find('\n');
        if (nl == std::string::npos) return;
        uri_ = out.substr(0, nl);
        dir_ = out.substr(nl + 1);
        while (!dir_.empty() && dir_.back() == '\n') dir_.pop_back();
    }
    ~private_mysql() {
        if (!dir_.empty()) {
            (void)signal_server(SIGCONT);
            (void)shell("MY_DIR='" + dir_ + "' my_stop");
        }
    }
    private_mysql(const private_mysql&) = delete;
    private_mysql& operator=(const private_mysql&) = delete;

    /// mysql://idem@127.0.0.1:PORT/idem, or empty when the server did not start.
    [[nodiscard]] const std::string& uri() const { return uri_; }
    /// SIGKILL: the server dies at once, as in a machine crash (InnoDB recovers at resume()).
    bool crash() { return shell("MY_DIR='" + dir_ + "' my_crash && echo crashed") == "crashed\n"; }
    /// Started again on the same port and data after crash(). True when it answers.
    bool resume() { return shell("MY_DIR='" + dir_ + "' my_resume && echo resumed") == "resumed\n"; }
    /// Fills the data directory's file system (a tmpfs_mb server) with a ballast file.
    bool fill_disk() {
        return shell("dd if=/dev/zero of='" + dir_ + "/data/ballast' bs=1M 2>/dev/null || true; echo filled") == "filled\n";
    }
    /// Removes the ballast.
    bool free_disk() { return shell("rm -f '" + dir_ + "/data/ballast' && echo freed") == "freed\n"; }
    /// Whether the server answers.
    bool alive() {
        return shell("mariadb-admin --no-defaults -S '" + dir_ + "/sock' -u root ping >/dev/null 2>&1 && echo up") == "up\n";
    }
    /// Sends `sig` (SIGSTOP, SIGCONT) to the server process.
    bool signal_server(int sig) {
        std::ifstream f(dir_ + "/pid");
        long pid = 0;
        if (!(f >> pid) || pid <= 0) return false;
        return ::kill(static_cast<pid_t>(pid), sig) == 0;
    }

private:
    static std::string shell(const std::string& cmd) { return lib_shell("mariadb.sh", cmd); }
    std::string uri_, dir_;
};

}  // namespace idem_test
