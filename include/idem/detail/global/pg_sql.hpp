// idem/detail/global/pg_sql.hpp: the SQL of scope::global (global_guard.hpp), on the schema of
// detail/pg/sql.hpp.
//
// What a statement may use. The claim path must run unchanged on PostgreSQL-compatible distributed
// databases (CockroachDB, YugabyteDB, Citus), so it uses only: INSERT ... ON CONFLICT DO NOTHING
// RETURNING, UPDATE ... FROM unnest(...) RETURNING, data-modifying CTEs, = ANY(array), and
// statement_timestamp(); with ordered versions also INSERT ... ON CONFLICT DO UPDATE ... WHERE
// RETURNING and array_agg. No advisory lock, no LISTEN/NOTIFY, no SELECT ... FOR UPDATE SKIP LOCKED,
// no sequence other than the audit table's BIGSERIAL, no temporary table.
//
// Every batch is one autocommit statement (one round trip, its own transaction) that also inserts a
// random batch id into idempotent_batch. A statement whose answer is lost is resolved with
// `batch_committed` (the speculative insert of detail/pg/sql.hpp's `committed`): it waits for a
// session that still holds the id uncommitted, and returns no row exactly when the batch committed.
// For that wait to be exact the batch row must be written BEFORE anything else of the statement
// (PostgreSQL runs an unreferenced data-modifying CTE after the main query: the old session could be
// blocked on a row lock, batch row not yet written, while the probe concludes "not committed").
// So every part of a batch statement that reads or locks idempotent_record gets there through the
// batch CTE `b`: the row set `u` joins b, and so does the key-order lock CTE `lk` of the completion
// statement (a row lock is taken only on a row the join emitted, which needs b's row): no key is
// touched before b's row (and its primary-key entry) exists. The one case left is a statement the
// server has not read at all when the probe runs; the probe runs after the call deadline (seconds),
// on a new connection. (The lease renewal is not a batch: it has no batch id and is never probed.)
//
// Time. lease_until, created_time, updated_time and at_time are the SERVER's clock (Unix ms), so
// machines with skewed clocks still agree on when a lease expired. `now_ms` is the statement's start.
//
// Linearization. A claim of key K linearizes at the row lock its INSERT (new row) or UPDATE
// (RELEASED row) takes; a completion, compensation or lease renewal at its fenced UPDATE. Under READ
// COMMITTED an UPDATE that waited for another transaction's lock re-evaluates its WHERE on the
// committed row version, so `status = 'PROCESSING' AND fencing_token = f` decides exactly one winner.
// Each audit row is written by the same statement, after the row lock (the audit CTE reads the
// RETURNING rows), so a key's audit sequence numbers follow its transitions.
#pragma once

#include <string>
#include <string_view>

#include "idem/detail/rows/audit_detail.hpp"  // IDEM_AUDIT_CLAIM_BATCH_PREFIX: a claim's audit detail

