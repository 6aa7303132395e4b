// tests/support/regions_fixture.hpp: three PostgreSQL clusters of the test's own, with wal_level =
// logical, as three regions named a, b and c (regions_test, takeover_test). The home rule of every
// test: a key's first letter names its region. Waits for replication by polling the replica
// (bounded), never by sleeping.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "idem/regional_guard.hpp"
#include "idem/regions.hpp"
#include "private_pg.hpp"

#ifdef IDEM_TEST_CLI
#include <sys/wait.h>

#include <cstdio>
#endif

namespace idem_test {

using namespace std::chrono_literals;

// The home rule of every test: the key's first letter names its region.
inline std::string home_rule(std::string_view k) { return std::string(k.substr(0, 1)); }

inline std::uint16_t port_of(const std::string& uri) {
    const auto colon = uri.rfind(':');
    return static_cast<std::uint16_t>(std::stoi(uri.substr(colon + 1, uri.find('/', colon) - colon - 1)));
}

/// Three clusters with wal_level = logical, named a, b and c.
class Regions : public ::testing::Test {
protected:
    static constexpr const char* conf = "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20";

    void SetUp() override {
        for (auto& s : servers_) {
            s = std::make_unique<private_server>(conf);
            ASSERT_FALSE(s->uri().empty()) << "a PostgreSQL cluster did not start (scripts/lib/postgres.sh)";
        }
        rs_ = {{"a", servers_[0]->uri()}, {"b", servers_[1]->uri()}, {"c", servers_[2]->uri()}};
    }

    idem::regional_options opts(const std::string& self, std::vector<idem::region> rs = {}) const {
        idem::regional_options ro;
        ro.self = self;
        ro.regions = rs.empty() ? rs_ : std::move(rs);
        ro.home = home_rule;
        ro.local.call_deadline = 2000ms;
        ro.local.wait_timeout = 4000ms;
        ro.forward.call_deadline = 1000ms;
        ro.forward.wait_timeout = 3000ms;
        ro.forward.max_backoff = 200ms;
        return ro;
    }
    static idem::options fast() {
        idem::options o;
        o.capacity = 1 << 14;
        o.maintenance_interval = 200ms;
        return o;
    }

    /// The status of `k` in `home`'s schema on region `on`'s cluster ("" when it has no row).
    std::string row_status(const std::string& on, const std::string& home, const std::string& k) {
        pqxx::connection c(uri_of(on));
        pqxx::nontransaction n(c);
        const auto r = n.exec_params("SELECT status FROM idem_" + home + ".idempotent_record WHERE idempotent_key = $1", k);
        return r.empty() ? "" : r[0][0].c_str();
    }
    /// Polls until `k` has status `want` in home's replica on `on` (bounded): replication is asynchronous.
    bool arrives(const std::string& on, const std::string& home, const std::string& k, const std::string& want,
                 std::chrono::seconds limit = 30s) {
        const auto until = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < until) {
            if (row_status(on, home, k) == want) return true;
            std::this_thread::sleep_for(20ms);  // polling the replica, an external process
        }
        return false;
    }
    void exec(const std::string& on, const std::string& sql) {
        pqxx::connection c(uri_of(on));
        pqxx::nontransaction n(c);
        n.exec(sql);
    }
    std::string uri_of(const std::string& name) const {
        for (const auto& r : rs_)
            if (r.name == name) return r.uri;
        return {};
    }

#ifdef IDEM_TEST_CLI
    /// Runs `idem regions SUB --region a=... --region b=... --region c=... EXTRA`: exit status and stdout.
    std::pair<int, std::string> cli(const std::string& sub, const std::string& extra = {}) {
        return run_cli("regions " + sub, extra);
    }
    /// Runs `idem WORDS --region a=... --region b=... --region c=... EXTRA`: exit status and output.
    std::pair<int, std::string> run_cli(const std::string& words, const std::string& extra) {
        std::string cmd = std::string(IDEM_TEST_CLI) + " " + words;
        for (const auto& r : rs_) cmd += " --region '" + r.name + "=" + r.uri + "'";
        cmd += " " + extra + " 2>&1";
        std::FILE* p = ::popen(cmd.c_str(), "r");
        if (p == nullptr) return {-1, "popen failed"};
        std::string out;
        std::array<char, 4096> buf;
        while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
        const int st = ::pclose(p);
        return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
    }
#endif

    std::array<std::unique_ptr<private_server>, 3> servers_;
    std::vector<idem::region> rs_;
};

}  // namespace idem_test
