// idem/verify.hpp: checks a store's audit trails against the state machine.
//
// For every key, in sequence order:
//   * each row's from_status equals the previous row's to_status (the first row starts at ABSENT);
//     a row from ABSENT after a SUCCESS, FAILED or RELEASED row is a key claimed again after memory
//     evicted it (retention, or a rotation that recycled a released record), counted in `reopened`,
//     not a violation (the fence must still rise);
//   * the step is legal: ABSENT|RELEASED -> PROCESSING (claim), PROCESSING -> SUCCESS|FAILED|RELEASED
//     (completion, compensation), PROCESSING -> PROCESSING (doubt mark, same fence; or reclaim,
//     higher fence);
//   * every claim's fence is strictly greater than every earlier fence of the key; every
//     completion carries the fence of the claim it completes;
//   * the last row matches the record (status and fence), and no record lacks a trail;
//   * a SUCCESS or FAILED record has the outcome its completing row names (" outcome=N") and the
//     response payload it names (" payload=NB fnv=H": the size and the FNV-1a hash of the bytes;
//     no payload part: none), so a response changed in the store after it was recorded shows.
//
// A pruned store (store::prune, store::horizon) is read with its horizon. Legal, and counted:
//   * a trail whose first remaining row does not start at ABSENT, when audit rows were pruned (the
//     audit horizon is not keep_all): its start is gone; its first row starts the checks (a claim
//     from RELEASED has no earlier fence to rise above);
//   * a record with no trail left, when its updated_time is older than the audit horizon;
//   * a trail with no record, when its last row is not PROCESSING and is older than the records
//     horizon (the record was pruned; a key claimed again after that is `reopened`).
// Anything else stays a violation. A truncated trail's first row may itself be older than the
// audit horizon: a prune bounded by max_rows (more to come) or stopped at a row written out of
// time order leaves such rows, so that is not checked.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "idem/detail/rows/audit_detail.hpp"
#include "idem/store.hpp"

namespace idem {

struct verify_report {
    std::uint64_t keys = 0;
    std::uint64_t transitions = 0;
    std::uint64_t reopened = 0;
    prune_horizon horizon;                    ///< the store's (keep_all, keep_all when never pruned)
    std::uint64_t truncated_trails = 0;       ///< trails whose first rows were pruned
    std::uint64_t records_without_trail = 0;  ///< records whose whole trail was pruned
    std::uint64_t trails_without_record = 0;  ///< trails whose record was pruned
    std::vector<std::string> violations;      ///< each names the key, the audit sequence and the rule
};

namespace detail {

class trail_checker {
public:
    explicit trail_checker(verify_report& r) : report_(r) {}

    void row(const audit_entry& a) {
        const bool claim = a.to == record_state::processing && a.from != record_state::processing;
        if (a.key != key_) {
            key_ = a.key;
            state_ = record_state::absent;
            fence_ = 0;
            ++report_.keys;
            if (a.from != record_state::absent && report_.horizon.audit_ms != prune_limits::keep_all) {
                // The trail's start was pruned: this row starts the checks.
                ++report_.truncated_trails;
                state_ = a.from;
                fence_ = claim ? 0 : a.fence;
            }
        }
        ++report_.transitions;
        if (a.from != state_) {
            if (a.from == record_state::absent && claim &&
                (state_ == record_state::succeeded || state_ == record_state::failed || state_ == record_state::released))
                ++report_.reopened;
            else violation(a, std::string("from ") + to_string(a.from) + " but the previous state was " + to_string(state_));
        }
        if (claim) {
            if (a.fence <= fence_)
                violation(a, "claim fence " + std::to_string(a.fence) + " is not above the earlier fence " +
                                 std::to_string(fence_));
        } else if (a.from == record_state::processing && a.to == record_state::processing) {
            if (a.fence < fence_) violation(a, "re-claim or doubt mark with a lower fence");
        } else if (a.from == record_state::processing) {
            if (a.to == record_state::absent) violation(a, "PROCESSING -> ABSENT is not a transition");
            if (a.fence != fence_)
                violation(a, "completion fence " + std::to_string(a.fence) + " is not the claim's fence " +
                                 std::to_string(fence_));
        } else {
            violation(a, std::string("illegal step ") + to_string(a.from) + " -> " + to_string(a.to));
        }
        state_ = a.to;
        fence_ = std::max(fence_, a.fence);
        last_[a.key] = {state_, fence_, a.at_ms,
                        a.to == record_state::succeeded || a.to == record_state::failed ? a.detail : std::string()};
    }

