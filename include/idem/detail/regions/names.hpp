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
#include <vector>

#include <pqxx/except>

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

// The replica guard. A cluster that does not decide a key space holds its schema as a replica:
// a trigger on the tables a decision writes (records, audit rows, and idem_schema, whose prune
// horizon and pruned fence a prune writes) refuses every local write with SQLSTATE 55000, so a
// process given a wrong map (a key space it thinks is decided here) is refused, never granted.
// Replication writes through: the apply and table-sync workers run with session_replication_role =
// replica, and a trigger created by CREATE TRIGGER (ENABLE, "origin") does not fire for them.
// move_home() installs it on the old home first (the fence) and removes it on the new home last.
// Batch rows stay writable: an in-doubt probe of a batch in flight at the fence still answers.
inline constexpr const char* guarded_tables[] = {"idempotent_record", "idempotent_audit", "idem_schema"};

/// The statements installing the replica guard on `schema` (key space `space`), naming `decider`
/// (the region whose cluster decides it, or "another region" when unknown) in its message.
[[nodiscard]] inline std::vector<std::string> guard_sql(const std::string& schema, std::string_view space,
                                                        std::string_view decider) {
    std::vector<std::string> out;
    out.push_back("CREATE OR REPLACE FUNCTION " + schema +
                  ".idem_replica() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN RAISE EXCEPTION "
                  "'idem: key space " +
                  std::string(space) + " is decided by " + std::string(decider) +
                  "; this cluster holds a replica of it and refuses local writes' USING ERRCODE = '55000'; END $f$");
    for (const char* t : guarded_tables) {
        out.push_back("DROP TRIGGER IF EXISTS idem_replica ON " + schema + "." + t);
        out.push_back("CREATE TRIGGER idem_replica BEFORE INSERT OR UPDATE OR DELETE ON " + schema + "." + t +
                      " FOR EACH ROW EXECUTE FUNCTION " + schema + ".idem_replica()");
    }
    return out;
}

/// Runs `tx`, one whole transaction (opened and committed inside it), again when PostgreSQL made it
/// a deadlock's victim (SQLSTATE 40P01, pqxx::deadlock_detected). Installing or removing the replica
/// guard (DROP / CREATE TRIGGER: ACCESS EXCLUSIVE on each guarded table, after the weaker locks of
/// the statements before it) can deadlock with a writer of the same tables (a flusher, a
/// subscription's apply worker) that holds a weak lock and waits for a stronger one; the server
/// ends one of them and rolls its transaction back whole, so running it again changes nothing
/// twice. At most `attempts` runs; the last deadlock is thrown.
template <class Tx>
void retry_deadlocks(const Tx& tx, int attempts = 5) {
    for (int run = 1;; ++run) {
        try {
            tx();
            return;
        } catch (const pqxx::deadlock_detected&) {
            if (run >= attempts) throw;
        }
    }
}

/// The statements removing it (the cluster decides the key space).
[[nodiscard]] inline std::vector<std::string> unguard_sql(const std::string& schema) {
    std::vector<std::string> out;
    for (const char* t : guarded_tables) out.push_back("DROP TRIGGER IF EXISTS idem_replica ON " + schema + "." + t);
    return out;
}

// Whether publication $1 publishes schema $2 (FOR TABLES IN SCHEMA): the cluster decides that key
// space. The catalog, not a configuration, says which cluster decides what, so a move that
// stopped half-way is resumed from where it stopped.
inline constexpr std::string_view publishes_sql =
    "SELECT 1 FROM pg_publication_namespace pn JOIN pg_publication p ON p.oid = pn.pnpubid "
    "JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = $1 AND n.nspname = $2";

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
