// idem/detail/my/sql.hpp: the SQL text the MySQL/MariaDB store sends: the session's setup, how a
// batch is written in one round trip, and the reads (whose rows rows::text_decoder decodes).
//
// How a batch is written. One text query of several statements (CLIENT_MULTI_STATEMENTS), so a
// typical batch costs one round trip, COMMIT included:
//
//   START TRANSACTION;
//   INSERT INTO idempotent_batch ...;                        -- the batch id: commits once
//   INSERT INTO idempotent_audit ... VALUES (...), ...;      -- one audit row per row, in order
//   INSERT INTO idempotent_record ... VALUES (...), ...
//     ON DUPLICATE KEY UPDATE ...;                           -- the fence-guarded upsert of the keys
//                                                           -- claimed in this batch (one folded row each)
//   INSERT INTO idempotent_record ... ON DUPLICATE KEY UPDATE ...;  -- and of the keys only completed
//   [INSERT INTO idem_stage ...; INSERT INTO idempotent_record ... SELECT ... FROM idem_stage
//     ON DUPLICATE KEY UPDATE ...; DELETE FROM idem_stage]   -- the rare rest (below)
//   [the durability guard, in sync mode]
//   COMMIT
//
// The server runs the statements in order and stops at the first that fails, so COMMIT runs only
// when everything before it succeeded; the store then rolls the open transaction back. A batch
// larger than the server's max_allowed_packet is cut into several round trips at statement
// boundaries (multi-row INSERTs are cut by size too), all in the one transaction; only the last
// holds COMMIT.
//
// Values travel inside the SQL text, never built from text the store did not format itself: keys,
// biz_type, node, detail and payload as hex literals (X'...'), statuses from status_text(),
// integers by std::to_string. Hex text holds no quote or backslash, so no escaping rule is involved.
//
// The upsert (the guard of detail/rows/batch_fold.hpp, with the stored record on the server).
// Most keys are written by a direct multi-row upsert that reads the batch's values with VALUES()
// (upsert_direct_claimed, upsert_direct_completed: no stage table, which costs the server two more
// writes per key). A key whose last PROCESSING row in the batch has a lower fence than its last row
// (a claim, then a takeover at a higher fence without its PROCESSING row, in one batch) needs the
// lease rule's extra columns, and goes through the stage table:
// idem_stage is a per-session InnoDB temporary table (rolled back with the transaction) holding,
// per key, the fold's last row, its last PROCESSING row's lease, fingerprint and fence (s_has_proc,
// s_proc_fence), and the first row's time. With S the stored fence and G the guard
// (S < F, or S = F and not (stored terminal and new not terminal)):
//   lease_until, request_fingerprint  <- the stage's iff G and s_has_proc and s_proc_fence >= S
//   outcome, payload, updated_time, status <- the stage's iff G
//   fencing_token <- GREATEST(S, F), assigned last
// MySQL evaluates ON DUPLICATE KEY UPDATE assignments left to right, each seeing the columns
// assigned before it. Every assignment but the last reads only fencing_token and status of the
// stored row, and both are assigned at the end: status before fencing_token, whose expression does
// not read status. GREATEST(S, F) is the guarded fence: G true implies F >= S (so F); G false with
// F = S writes S again; G false otherwise means F < S (so S). The same assignments are right if the
// server evaluates them simultaneously (MariaDB's SIMULTANEOUS_ASSIGNMENT mode), since each reads
// only stored values. tests/mysql_store_test.cpp and the conformance suite check the records
// against memory_store's fold.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/detail/rows/batch_fold.hpp"
#include "idem/detail/rows/hex.hpp"
#include "idem/store_rows.hpp"

