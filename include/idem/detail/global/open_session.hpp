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

/// The refusal when this build lacks the arbiter `uri` names (its client library's target).
[[noreturn]] inline void missing_arbiter(const std::string& uri, const std::string& name) {
    throw error(errc::invalid_argument,
                "global guard " + name +
                    (is_mysql_uri(uri) ? ": a MySQL arbiter needs the idem::mysql target (MariaDB Connector/C)"
                                       : ": a PostgreSQL arbiter needs the idem::postgres target (libpqxx)") +
                    "; this program was built without it");
}

/// The arbiter of `uri`, not connected yet (it connects at its first call). `name`: the URI without
/// its password, for messages; `application`: the session's name on the server; `standby`:
/// refuse to commit while the server names no synchronous standby (PostgreSQL; batch_context
/// refuses it on MySQL). Throws invalid_argument when this build lacks the arbiter the URI names.
[[nodiscard]] inline std::unique_ptr<global_session> open_session(const std::string& uri, const std::string& name,
                                                                  std::chrono::milliseconds deadline,
                                                                  const std::string& application, bool standby,
                                                                  bool ordered = false) {
#ifdef IDEM_HAVE_MYSQL
    if (is_mysql_uri(uri)) return std::make_unique<my_session>(uri, name, deadline, application, ordered);
#endif
#ifdef IDEM_HAVE_POSTGRES
    if (!is_mysql_uri(uri)) return std::make_unique<pg_session>(uri, name, deadline, application, standby, ordered);
#endif
    (void)deadline;
    (void)application;
    (void)standby;
    (void)ordered;
    missing_arbiter(uri, name);
}

/// The arbiter's store, for what a global guard does outside its batches: the schema (created or
/// checked when it opens), reads (lookup, audit), prune, the server's clock and its durability.
struct arbiter_store {
    std::unique_ptr<store> st;
    std::function<std::int64_t()> server_now_ms;  ///< the server's clock, Unix ms
    std::function<void()> require_durability;     ///< refuses a server that may lose a commit
    std::function<void()> require_standby;        ///< refuses a server without a synchronous standby
};

/// `S`'s store over `uri` as an arbiter_store (S: postgres_store or mysql_store).
template <class S>
[[nodiscard]] arbiter_store arbiter_store_of(const std::string& uri, std::chrono::milliseconds deadline) {
    auto st = std::make_unique<S>(uri, deadline);
    S* s = st.get();
    std::function<void()> standby;
    if constexpr (requires { s->require_synchronous_standby(); }) standby = [s] { s->require_synchronous_standby(); };
    return {std::move(st), [s] { return s->server_now_ms(); }, [s] { s->require_durability(""); }, std::move(standby)};
}

[[nodiscard]] inline arbiter_store open_store(const std::string& uri, const std::string& name,
                                              std::chrono::milliseconds deadline) {
#ifdef IDEM_HAVE_MYSQL
    if (is_mysql_uri(uri)) return arbiter_store_of<mysql_store>(uri, deadline);
#endif
#ifdef IDEM_HAVE_POSTGRES
    if (!is_mysql_uri(uri)) return arbiter_store_of<postgres_store>(uri, deadline);
#endif
    (void)deadline;
    missing_arbiter(uri, name);
}

}  // namespace idem::detail::global
