// idem/detail/sqlite/schema.hpp: sqlite_store's tables, their versions and the upgrades between them,
// and idem_schema, the one-row table of the store's counters.
//
// Invariant: a file this library opens is at schema_version when its open commits: an empty file
// gets the current layout, a version 1 or 2 file is upgraded in place inside the open's schema
// transaction (all or nothing), and a version it does not know is refused (store_error), never
// read. idem_schema holds exactly one row; a file without it is corrupt_record.
//
// Version 2 (why: random-order keys). Each batch appends its audit rows at the end of a table keyed
// by sequence (the rowid), instead of inserting them into a B-tree ordered by (key, sequence), and
// keeps no (biz_type, status) index: with keys that arrive in random order (client UUIDs) each of
// those dirtied about one page per row, so every commit wrote several pages per row to the log
// (docs/stores.md, "Layout"). A key's audit rows are chained: each names the key's previous row, and
// the record names the latest (last_audit), so audit(key) stays a few rowid lookups.
//
// Version 3 (why: pruning). idem_schema holds the prune horizon (records_horizon, audit_horizon;
// NULL: never pruned), pruned_sequence (audit rows below it may be gone, so a chain link below it is
// a trail's legal start) and pruned_fence (the largest fence of a pruned record, for max_fence()); an
// index on idempotent_record (updated_time) lets prune read only the records it deletes
// (docs/stores.md, "Pruning"). A version 2 file gains them in place.
//
// Version 4 (why: serving before the window is read, recovery_start::claims_first). idem_schema
// keeps max_fence, the largest fence any batch wrote (raised in each batch's transaction), so
// max_fence() is one row, not a read of every record; a partial index on the PROCESSING records
// finds the claims in flight without reading the others (a claim and its completion in one batch
// never touch it). The updated_time index already holds the key (the table is WITHOUT ROWID), so
// the window's keys are read from it alone. A version 3 file gains both in place: one read of
// every record (the largest fence, and the index built), once.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>

#include "idem/detail/sqlite/connection.hpp"
#include "idem/error.hpp"
#include "idem/store.hpp"

namespace idem::detail::sqlite {

inline constexpr int schema_version = 4;

inline constexpr const char* audit_table_sql = R"SQL(
CREATE TABLE IF NOT EXISTS idempotent_audit (
  sequence       INTEGER      PRIMARY KEY,
  previous       BIGINT       NOT NULL,
  idempotent_key VARCHAR(128) NOT NULL,
  from_status    VARCHAR(16)  NOT NULL,
  to_status      VARCHAR(16)  NOT NULL,
  fencing_token  BIGINT       NOT NULL,
  node           VARCHAR(64)  NOT NULL,
  at_time        BIGINT       NOT NULL,
  detail         TEXT         NOT NULL
);
)SQL";

/// Version 2 to 3: the prune columns of idem_schema and the updated_time index.
inline constexpr const char* version_3_changes = R"SQL(
ALTER TABLE idem_schema ADD COLUMN records_horizon BIGINT;
ALTER TABLE idem_schema ADD COLUMN audit_horizon BIGINT;
ALTER TABLE idem_schema ADD COLUMN pruned_sequence BIGINT NOT NULL DEFAULT 0;
ALTER TABLE idem_schema ADD COLUMN pruned_fence BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS idx_idempotent_record_updated ON idempotent_record (updated_time);
UPDATE idem_schema SET version = 3;
)SQL";

/// Version 3 to 4: idem_schema.max_fence, the index of the claims in flight.
inline constexpr const char* version_4_changes = R"SQL(
ALTER TABLE idem_schema ADD COLUMN max_fence BIGINT NOT NULL DEFAULT 0;
UPDATE idem_schema SET max_fence = (SELECT COALESCE(MAX(fencing_token), 0) FROM idempotent_record
                                    WHERE typeof(fencing_token) = 'integer');
CREATE INDEX IF NOT EXISTS idx_idempotent_record_claims ON idempotent_record (updated_time)
  WHERE status = 'PROCESSING';
UPDATE idem_schema SET version = 4;
)SQL";