namespace idem::detail::global::sql {

/// Unix milliseconds on the server, at the start of the statement.
#define IDEM_GSQL_NOW "((extract(epoch FROM statement_timestamp()) * 1000)::bigint)"

// A fenced UPDATE by key tests the row's status as `(r.status || '') = 'PROCESSING'`: the same
// truth as `r.status = 'PROCESSING'` (status is NOT NULL), written so that PostgreSQL cannot prove
// the partial index below applies. With the plain test the planner reached the keys of a completion
// or a lease renewal by scanning that whole index (it holds the claims in flight, so its statistics
// say it is tiny) and filtering by key: every index entry of every claim since the last vacuum (a
// completion leaves its claim's entry behind, dead), read per batch, so a batch's cost grew with
// the claims made before it. Measured with idem-global-bench's server counters (docs/benchmarks.md,
// "Global scope"); the keys are now reached through the primary key, as the claim statements are.
#define IDEM_GSQL_IS_PROCESSING "(r.status || '') = 'PROCESSING'"

// Expired claims are looked up by this partial index (compensation runs every second on every node).
// Created when a global guard opens; CREATE INDEX IF NOT EXISTS is retried once if two openers race.
inline constexpr std::string_view processing_index =
    "CREATE INDEX IF NOT EXISTS idx_idempotent_record_processing ON idempotent_record (lease_until) "
    "WHERE status = 'PROCESSING'";

// The batch row, first in every batch statement (`b`; the header says why everything else reaches
// the keys through it). $1 batch id.
#define IDEM_GSQL_BATCH_CTE                                                                             \
    "WITH b AS (\n  INSERT INTO idempotent_batch (batch_id, committed_time) VALUES ($1, " IDEM_GSQL_NOW \
    ") RETURNING batch_id\n)"

/// Claim batch, statement 1, from the part that names the keys to claim: `claimable` is the CTEs
/// after b (each starting ", name AS (", reaching the keys through b) and `from` the one of them
/// whose rows (k, biz, fp, n) are claimed. What follows is the same for `claim` and
/// `claim_ordered`, so it is written once here: the INSERT of new keys, the UPDATE of RELEASED
/// ones, the winners' audit rows, and the winners returned (key, fence, from).
inline std::string claim_statement(std::string_view claimable, std::string_view from) {
    static constexpr std::string_view tail = R"sql(, ins AS (
  INSERT INTO idempotent_record AS r (idempotent_key, biz_type, status, fencing_token, lease_until, outcome,
                                      request_fingerprint, created_time, updated_time)
  SELECT c.k, c.biz, 'PROCESSING', pf.f + 1, )sql" IDEM_GSQL_NOW R"sql( + $5, 0, c.fp, )sql" IDEM_GSQL_NOW
                                             R"sql(, )sql" IDEM_GSQL_NOW R"sql(
  FROM {claimable} AS c, (SELECT COALESCE(max(pruned_fence), 0) AS f FROM idem_schema) AS pf ORDER BY c.n
  ON CONFLICT (idempotent_key) DO NOTHING
  RETURNING r.idempotent_key AS k, r.fencing_token AS f, 'ABSENT'::text AS fr
), re AS (
  UPDATE idempotent_record AS r
     SET status = 'PROCESSING', fencing_token = r.fencing_token + 1, lease_until = )sql" IDEM_GSQL_NOW R"sql( + $5,
         outcome = 0, request_fingerprint = c.fp, updated_time = )sql" IDEM_GSQL_NOW R"sql(, payload = ''::bytea
    FROM {claimable} AS c
   WHERE r.idempotent_key = c.k AND r.status = 'RELEASED'
  RETURNING r.idempotent_key AS k, r.fencing_token AS f, 'RELEASED'::text AS fr
), won AS (
  SELECT k, f, fr FROM ins UNION ALL SELECT k, f, fr FROM re
), aud AS (
  INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, detail)
  SELECT won.k, won.fr, 'PROCESSING', won.f, $6, )sql" IDEM_GSQL_NOW R"sql(, ')sql" IDEM_AUDIT_CLAIM_BATCH_PREFIX
                                             R"sql(' || $1::text
  FROM won ORDER BY won.k
)
SELECT k, f, fr FROM won
)sql";
    static constexpr std::string_view slot = "{claimable}";
    std::string s = "\n" IDEM_GSQL_BATCH_CTE;
    s += claimable;
    std::size_t done = 0;
    for (std::size_t at = tail.find(slot); at != std::string_view::npos; at = tail.find(slot, done)) {
        s.append(tail.substr(done, at - done)).append(from);
        done = at + slot.size();
    }
    s.append(tail.substr(done));
    return s;
}