namespace idem::detail::my {

/// The session's setup, one round trip: strict types (a value a column cannot hold is an error,
/// never truncated), no backslash escapes, REPEATABLE READ, the server's own waits bounded by the
/// call deadline (`secs`: lock waits; statements half a second more, so a lock wait is what the
/// server reports when both would fire), the stage table, and a row with the durability settings and
/// max_allowed_packet.
[[nodiscard]] inline std::string session_setup(unsigned secs) {
    const std::string s = std::to_string(secs);
    return "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,NO_BACKSLASH_ESCAPES';"
           "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ;"
           "SET SESSION time_zone = '+00:00';"
           "SET SESSION innodb_lock_wait_timeout = " +
           s +
           ";"
           "SET SESSION max_statement_time = " +
           s +
           ".5;"
           "CREATE TEMPORARY TABLE IF NOT EXISTS idem_stage ("
           " s_key VARBINARY(128) NOT NULL PRIMARY KEY, s_biz VARBINARY(32) NOT NULL, s_status VARCHAR(16) NOT NULL,"
           " s_fence BIGINT UNSIGNED NOT NULL, s_lease BIGINT NOT NULL, s_outcome BIGINT UNSIGNED NOT NULL,"
           " s_fp BIGINT UNSIGNED NOT NULL, s_created BIGINT NOT NULL, s_updated BIGINT NOT NULL,"
           " s_payload MEDIUMBLOB NOT NULL, s_has_proc TINYINT NOT NULL, s_proc_fence BIGINT UNSIGNED NOT NULL"
           ") ENGINE=InnoDB;"
           "SELECT @@global.innodb_flush_log_at_trx_commit, @@global.log_bin, @@global.sync_binlog, "
           "@@max_allowed_packet";
}
/// The statement of session_setup() whose row holds the settings.
inline constexpr int session_setup_settings_statement = 6;

/// Refuses to commit while the server would lose the commit in a crash (schema.hpp, "Invariants").
inline constexpr std::string_view durability_guard =
    "BEGIN NOT ATOMIC IF @@global.innodb_flush_log_at_trx_commit <> 1 OR (@@global.log_bin = 1 AND "
    "@@global.sync_binlog <> 1) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the server would lose this "
    "commit in a crash: innodb_flush_log_at_trx_commit must be 1 (and sync_binlog 1 where a binary log is "
    "kept)'; END IF; END";

// G, the upsert guard (the header's comment).
#define IDEM_MY_GUARD                                                                               \
    "(idempotent_record.fencing_token < s_fence OR (idempotent_record.fencing_token = s_fence AND " \
    "(idempotent_record.status NOT IN ('SUCCESS','FAILED') OR s_status IN ('SUCCESS','FAILED'))))"
inline constexpr std::string_view upsert =
    "INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
    "request_fingerprint, created_time, updated_time, payload) "
    "SELECT s_key, s_biz, s_status, s_fence, s_lease, s_outcome, s_fp, s_created, s_updated, s_payload "
    "FROM idem_stage ON DUPLICATE KEY UPDATE "
    "lease_until = IF(" IDEM_MY_GUARD
    " AND s_has_proc = 1 AND s_proc_fence >= idempotent_record.fencing_token, s_lease, "
    "idempotent_record.lease_until), "
    "request_fingerprint = IF(" IDEM_MY_GUARD
    " AND s_has_proc = 1 AND s_proc_fence >= idempotent_record.fencing_token, s_fp, "
    "idempotent_record.request_fingerprint), "
    "outcome = IF(" IDEM_MY_GUARD
    ", s_outcome, idempotent_record.outcome), "
    "payload = IF(" IDEM_MY_GUARD
    ", s_payload, idempotent_record.payload), "
    "updated_time = IF(" IDEM_MY_GUARD
    ", s_updated, idempotent_record.updated_time), "
    "status = IF(" IDEM_MY_GUARD
    ", s_status, idempotent_record.status), "
    "fencing_token = GREATEST(idempotent_record.fencing_token, s_fence)";
#undef IDEM_MY_GUARD

// The direct upserts: the same guard with the batch's values read by VALUES(), for the folded keys
// whose lease rule needs no stage column. Their last PROCESSING row has the last row's fence
// (a claim in this batch: "s_has_proc and s_proc_fence >= S" is G itself, since G implies F >= S),
// or there is none (a completion of an earlier batch's claim: the lease and fingerprint are never
// taken from the batch on an existing row). The assignment order argument is the stage upsert's.
#define IDEM_MY_GUARD_V                                                                                     \
    "(idempotent_record.fencing_token < VALUES(fencing_token) OR (idempotent_record.fencing_token = "       \
    "VALUES(fencing_token) AND (idempotent_record.status NOT IN ('SUCCESS','FAILED') OR VALUES(status) IN " \
    "('SUCCESS','FAILED'))))"
inline constexpr std::string_view record_insert =
    "INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
    "request_fingerprint, created_time, updated_time, payload) VALUES ";
#define IDEM_MY_UPSERT_TERMINAL_PART                            \
    "outcome = IF(" IDEM_MY_GUARD_V                             \
    ", VALUES(outcome), idempotent_record.outcome), "           \
    "payload = IF(" IDEM_MY_GUARD_V                             \
    ", VALUES(payload), idempotent_record.payload), "           \
    "updated_time = IF(" IDEM_MY_GUARD_V                        \
    ", VALUES(updated_time), idempotent_record.updated_time), " \
    "status = IF(" IDEM_MY_GUARD_V                              \
    ", VALUES(status), idempotent_record.status), "             \
    "fencing_token = GREATEST(idempotent_record.fencing_token, VALUES(fencing_token))"
inline constexpr std::string_view upsert_direct_claimed =
    " ON DUPLICATE KEY UPDATE "
    "lease_until = IF(" IDEM_MY_GUARD_V
    ", VALUES(lease_until), idempotent_record.lease_until), "
    "request_fingerprint = IF(" IDEM_MY_GUARD_V
    ", VALUES(request_fingerprint), idempotent_record.request_fingerprint), " IDEM_MY_UPSERT_TERMINAL_PART;
inline constexpr std::string_view upsert_direct_completed = " ON DUPLICATE KEY UPDATE " IDEM_MY_UPSERT_TERMINAL_PART;
#undef IDEM_MY_UPSERT_TERMINAL_PART
#undef IDEM_MY_GUARD_V

// ---- reads (columns in rows::text_decoder's order) ------------------------------------------------
inline constexpr std::string_view record_select =
    "SELECT idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, "
    "created_time, updated_time, HEX(payload) FROM idempotent_record";
inline constexpr std::string_view audit_select =
    "SELECT sequence, idempotent_key, from_status, to_status, fencing_token, node, at_time, detail FROM "
    "idempotent_audit";
inline constexpr std::string_view max_fence =
    "SELECT GREATEST(COALESCE((SELECT MAX(fencing_token) FROM idempotent_record), 0), "
    "COALESCE((SELECT MAX(pruned_fence) FROM idem_schema), 0))";
inline constexpr std::string_view horizon = "SELECT records_horizon, audit_horizon FROM idem_schema LIMIT 1";

/// The server's clock in Unix milliseconds, at the start of the statement. UNIX_TIMESTAMP(NOW(3))
/// converts from the session's time zone, which session_setup() pins to UTC (no ambiguous hour).
#define IDEM_MY_NOW_MS "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
inline constexpr std::string_view server_now_ms = "SELECT " IDEM_MY_NOW_MS;

/// X'..': the hex literal of `bytes` appended to `out`.
inline void append_literal(std::string& out, std::string_view bytes) {
    out += "X'";
    rows::append_hex(out, bytes);
    out += '\'';
}

/// `k` as a hex literal.
[[nodiscard]] inline std::string literal(std::string_view k) {
    std::string out;
    out.reserve(3 + 2 * k.size());
    append_literal(out, k);
    return out;
}

/// The round trips of one batch (see the header): each a query of statements separated by ';',
/// the first starting the transaction, the last committing it. No query is longer than `budget`
/// bytes unless a single row is, which `reject(key, rule)` is told (it throws).
class batch_text {
public:
    using reject_fn = std::function<void(std::string_view key, const std::string& rule)>;