/// Version 1 to 2 (see above): the audit table rebuilt in sequence order, with its chain.
inline void upgrade_1_to_2(connection& c) {
    c.exec(R"SQL(
ALTER TABLE idempotent_record ADD COLUMN last_audit BIGINT NOT NULL DEFAULT 0;
DROP INDEX IF EXISTS idx_idempotent_record_biz_status;
ALTER TABLE idempotent_audit RENAME TO idempotent_audit_v1;
)SQL",
           "upgrade schema 1 to 2");
    c.exec(audit_table_sql, "upgrade schema 1 to 2: create audit table");
    c.exec(R"SQL(
INSERT INTO idempotent_audit (sequence, previous, idempotent_key, from_status, to_status, fencing_token, node,
                              at_time, detail)
  SELECT sequence, COALESCE(LAG(sequence) OVER (PARTITION BY idempotent_key ORDER BY sequence), 0), idempotent_key,
         from_status, to_status, fencing_token, node, at_time, detail
  FROM idempotent_audit_v1 ORDER BY sequence;
UPDATE idempotent_record SET last_audit = COALESCE(
  (SELECT MAX(a.sequence) FROM idempotent_audit_v1 a WHERE a.idempotent_key = idempotent_record.idempotent_key), 0);
DROP TABLE idempotent_audit_v1;
UPDATE idem_schema SET version = 2;
)SQL",
           "upgrade schema 1 to 2: copy audit rows");
}

