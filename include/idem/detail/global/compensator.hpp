// idem/detail/global/compensator.hpp: the compensator of scope::global: resolves claims whose lease
// expired in the store (their owner died, hung or lost the store) by asking options.resolve, and
// writes its answers with fenced UPDATEs. Run by the maintenance thread (coordinator.hpp) on its own
// connection, or by global_guard::compensate(); only with a resolver.
//
// Invariant: exactly one resolution per expired claim, one audit row. A pass SELECTs expired
// PROCESSING rows (a partial index), skips those this process holds a live local claim on, asks the
// resolver, then writes one fenced batch (completion_batcher::write, compensation = true) that also
// re-checks the lease under the row lock: the owner may have renewed it since the scan. Two nodes
// compensating the same claim: the second one's UPDATE waits for the first's row lock, then finds
// status != PROCESSING and returns no row. A claim the resolver cannot decide is marked in doubt
// (an audited no-op) once per node while it stays expired. Compensation never writes the local
// table: a duplicate learns its result from the store, after it committed.
//
// Thread-safety: compensate() may be called from any thread; one pass runs at a time (a mutex).
// Progress: blocking (round trips, each bounded by call_deadline; a transient failure ends the pass).
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "idem/detail/global/batch_context.hpp"
#include "idem/detail/global/completion_batcher.hpp"
#include "idem/detail/global/arbiter.hpp"
#include "idem/guard.hpp"

namespace idem::detail::global {

class compensator {
public:
    /// `db` (the maintenance connection), `completions` (its batch writer) and `local` (the local
    /// table, asked which claims this process still executes) must outlive the compensator.
    compensator(batch_context& ctx, completion_batcher& completions, global_session& db, const guard& local) noexcept
        : ctx_(ctx), completions_(completions), db_(db), local_(local) {}
    compensator(const compensator&) = delete;
    compensator& operator=(const compensator&) = delete;

    /// One compensation pass: expired claims (at most compensation_limit) go to the resolver, and its
    /// answers are written with fenced UPDATEs. Returns how many claims this node resolved (doubt
    /// marks not included). Without a resolver, does nothing.
    std::size_t compensate() {
        const options& opts = ctx_.opts;
        if (!opts.resolve) return 0;
        std::lock_guard lk(run_m_);
        std::vector<global_session::expired_row> rows;
        if (db_.expired(ctx_.go.compensation_limit, rows) != global_session::result::ok) {
            ctx_.note_error(db_.last_error());
            return 0;
        }
        std::vector<completion_row> items;
        std::vector<resolver_answer> answers;  // their payloads, viewed by items until written
        answers.reserve(rows.size());          // never reallocated: the views stay valid
        std::set<std::pair<std::string, std::uint64_t>> still_expired;
        for (const global_session::expired_row& e : rows) {
            const auto k = key::parse(e.k);
            if (!k) continue;
            // A live local claim: a thread of this process is executing it (or asking about it).
            if (local_.query(*k).state == record_state::processing) continue;
            IDEM_ASSERT(answers.size() < answers.capacity(),
                        "the resolver's answers never reallocate: the batch's rows view their payloads");
            resolver_answer& a = answers.emplace_back();
            try {
                a = opts.resolve(expired_claim{e.k, e.fence, e.fp});
            } catch (...) {
                a = {};  // a throwing resolver decides nothing
            }
            // A response over options.max_payload is not recorded without it: in doubt, asked again.
            if ((a.verdict == resolution::succeeded || a.verdict == resolution::failed) &&
                a.payload.size() > opts.max_payload)
                a = {};
            completion_row it{*k, e.fence, record_state::processing, a.outcome, transition_cause::compensate, a.payload};
            switch (a.verdict) {
                case resolution::succeeded: it.to = record_state::succeeded; break;
                case resolution::failed: it.to = record_state::failed; break;
                case resolution::not_executed:
                    it.to = record_state::released;
                    it.outcome = 0;
                    it.payload = {};
                    break;
                case resolution::unknown:
                    still_expired.insert({e.k, e.fence});
                    if (doubted_.contains({e.k, e.fence})) continue;  // marked and audited already
                    it.cause = transition_cause::doubt;
                    it.outcome = 0;
                    it.payload = {};
                    break;
            }
            items.push_back(std::move(it));
        }
        std::erase_if(doubted_, [&](const auto& p) { return !still_expired.contains(p); });
        if (items.empty()) return 0;
        std::sort(items.begin(), items.end(),
                  [](const completion_row& a, const completion_row& b) { return a.k.view() < b.k.view(); });
        std::unordered_set<std::string> won;
        if (!completions_.write(db_, items, /*compensation=*/true, won, /*give_up=*/true)) return 0;
        std::size_t resolved = 0;
        for (const completion_row& it : items) {
            if (!won.contains(std::string(it.k.view()))) continue;
            if (it.cause == transition_cause::doubt) {
                doubted_.insert({std::string(it.k.view()), it.fence});
                batch_context::count(ctx_.n.doubt_marks);
            } else {
                ++resolved;
                batch_context::count(ctx_.n.compensated);
            }
        }
        return resolved;
    }

private:
    batch_context& ctx_;
    completion_batcher& completions_;
    global_session& db_;
    const guard& local_;
    std::mutex run_m_;                                         // one compensation pass at a time
    std::set<std::pair<std::string, std::uint64_t>> doubted_;  // (key, fence) marked in doubt by this node
};

}  // namespace idem::detail::global
