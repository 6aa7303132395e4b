// idem/detail/pg/retention.hpp: pruning the PostgreSQL store (postgres_store::prune, horizon): the
// statements and the transaction that runs them.
//
// Invariants
//   * One prune call is one short transaction: at most limits.max_rows records and as many audit
//     rows, so it never holds the writer for long; `more` says a bound still has rows past it.
//   * A PROCESSING record is never pruned, nor a record a concurrent batch updated meanwhile (the
//     DELETE repeats the bound, and READ COMMITTED re-checks the updated row).
//   * Audit rows go as a prefix of the table in sequence order, deleted as one range of its primary
//     key (docs/stores.md, "Pruning", says why not partitions); a row of a batch still uncommitted
//     is invisible and newer than any bound.
//   * The horizon only moves forward (GREATEST), and the largest pruned fence is kept
//     (idem_schema.pruned_fence), so max_fence() never goes back and a pruned key's next claim
//     still gets a higher fence.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <pqxx/pqxx>

#include "idem/store.hpp"

namespace idem::detail::pg {

// prune(). One transaction: prune_records, prune_more_records, prune_audit_head, prune_audit,
// prune_horizon (each only when its bound is set). Records: the oldest first by the updated_time
// index; the outer WHERE repeats the bound so that a row a concurrent batch updates meanwhile
// (READ COMMITTED re-checks the updated row) is kept. Answers the count and the largest fence
// (sign-flipped, NULL when none). $1 bound, $2 limit.
inline constexpr std::string_view prune_records = R"sql(
WITH gone AS (
  DELETE FROM idempotent_record r
  WHERE r.idempotent_key IN (SELECT idempotent_key FROM idempotent_record
                             WHERE updated_time < $1 AND status <> 'PROCESSING' ORDER BY updated_time LIMIT $2)
    AND r.updated_time < $1 AND r.status <> 'PROCESSING'
  RETURNING r.fencing_token
)
SELECT count(*), max(fencing_token # (-9223372036854775808)::bigint) FROM gone
)sql";
inline constexpr std::string_view prune_more_records =
    "SELECT EXISTS (SELECT 1 FROM idempotent_record WHERE updated_time < $1 AND status <> 'PROCESSING')";
// Audit rows: the head of the table in sequence order ($1 rows: the limit + 1); the client finds
// where the prefix older than the bound ends, and prune_audit deletes it as one range of the
// primary key. (A row of a batch still uncommitted is invisible here and newer than any bound.)
inline constexpr std::string_view prune_audit_head =
    "SELECT sequence, at_time FROM idempotent_audit ORDER BY sequence LIMIT $1";
inline constexpr std::string_view prune_audit = "DELETE FROM idempotent_audit WHERE sequence <= $1";
// $1 records bound, $2 audit bound (NULL: unchanged; GREATEST ignores NULL, so the horizon only
// moves forward), $3 the largest pruned fence (NULL: none).
inline constexpr std::string_view prune_horizon =
    "UPDATE idem_schema SET records_horizon = GREATEST(records_horizon, $1::bigint), "
    "audit_horizon = GREATEST(audit_horizon, $2::bigint), pruned_fence = GREATEST(pruned_fence, $3::bigint)";
inline constexpr std::string_view horizon = "SELECT records_horizon, audit_horizon FROM idem_schema";

/// One prune call inside `w` (the caller commits it). `step` is set to the step under way, for the
/// caller's messages.
[[nodiscard]] inline prune_result prune_in(pqxx::work& w, const prune_limits& limits, std::string& step) {
    prune_result out;
    const auto limit = static_cast<std::int64_t>(std::min<std::size_t>(limits.max_rows, INT64_MAX - 1));
    auto bound = [](std::int64_t v) { return v == prune_limits::keep_all ? std::optional<std::int64_t>() : v; };
    std::optional<std::int64_t> fence;
    if (limits.records_before_ms != prune_limits::keep_all) {
        step = "delete expired records";
        const auto r = w.exec_params(std::string(prune_records), limits.records_before_ms, limit);
        out.records = r[0][0].as<std::size_t>();
        if (!r[0][1].is_null())  // undo the sign-bit flip
            fence = static_cast<std::int64_t>(static_cast<std::uint64_t>(r[0][1].as<std::int64_t>()) ^
                                              (std::uint64_t{1} << 63));
        step = "look for more expired records";
        out.more = w.exec_params(std::string(prune_more_records), limits.records_before_ms)[0][0].as<bool>();
    }
    if (limits.audit_before_ms != prune_limits::keep_all) {
        step = "read the head of the audit table";
        const auto head = w.exec_params(std::string(prune_audit_head), limit + 1);
        std::int64_t last = 0;
        for (const auto& row : head) {
            if (row[1].as<std::int64_t>() >= limits.audit_before_ms) break;
            if (out.audit_rows == limits.max_rows) {
                out.more = true;
                break;
            }
            last = row[0].as<std::int64_t>();
            ++out.audit_rows;
        }
        if (last != 0) {
            step = "delete expired audit rows";
            w.exec_params(std::string(prune_audit), last);
        }
    }
    step = "write the prune horizon";
    w.exec_params(std::string(prune_horizon), bound(limits.records_before_ms), bound(limits.audit_before_ms), fence);
    return out;
}

/// The horizon as idem_schema holds it (keep_all where never pruned).
[[nodiscard]] inline idem::prune_horizon read_horizon(pqxx::transaction_base& t) {
    idem::prune_horizon h;
    const auto r = t.exec(std::string(horizon));
    if (r.empty()) return h;
    if (!r[0][0].is_null()) h.records_ms = r[0][0].as<std::int64_t>();
    if (!r[0][1].is_null()) h.audit_ms = r[0][1].as<std::int64_t>();
    return h;
}

}  // namespace idem::detail::pg
