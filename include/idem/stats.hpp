// idem/stats.hpp: a snapshot of the guard's counters and its Prometheus text exposition.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/key.hpp"

namespace idem {

struct stats {
    std::uint64_t acquired = 0;            ///< claims granted (including reclaims)
    std::uint64_t duplicates = 0;          ///< begin() on a completed key (replayed or refused)
    std::uint64_t in_progress_hits = 0;    ///< begin() on a key someone else holds
    std::uint64_t payload_mismatches = 0;  ///< begin() with a different request fingerprint
    std::uint64_t superseded = 0;          ///< claims refused: a newer version was claimed (options.ordered_versions)
    std::uint64_t succeeded = 0;           ///< claims completed with succeed()
    std::uint64_t failed = 0;              ///< claims completed as FAILED (terminal)
    std::uint64_t released = 0;            ///< claims released for retry (retryable failure, dropped ticket)
    std::uint64_t stale_tickets = 0;       ///< completions or extensions refused for a stale fence
    std::uint64_t in_doubt = 0;            ///< expired claims the resolver could not decide (events)
    std::uint64_t compensated = 0;         ///< expired claims resolved by the resolver
    std::uint64_t reclaimed = 0;           ///< expired claims taken over (reclaim_expired option)
    std::uint64_t capacity_exhausted = 0;  ///< begin() refused for lack of space
    std::uint64_t backpressure = 0;        ///< transitions refused because the flush queue was full
    std::uint64_t evicted = 0;             ///< terminal records dropped by generation recycle
    std::uint64_t rotations = 0;           ///< generation rotations
    std::uint64_t rotations_blocked = 0;   ///< rotations refused: a record in the previous generation
                                           ///< is processing, too young, or not yet flushed
    std::uint64_t max_probe = 0;           ///< longest probe sequence seen
    // The cold window (durable guards): keys the store remembers that memory no longer holds.
    std::uint64_t recalls = 0;            ///< begin() on a key the cold window may hold: the store was read
    std::uint64_t recalled = 0;           ///< of those, a record in the window (answered from it)
    std::uint64_t recall_failures = 0;    ///< of those, the store could not be read (store_unavailable)
    std::uint64_t cold_keys = 0;          ///< keys in the cold window's filter
    std::uint64_t cold_bytes = 0;         ///< the filter's memory
    std::uint64_t pruned_records = 0;     ///< records the background prune removed (this process)
    std::uint64_t pruned_audit_rows = 0;  ///< audit rows it removed
    // Filled by a durable store pipeline; zero for a memory-only guard.
    std::uint64_t flush_batches = 0;
    std::uint64_t flushed_transitions = 0;
    std::uint64_t queue_depth = 0;
    std::uint64_t flush_lag_ns = 0;  ///< the last committed batch: from gathering its first row to its commit
    std::uint64_t store_errors = 0;
    std::uint64_t rejected_rows = 0;   ///< rows the store can never take, set aside (last_store_error() names the last)
    std::uint64_t flusher_cpu_ns = 0;  ///< CPU time the flusher thread has used; / flushed_transitions = its cost per row
};

/// One operation's claim-to-completion times in this process and the lease its claims get now
/// (options.adaptive; guard::operation_latencies()). p50/p99 are the upper edges of their histogram
/// buckets: never below the true value, at most 12.5% above (detail/table/lease_histogram.hpp).
struct operation_latency {
    std::string operation;              ///< the OPERATION of TXID_OPERATION_vN (cut at 32 bytes, so two
                                        ///< operations may show one name); "" for the shared histogram of
                                        ///< operations beyond the table's 64
    std::uint64_t samples = 0;          ///< terminal completions measured (halved by ageing)
    std::chrono::nanoseconds p50{0};    ///< 0 without samples
    std::chrono::nanoseconds p99{0};    ///< 0 without samples; nanoseconds::max(): 73 min or more
    std::chrono::nanoseconds lease{0};  ///< what a claim of this operation gets now
    bool adaptive = false;              ///< lease is clamp(k x p99, min, max); false: options.lease
};

namespace detail {

/// Nanoseconds as Prometheus's base unit, seconds, with nanosecond resolution ("1.500000000").
inline std::string prometheus_seconds(std::uint64_t ns) {
    const std::string frac = std::to_string(ns % 1000000000u);
    return std::to_string(ns / 1000000000u) + "." + std::string(9 - frac.size(), '0') + frac;
}

/// A label value written per the text format: backslash, double quote and newline escaped, and a
/// byte that is not part of well-formed UTF-8 shown as the four characters \xHH (a scraper rejects
/// a whole exposition with a label value that is not UTF-8).
inline std::string prometheus_label(std::string_view v) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string o;
    for (std::size_t i = 0; i < v.size();) {
        const auto c = static_cast<unsigned char>(v[i]);
        // The length of the UTF-8 sequence c would start (0: none); key::is_utf8 checks the rest.
        std::size_t n = 0;
        if (c < 0x80) n = 1;
        else if (c >= 0xc2 && c <= 0xdf) n = 2;
        else if (c >= 0xe0 && c <= 0xef) n = 3;
        else if (c >= 0xf0 && c <= 0xf4) n = 4;
        if (n > 1 && i + n <= v.size() && key::is_utf8(v.substr(i, n))) {
            o.append(v.substr(i, n));
            i += n;
            continue;
        }
        const char ch = v[i++];
        if (ch == '\\') o += "\\\\";
        else if (ch == '"') o += "\\\"";
        else if (ch == '\n') o += "\\n";
        else if (n == 1) o += ch;
        else o.append("\\\\x").append(1, hex[c >> 4]).append(1, hex[c & 15]);
    }
    return o;
}

/// The counters of `s`, one "# HELP" line, one "# TYPE" line and one sample each, every name
/// prefixed with `prefix` ("idem_" for a process-scope guard, "idem_global_local_" for
/// scope::global's local table).
inline void append_prometheus(std::string& out, const stats& s, std::string_view prefix) {
    // "<lead><prefix><name> <rest>\n": the HELP line, the TYPE line and the sample.
    auto line = [&](std::string_view lead, const char* name, std::string_view rest) {
        out.append(lead).append(prefix).append(name).append(1, ' ').append(rest).append(1, '\n');
    };
    auto sample = [&](const char* name, const char* type, const char* help, const std::string& value) {
        line("# HELP ", name, help);
        line("# TYPE ", name, type);
        line("", name, value);
    };
    auto put = [&](const char* name, const char* type, const char* help, std::uint64_t v) {
        sample(name, type, help, std::to_string(v));
    };
    auto put_seconds = [&](const char* name, const char* type, const char* help, std::uint64_t ns) {
        sample(name, type, help, prometheus_seconds(ns));
    };
    put("acquired_total", "counter", "Claims granted: the caller runs the operation.", s.acquired);
    put("duplicates_total", "counter", "Requests answered with a recorded result instead of running again.", s.duplicates);
    put("in_progress_hits_total", "counter", "Requests that found the key claimed by another caller.", s.in_progress_hits);
    put("payload_mismatches_total", "counter", "Requests whose fingerprint differed from the recorded request of their key.",
        s.payload_mismatches);
    put("superseded_total", "counter", "Claims refused because a newer version of the operation was claimed.", s.superseded);
    put("succeeded_total", "counter", "Claims completed as succeeded.", s.succeeded);
    put("failed_total", "counter", "Claims completed as failed terminally.", s.failed);
    put("released_total", "counter", "Claims released after a retryable failure: the key may be claimed again.", s.released);
    put("stale_tickets_total", "counter", "Completions refused because the claim was no longer current (fenced).",
        s.stale_tickets);
    put("in_doubt_total", "counter", "Claims marked in doubt: the operation may have run; the resolver decides.",
        s.in_doubt);
    put("compensated_total", "counter", "Expired claims decided by compensation (the resolver).", s.compensated);
    put("reclaimed_total", "counter", "Expired claims taken over by a new claim.", s.reclaimed);
    put("capacity_exhausted_total", "counter", "Requests refused because memory held too many claims in flight.",
        s.capacity_exhausted);
    put("backpressure_total", "counter", "Requests refused because the flush queue was full (the store is slow or down).",
        s.backpressure);
    put("evicted_total", "counter", "Decided records evicted from memory into the cold window.", s.evicted);
    put("rotations_total", "counter", "Generations of the record table recycled.", s.rotations);
    put("rotations_blocked_total", "counter", "Rotations that could not run yet (claims in flight or rows not durable).",
        s.rotations_blocked);
    put("max_probe", "gauge", "Longest probe sequence seen in the record table.", s.max_probe);
    put("recalls_total", "counter", "Requests for evicted keys that asked the store.", s.recalls);
    put("recalled_total", "counter", "Recalls that found a record in the store.", s.recalled);
    put("recall_failures_total", "counter", "Recalls the store could not answer in time.", s.recall_failures);
    put("cold_keys", "gauge", "Keys in the cold window filter.", s.cold_keys);
    put("cold_bytes", "gauge", "Memory of the cold window filter in bytes.", s.cold_bytes);
    put("pruned_records_total", "counter", "Records removed from the store past the idempotency window.", s.pruned_records);
    put("pruned_audit_rows_total", "counter", "Audit rows removed from the store past the audit window.",
        s.pruned_audit_rows);
    put("flush_batches_total", "counter", "Batches committed to the store.", s.flush_batches);
    put("flushed_transitions_total", "counter", "Transitions committed to the store.", s.flushed_transitions);
    put("queue_depth", "gauge", "Transitions waiting to be written to the store.", s.queue_depth);
    put_seconds("flush_lag_seconds", "gauge",
                "Time the last committed batch took from gathering its first row to its commit.", s.flush_lag_ns);
    put("store_errors_total", "counter", "Store calls that failed (outages, unknown commits, rejected rows).",
        s.store_errors);
    put("rejected_rows_total", "counter",
        "Rows the store can never take, set aside (an incident: their decisions are kept in memory only).", s.rejected_rows);
    put_seconds("flusher_cpu_seconds_total", "counter", "CPU time used by the flusher thread.", s.flusher_cpu_ns);
}

}  // namespace detail