/// Inside the open's schema transaction: creates the current layout in an empty file, or upgrades a
/// version 1 or 2 file in place, or refuses a version it does not know.
inline void create_or_upgrade_schema(connection& c) {
    int version = 0;
    sqlite3_stmt* v = nullptr;
    if (sqlite3_prepare_v2(c.handle(), "SELECT version FROM idem_schema", -1, &v, nullptr) == SQLITE_OK) {
        // The table exists (an empty file has none): it must hold one integer version.
        const int rc = sqlite3_step(v);
        try {
            if (rc == SQLITE_ROW) version = static_cast<int>(c.integer(v, 0, "idem_schema"));
        } catch (...) {
            sqlite3_finalize(v);
            throw;
        }
        sqlite3_finalize(v);
        if (rc == SQLITE_DONE)
            throw error(errc::corrupt_record, c.where() + "idem_schema has no version row (damaged file?)");
        if (rc != SQLITE_ROW) c.fail(rc, "read schema version");
        if (version == 0) version = -1;  // not a version any writer wrote
    }
    if (version == schema_version) return;
    if (version == 1) {
        upgrade_1_to_2(c);
        version = 2;
    }
    if (version == 2) {
        c.exec(version_3_changes, "upgrade schema 2 to 3");
        version = 3;
    }
    if (version == 3) {
        c.exec(version_4_changes, "upgrade schema 3 to 4");
        return;
    }
    if (version != 0)
        throw error(errc::store_error, c.where() + "schema version " + std::to_string(version) +
                                           " is not one this library reads (1, 2 and 3, upgraded in place, or 4)");
    c.exec(R"SQL(
CREATE TABLE IF NOT EXISTS idem_schema (version INTEGER NOT NULL, next_sequence BIGINT NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS idempotent_record (
  idempotent_key      VARCHAR(128) PRIMARY KEY,
  biz_type            VARCHAR(32)  NOT NULL,
  status              VARCHAR(16)  NOT NULL CHECK (status IN ('PROCESSING','SUCCESS','FAILED','RELEASED')),
  fencing_token       BIGINT       NOT NULL,
  lease_until         BIGINT       NOT NULL,
  outcome             BIGINT       NOT NULL,
  request_fingerprint BIGINT       NOT NULL,
  created_time        BIGINT       NOT NULL,
  updated_time        BIGINT       NOT NULL,
  last_audit          BIGINT       NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotent_batch (batch_id BIGINT PRIMARY KEY, committed_time BIGINT NOT NULL);
INSERT INTO idem_schema (version) VALUES (2);
)SQL",
           "create schema");
    c.exec(audit_table_sql, "create audit table");
    c.exec(version_3_changes, "create schema (version 3)");
    c.exec(version_4_changes, "create schema (version 4)");
}

/// The payload column (response payloads: the bytes a completion records with its outcome), added
/// to a file of any version that lacks it, so the schema version stays 3: ADD COLUMN with a constant
/// default rewrites no row (SQLite reads the default for rows stored before it), so the migration
/// costs the same on a file of any size, and runs once (a file that has the column is left alone).
/// An older library opening a migrated file reads it without the column, and would keep a record's
/// old payload when it writes that record again: do not go back to one.
inline void add_payload_column(connection& c) {
    statement q(c, "SELECT COUNT(*) FROM pragma_table_info('idempotent_record') WHERE name = 'payload'");
    q.row("look for the payload column");
    if (sqlite3_column_int64(q.s, 0) != 0) return;
    c.exec("ALTER TABLE idempotent_record ADD COLUMN payload BLOB NOT NULL DEFAULT x''", "add the payload column");
}

/// idem_schema.next_sequence, the sequence of the next audit row; nullopt when the row cannot be read
/// (the callers keep what they had).
[[nodiscard]] inline std::optional<std::int64_t> read_next_sequence(connection& c) {
    sqlite3_stmt* m = c.prepare("SELECT next_sequence FROM idem_schema");
    std::optional<std::int64_t> out;
    try {
        if (sqlite3_step(m) == SQLITE_ROW) out = c.integer(m, 0, "idem_schema");
    } catch (...) {
        sqlite3_finalize(m);
        throw;
    }
    sqlite3_finalize(m);
    return out;
}

/// What idem_schema says of past prunes (version 3).
struct pruned_state {
    std::int64_t records_ms = prune_limits::keep_all;
    std::int64_t audit_ms = prune_limits::keep_all;
    std::int64_t sequence = 0;  // audit rows below it may be gone
    std::int64_t fence = 0;     // the largest fence of a pruned record
};

/// idem_schema.max_fence (version 4): the largest fence any batch wrote.
[[nodiscard]] inline std::int64_t read_max_fence(connection& c) {
    statement s(c, "SELECT max_fence FROM idem_schema");
    if (const int rc = sqlite3_step(s.s); rc == SQLITE_DONE)
        throw error(errc::corrupt_record, c.where() + "idem_schema has no version row (damaged file?)");
    else if (rc != SQLITE_ROW) c.fail(rc, "read the largest fence");
    return c.integer(s.s, 0, "idem_schema.max_fence");
}

[[nodiscard]] inline pruned_state read_pruned(connection& c) {
    statement s(c, "SELECT records_horizon, audit_horizon, pruned_sequence, pruned_fence FROM idem_schema");
    if (const int rc = sqlite3_step(s.s); rc == SQLITE_DONE)
        throw error(errc::corrupt_record, c.where() + "idem_schema has no version row (damaged file?)");
    else if (rc != SQLITE_ROW) c.fail(rc, "read the prune horizon");
    pruned_state p;
    if (sqlite3_column_type(s.s, 0) != SQLITE_NULL) p.records_ms = c.integer(s.s, 0, "idem_schema");
    if (sqlite3_column_type(s.s, 1) != SQLITE_NULL) p.audit_ms = c.integer(s.s, 1, "idem_schema");
    p.sequence = c.integer(s.s, 2, "idem_schema");
    p.fence = c.integer(s.s, 3, "idem_schema");
    return p;
}

/// Writes `p` back into idem_schema (inside the prune's transaction; a bound that is keep_all is NULL).
inline void write_pruned(connection& c, const pruned_state& p) {
    statement w(c,
                "UPDATE idem_schema SET records_horizon = ?1, audit_horizon = ?2, pruned_sequence = ?3, "
                "pruned_fence = ?4");
    for (auto [i, v] : {std::pair{1, p.records_ms}, std::pair{2, p.audit_ms}}) {
        if (v == prune_limits::keep_all) sqlite3_bind_null(w.s, i);
        else sqlite3_bind_int64(w.s, i, v);
    }
    sqlite3_bind_int64(w.s, 3, p.sequence);
    sqlite3_bind_int64(w.s, 4, p.fence);
    c.step_done(w.s, "write the prune horizon");
}

}  // namespace idem::detail::sqlite
