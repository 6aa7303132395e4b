// idem/global_options.hpp: the options and counters of scope::global (global_guard.hpp).
//
//   idem::global_options go;
//   go.node = "payments-eu-1";                        // this process in the audit trail
//   go.wait_timeout = std::chrono::seconds(2);        // begin() answers store_unavailable after it
//   go.window = std::chrono::hours(24 * 30);          // a decided key is remembered this long
//   go.audit_window = idem::forever;                  // audit rows are kept
//
// Plain values: copy them, read them from any thread. global_guard checks them (with the
// idem::options it is given) when it is built, before it attempts any connection, and throws
// idem::error (invalid_argument) naming the one out of range and its rule: durations positive, counts
// at least 1, options.retention within window, options.lease at least 1 ms
// (detail/global/batch_context.hpp, check_options).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "idem/stats.hpp"
#include "idem/store.hpp"  // idem::forever

namespace idem {

/// Options of scope::global (global_guard.hpp). The guard's idem::options keep their meaning: lease
/// is the lease written into the store, resolve answers compensation, capacity sizes the local table.
struct global_options {
    /// This process's identity in the audit trail (node column, 64 characters at most). Empty: hostname:pid:random
    /// (the random part tells a restarted process with a reused pid apart).
    std::string node;
    /// Deadline of every SQL call (the watchdog cuts the connection after it).
    std::chrono::milliseconds call_deadline{5000};
    /// How long begin() and a ticket's completion wait for their batch before answering
    /// store_unavailable.
    std::chrono::milliseconds wait_timeout{10000};
    /// Largest number of claims (or completions) in one transaction.
    std::size_t max_batch = 1024;
    /// Claim batcher threads, each with its own connection: batches in flight at once. A batch waits
    /// for its commit (the WAL flush), so more of them in flight is what raises throughput; the server
    /// group-commits their flushes.
    std::size_t claim_connections = 2;
    /// Completion batcher threads, each with its own connection.
    std::size_t completion_connections = 2;
    /// A claim (or completion) batch starts beside one already in flight only when at least this
    /// many requests wait; fewer wait for the batch in flight to end and go in the next one, or
    /// start one anyway after 20 ms without a new batch (a batch stuck on another client's row lock
    /// or in retries holds no one back longer). 1: a batch starts whenever a connection is free, as
    /// before this option. Each batch is a statement
    /// and a commit for the server, so a handful of requests costs it less in the next batch. On
    /// the 2-core benchmark machine, where the server shares the cores, 16 threads per process, two
    /// interleaved runs of each (idem-global-bench, IDEM_BENCH_BATCH_BESIDE=1 against 8, measured
    /// before the 20 ms patience was added): claims per batch 3.6-3.9 -> 5.5-5.7; server CPU per
    /// claim at 4 processes 369 and 451 us -> 336 and 305 us; claims/s at 4 processes 3.9k and
    /// 3.3k -> 4.1k and 4.3k. With a server of its own
    /// and a network between, load reaches the threshold, so the connections still run side by side
    /// when enough claims wait.
    std::size_t batch_beside = 8;
    /// Expired claims looked at per compensation pass.
    std::size_t compensation_limit = 1000;
    /// Longest pause between retries of a batch that met a transient failure.
    std::chrono::milliseconds max_backoff{1000};
    /// The idempotency window, as store_options::window: the maintenance thread prunes records
    /// (never PROCESSING ones) last updated longer ago, and a key whose record is pruned is new
    /// again on every node. forever: never pruned. options.retention (what the local table holds)
    /// must fit inside it.
    std::chrono::milliseconds window = std::chrono::hours(24 * 7);
    /// How long audit rows are kept. forever: never pruned.
    std::chrono::milliseconds audit_window = forever;
    /// How often the maintenance thread prunes (bounded calls, each a short transaction). Zero:
    /// never (global_guard::prune or `idem prune` does it).
    std::chrono::milliseconds prune_interval = std::chrono::minutes(1);
    /// PostgreSQL only: refuse a server on which a failover can lose an acknowledged claim or
    /// completion, i.e. one without a synchronous standby (synchronous_standby_names empty):
    /// invalid_argument at construction, and afterwards every session's (re)connect refuses to
    /// commit on it (store_unavailable) until a standby is named again. See docs/scaling.md,
    /// "A failover pair". On a MySQL / MariaDB URI the guard refuses the option.
    bool require_synchronous_standby = false;
};

/// Counters of a global guard: the local table's, plus the store traffic.
struct global_stats {
    stats local;                         ///< the local table (cache) counters
    std::uint64_t answered_locally = 0;  ///< begin() answered from the local table (no round trip)
    std::uint64_t claims_sent = 0;       ///< claims sent to the store (including retries)
    std::uint64_t claims_won = 0;
    std::uint64_t claims_lost = 0;  ///< the key had a row in another state: the winner's state was returned
    std::uint64_t superseded = 0;   ///< options.ordered_versions: claims refused, a newer version of their pair was claimed
    std::uint64_t claim_batches = 0;
    std::uint64_t completions = 0;  ///< completions (and releases) the store took
    std::uint64_t stale_completions = 0;
    std::uint64_t completion_batches = 0;
    std::uint64_t compensated = 0;        ///< expired claims this node resolved
    std::uint64_t doubt_marks = 0;        ///< expired claims the resolver could not decide (audited once per node)
    std::uint64_t withdrawn = 0;          ///< claims won after their caller gave up, released again
    std::uint64_t commits_in_doubt = 0;   ///< COMMITs that went unanswered (each resolved by batch id)
    std::uint64_t store_errors = 0;       ///< failed store calls (each retried or reported)
    std::uint64_t timeouts = 0;           ///< callers that stopped waiting (store_unavailable)
    std::uint64_t pruned_records = 0;     ///< records this node's prunes removed (past global_options::window)
    std::uint64_t pruned_audit_rows = 0;  ///< audit rows they removed (past global_options::audit_window)
};

/// scope::global's counters in the Prometheus text exposition format. Its series have names of their
/// own, so the text can be concatenated with a process-scope guard's to_prometheus() in one scrape
/// without a duplicate metric: the global fields as idem_global_<field>_total (counters), the local
/// table's as idem_global_local_<name> (the names to_prometheus(stats) gives, after "idem_"):
///   idem_global_claims_sent_total 1200
///   idem_global_local_acquired_total 1180
/// Here (not in global_guard.hpp) so that it compiles without libpqxx.
inline std::string to_prometheus(const global_stats& s) {
    std::string out;
    auto put = [&](const char* name, const char* help, std::uint64_t v) {
        out += "# HELP idem_global_";
        out += name;
        out += ' ';
        out += help;
        out += "\n# TYPE idem_global_";
        out += name;
        out += " counter\nidem_global_";
        out += name;
        out += ' ';
        out += std::to_string(v);
        out += '\n';
    };
    put("answered_locally_total", "Requests answered from the local table without a round trip.", s.answered_locally);
    put("claims_sent_total", "Claims sent to PostgreSQL.", s.claims_sent);
    put("claims_won_total", "Claims PostgreSQL granted to this node.", s.claims_won);
    put("claims_lost_total", "Claims another node held or had decided.", s.claims_lost);
    put("superseded_total", "Claims refused because a newer version was claimed.", s.superseded);
    put("claim_batches_total", "Claim statements sent (batches).", s.claim_batches);
    put("completions_total", "Completions written to PostgreSQL.", s.completions);
    put("stale_completions_total", "Completions refused because the claim was no longer current (fenced).",
        s.stale_completions);
    put("completion_batches_total", "Completion statements sent (batches).", s.completion_batches);
    put("compensated_total", "Expired claims decided by compensation (the resolver).", s.compensated);
    put("doubt_marks_total", "Claims marked in doubt.", s.doubt_marks);
    put("withdrawn_total", "Claims withdrawn.", s.withdrawn);
    put("commits_in_doubt_total", "Commits whose outcome was unknown and had to be asked again.", s.commits_in_doubt);
    put("store_errors_total", "PostgreSQL calls that failed.", s.store_errors);
    put("timeouts_total", "Requests that timed out waiting for PostgreSQL.", s.timeouts);
    put("pruned_records_total", "Records removed past the idempotency window.", s.pruned_records);
    put("pruned_audit_rows_total", "Audit rows removed past the audit window.", s.pruned_audit_rows);
    detail::append_prometheus(out, s.local, "idem_global_local_");
    return out;
}

}  // namespace idem
