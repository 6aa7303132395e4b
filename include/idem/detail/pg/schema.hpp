// idem/detail/pg/schema.hpp: the PostgreSQL store's schema and the server settings its promises
// rest on: the tables' DDL and version, creating, upgrading or checking them at open
// (ensure_schema()), and the durability settings: synchronous_commit pinned on every session,
// fsync and synchronous_commit checked for sync mode (check_durability(), refuse_fsync_off()).
//
// Invariants
//   * Opening is idempotent and safe when several processes open one database at once: a
//     transaction-scoped advisory lock serialises the CREATE ... IF NOT EXISTS, and a unique
//     violation from a racing opener without the lock is retried.
//   * A database that already holds this version is only read, never sent DDL: CREATE INDEX IF NOT
//     EXISTS takes a SHARE lock on its table even when the index exists, which would wait for, and
//     could deadlock with, a live writer's batch (it holds the audit table and waits for the record
//     table). So a store opens beside a running guard, and a lane or a reader opens no schema step.
//   * A version newer than this library's is refused (store_error), never written over.
//   * Sync durability acknowledges nothing a crash of the server can lose. check_durability() (a
//     durable_guard in sync mode calls it at open) refuses fsync=off and synchronous_commit=off as
//     configured on the server. It accepts on, local, remote_write and remote_apply: each of them
//     waits for the primary's WAL flush before a commit is acknowledged, which is what a crash of
//     this server needs (local, like on without a synchronous standby, does not survive the loss of
//     the machine). Settings can change behind a running store, so they are also guarded afterwards:
//      - synchronous_commit is pinned on every connection (pin_durability(): on, or remote_apply when
//        the server is configured with it; never weaker), in the round trip that sets the session
//        up (connection.hpp, session_setup()). A reload of the server's configuration does not reach
//        a session's own SET.
//      - fsync cannot be pinned. Once sync durability was required, every (re)connect reads it (same
//        round trip) and every apply() reads it inside the batch's transaction, right before COMMIT
//        (the main statement answers with it: no round trip of its own for a typical batch). When it
//        is off, the store refuses (refuse_fsync_off(): store_unavailable naming fsync) and commits
//        nothing; the batch waits (the flusher retries) until fsync is on again.
//   * A failover loses nothing acknowledged only when every commit waited for a standby too. That
//     is synchronous_standby_names: non-empty, `on` (pinned) waits for the named standbys' flush.
//     An owner that requires it (postgres_store::require_synchronous_standby(), global_options::
//     require_synchronous_standby) refuses an empty value at open (check_synchronous_standby():
//     invalid_argument naming the setting), and reads it where it reads fsync afterwards (every
//     (re)connect; a store's every batch before COMMIT): empty then refuses the commit
//     (refuse_no_standby(): store_unavailable), and work resumes once a standby is named again.
//     failover_exposure() says in words what a failover of the server can lose, at open.
//   * A commit that waits for a standby is visible to no other session until the standby answered,
//     unless the wait is cancelled (pg_cancel_backend: the client gets COMMIT with a WARNING) or
//     the backend is terminated (the client gets nothing). Then the commit is visible on the
//     primary and may be missing on the standby. So the owners take such a WARNING as a commit in
//     doubt (sync_wait_cancelled, connection.hpp's quiet_notices), and an in-doubt probe that finds
//     a batch committed confirms it with a write of its own (committed_barrier, sql.hpp): its commit
//     follows the batch's in the WAL, so its wait for the standby covers the batch too.
#pragma once

#include <string>
#include <string_view>

#include <pqxx/pqxx>

#include "idem/error.hpp"

