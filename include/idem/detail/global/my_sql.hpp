// idem/detail/global/my_sql.hpp: the SQL of scope::global on a MariaDB arbiter, on the schema of
// detail/my/schema.hpp. my_session.hpp sends it.
//
// MariaDB has no data-modifying CTE and no UPDATE ... RETURNING, so a batch is not one statement
// as on PostgreSQL (pg_sql.hpp) but one transaction of several statements, sent as multi-statement
// queries (detail/my/connection.hpp). Values travel as hex literals (X'...') and integers the
// session formatted itself, as in the store (detail/my/sql.hpp). The sessions run READ COMMITTED:
// a locking read or an UPDATE that waited for another transaction's row lock reads the row as that
// transaction committed it, and a plain read sees the latest committed rows (and this transaction's
// own changes).
//
// Claim batch: one round trip, one transaction (claim()).
//   START TRANSACTION; the batch id; @idem_now (the server's clock); @idem_pf (the largest fence a
//   prune removed, under a shared lock of idem_schema); the batch's keys into the session's
//   temporary table idem_gclaim; the keys whose committed row is RELEASED into idem_grel (a
//   consistent read); an UPDATE taking those rows over (fence + 1, PROCESSING, a new lease);
//   INSERT IGNORE ... SELECT of the keys that have no committed row (fence @idem_pf + 1); both
//   mark the rows they write with updated_time = -batch id; the marked rows into idem_gwon; their
//   audit rows; the wins returned; the marks replaced by @idem_now; the durability check; COMMIT.
// Why a claim is decided once. A new key's row is inserted by one transaction only: the primary
// key; a second inserter of the same key waits on the first's uncommitted row, and IGNORE turns it
// away once the first committed (or it inserts, if the first rolled back). A RELEASED row is taken
// over only by an UPDATE that holds its row lock and read it RELEASED: a second batch's UPDATE waits
// for that lock, then reads the row as committed, PROCESSING, and passes it over. Which rows the
// batch won is read back by its mark: updated_time = -batch id is written only by this transaction
// and replaced before it commits, so no other transaction ever reads it, and every row carrying it
// was written by one of the batch's two statements (created_time carries the mark too for a new
// row). Every other key of the batch is a loser, read afterwards in a fresh snapshot (read_rows), as
// on PostgreSQL. IGNORE turns only the duplicate key into a warning here: every other value is
// checked before it is sent (keys of at most 128 bytes, biz_type of at most 32, integers in range),
// and strict mode stays on for every other statement.
// A claim waits only for a row another claim may be taking (a RELEASED row, or a key being inserted),
// never for a row under completion. InnoDB reads a row found by its primary key with a lock and
// waits for it (there is no semi-consistent read for a unique search), so every statement that
// locks reaches only rows chosen by a consistent read first: the RELEASED rows (idem_grel), the
// keys with no committed row, the batch's own marked rows (idem_gwon). A duplicate of a key whose
// completion holds its row is answered by the loser read at once, as on PostgreSQL.
//
// Completion / compensation batch: one round trip (several if the payloads exceed
// max_allowed_packet: the stage rows are then sent ahead, in the same transaction).
//   START TRANSACTION; the batch id; @idem_now; the stage rows into the session's temporary table
//   idem_gstage; SELECT ... FOR UPDATE of the keys' rows in key order (the same order as every
//   other writer: no lock cycle between an owner's completion and another node's compensation);
//   SELECT of the winners: rows PROCESSING with the item's fence (compensation: and a lease passed
//   on @idem_now), under the locks just taken, so the three statements that follow see the same
//   rows; their audit rows; the UPDATE of the same rows; the durability check; COMMIT.
// The lease renewal is the same without batch id and audit rows, and is never probed.
//
// An unanswered commit: my_session.hpp first ends the session that lost its answer (a user lock
// names it), then reads the batch id with a locking read (detail/my/schema.hpp's store does the
// same, mysql_store::committed).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "idem/detail/global/arbiter.hpp"
#include "idem/detail/my/sql.hpp"
#include "idem/detail/rows/audit_detail.hpp"
#include "idem/store_rows.hpp"  // biz_type_of