// Claim batch, statement 1. $1 batch id; $2 keys (sorted), $3 biz_types, $4 fingerprints;
// $5 lease (ms); $6 node. Returns (key, fence, from) for every claim this batch won: new rows (fence
// 1 above the largest fence a prune removed, so a key claimed again after its record was pruned
// still gets a fence above its old ones; 1 on a store never pruned; from ABSENT) and RELEASED rows
// taken again (fence + 1, from RELEASED; payload reset to '', so a key claimed again never replays
// the bytes of an earlier completion: a RELEASED row has none today, the reset keeps it so). Keys
// whose row exists in another state are losers; statement 2 reads them. The audit detail of a claim
// is "claim outcome=0 batch=<batch id>" (the batch id tells an unanswered commit's claims apart;
// detail/rows/audit_detail.hpp formats and parses it, claim_batch_prefix).
// The keys to claim are `u`: every key of the batch.
inline constexpr std::string_view claim_name = "idem_g_claim";
inline const std::string claim = claim_statement(R"sql(, u AS (
  SELECT u.* FROM b, unnest($2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY AS u(k, biz, fp, n)
))sql",
                                                 "u");

// Ordered versions (options.ordered_versions; none of this SQL runs, and the table is not created,
// when the option is off). The newest version claimed of each (txid, operation) of a key
// "TXID_OPERATION_vN" (key::split) is one row of idempotent_version, keyed by "TXID_OPERATION" (the
// parts hold no '_', so the text names the pair). Created when a global guard with the option opens.
// Never pruned: a record past the window is new again, but its version still orders the pair's
// later claims (one small row per pair ever claimed; an operator may delete rows of pairs that are
// finished for good).
inline constexpr std::string_view version_table =
    "CREATE TABLE IF NOT EXISTS idempotent_version (txid_op TEXT PRIMARY KEY, version BIGINT NOT NULL, "
    "updated_time BIGINT NOT NULL)";

// Claim batch, statement 1, ordered. The parameters of `claim` plus $7 the keys' "TXID_OPERATION"
// ('' for a key that does not split: claimed as by `claim`) and $8 their versions (0 for those). The
// caller sends at most one key per pair in a batch: the highest version (ON CONFLICT cannot update a
// row twice in one statement); a lower one of the same batch is answered after it, as the sequential
// order "highest first" would (superseded by it, or its usual answer when its record exists).
//
// How a claim is refused. `vc` keeps the ordered keys whose record is absent or RELEASED in the
// statement's snapshot (the claims that would be granted: a duplicate of a live or decided record
// keeps its usual answer and takes no version lock). `ver` is a conditional upsert of their pairs,
// in pair order: it locks the pair's row (a new one: the primary key's insertion wait) and raises it
// to the key's version only when that is not lower. Only the keys it returned, and the keys that do
// not split, reach `ins` / `re` (they are `ok`, the rows claim_statement claims): a refused key
// claims nothing, a granted one raised its pair with its claim, in one transaction. `g` aggregates
// `ver`, so every version row is locked before any record row is touched (no lock cycle with
// another batch, or a completion, which lock record rows in key order). `vc` reaches the keys
// through `b` like `u` (the header's probe rule).
//
// Why a lower version never runs after a higher one was claimed: each granted claim of a pair holds
// the pair's version row locked from its check until its commit, and leaves it at its version. A
// claim of v < N, checked after N's claim committed, reads N (READ COMMITTED re-reads the row it
// waited for) and is refused; one checked before holds the row lock, so N's claim waits for it: the
// lower one committed first. The version row only rises, and is never deleted by idem (prune keeps
// it), so this holds across restarts of any node. A version raised by a claim whose record then
// conflicted (another node inserted the same key meanwhile, under the same version lock, so with the
// same version) or that was withdrawn (its caller gave up; released again) was claimed all the same.
inline constexpr std::string_view claim_ordered_name = "idem_g_claim_ordered";
inline const std::string claim_ordered = claim_statement(R"sql(, u AS (
  SELECT u.* FROM b, unnest($2::text[], $3::text[], $4::bigint[], $7::text[], $8::bigint[]) WITH ORDINALITY AS u(k, biz, fp, p, v, n)
), vc AS (
  SELECT u.p, u.v FROM u
   WHERE u.p <> '' AND NOT EXISTS (SELECT 1 FROM idempotent_record AS r
                                    WHERE r.idempotent_key = u.k AND r.status <> 'RELEASED')
), ver AS (
  INSERT INTO idempotent_version AS iv (txid_op, version, updated_time)
  SELECT vc.p, vc.v, )sql" IDEM_GSQL_NOW R"sql( FROM vc ORDER BY vc.p
  ON CONFLICT (txid_op) DO UPDATE SET version = EXCLUDED.version, updated_time = EXCLUDED.updated_time
   WHERE iv.version <= EXCLUDED.version
  RETURNING iv.txid_op AS p
), g AS MATERIALIZED (
  SELECT COALESCE(array_agg(ver.p), ARRAY[]::text[]) AS granted FROM ver
), ok AS MATERIALIZED (
  SELECT u.k, u.biz, u.fp, u.n FROM u CROSS JOIN g WHERE u.p = '' OR u.p = ANY(g.granted)
))sql",
                                                         "ok");