    void build(std::span<const store_row> rows, std::uint64_t batch_id, std::int64_t now_ms, std::string_view node,
               bool durability, std::size_t budget, const reject_fn& reject) {
        budget_ = budget;
        queries_.clear();
        open_query();
        add_statement("START TRANSACTION");
        add_statement("INSERT INTO idempotent_batch (batch_id, committed_time) VALUES (" + std::to_string(batch_id) + ", " +
                      std::to_string(now_ms) + ")");
        std::string node_literal = literal(node);
        {
            multi_row m(*this,
                        "INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, "
                        "fencing_token, node, at_time, detail) VALUES ");
            std::string row;
            for (const store_row& r : rows) {
                row.clear();
                row += '(';
                append_literal(row, r.t.k.view());
                row += ",'";
                row += status_text(r.t.from);
                row += "','";
                row += status_text(r.t.to);
                row += "',";
                row += std::to_string(r.t.fence);
                row += ',';
                row += node_literal;
                row += ',';
                row += std::to_string(r.at_ms);
                row += ',';
                append_literal(row, audit_detail(r.t));
                row += ')';
                m.add(row, r.t.k.view(), reject);
            }
        }
        // The folded rows (one per key), written by the direct upserts where their lease rule needs
        // no stage column, else through the stage table (the header's comment).
        const rows::batch_fold fold = rows::fold_batch(rows);
        std::vector<const rows::key_fold*> claimed, completed, staged;
        for (const rows::key_fold& f : fold.keys) {
            if (f.proc == nullptr) completed.push_back(&f);
            else if (f.proc->t.fence == f.last->t.fence) claimed.push_back(&f);
            else staged.push_back(&f);
        }
        {
            multi_row m(*this, record_insert, upsert_direct_claimed);
            for (const rows::key_fold* f : claimed) m.add(record_row(*f), f->key(), reject);
        }
        {
            multi_row m(*this, record_insert, upsert_direct_completed);
            for (const rows::key_fold* f : completed) m.add(record_row(*f), f->key(), reject);
        }
        if (!staged.empty()) {
            {
                multi_row m(*this,
                            "INSERT INTO idem_stage (s_key, s_biz, s_status, s_fence, s_lease, s_outcome, s_fp, "
                            "s_created, s_updated, s_payload, s_has_proc, s_proc_fence) VALUES ");
                for (const rows::key_fold* f : staged) {
                    std::string row = record_row(*f);
                    row.pop_back();  // the record's columns, then the stage's own two
                    row += ",1," + std::to_string(f->proc->t.fence) + ')';
                    m.add(row, f->key(), reject);
                }
            }
            add_statement(std::string(upsert));
            add_statement("DELETE FROM idem_stage");
        }
        if (durability) add_statement(std::string(durability_guard));
        add_statement("COMMIT");
        commit_statement_ = statements_in_last_ - 1;
    }