namespace idem::detail::global::my_sql {

using my::append_literal;

/// The stage tables of claim batches, completion batches and lease renewals (per session). The
/// claim's three hold keys and integers only, so they are MEMORY tables: no undo or redo for the
/// server to write, and not rolled back with the transaction, which nothing needs (each batch
/// empties them before it fills them). The completions' holds payloads (a BLOB, which MEMORY cannot
/// hold) and is InnoDB, rolled back with the transaction.
inline constexpr std::string_view session_stage =
    "CREATE TEMPORARY TABLE IF NOT EXISTS idem_gclaim (c_key VARBINARY(128) NOT NULL PRIMARY KEY, c_biz VARBINARY(32) "
    "NOT NULL, c_fp BIGINT UNSIGNED NOT NULL) ENGINE=MEMORY;"
    "CREATE TEMPORARY TABLE IF NOT EXISTS idem_grel (r_key VARBINARY(128) NOT NULL PRIMARY KEY, r_fp BIGINT UNSIGNED "
    "NOT NULL) ENGINE=MEMORY;"
    "CREATE TEMPORARY TABLE IF NOT EXISTS idem_gwon (w_key VARBINARY(128) NOT NULL PRIMARY KEY) ENGINE=MEMORY;"
    "CREATE TEMPORARY TABLE IF NOT EXISTS idem_gstage ("
    " g_key VARBINARY(128) NOT NULL PRIMARY KEY, g_fence BIGINT UNSIGNED NOT NULL, g_status VARCHAR(16) NOT NULL,"
    " g_outcome BIGINT UNSIGNED NOT NULL, g_detail BLOB NOT NULL, g_payload MEDIUMBLOB NOT NULL,"
    " g_ms BIGINT NOT NULL) ENGINE=InnoDB";

/// What a global session adds to the store's session setup (detail/my/sql.hpp, session_setup):
/// READ COMMITTED; a write transaction left idle (its client lost between the claim's two round
/// trips, or while stage rows were being sent) is ended by the server after `secs`, so its row locks
/// do not outlive the call that took them by the hours of TCP keepalive or wait_timeout; the stage
/// table; and a row with the binary log's state and format (my_session::connect refuses
/// binlog_format=STATEMENT, which cannot log a READ COMMITTED write).
[[nodiscard]] inline std::string session_extra(unsigned secs) {
    return "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;SET SESSION idle_write_transaction_timeout = " +
           std::to_string(secs) + ";" + std::string(session_stage) + ";SELECT @@global.log_bin, @@session.binlog_format";
}
inline constexpr int session_extra_binlog_statement = 6;

/// The index the compensation scan reads (expired claims by lease). MariaDB has no partial index:
/// (status, lease_until) keeps the PROCESSING rows together, in lease order.
inline constexpr std::string_view processing_index =
    "CREATE INDEX IF NOT EXISTS idx_idempotent_record_processing ON idempotent_record (status, lease_until)";

/// `( X'..', X'..', ... )` of `keys`.
inline void append_key_list(std::string& out, std::span<const std::string_view> keys) {
    out += '(';
    for (std::size_t i = 0; i < keys.size(); ++i) {
        if (i > 0) out += ',';
        append_literal(out, keys[i]);
    }
    out += ')';
}

/// The statements that open a batch: the transaction, the batch id, the server's clock.
inline std::string batch_head(std::int64_t batch_id) {
    return "START TRANSACTION;INSERT INTO idempotent_batch (batch_id, committed_time) VALUES (" + std::to_string(batch_id) +
           ", " IDEM_MY_NOW_MS ");SET @idem_now = " IDEM_MY_NOW_MS ";";
}

/// Claim batch: one round trip, one transaction (the header). The statement claim_winners_statement
/// returns the won claims (key, fence, 'ABSENT' or 'RELEASED'); COMMIT is claim_commit_statement.
inline constexpr int claim_winners_statement = 13;
inline constexpr int claim_commit_statement = 16;
inline std::string claim(std::int64_t batch_id, std::span<const global_session::claim_item> items, std::int64_t lease_ms,
                         std::string_view node) {
    const std::string id = std::to_string(batch_id), lease = std::to_string(lease_ms);
    const std::string marker = "-" + id;  // updated_time of this batch's claims until its last statement
    std::string keys;
    for (std::size_t i = 0; i < items.size(); ++i) {
        keys += i == 0 ? '(' : ',';
        append_literal(keys, items[i].k);
    }
    keys += ')';
    std::string q = batch_head(batch_id);  // 0-2
    // 3: the pruned fence under a shared lock: a prune locks idem_schema first (mysql_store::prune),
    // so it either committed before this read (its fence is seen) or waits for this batch to commit
    // (it removes no row this batch could insert again meanwhile): a key claimed again after its
    // record was pruned never gets a fence at or below one its old record had.
    q += "SELECT CAST(COALESCE(MAX(pruned_fence), 0) AS UNSIGNED) INTO @idem_pf FROM idem_schema LOCK IN SHARE MODE;";
    // 4-5: the batch's keys into the session's claim table.
    q += "DELETE FROM idem_gclaim;INSERT INTO idem_gclaim (c_key, c_biz, c_fp) VALUES ";
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) q += ',';
        q += '(';
        append_literal(q, items[i].k);
        q += ',';
        append_literal(q, biz_type_of(items[i].k));  // at most 32 bytes: VARBINARY(32)
        q += ',' + std::to_string(items[i].fp) + ')';
    }
    // 6-7: the keys whose committed row is RELEASED (INSERT ... SELECT reads idempotent_record as a
    // consistent read under READ COMMITTED: no lock, no wait).
    q += ";DELETE FROM idem_grel;INSERT INTO idem_grel (r_key, r_fp) SELECT c.c_key, c.c_fp FROM idem_gclaim c JOIN "
         "idempotent_record r FORCE INDEX (PRIMARY) ON r.idempotent_key = c.c_key WHERE r.status = 'RELEASED';";
    // 8: those rows taken over and marked, each under its row lock (the join reaches them from
    // idem_grel, by the primary key: no other row is locked). A row another claim batch took over
    // meanwhile is waited for, read again as committed (PROCESSING), and passed over.
    q += "UPDATE idem_grel g STRAIGHT_JOIN idempotent_record r FORCE INDEX (PRIMARY) ON r.idempotent_key = g.r_key "
         "SET r.status = 'PROCESSING', r.fencing_token = r.fencing_token + 1, r.lease_until = @idem_now + " +
         lease + ", r.outcome = 0, r.request_fingerprint = g.r_fp, r.updated_time = " + marker +
         ", r.payload = '' WHERE r.status = 'RELEASED';";
    // 9: new rows for the keys without a committed row, marked (created_time too, to tell them
    // apart). The NOT EXISTS read is a consistent read too; a row another transaction inserted and
    // has not committed is invisible to it: the insert waits for that transaction, and IGNORE turns
    // the key away once it committed.
    q += "INSERT IGNORE INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
         "request_fingerprint, created_time, updated_time, payload) SELECT c.c_key, c.c_biz, 'PROCESSING', @idem_pf + 1, "
         "@idem_now + " +
         lease + ", 0, c.c_fp, " + marker + ", " + marker +
         ", '' FROM idem_gclaim c WHERE NOT EXISTS (SELECT 1 FROM idempotent_record r WHERE r.idempotent_key = c.c_key) "
         "ORDER BY c.c_key;";
    // 10-11: the rows this batch marked are exactly its wins (no other transaction can see, or
    // write, a negative updated_time; a consistent read sees this transaction's own rows).
    q += "DELETE FROM idem_gwon;INSERT INTO idem_gwon (w_key) SELECT idempotent_key FROM idempotent_record FORCE INDEX "
         "(PRIMARY) WHERE idempotent_key IN " +
         keys + " AND updated_time = " + marker + ";";
    // 12-13: their audit rows in key order; the wins for the caller.
    const std::string won =
        " FROM idem_gwon w STRAIGHT_JOIN idempotent_record r FORCE INDEX (PRIMARY) ON "
        "r.idempotent_key = w.w_key";
    std::string detail(IDEM_AUDIT_CLAIM_BATCH_PREFIX);
    detail += id;
    q += "INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, detail) "
         "SELECT r.idempotent_key, IF(r.created_time = " +
         marker + ", 'ABSENT', 'RELEASED'), 'PROCESSING', r.fencing_token, ";
    append_literal(q, node);
    q += ", @idem_now, ";
    append_literal(q, detail);
    q += won + " ORDER BY r.idempotent_key;";
    q += "SELECT r.idempotent_key, r.fencing_token, IF(r.created_time = " + marker + ", 'ABSENT', 'RELEASED')" + won + ";";
    // 14: the marks replaced by the server's clock (rows this transaction holds: no wait).
    q += "UPDATE idem_gwon w STRAIGHT_JOIN idempotent_record r FORCE INDEX (PRIMARY) ON r.idempotent_key = w.w_key SET "
         "r.created_time = IF(r.created_time = " +
         marker + ", @idem_now, r.created_time), r.updated_time = @idem_now;";
    q += my::durability_guard;  // 15
    q += ";COMMIT";             // 16
    return q;
}