    struct last_state {
        record_state state;
        std::uint64_t fence;
        std::int64_t at_ms;
        std::string completion;  ///< the detail of the row that made the record terminal (empty otherwise)
    };
    std::map<std::string, last_state>& last() { return last_; }

private:
    void violation(const audit_entry& a, const std::string& rule) {
        report_.violations.push_back("key '" + key::printable(a.key) + "' audit sequence " + std::to_string(a.sequence) +
                                     ": " + rule);
    }

    verify_report& report_;
    std::string key_;
    record_state state_ = record_state::absent;
    std::uint64_t fence_ = 0;
    std::map<std::string, last_state> last_;
};

/// A terminal record against the detail of the row that completed it (parsed by
/// detail/rows/audit_detail.hpp, the one parser of the text): the outcome the row names, and the
/// payload's size and hash it names (none named: the record has no payload). A detail without
/// " outcome=" (a row written by hand) is not checked.
inline void check_completion(const stored_record& r, const std::string& detail, verify_report& report) {
    const rows::parsed_audit_detail parsed = rows::parse_audit_detail(detail);
    if (parsed.status == rows::detail_parse::foreign) return;
    const std::string name = "key '" + key::printable(r.key) + "': ";
    if (parsed.status == rows::detail_parse::bad_outcome) {
        report.violations.push_back(name + "its completing audit row names no readable outcome: '" + detail + "'");
        return;
    }
    if (parsed.fields.outcome != r.outcome)
        report.violations.push_back(name + "record's outcome is " + std::to_string(r.outcome) +
                                    " but its completing audit row says " + std::to_string(parsed.fields.outcome));
    if (parsed.status != rows::detail_parse::ok) {
        report.violations.push_back(name + "its completing audit row names no readable payload: '" + detail + "'");
        return;
    }
    const std::optional<rows::payload_summary> have = r.payload.empty()
                                                          ? std::nullopt
                                                          : std::optional(rows::payload_summary::of(r.payload));
    const std::optional<rows::payload_summary> want = parsed.fields.payload;
    if (have != want)
        report.violations.push_back(
            name + "record's payload is" + (have ? " " + rows::payload_summary_text(*have) : std::string(" empty")) +
            " but its completing audit row says" + (want ? " " + rows::payload_summary_text(*want) : std::string(" none")));
}

}  // namespace detail

/// Reads every trail and record of `st`, in one snapshot (store::snapshot_read): on a live store,
/// transitions committed while verify reads are invisible to both reads, so they cannot show up as
/// a record ahead of its trail. Memory grows with the number of keys (one small entry each).
inline verify_report verify(store& st) {
    verify_report report;
    st.snapshot_read([&] {
        report = verify_report{};
        report.horizon = st.horizon();
        const prune_horizon& h = report.horizon;
        detail::trail_checker checker(report);
        st.scan_audit([&](const audit_entry& a) { checker.row(a); });
        auto& last = checker.last();
        st.load([&](const stored_record& r) {
            auto it = last.find(r.key);
            if (it == last.end()) {
                if (h.audit_ms != prune_limits::keep_all && r.updated_ms < h.audit_ms) {
                    ++report.records_without_trail;  // its whole trail was older than the audit horizon
                    return;
                }
                report.violations.push_back("key '" + key::printable(r.key) + "' has a record but no audit trail" +
                                            (h.audit_ms == prune_limits::keep_all
                                                 ? std::string()
                                                 : " (updated_time " + std::to_string(r.updated_ms) +
                                                       " is not older than the audit horizon " + std::to_string(h.audit_ms) +
                                                       ", so its trail cannot have been pruned)"));
                return;
            }
            if (it->second.state != r.state || it->second.fence != r.fence)
                report.violations.push_back("key '" + key::printable(r.key) + "': record is " + to_string(r.state) +
                                            " fence " + std::to_string(r.fence) + " but its last audit row says " +
                                            to_string(it->second.state) + " fence " + std::to_string(it->second.fence));
            else if (!it->second.completion.empty()) detail::check_completion(r, it->second.completion, report);
            last.erase(it);
        });
        for (auto& [k, s] : last) {
            if (h.records_ms != prune_limits::keep_all && s.state != record_state::processing && s.at_ms < h.records_ms) {
                ++report.trails_without_record;  // its record was pruned
                continue;
            }
            std::string why;
            if (h.records_ms != prune_limits::keep_all)
                why = s.state == record_state::processing
                          ? " (its last row is PROCESSING, and prune never removes a PROCESSING record)"
                          : " (its last row, at " + std::to_string(s.at_ms) + ", is not older than the records horizon " +
                                std::to_string(h.records_ms) + ", so its record cannot have been pruned)";
            report.violations.push_back("key '" + key::printable(k) + "' has an audit trail but no record" + why);
        }
    });
    return report;
}

}  // namespace idem