/// Prometheus text exposition format, one counter/gauge per field, prefixed "idem_".
inline std::string to_prometheus(const stats& s) {
    std::string out;
    detail::append_prometheus(out, s, "idem_");
    return out;
}

/// The counters, then each operation's latency quantiles and lease (seconds):
///   idem_operation_latency_seconds{operation="PAY",quantile="0.99"} 0.012000000
///   idem_operation_latency_seconds_count{operation="PAY"} 1000
///   idem_operation_lease_seconds{operation="PAY"} 1.000000000
/// An operation name is a label value, written per the text format: backslash, double quote and
/// newline are escaped, and a byte that is not part of well-formed UTF-8 (a name cut inside a
/// character; keys need not be text) is shown as the four characters \xHH, since a scraper rejects
/// a whole exposition with a label value that is not UTF-8.
/// Each row gets its own label set. Names are kept cut at 32 bytes, so two operations sharing their
/// first 32 bytes are two rows with one name: the first keeps it, the next ones get "_2", "_3", ...
/// appended (the first suffix no row's own label holds). '_' cannot occur in an operation
/// (key::compose refuses it), so a suffixed label never reads as another operation's name. Which
/// of two such operations gets the suffix follows the table's order, which can differ between
/// processes: their series are told apart in one exposition, not matched across restarts.
inline std::string to_prometheus(const stats& s, std::span<const operation_latency> ops) {
    std::string out = to_prometheus(s);
    if (ops.empty()) return out;
    auto seconds = [](std::chrono::nanoseconds d) -> std::string {
        if (d == std::chrono::nanoseconds::max()) return "+Inf";
        return detail::prometheus_seconds(static_cast<std::uint64_t>(d.count()));
    };
    // One label value per row, unique. `own`: every row's own label, so no suffix takes one of
    // them (a later row named "PAY_2" keeps its name when two "PAY" rows came first).
    std::vector<std::string> labels;
    labels.reserve(ops.size());
    for (const auto& o : ops) labels.push_back(detail::prometheus_label(o.operation));
    const std::set<std::string> own(labels.begin(), labels.end());
    std::set<std::string> used;
    for (auto& l : labels) {
        if (used.insert(l).second) continue;
        for (std::size_t n = 2;; ++n) {
            std::string again = l + "_" + std::to_string(n);
            if (own.count(again) == 0 && used.insert(again).second) {
                l = std::move(again);
                break;
            }
        }
    }
    out += "# HELP idem_operation_latency_seconds Claim-to-completion time of each operation (terminal completions).\n";
    out += "# TYPE idem_operation_latency_seconds summary\n";
    for (std::size_t i = 0; i < ops.size(); ++i) {
        const auto& o = ops[i];
        const std::string op = "{operation=\"" + labels[i] + "\"";
        if (o.samples != 0) {
            out += "idem_operation_latency_seconds" + op + ",quantile=\"0.5\"} " + seconds(o.p50) + "\n";
            out += "idem_operation_latency_seconds" + op + ",quantile=\"0.99\"} " + seconds(o.p99) + "\n";
        }
        out += "idem_operation_latency_seconds_count" + op + "} " + std::to_string(o.samples) + "\n";
    }
    out += "# HELP idem_operation_lease_seconds The lease a claim of each operation gets now.\n";
    out += "# TYPE idem_operation_lease_seconds gauge\n";
    for (std::size_t i = 0; i < ops.size(); ++i)
        out += "idem_operation_lease_seconds{operation=\"" + labels[i] + "\"} " + seconds(ops[i].lease) + "\n";
    return out;
}

}  // namespace idem
