// idem/stores/memory_store.hpp: memory_store, the reference store. It applies every batch to
// in-memory maps with the fold every store writes (detail/rows/batch_fold.hpp), so the other
// stores are tested against it; it keeps nothing across a restart.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/detail/rows/batch_fold.hpp"
#include "idem/error.hpp"
#include "idem/store.hpp"

namespace idem {

/// Applies a batch to in-memory maps: the reference semantics every store must match.
class memory_store final : public store {
public:
    void apply(std::span<const store_row> rows, std::uint64_t batch_id) override {
        if (fail_next_ > 0) {
            --fail_next_;
            throw error(errc::store_unavailable, "memory store: injected failure");
        }
        // The fold every store writes (detail/rows/batch_fold.hpp): the reference semantics.
        for (const store_row& r : rows)
            audit_.push_back({next_sequence_++, std::string(r.t.k.view()), r.t.from, r.t.to, r.t.fence, node_, r.at_ms,
                              audit_detail(r.t)});
        const detail::rows::batch_fold fold = detail::rows::fold_batch(rows);
        for (const detail::rows::key_fold& f : fold.keys) {
            const auto it = records_.find(std::string(f.key()));
            auto rec = detail::rows::folded(f, it == records_.end() ? nullptr : &it->second);
            if (rec) records_.insert_or_assign(rec->key, std::move(*rec));
        }
        batches_.push_back(batch_id);
    }
    bool committed(std::uint64_t batch_id) override {
        return std::find(batches_.begin(), batches_.end(), batch_id) != batches_.end();
    }
    void load(const std::function<void(const stored_record&)>& fn) override {
        for (auto& [k, r] : records_) fn(r);
    }
    std::optional<stored_record> get(std::string_view key) override {
        auto it = records_.find(std::string(key));
        if (it == records_.end()) return std::nullopt;
        return it->second;
    }
    std::vector<audit_entry> audit(std::string_view key) override {
        std::vector<audit_entry> out;
        for (auto& a : audit_)
            if (a.key == key) out.push_back(a);
        return out;
    }
    void scan_audit(const std::function<void(const audit_entry&)>& fn) override {
        std::vector<audit_entry> sorted = audit_;
        std::stable_sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.key < b.key; });
        for (auto& a : sorted) fn(a);
    }
    std::string name() const override { return "memory"; }
    std::uint64_t max_fence() override {
        std::uint64_t m = pruned_fence_;
        for (auto& [k, r] : records_) m = std::max(m, r.fence);
        return m;
    }
    /// The reference: records oldest updated_time first (then key), audit rows oldest sequence
    /// first, up to the first row that is not older than the bound.
    prune_result prune(const prune_limits& limits) override {
        prune_result out;
        if (limits.records_before_ms != prune_limits::keep_all) {
            std::vector<std::pair<std::int64_t, std::string>> expired;
            for (auto& [k, r] : records_)
                if (r.state != record_state::processing && r.updated_ms < limits.records_before_ms)
                    expired.emplace_back(r.updated_ms, k);
            std::sort(expired.begin(), expired.end());
            out.more = expired.size() > limits.max_rows;
            expired.resize(std::min(expired.size(), limits.max_rows));
            for (auto& [at, k] : expired) {
                pruned_fence_ = std::max(pruned_fence_, records_[k].fence);
                records_.erase(k);
            }
            out.records = expired.size();
            horizon_.records_ms = std::max(horizon_.records_ms, limits.records_before_ms);
        }
        if (limits.audit_before_ms != prune_limits::keep_all) {
            std::size_t n = 0;  // audit_ is in sequence order
            while (n < audit_.size() && n < limits.max_rows && audit_[n].at_ms < limits.audit_before_ms) ++n;
            audit_.erase(audit_.begin(), audit_.begin() + static_cast<std::ptrdiff_t>(n));
            out.audit_rows = n;
            out.more = out.more || (!audit_.empty() && audit_.front().at_ms < limits.audit_before_ms);
            horizon_.audit_ms = std::max(horizon_.audit_ms, limits.audit_before_ms);
        }
        return out;
    }
    prune_horizon horizon() override { return horizon_; }

    /// Test hook: the next n apply() calls throw store_unavailable.
    void fail_next(int n) { fail_next_ = n; }

private:
    std::map<std::string, stored_record> records_;
    std::vector<audit_entry> audit_;
    std::vector<std::uint64_t> batches_;
    std::int64_t next_sequence_ = 1;
    std::uint64_t pruned_fence_ = 0;  // the largest fence of a pruned record
    prune_horizon horizon_;
    int fail_next_ = 0;
};

}  // namespace idem