// Claim batch, statement 2, ordered: read_rows's columns for every key of $1 (status NULL: no
// record), plus the newest version of its pair $2 (0: none, or the key does not split). One
// snapshot: a key whose record is absent or RELEASED while its pair is at a higher version is
// superseded at that instant.
inline constexpr std::string_view read_rows_ordered_name = "idem_g_read_ordered";
inline const std::string read_rows_ordered =
    "SELECT u.k, r.status, r.fencing_token, r.outcome, r.request_fingerprint, r.lease_until < " IDEM_GSQL_NOW
    ", COALESCE(v.version, 0), encode(r.payload, 'hex') FROM unnest($1::text[], $2::text[]) AS u(k, p) "
    "LEFT JOIN idempotent_record AS r ON r.idempotent_key = u.k LEFT JOIN idempotent_version AS v ON v.txid_op = u.p";

// Claim batch, statement 2 (only when some key lost): the winners' rows as committed now. A fresh
// READ COMMITTED snapshot, so a row whose insert made ours conflict is visible. The payload comes
// hex-encoded, as postgres_store reads it (pg::from_hex on the client).
inline constexpr std::string_view read_rows_name = "idem_g_read";
inline const std::string read_rows =
    "SELECT idempotent_key, status, fencing_token, outcome, request_fingerprint, lease_until < " IDEM_GSQL_NOW
    ", encode(payload, 'hex') FROM idempotent_record WHERE idempotent_key = ANY($1::text[])";

// After a claim batch whose commit went unanswered turned out to have committed: which of its keys
// it won (the RETURNING rows died with the connection). The claim statement wrote one audit row per
// won key whose detail names the batch id. $1 keys, $2 that detail, $3 node.
inline constexpr std::string_view claimed_by_us_name = "idem_g_claimed_by_us";
inline constexpr std::string_view claimed_by_us = R"sql(
SELECT a.idempotent_key, a.fencing_token FROM idempotent_audit a
 WHERE a.idempotent_key = ANY($1::text[]) AND a.detail = $2 AND a.node = $3
)sql";

// Completion and compensation batch. $1 batch id; $2 keys (sorted, each once), $3 fences, $4 new
// status, $5 outcomes, $6 audit details; $7 node; $8 true for compensation: the lease must have
// expired (re-checked under the row lock: the owner may have renewed it since the scan); $9 the
// payloads, hex-encoded as postgres_store writes them ('' for none: compensations, failures,
// releases, doubt marks), written by the same fenced UPDATE as the state.
// A doubt mark is the same statement with status PROCESSING (an audited no-op on the record).
// Returns the keys whose fenced UPDATE won. The rows are locked first, in key order (`lk`, which
// joins b like `u`: see the header): the UPDATE's join would lock them in whatever order its plan
// reads them, and an owner's completion and another node's compensation of overlapping keys could
// then deadlock (PostgreSQL breaks that after deadlock_timeout, 1 s by default; the batch is
// retried, but the batch's callers wait).
inline constexpr std::string_view complete_name = "idem_g_complete";
inline const std::string complete = "\n" IDEM_GSQL_BATCH_CTE R"sql(, u AS (
  SELECT u.* FROM b, unnest($2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[], $9::text[]) AS u(k, f, st, oc, d, p)
), lk AS MATERIALIZED (
  SELECT r.idempotent_key AS k FROM b CROSS JOIN idempotent_record AS r
   WHERE r.idempotent_key = ANY($2::text[]) ORDER BY r.idempotent_key FOR UPDATE OF r
), upd AS (
  UPDATE idempotent_record AS r
     SET status = u.st, outcome = u.oc, payload = decode(u.p, 'hex'), updated_time = )sql" IDEM_GSQL_NOW R"sql(
    FROM u JOIN lk ON lk.k = u.k
   WHERE r.idempotent_key = u.k AND r.fencing_token = u.f AND )sql" IDEM_GSQL_IS_PROCESSING R"sql(
     AND (NOT $8::boolean OR r.lease_until < )sql" IDEM_GSQL_NOW R"sql()
  RETURNING r.idempotent_key AS k, r.fencing_token AS f, u.st AS st, u.d AS d
), aud AS (
  INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, detail)
  SELECT upd.k, 'PROCESSING', upd.st, upd.f, $7, )sql" IDEM_GSQL_NOW R"sql(, upd.d FROM upd ORDER BY upd.k
)
SELECT k FROM upd
)sql";

