// idem/detail/regions/names.hpp: how regions (idem/regions.hpp) name what they make in PostgreSQL,
// and the SQL of their replication.
//
// One schema per home region: the records, audit rows and batch rows of the keys whose home is
// region R live in schema idem_R, in every cluster. In R's cluster idem_R is written by R's
// processes (the claims decided there); in every other cluster idem_R is a read-only replica, fed
// by the logical-replication subscription idem_R_to_S from R's publication idem_R (PostgreSQL 15's
// FOR TABLES IN SCHEMA). A process reaches a schema through the connection's search_path, so the
// claim SQL of scope::global runs unchanged (detail/global/pg_sql.hpp names no schema).
//
// Why a schema per home and not a row filter on one shared table: a row filter on UPDATE and
// DELETE must use only replica-identity columns, so the home would have to be part of the primary
// key; and two regions' rows in one table would share the subscriber's table with its own claims,
// where the compensation scan of one region would find, and decide, the other's PROCESSING rows. A
// schema keeps each home's rows where only its home writes them; publishing a schema is
// PostgreSQL 15's "row filter" at the granularity the key space needs.
#pragma once

#include <string>
#include <string_view>

#include "idem/detail/pg/sql.hpp"
#include "idem/error.hpp"

namespace idem::detail::regions {

/// A region name: 1 to 24 characters of [a-z0-9], starting with a letter (it becomes part of a
/// schema, a publication and a subscription name, unquoted, within PostgreSQL's 63 bytes; no '_',
/// so "idem_<home>_to_<subscriber>" names its two regions unambiguously).
[[nodiscard]] inline bool valid_name(std::string_view n) noexcept {
    if (n.empty() || n.size() > 24 || n[0] < 'a' || n[0] > 'z') return false;
    for (const char c : n)
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
    return true;
}

inline void check_name(std::string_view n) {
    if (!valid_name(n))
        throw error(errc::invalid_argument,
                    "region name '" + std::string(n) + "' is not 1 to 24 characters of a-z and 0-9 starting with a letter");
}

/// The schema holding the keys whose home is `region`, in every cluster.
[[nodiscard]] inline std::string schema_of(std::string_view region) { return "idem_" + std::string(region); }
/// The publication of `home`'s schema, in home's cluster.
[[nodiscard]] inline std::string publication_of(std::string_view home) { return "idem_" + std::string(home); }
/// The subscription, in `subscriber`'s cluster, to home's publication. It is also the application
/// name its walsender shows in home's pg_stat_replication, so synchronous_standby_names can name it.
[[nodiscard]] inline std::string subscription_of(std::string_view home, std::string_view subscriber) {
    return "idem_" + std::string(home) + "_to_" + std::string(subscriber);
}

/// `conninfo` with search_path set to `schema` for every session (libpq's `options`). A connection
/// string that already sets `options` is refused: idem needs the search path to be its own.
[[nodiscard]] inline std::string with_schema(std::string conninfo, std::string_view schema) {
    if (pg::has_option(conninfo, "options"))
        throw error(errc::invalid_argument, "region connection " + pg::redact(conninfo) +
                                                " sets libpq 'options'; regions set it themselves (search_path)");
    if (pg::is_uri(conninfo)) {
        conninfo += conninfo.find('?') == std::string::npos ? '?' : '&';
        conninfo.append("options=-c%20search_path%3D").append(schema);
    } else {
        conninfo.append(conninfo.empty() ? "" : " ").append("options='-c search_path=").append(schema).append("'");
    }
    return conninfo;
}

/// The subscription's connection string: `conninfo` as a quoted SQL literal.
[[nodiscard]] inline std::string sql_literal(std::string_view s) {
    std::string out = "'";
    for (const char c : s) {
        if (c == '\'') out += '\'';
        out += c;
    }
    return out + "'";
}

// Replication state, read on a subscriber: each incoming subscription, whether its apply worker
// runs, and how long ago it last heard from its publisher.
inline constexpr std::string_view incoming_sql = R"sql(
SELECT s.subname, st.pid IS NOT NULL AS running, s.subenabled,
       COALESCE((extract(epoch FROM now() - st.last_msg_receipt_time) * 1000)::bigint, -1) AS heard_ms
  FROM pg_subscription s LEFT JOIN pg_stat_subscription st ON st.subid = s.oid AND st.relid IS NULL
 WHERE left(s.subname, 5) = 'idem_' AND right(s.subname, length($1) + 4) = '_to_' || $1 ORDER BY s.subname
)sql";

// Read on a home: each outgoing subscription's walsender, the WAL bytes it has not yet confirmed
// flushed (what a loss of this cluster with its disks would take with it in asynchronous mode),
// and the time lag PostgreSQL measured for its last flush (NULL when idle).
inline constexpr std::string_view outgoing_sql = R"sql(
SELECT sl.slot_name, r.pid IS NOT NULL AS streaming,
       COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), sl.confirmed_flush_lsn), 0)::bigint AS lag_bytes,
       COALESCE((extract(epoch FROM r.flush_lag) * 1000)::bigint, 0) AS lag_ms,
       COALESCE(r.sync_state, 'none') AS sync_state
  FROM pg_replication_slots sl LEFT JOIN pg_stat_replication r ON r.application_name = sl.slot_name
 WHERE sl.slot_type = 'logical' AND left(sl.slot_name, length($1) + 9) = 'idem_' || $1 || '_to_'
 ORDER BY sl.slot_name
)sql";

}  // namespace idem::detail::regions