    /// The round trips, in order; the last holds COMMIT.
    [[nodiscard]] const std::vector<std::string>& queries() const noexcept { return queries_; }
    /// The index of COMMIT among the last query's statements.
    [[nodiscard]] int commit_statement() const noexcept { return commit_statement_; }

private:
    /// Rows of one INSERT ... VALUES, cut into several statements by size.
    class multi_row {
    public:
        multi_row(batch_text& b, std::string_view head, std::string_view tail = {}) : b_(b), head_(head), tail_(tail) {}
        ~multi_row() { flush(); }
        multi_row(const multi_row&) = delete;
        multi_row& operator=(const multi_row&) = delete;
        void add(const std::string& row, std::string_view key, const reject_fn& reject) {
            if (head_.size() + row.size() + tail_.size() + 1 > b_.budget_)
                reject(key, "needs a statement of " + std::to_string(head_.size() + row.size() + tail_.size()) +
                                " bytes; the server's max_allowed_packet admits " + std::to_string(b_.budget_));
            if (!text_.empty() && text_.size() + row.size() + tail_.size() + 1 > b_.budget_) flush();
            if (text_.empty()) text_.assign(head_);
            else text_ += ',';
            text_ += row;
        }

    private:
        void flush() {
            if (text_.empty()) return;
            text_ += tail_;
            b_.add_statement(std::move(text_));
            text_.clear();
        }
        batch_text& b_;
        std::string_view head_, tail_;
        std::string text_;
    };

    /// A folded key's record row, in record_insert's column order.
    static std::string record_row(const rows::key_fold& f) {
        const store_row& last = *f.last;
        std::string row;
        row.reserve(96 + 2 * (f.key().size() + last.t.payload.size()));
        row += '(';
        append_literal(row, f.key());
        row += ',';
        append_literal(row, biz_type_of(f.key()));
        row += ",'";
        row += status_text(last.t.to);
        row += "',";
        row += std::to_string(last.t.fence);
        row += ',';
        row += std::to_string(f.proc != nullptr ? f.proc->lease_until_ms : 0);
        row += ',';
        row += std::to_string(last.t.outcome);
        row += ',';
        row += std::to_string(f.proc != nullptr ? f.proc->t.fingerprint : 0);
        row += ',';
        row += std::to_string(f.first->at_ms);
        row += ',';
        row += std::to_string(last.at_ms);
        row += ',';
        append_literal(row, last.t.payload);
        row += ')';
        return row;
    }

    void open_query() {
        queries_.emplace_back();
        statements_in_last_ = 0;
    }
    void add_statement(std::string s) {
        std::string* q = &queries_.back();
        if (!q->empty() && q->size() + 1 + s.size() > budget_) {
            open_query();
            q = &queries_.back();
        }
        if (!q->empty()) *q += ';';
        *q += s;
        ++statements_in_last_;
    }

    std::size_t budget_ = 0;
    std::vector<std::string> queries_;
    int statements_in_last_ = 0;
    int commit_statement_ = 0;
};

}  // namespace idem::detail::my