/// The rows of `keys` (read_rows): key, status, fence, outcome, fingerprint, expired, HEX(payload).
inline std::string read_rows(std::span<const std::string_view> keys) {
    std::string q =
        "SELECT idempotent_key, status, fencing_token, outcome, request_fingerprint, lease_until < " IDEM_MY_NOW_MS
        ", HEX(payload) FROM idempotent_record WHERE idempotent_key IN ";
    append_key_list(q, keys);
    return q;
}

/// The claim audit rows (key, fence) of `keys` with `detail`, written by `node`.
inline std::string claimed_by_us(std::span<const std::string_view> keys, std::string_view detail, std::string_view node) {
    std::string q = "SELECT idempotent_key, fencing_token FROM idempotent_audit WHERE detail = ";
    append_literal(q, detail);
    q += " AND node = ";
    append_literal(q, node);
    q += " AND idempotent_key IN ";
    append_key_list(q, keys);
    return q;
}

/// The audit rows from PROCESSING that `node` wrote for `keys`: key, fence, to_status, detail
/// (completed_before matches them against its items).
inline std::string audit_of_node(std::span<const std::string_view> keys, std::string_view node) {
    std::string q =
        "SELECT idempotent_key, fencing_token, to_status, detail FROM idempotent_audit WHERE "
        "from_status = 'PROCESSING' AND node = ";
    append_literal(q, node);
    q += " AND idempotent_key IN ";
    append_key_list(q, keys);
    return q;
}

