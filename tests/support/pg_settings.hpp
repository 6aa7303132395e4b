// tests/support/pg_settings.hpp: changing a PostgreSQL setting behind a running client, and knowing
// when the change has reached every session.
//
// pg_reload_conf() only sends SIGHUP to the postmaster and returns: a session that runs its next
// statement at once may still see the old value. reconfigure() returns once a NEW session sees the
// new value: the postmaster re-reads the file and signals every backend in the same handler, before
// it accepts that new session, and a backend applies a pending reload before the next statement it
// reads. So after reconfigure() every session, old or new, runs with the new value.
#pragma once

#include <pqxx/pqxx>

#include <string>

#include "store_fixtures.hpp"

namespace idem_test {

/// Runs one statement as the administrator, on a connection of its own.
inline void admin(const std::string& uri, const std::string& sql) {
    pqxx::connection c(uri);
    pqxx::nontransaction n(c);
    n.exec(sql);
}

/// What a new session of the server says about `setting`.
inline std::string fresh_setting(const std::string& uri, const std::string& setting) {
    pqxx::connection c(uri);
    pqxx::nontransaction n(c);
    return n.exec_params("SELECT current_setting($1)", setting)[0][0].c_str();
}

/// ALTER SYSTEM SET setting = value (RESET when value is empty; value is SQL, quote strings) and a
/// reload; true once a new session reads `expect` (20 s at most).
inline bool reconfigure(const std::string& uri, const std::string& setting, const std::string& value,
                        const std::string& expect) {
    admin(uri, value.empty() ? "ALTER SYSTEM RESET " + setting : "ALTER SYSTEM SET " + setting + " = " + value);
    admin(uri, "SELECT pg_reload_conf()");
    return wait_for([&] { return fresh_setting(uri, setting) == expect; });
}

}  // namespace idem_test
