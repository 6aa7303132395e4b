// idem/detail/global/my_sql.hpp: the SQL of scope::global on a MySQL-family arbiter (MariaDB 10.5 or
// later: INSERT ... RETURNING), on the schema of detail/my/schema.hpp. my_session.hpp sends it.
//
// MariaDB has no data-modifying CTE and no UPDATE ... RETURNING, so a batch is not one statement
// as on PostgreSQL (pg_sql.hpp) but one transaction of several statements, sent as multi-statement
// queries (detail/my/connection.hpp). Values travel as hex literals (X'...') and integers the
// session formatted itself, as in the store (detail/my/sql.hpp). The sessions run READ COMMITTED:
// a locking read or an UPDATE that waited for another transaction's row lock reads the row as that
// transaction committed it, and a plain read sees the latest committed rows (and this transaction's
// own changes).
//
// Claim batch: two round trips, one transaction.
//   1. START TRANSACTION; the batch id; @idem_now (the server's clock) and @idem_pf (the largest
//      fence a prune removed, under a shared lock of idem_schema); SELECT ... FOR UPDATE of the
//      batch's keys whose row is RELEASED, in key order; INSERT IGNORE ... RETURNING of every key
//      of the batch as a new PROCESSING row (fence @idem_pf + 1).
//   2. The UPDATE of exactly the RELEASED rows the locking read returned (fence + 1, PROCESSING, a
//      new lease, payload ''), re-checked with status = 'RELEASED'; the winners' audit rows in key
//      order; the durability check; COMMIT.
// Why a claim is decided once. A new key's row is inserted by one transaction only: the primary
// key; a second inserter of the same key waits on the first's uncommitted row, and is turned away by
// IGNORE once it committed (or inserts, if it rolled back). RETURNING gives the rows this statement
// inserted, not the ones the key turned away. A RELEASED row is taken only under the row lock of
// the locking read, which a second batch waits for and then re-reads as PROCESSING (READ COMMITTED),
// so it is not in that batch's list. Every other key of the batch is a loser, read afterwards in a
// fresh snapshot (read_rows), as on PostgreSQL. IGNORE turns only the duplicate key into a warning
// here: every other value is checked before it is sent (keys of at most 128 bytes, biz_type of at
// most 32, integers in range), and the session's strict mode stays on for every other statement.
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

namespace idem::detail::global::my_sql {

using my::append_literal;

/// The stage table of completion batches and lease renewals (per session, rolled back with the
/// transaction).
inline constexpr std::string_view session_stage =
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
inline constexpr int session_extra_binlog_statement = 3;

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

/// Claim batch, round trip 1 (the header). Statement 4 returns the locked RELEASED rows (key,
/// fence), statement 5 the inserted rows (key, fence).
inline constexpr int claim_released_statement = 4;
inline constexpr int claim_inserted_statement = 5;
inline std::string claim_first(std::int64_t batch_id, std::span<const global_session::claim_item> items,
                               std::int64_t lease_ms) {
    std::string keys;
    for (std::size_t i = 0; i < items.size(); ++i) {
        keys += i == 0 ? '(' : ',';
        append_literal(keys, items[i].k);
    }
    keys += ')';
    std::string q = batch_head(batch_id);
    // The pruned fence under a shared lock: a prune locks idem_schema first (mysql_store::prune), so
    // it either committed before this read (its fence is seen) or waits for this batch to commit
    // (it removes no row this batch could insert again meanwhile): a key claimed again after its
    // record was pruned never gets a fence at or below one its old record had.
    q += "SELECT CAST(COALESCE(MAX(pruned_fence), 0) AS UNSIGNED) INTO @idem_pf FROM idem_schema LOCK IN SHARE MODE;";
    // The RELEASED rows first, locked in key order through the primary key (FORCE INDEX: a plan
    // through the (status, lease_until) index would lock them in lease order), before any insert
    // takes a lock. The inserts then lock the other keys in key order too; a cycle with another
    // writer is still possible (this batch holds a RELEASED row above a key a completion holds),
    // and is broken by InnoDB at once: the victim's batch is retried (transient), nothing decided.
    q += "SELECT idempotent_key, fencing_token FROM idempotent_record FORCE INDEX (PRIMARY) WHERE status = 'RELEASED' "
         "AND idempotent_key IN ";
    q += keys;
    q += " ORDER BY idempotent_key FOR UPDATE;";
    q += "INSERT IGNORE INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
         "request_fingerprint, created_time, updated_time, payload) VALUES ";
    const std::string lease = std::to_string(lease_ms);
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) q += ',';
        q += '(';
        append_literal(q, items[i].k);
        q += ',';
        append_literal(q, items[i].biz);
        q += ",'PROCESSING',@idem_pf + 1,@idem_now + " + lease + ",0," + std::to_string(items[i].fp) +
             ",@idem_now,@idem_now,'')";
    }
    q += " RETURNING idempotent_key, fencing_token";
    return q;
}

/// A won claim for the second round trip: its key, fingerprint, fence, and the state it came from.
struct won_claim {
    std::string_view k;
    std::uint64_t fp;
    std::uint64_t fence;  ///< the new fence (a RELEASED row: its fence + 1)
    bool released;
};

/// Claim batch, round trip 2: the takeover of `won`'s RELEASED rows, every winner's audit row (in key
/// order: `won` is sorted), the durability check, COMMIT.
inline std::string claim_second(std::int64_t batch_id, std::span<const won_claim> won, std::int64_t lease_ms,
                                std::string_view node) {
    std::string q;
    std::string keys, fps;
    for (const won_claim& w : won) {
        if (!w.released) continue;
        keys += keys.empty() ? '(' : ',';
        append_literal(keys, w.k);
        fps += " WHEN ";
        append_literal(fps, w.k);
        fps += " THEN " + std::to_string(w.fp);
    }
    if (!keys.empty()) {
        keys += ')';
        q += "UPDATE idempotent_record FORCE INDEX (PRIMARY) SET status = 'PROCESSING', fencing_token = fencing_token + "
             "1, lease_until = "
             "@idem_now + " +
             std::to_string(lease_ms) + ", outcome = 0, request_fingerprint = CASE idempotent_key" + fps +
             " END, updated_time = @idem_now, payload = '' WHERE status = 'RELEASED' AND idempotent_key IN " + keys + ";";
    }
    if (!won.empty()) {
        std::string detail(IDEM_AUDIT_CLAIM_BATCH_PREFIX);
        detail += std::to_string(batch_id);
        std::string d, n;
        append_literal(d, detail);
        append_literal(n, node);
        q += "INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, "
             "detail) VALUES ";
        for (std::size_t i = 0; i < won.size(); ++i) {
            if (i > 0) q += ',';
            q += '(';
            append_literal(q, won[i].k);
            q += won[i].released ? ",'RELEASED'" : ",'ABSENT'";
            q += ",'PROCESSING'," + std::to_string(won[i].fence) + ',' + n + ",@idem_now," + d + ')';
        }
        q += ';';
    }
    q += my::durability_guard;
    q += ";COMMIT";
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
