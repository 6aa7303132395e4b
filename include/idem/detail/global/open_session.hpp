// idem/detail/global/open_session.hpp: the arbiter a global guard's URI names (arbiter.hpp), and
// which arbiters this build has.
//
// Which arbiters are compiled in. Each needs its client library: PostgreSQL libpqxx (target
// idem::postgres, which defines IDEM_HAVE_POSTGRES), MySQL / MariaDB Connector/C (target idem::mysql,
// which defines IDEM_HAVE_MYSQL). A program linking both targets gets both; one including
// global_guard.hpp without either definition (not through CMake) gets PostgreSQL, as before MySQL
// could arbitrate.
#pragma once

#if !defined(IDEM_HAVE_POSTGRES) && !defined(IDEM_HAVE_MYSQL)
#define IDEM_HAVE_POSTGRES 1
#endif

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "idem/detail/global/arbiter.hpp"
#include "idem/error.hpp"
#include "idem/store.hpp"

#ifdef IDEM_HAVE_POSTGRES
#include "idem/detail/global/pg_session.hpp"
#include "idem/stores/postgres_store.hpp"
#endif
#ifdef IDEM_HAVE_MYSQL
#include "idem/detail/global/my_session.hpp"
#include "idem/stores/mysql_store.hpp"
#endif

namespace idem::detail::global {

/// The arbiter of `uri`, not connected yet (it connects at its first call). `name`: the URI without
/// its password, for messages; `application`: the session's name on the server. Throws
/// invalid_argument when this build lacks the arbiter the URI names.
[[nodiscard]] inline std::unique_ptr<global_session> open_session(const std::string& uri, const std::string& name,
                                                                  std::chrono::milliseconds deadline,
                                                                  const std::string& application, bool ordered = false) {
    if (is_mysql_uri(uri)) {
#ifdef IDEM_HAVE_MYSQL
        return std::make_unique<my_session>(uri, name, deadline, application, ordered);
#else
        throw error(errc::invalid_argument, "global guard " + name +
                                                ": a MySQL arbiter needs the idem::mysql target (MariaDB "
                                                "Connector/C); this program was built without it");
#endif
    }
#ifdef IDEM_HAVE_POSTGRES
    return std::make_unique<pg_session>(uri, name, deadline, application, ordered);
#else
    (void)deadline;
    (void)application;
    (void)ordered;
    throw error(errc::invalid_argument, "global guard " + name +
                                            ": a PostgreSQL arbiter needs the idem::postgres target (libpqxx); this "
                                            "program was built without it");
#endif
}

/// The arbiter's store, for what a global guard does outside its batches: the schema (created or
/// checked when it opens), reads (lookup, audit), prune, the server's clock and its durability.
struct arbiter_store {
    std::unique_ptr<store> st;
    std::function<std::int64_t()> server_now_ms;  ///< the server's clock, Unix ms
    std::function<void()> require_durability;     ///< refuses a server that may lose a commit
};

[[nodiscard]] inline arbiter_store open_store(const std::string& uri, const std::string& name,
                                              std::chrono::milliseconds deadline) {
    arbiter_store a;
    (void)name;  // in the messages of a build without the arbiter
    if (is_mysql_uri(uri)) {
#ifdef IDEM_HAVE_MYSQL
        auto st = std::make_unique<mysql_store>(uri, deadline);
        mysql_store* s = st.get();
        a.server_now_ms = [s] { return s->server_now_ms(); };
        a.require_durability = [s] { s->require_durability(""); };
        a.st = std::move(st);
        return a;
#else
        (void)deadline;
        throw error(errc::invalid_argument, "global guard " + name +
                                                ": a MySQL arbiter needs the idem::mysql target (MariaDB "
                                                "Connector/C); this program was built without it");
#endif
    }
#ifdef IDEM_HAVE_POSTGRES
    auto st = std::make_unique<postgres_store>(uri, deadline);
    postgres_store* s = st.get();
    a.server_now_ms = [s] { return s->server_now_ms(); };
    a.require_durability = [s] { s->require_durability(""); };
    a.st = std::move(st);
    return a;
#else
    (void)deadline;
    throw error(errc::invalid_argument, "global guard " + name +
                                            ": a PostgreSQL arbiter needs the idem::postgres target (libpqxx); this "
                                            "program was built without it");
#endif
}

}  // namespace idem::detail::global
