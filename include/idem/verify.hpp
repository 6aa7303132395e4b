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
//   * the last row matches the record (status and fence), and no record lacks a trail.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "idem/store.hpp"

namespace idem {

struct verify_report {
    std::uint64_t keys = 0;
    std::uint64_t transitions = 0;
    std::uint64_t reopened = 0;
    std::vector<std::string> violations;  ///< each names the key, the audit sequence and the rule
};

namespace detail {

class trail_checker {
public:
    explicit trail_checker(verify_report& r) : report_(r) {}

    void row(const audit_entry& a) {
        if (a.key != key_) {
            key_ = a.key;
            state_ = record_state::absent;
            fence_ = 0;
            ++report_.keys;
        }
        ++report_.transitions;
        const bool claim = a.to == record_state::processing && a.from != record_state::processing;
        if (a.from != state_) {
            if (a.from == record_state::absent && claim &&
                (state_ == record_state::succeeded || state_ == record_state::failed ||
                 state_ == record_state::released))
                ++report_.reopened;
            else
                violation(a, std::string("from ") + to_string(a.from) + " but the previous state was " + to_string(state_));
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
        last_[a.key] = {state_, fence_};
    }

    struct last_state {
        record_state state;
        std::uint64_t fence;
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

}  // namespace detail

/// Reads every trail and record of `st`, in one snapshot (store::snapshot_read): on a live store,
/// transitions committed while verify reads are invisible to both reads, so they cannot show up as
/// a record ahead of its trail. Memory grows with the number of keys (one small entry each).
inline verify_report verify(store& st) {
    verify_report report;
    st.snapshot_read([&] {
        report = verify_report{};
        detail::trail_checker checker(report);
        st.scan_audit([&](const audit_entry& a) { checker.row(a); });
        auto& last = checker.last();
        st.load([&](const stored_record& r) {
            auto it = last.find(r.key);
            if (it == last.end()) {
                report.violations.push_back("key '" + key::printable(r.key) + "' has a record but no audit trail");
                return;
            }
            if (it->second.state != r.state || it->second.fence != r.fence)
                report.violations.push_back("key '" + key::printable(r.key) + "': record is " + to_string(r.state) +
                                            " fence " + std::to_string(r.fence) + " but its last audit row says " +
                                            to_string(it->second.state) + " fence " +
                                            std::to_string(it->second.fence));
            last.erase(it);
        });
        for (auto& [k, s] : last)
            report.violations.push_back("key '" + key::printable(k) + "' has an audit trail but no record");
    });
    return report;
}

}  // namespace idem
