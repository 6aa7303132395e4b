// tests/support/my_database.hpp: a fresh MySQL/MariaDB database for one test, on the server that
// IDEM_TEST_MY_URI names (scripts/test starts a MariaDB: scripts/lib/mariadb.sh), dropped when the
// test ends. A missing or unreachable server is a failure of the test, never a skip. exec() runs
// SQL of the test's own on it (hand edits, KILL CONNECTION, settings).
#pragma once

#include <idem/detail/my/connection.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace idem_test {

/// Runs `sql` on a session of its own to `uri`; "" or the server's message (tests' hand edits,
/// KILL CONNECTION, global settings).
inline std::string my_exec(const std::string& uri, const std::string& sql, const idem::detail::my::row_fn& on_row = {}) {
    namespace my = idem::detail::my;
    try {
        my::session s;
        s.open(my::parse_uri(uri), std::chrono::seconds(10));
        s.run(sql, on_row);
        return {};
    } catch (const std::exception& e) {
        return e.what();
    }
}

class my_database {
public:
    /// Creates the database. False (with the reason in *why) when IDEM_TEST_MY_URI is unset or the
    /// server refuses.
    [[nodiscard]] bool create(std::string* why) {
        namespace my = idem::detail::my;
        const char* u = std::getenv("IDEM_TEST_MY_URI");
        server_ = u ? u : "";
        if (server_.empty()) {
            *why =
                "IDEM_TEST_MY_URI is unset: these tests need a MariaDB server "
                "(scripts/test starts one; or source scripts/lib/mariadb.sh && my_start)";
            return false;
        }
        std::random_device rd;
        char name[40];
        std::snprintf(name, sizeof name, "idem_t_%08x%08x", rd(), rd());
        name_ = name;  // hex digits only: safe to splice into SQL
        try {
            my::session s;
            s.open(my::parse_uri(server_), std::chrono::seconds(10));
            s.run("CREATE DATABASE " + name_);
        } catch (const std::exception& e) {
            *why = "cannot create a test database on " + my::redact(server_) + ": " + e.what();
            return false;
        }
        created_ = true;
        uri_ = server_.substr(0, server_.rfind('/') + 1) + name_;
        return true;
    }

    /// Runs `sql` on the test's database; "" or the server's message.
    std::string exec(const std::string& sql, const idem::detail::my::row_fn& on_row = {}) const {
        return my_exec(uri_, sql, on_row);
    }

    /// Drops the database (also done by the destructor).
    bool drop() {
        if (!created_) return true;
        created_ = false;
        namespace my = idem::detail::my;
        try {
            my::session s;
            s.open(my::parse_uri(server_), std::chrono::seconds(10));
            s.run("DROP DATABASE IF EXISTS " + name_);
        } catch (const std::exception&) {
            return false;
        }
        return true;
    }
    ~my_database() { (void)drop(); }

    [[nodiscard]] const std::string& server() const noexcept { return server_; }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    [[nodiscard]] const std::string& uri() const noexcept { return uri_; }

private:
    std::string server_, name_, uri_;
    bool created_ = false;
};

}  // namespace idem_test