/// One stage row of a completion or renewal: (key, fence, status, outcome, detail, payload, ms).
inline std::string stage_row(std::string_view k, std::uint64_t fence, std::string_view status, std::uint64_t outcome,
                             std::string_view detail, std::string_view payload, std::int64_t ms) {
    std::string r = "(";
    append_literal(r, k);
    r += ',' + std::to_string(fence) + ",'";
    r += status;  // status_text(): letters only
    r += "'," + std::to_string(outcome) + ',';
    append_literal(r, detail);
    r += ',';
    append_literal(r, payload);
    r += ',' + std::to_string(ms) + ')';
    return r;
}
inline constexpr std::string_view stage_insert =
    "INSERT INTO idem_gstage (g_key, g_fence, g_status, g_outcome, g_detail, g_payload, g_ms) VALUES ";

/// The rows an item of the stage wins: PROCESSING with its fence (compensation: and expired). The
/// record side is bounded by the batch's keys (`keys`, all locked by the batch), and every
/// statement reads idempotent_record through its primary key (FORCE INDEX): a multi-table UPDATE
/// has no semi-consistent read, so a plan through the (status, lease_until) index would wait for
/// the locked PROCESSING rows of other keys (and deadlock with their batches).
inline std::string stage_condition(std::span<const std::string_view> keys, bool compensation) {
    std::string c = "r.idempotent_key IN ";
    append_key_list(c, keys);
    c += " AND r.fencing_token = g.g_fence AND r.status = 'PROCESSING'";
    if (compensation) c += " AND r.lease_until < @idem_now";
    return c;
}