// A completion that lost its fenced UPDATE may have won an earlier attempt whose acknowledgement
// was lost (a caller retrying after store_unavailable): that attempt left an audit row with this
// node, fence, target status and detail. $1 keys, $2 fences, $3 statuses, $4 details, $5 node.
inline constexpr std::string_view completed_before_name = "idem_g_done_before";
inline constexpr std::string_view completed_before = R"sql(
SELECT u.k FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS u(k, f, st, d)
 WHERE EXISTS (SELECT 1 FROM idempotent_audit a
                WHERE a.idempotent_key = u.k AND a.fencing_token = u.f AND a.from_status = 'PROCESSING'
                  AND a.to_status = u.st AND a.detail = u.d AND a.node = $5)
)sql";

// Lease renewal: $1 keys, $2 fences, $3 lease (ms from now). Not a transition: no audit row. Rows
// locked in key order first, as for completions.
inline constexpr std::string_view extend_name = "idem_g_extend";
inline const std::string extend = R"sql(
WITH lk AS MATERIALIZED (
  SELECT r.idempotent_key AS k FROM idempotent_record AS r
   WHERE r.idempotent_key = ANY($1::text[]) ORDER BY r.idempotent_key FOR UPDATE
)
UPDATE idempotent_record AS r SET lease_until = )sql" IDEM_GSQL_NOW R"sql( + u.ms
  FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(k, f, ms) JOIN lk ON lk.k = u.k
 WHERE r.idempotent_key = u.k AND r.fencing_token = u.f AND )sql" IDEM_GSQL_IS_PROCESSING R"sql(
RETURNING r.idempotent_key
)sql";

// Compensation scan: expired claims, oldest lease first. $1 limit.
inline constexpr std::string_view expired_name = "idem_g_expired";
inline const std::string expired =
    "SELECT idempotent_key, fencing_token, request_fingerprint FROM idempotent_record "
    "WHERE status = 'PROCESSING' AND lease_until < " IDEM_GSQL_NOW " ORDER BY lease_until LIMIT $1";

// Batch id of a batch whose COMMIT went unanswered: no row returned = it committed (run in a
// transaction that is rolled back).
inline constexpr std::string_view batch_committed_name = "idem_g_committed";
inline constexpr std::string_view batch_committed =
    "INSERT INTO idempotent_batch (batch_id, committed_time) VALUES ($1, 0) ON CONFLICT (batch_id) DO NOTHING "
    "RETURNING 1";
// A batch found committed, confirmed by a write of the prober's own that it commits: its commit waits
// for a synchronous standby, and covers the batch's (detail/pg/sql.hpp, committed_barrier).
inline constexpr std::string_view batch_committed_barrier_name = "idem_g_committed_barrier";
inline constexpr std::string_view batch_committed_barrier =
    "UPDATE idempotent_batch SET committed_time = committed_time WHERE batch_id = $1";

#undef IDEM_GSQL_BATCH_CTE
#undef IDEM_GSQL_IS_PROCESSING
#undef IDEM_GSQL_NOW

}  // namespace idem::detail::global::sql
