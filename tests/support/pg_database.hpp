// tests/support/pg_database.hpp: a fresh PostgreSQL database for one test, on the server that
// IDEM_TEST_PG_URI names, dropped (WITH (FORCE)) when the test ends. A missing or unreachable
// server is a failure of the test, never a skip.
#pragma once

#include <idem/stores/postgres_store.hpp>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace idem_test {

class pg_database {
public:
    /// Creates the database. False (with the reason in *why) when IDEM_TEST_PG_URI is unset or the
    /// server refuses.
    [[nodiscard]] bool create(std::string* why) {
        namespace pg = idem::detail::pg;
        const char* u = std::getenv("IDEM_TEST_PG_URI");
        server_ = u ? u : "";
        if (server_.empty()) {
            *why =
                "IDEM_TEST_PG_URI is unset: these tests need a PostgreSQL server "
                "(scripts/test starts one; or source scripts/lib/postgres.sh && pg_start)";
            return false;
        }
        std::random_device rd;
        char name[32];
        std::snprintf(name, sizeof name, "idem_t_%08x%08x", rd(), rd());
        name_ = name;  // hex digits only: safe to splice into SQL
        try {
            pqxx::connection c(server_ + (pg::is_uri(server_) ? (server_.find('?') == std::string::npos ? "?" : "&") : " ") +
                               "connect_timeout=10");
            pqxx::nontransaction n(c);
            n.exec("CREATE DATABASE " + name_);
        } catch (const std::exception& e) {
            *why = "cannot create a test database on " + pg::redact(server_) + ": " + e.what();
            return false;
        }
        created_ = true;
        uri_ = pg::with_database(server_, name_);
        return true;
    }

    /// Drops the database (also done by the destructor). False with the reason when it cannot.
    bool drop(std::string* why = nullptr) {
        if (!created_) return true;
        created_ = false;
        try {
            pqxx::connection c(server_);
            pqxx::nontransaction n(c);
            n.exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
        } catch (const std::exception& e) {
            if (why) *why = "cannot drop test database " + name_ + ": " + e.what();
            return false;
        }
        return true;
    }
    ~pg_database() { (void)drop(); }

    [[nodiscard]] const std::string& server() const noexcept { return server_; }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    [[nodiscard]] const std::string& uri() const noexcept { return uri_; }

private:
    std::string server_, name_, uri_;
    bool created_ = false;
};

}  // namespace idem_test