/// The locking read of `keys` in key order (the rows are returned and ignored).
inline std::string lock_keys(std::span<const std::string_view> keys) {
    std::string q = "SELECT idempotent_key FROM idempotent_record FORCE INDEX (PRIMARY) WHERE idempotent_key IN ";
    append_key_list(q, keys);
    q += " ORDER BY idempotent_key FOR UPDATE";
    return q;
}

/// The statements after the stage rows of a completion batch: lock, winners (statement 1 of this
/// tail returns them), audit, update, durability check, COMMIT.
inline constexpr int complete_winners_in_tail = 1;
inline constexpr int complete_commit_in_tail = 5;  // lock, winners, audit, update, durability check, COMMIT
inline constexpr int extend_commit_in_tail = 3;    // lock, renewed, update, COMMIT
inline std::string complete_tail(std::span<const std::string_view> keys, std::string_view node, bool compensation) {
    const std::string cond = stage_condition(keys, compensation);
    std::string n;
    append_literal(n, node);
    std::string q = lock_keys(keys) + ";";
    q += "SELECT g.g_key FROM idem_gstage g JOIN idempotent_record r FORCE INDEX (PRIMARY) ON r.idempotent_key = g.g_key "
         "WHERE " +
         cond + " ORDER BY g.g_key;";
    q += "INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, detail) "
         "SELECT g.g_key, 'PROCESSING', g.g_status, g.g_fence, " +
         n +
         ", @idem_now, g.g_detail FROM idem_gstage g JOIN idempotent_record r FORCE INDEX (PRIMARY) ON "
         "r.idempotent_key = g.g_key WHERE " +
         cond + " ORDER BY g.g_key;";
    q += "UPDATE idempotent_record r FORCE INDEX (PRIMARY) JOIN idem_gstage g ON r.idempotent_key = g.g_key SET "
         "r.status = g.g_status, "
         "r.outcome = g.g_outcome, r.payload = g.g_payload, r.updated_time = @idem_now WHERE " +
         cond + ";";
    q += my::durability_guard;
    q += ";COMMIT";
    return q;
}

/// The lease renewal after its stage rows: lock, the renewed keys (statement 1), update, COMMIT.
inline std::string extend_tail(std::span<const std::string_view> keys) {
    const std::string cond = stage_condition(keys, false);
    std::string q = lock_keys(keys) + ";";
    q += "SELECT g.g_key FROM idem_gstage g JOIN idempotent_record r FORCE INDEX (PRIMARY) ON r.idempotent_key = g.g_key "
         "WHERE " +
         cond + " ORDER BY g.g_key;";
    q += "UPDATE idempotent_record r FORCE INDEX (PRIMARY) JOIN idem_gstage g ON r.idempotent_key = g.g_key SET "
         "r.lease_until = @idem_now + "
         "g.g_ms WHERE " +
         cond + ";COMMIT";
    return q;
}

/// Expired claims, oldest lease first.
inline std::string expired(std::size_t limit) {
    return "SELECT idempotent_key, fencing_token, request_fingerprint FROM idempotent_record WHERE status = "
           "'PROCESSING' AND lease_until < " IDEM_MY_NOW_MS " ORDER BY lease_until LIMIT " +
           std::to_string(limit);
}

}  // namespace idem::detail::global::my_sql
