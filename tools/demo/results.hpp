// tools/demo/results.hpp: what a demo run reports beside its own counts: the durable store read back
// after the run (records and audit trails), and the JSON fields every run shares.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "demo/demo.hpp"
#include "idem/verify.hpp"
#include "report.hpp"
#include "store.hpp"

namespace idem::tool::demo {

inline double peak_rss_mib() {
    rusage u{};
    if (::getrusage(RUSAGE_SELF, &u) != 0) return 0.0;
    return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux reports KiB
}

/// What the durable store did during the run, and what the demo found in it afterwards.
struct durable_report {
    std::size_t recovered = 0;             ///< records recovery loaded at start
    std::size_t recovered_processing = 0;  ///< of those, claims in flight when an earlier process stopped
    std::size_t recovered_cold = 0;        ///< records older than the hot window: in the cold window's filter only
    double recovery_ms = 0;
    bool drained = true;  ///< the flusher committed every transition after the workers were joined
    double drain_s = 0;   ///< how long that took
    std::string last_store_error;
    std::uint64_t records_ok = 0;              ///< this run's keys whose record is SUCCESS with the executed outcome
    std::uint64_t records_wrong = 0;           ///< this run's keys whose record says something else
    std::uint64_t records_missing = 0;         ///< this run's keys with no record at all
    std::vector<std::string> record_problems;  ///< the first few wrong records
    idem::verify_report verify;
    double verify_s = 0;
};

/// What every demo run reports, whatever its scope: the request counts, the checks and the rate.
/// One helper so that the process and global scope summaries cannot drift apart.
struct run_summary {
    std::uint64_t requests, unique, executed, duplicates, concurrent, later, blocked, replayed, in_flight, wait_timeouts,
        double_executions, lost, mismatches, unexpected, declined;
    bool conserved, balances_match;
    double ops, elapsed_s;
};

inline void add_run_summary(json& j, const run_summary& r, const demo_config& c) {
    j["requests"] = r.requests;
    j["unique_keys"] = r.unique;
    j["executions"] = r.executed;
    j["duplicates_injected"] = r.duplicates;
    j["duplicates_concurrent"] = r.concurrent;
    j["duplicates_later"] = r.later;
    j["duplicates_blocked"] = r.blocked;
    j["duplicates_replayed"] = r.replayed;
    j["in_flight_hits"] = r.in_flight;
    j["wait_timeouts"] = r.wait_timeouts;
    j["double_executions"] = r.double_executions;
    j["lost_requests"] = r.lost;
    j["outcome_mismatches"] = r.mismatches;
    j["unexpected_answers"] = r.unexpected;
    j["declined"] = r.declined;
    j["money_conserved"] = r.conserved;
    j["balances_match"] = r.balances_match;
    j["ops_per_sec"] = r.ops;
    j["elapsed_s"] = r.elapsed_s;
    j["dup_rate"] = c.dup_rate;
    j["race_share"] = c.race_share;
    j["work_us"] = c.work_us;
    j["wait_ms"] = c.wait_ms;
}

/// The store checks of a report, as JSON fields (the first ten violations in full).
inline void add_store_checks(json& j, const durable_report& dr) {
    std::vector<std::string> first_violations;
    for (std::size_t i = 0; i < dr.verify.violations.size() && i < 10; ++i)
        first_violations.push_back(dr.verify.violations[i]);
    j["store_records_ok"] = dr.records_ok;
    j["store_records_missing"] = dr.records_missing;
    j["store_records_wrong"] = dr.records_wrong;
    j["verify_keys"] = dr.verify.keys;
    j["verify_transitions"] = dr.verify.transitions;
    j["violations"] = std::uint64_t{dr.verify.violations.size()};
    j["violation_list"] = first_violations;
}

/// Reads the store back after the guard closed: this run's records and the whole store's trails.
void check_store(const store_spec& spec, idem::durability mode, const std::string& prefix,
                 const std::function<std::uint64_t(std::size_t)>& outcome_of, std::size_t unique, durable_report& dr);

}  // namespace idem::tool::demo