namespace idem::detail::pg {

// Version 2 (pruning): idem_schema holds the prune horizon and the largest pruned fence, and an
// index on idempotent_record (updated_time) lets prune read only the records it deletes. A version 1
// database gains both in place (the DDL below, then schema_version_upgrade).
inline constexpr int schema_version = 2;

// Serialises concurrent openers of one database (CREATE TABLE IF NOT EXISTS is not race-free in
// PostgreSQL: two sessions can both pass the existence check and one fails on pg_type's unique
// index). The number is arbitrary: "idem" in ASCII.
inline constexpr std::string_view schema_lock = "SELECT pg_advisory_xact_lock(1768189293)";

// idempotent_key is COLLATE "C": byte order, the same as SQLite's BINARY and std::string, so
// scan_audit's order matches memory_store's, and btree comparisons skip the locale.
inline constexpr std::string_view schema_ddl = R"sql(
CREATE TABLE IF NOT EXISTS idem_schema (
  version INTEGER NOT NULL PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS idempotent_record (
  idempotent_key VARCHAR(128) COLLATE "C" PRIMARY KEY,
  biz_type VARCHAR(32) NOT NULL,
  status VARCHAR(16) NOT NULL CHECK (status IN ('PROCESSING','SUCCESS','FAILED','RELEASED')),
  fencing_token BIGINT NOT NULL,
  lease_until BIGINT NOT NULL,
  outcome BIGINT NOT NULL,
  request_fingerprint BIGINT NOT NULL,
  created_time BIGINT NOT NULL,
  updated_time BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_idempotent_record_biz_status ON idempotent_record (biz_type, status);
CREATE TABLE IF NOT EXISTS idempotent_audit (
  sequence BIGSERIAL PRIMARY KEY,
  idempotent_key VARCHAR(128) COLLATE "C" NOT NULL,
  from_status VARCHAR(16) NOT NULL,
  to_status VARCHAR(16) NOT NULL,
  fencing_token BIGINT NOT NULL,
  node VARCHAR(64) NOT NULL,
  at_time BIGINT NOT NULL,
  detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_idempotent_audit_key_seq ON idempotent_audit (idempotent_key, sequence);
CREATE TABLE IF NOT EXISTS idempotent_batch (
  batch_id BIGINT PRIMARY KEY,
  committed_time BIGINT NOT NULL
);
ALTER TABLE idem_schema ADD COLUMN IF NOT EXISTS records_horizon BIGINT;
ALTER TABLE idem_schema ADD COLUMN IF NOT EXISTS audit_horizon BIGINT;
ALTER TABLE idem_schema ADD COLUMN IF NOT EXISTS pruned_fence BIGINT NOT NULL DEFAULT 0;
ALTER TABLE idempotent_record ADD COLUMN IF NOT EXISTS payload BYTEA NOT NULL DEFAULT ''::bytea;
CREATE INDEX IF NOT EXISTS idx_idempotent_record_updated ON idempotent_record (updated_time)
)sql";

// Writes schema_version (the literal 2) into a fresh database, or upgrades version 1 (the DDL above
// added what version 2 has).
inline constexpr std::string_view schema_version_insert =
    "INSERT INTO idem_schema (version) SELECT 2 WHERE NOT EXISTS (SELECT 1 FROM idem_schema); "
    "UPDATE idem_schema SET version = 2 WHERE version = 1";
inline constexpr std::string_view schema_version_select = "SELECT max(version) FROM idem_schema";

// Response payloads: idempotent_record.payload (BYTEA, '' for none) holds the bytes a completion
// records with its outcome. It came without a version of its own (version 2 stays what a database
// says, so an existing database and the global scope, which shares the table, read on unchanged):
// a database whose version is current but which lacks the column runs the DDL above once, whose
// ADD COLUMN ... DEFAULT of a constant rewrites no row (PostgreSQL 11 and later store the default
// in the catalog). The check reads the catalog, so a current database takes no lock.
inline constexpr std::string_view payload_column_exists =
    "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('idempotent_record') "
    "AND attname = 'payload' AND NOT attisdropped)";

// ---------------------------------------------------------------------------------------------------
// Durability settings. fsync can change under a running server (ALTER SYSTEM + reload, or a
// restart) and no session can pin it, so it is read again: on every new connection, and by a
// sync-mode store on every batch (the batch's last statement answers with it, inside the batch's
// transaction, right before COMMIT: sql.hpp, apply_main and apply_keep_lease). synchronous_commit CAN be pinned: pin_durability() sets it for the session, and a
// session's SET outranks the configuration file, so a later ALTER SYSTEM ... + reload cannot weaken
// this connection's commits.
//
// The pinned value is `on`: COMMIT returns after the primary's WAL flush (and, when
// synchronous_standby_names names standbys, after theirs). remote_apply, when the server is
// configured with it (or was at an earlier connect: keep_remote_apply), is kept: it is stricter
// (the standbys have also applied the commit). off, local and remote_write are raised to on. The row
// holds the pinned value, then fsync. It runs first on a fresh session, so current_setting() still
// reads the configured value there.
// The third column is synchronous_standby_names (empty: no commit waits for a standby).
[[nodiscard]] inline std::string pin_durability(bool keep_remote_apply) {
    return std::string("SELECT set_config('synchronous_commit', CASE WHEN ") + (keep_remote_apply ? "true" : "false") +
           " OR current_setting('synchronous_commit') = 'remote_apply' THEN 'remote_apply' ELSE 'on' END, false), "
           "current_setting('fsync'), current_setting('synchronous_standby_names')";
}
// fsync, the synchronous_commit a session of this server starts with (its configured value,
// reloads included; pg_settings.reset_val, because this session's own value is pinned), and
// synchronous_standby_names.
inline constexpr std::string_view durability_settings =
    "SELECT current_setting('fsync'), (SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit'), "
    "current_setting('synchronous_standby_names')";

static_assert(schema_version == 2, "schema_version_insert writes the literal 2: change both together");

/// Creates the schema on `conn`, upgrades an older version in place, or only checks a current one
/// (see the header: no DDL then). `step` is set to the step under way, for the caller's messages.
/// Throws store_error (naming `name`, the store) when the database holds a version this library
/// does not read; anything else the server answers reaches the caller as libpqxx threw it.
inline void ensure_schema(pqxx::connection& conn, std::string_view name, std::string& step) {
    {
        step = "check schema";
        pqxx::work w(conn);
        // (Two statements: a name in a statement is resolved before it runs, so one statement
        // cannot read idem_schema only when it exists.)
        const bool exists = !w.exec("SELECT to_regclass('idem_schema')")[0][0].is_null();
        const int version = exists ? w.exec("SELECT COALESCE(max(version), 0) FROM idem_schema")[0][0].as<int>() : 0;
        // The payload column came without a version (above): a current database without it runs
        // the DDL once.
        const bool payload = version == schema_version && w.exec(std::string(payload_column_exists))[0][0].as<bool>();
        w.commit();
        if (payload) return;
    }
    for (int attempt = 0;; ++attempt) {
        try {
            step = "create schema";
            pqxx::work w(conn);
            w.exec(std::string(schema_lock));
            w.exec(std::string(schema_ddl));
            w.exec(std::string(schema_version_insert));
            const int v = w.exec(std::string(schema_version_select))[0][0].as<int>();
            w.commit();
            if (v != schema_version)
                throw error(errc::store_error, "postgres store " + std::string(name) + ": idem_schema says version " +
                                                   std::to_string(v) + "; this library reads version " +
                                                   std::to_string(schema_version) + " only");
            return;
        } catch (const pqxx::unique_violation&) {
            if (attempt == 2) throw;  // a racing opener without the lock (an older library): try again
        }
    }
}

/// The server's durability settings as durability_settings reads them.
struct durability {
    std::string fsync;               ///< current_setting('fsync')
    std::string synchronous_commit;  ///< the value a new session starts with (configured, reloads included)
    std::string standby_names;       ///< synchronous_standby_names (empty: no commit waits for a standby)
};

/// Reads the settings (one round trip, outside any transaction).
[[nodiscard]] inline durability read_durability(pqxx::connection& conn) {
    pqxx::nontransaction n(conn);
    const auto r = n.exec(std::string(durability_settings));
    return {r[0][0].c_str(), r[0][1].c_str(), r[0][2].c_str()};
}

/// Refuses settings under which a commit the server acknowledges can be lost on a crash (see the
/// header): throws idem::error(invalid_argument) naming the setting, the fix and then
/// `alternative` (the caller's alternative to fixing the server; empty: none).
inline void check_durability(const durability& d, std::string_view name, const std::string& alternative) {
    auto refuse = [&](const std::string& setting, const std::string& fix) {
        throw error(errc::invalid_argument, "sync durability refused: PostgreSQL at " + std::string(name) + " runs with " +
                                                setting + "; a commit acknowledged by it can be lost on a crash. Set " +
                                                fix + " in the server's configuration" + alternative);
    };
    if (d.fsync == "off") refuse("fsync=off", "fsync=on");
    if (d.synchronous_commit == "off") refuse("synchronous_commit=off", "synchronous_commit=on");
}

/// What a failover of the server can lose, in words, as its settings say (read_durability()).
[[nodiscard]] inline std::string failover_exposure(const durability& d) {
    if (d.standby_names.empty())
        return "no synchronous standby (synchronous_standby_names is empty): a commit is acknowledged once this "
               "server flushed it, so a failover to a standby can lose the commits acknowledged within its "
               "replication lag; the loss of this server's disk loses what no standby received";
    return "synchronous standby '" + d.standby_names +
           "': a commit is acknowledged only once a standby named there flushed it too, so a failover to such a "
           "standby loses no acknowledged commit (one to any other standby can)";
}

/// Refuses a server on which a failover can lose an acknowledged commit (synchronous_standby_names
/// empty): idem::error(invalid_argument) naming the setting.
inline void check_synchronous_standby(const durability& d, std::string_view name) {
    if (d.standby_names.empty())
        throw error(errc::invalid_argument,
                    "synchronous standby required: PostgreSQL at " + std::string(name) +
                        " runs with synchronous_standby_names empty, so " + failover_exposure(d) +
                        ". Name a standby there (for example synchronous_standby_names = 'FIRST 1 (standby1)'), "
                        "or do not require one");
}

/// A synchronous standby was required and the server now names none: the call in progress (`op`,
/// at `step`) commits nothing.
[[noreturn]] inline void refuse_no_standby(std::string_view name, std::string_view op, std::string_view step) {
    throw error(errc::store_unavailable,
                "postgres " + std::string(name) + ": " + std::string(op) + ": " + std::string(step) +
                    ": synchronous_standby_names is now empty, so a commit would not wait for a standby and a "
                    "failover could lose it; nothing is acknowledged until a synchronous standby is named again");
}

/// Sync durability was required and the server now runs with fsync=off: the call in progress (`op`,
/// at `step`) commits nothing.
[[noreturn]] inline void refuse_fsync_off(std::string_view name, std::string_view op, std::string_view step) {
    throw error(errc::store_unavailable,
                "postgres store " + std::string(name) + ": " + std::string(op) + ": " + std::string(step) +
                    ": the server now runs with fsync=off, so a commit it acknowledges can be lost on a crash; "
                    "sync durability acknowledges nothing on it (batches wait until fsync=on is configured "
                    "and reloaded)");
}

}  // namespace idem::detail::pg
