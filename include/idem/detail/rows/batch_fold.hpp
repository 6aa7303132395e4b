// idem/detail/rows/batch_fold.hpp: how a batch's rows become one record write per key, for every store.
//
// The reference semantics (store::apply): a key's rows apply in order, a row applies unless the
// record's fence is then higher, and against the record as it was before the batch the upsert
// guard holds: at the same fence a terminal record (SUCCESS, FAILED) is never taken back to
// PROCESSING or RELEASED. Every store writes what fold_batch() and folded() say, so they agree in
// general, not only for the batches the guard happens to produce (several transitions of a key,
// fences out of order, a claim, a release and a claim again, keys interleaved).
//
// The fold, per key. Let S be the stored fence, if any. Without S, row i applies iff its fence >= the
// largest fence of rows 0..i-1 (each row that set that maximum applied); call those rows the chain
// C: fences along C never decrease. With S, the rows that apply are the rows of C with fence >= S,
// a suffix of C. Hence, with F the fence of C's last row and P the last PROCESSING row of C:
//  - status, fence, outcome, payload, updated_time come from C's last row, written iff F > S, or
//    F == S and not (the stored record is terminal and C's last row is not): the upsert's guard
//    (apply_guard). The payload goes with the outcome: a completion's bytes, or none for a claim or a
//    release (a key claimed again does not keep the response of an earlier life);
//  - lease_until and request_fingerprint come from P, written iff the guard passes and P's fence >=
//    S, or on insert; otherwise they keep their stored values (0 on insert without P);
//  - created_time (on insert) is the first row's time; biz_type is biz_type_of(key).
// The SQL stores put the guard into their upsert (the stored record is on the server); memory_store
// and RocksDB read the record and call folded().
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/store_rows.hpp"

namespace idem::detail::rows {

[[nodiscard]] constexpr bool is_terminal(record_state s) noexcept {
    return s == record_state::succeeded || s == record_state::failed;
}

/// One key's rows in a batch, folded (see the header).
struct key_fold {
    const store_row* first = nullptr;  ///< the key's first row (created_time on insert)
    const store_row* last = nullptr;   ///< the last row of the chain C
    const store_row* proc = nullptr;   ///< the last PROCESSING row of C, or nullptr
    [[nodiscard]] std::string_view key() const noexcept { return first->t.k.view(); }
};

/// A batch folded: one entry per key in the order keys first appear, and for each row the index of
/// its key's entry.
struct batch_fold {
    std::vector<key_fold> keys;
    std::vector<std::size_t> key_of;  ///< key_of[i]: the entry of rows[i]'s key
};

/// Folds `rows`. Sorted input (by key, then seq: what the flusher passes) groups by neighbours
/// without a lookup; any order is folded exactly, a key's rows taken in the order given.
[[nodiscard]] inline batch_fold fold_batch(std::span<const store_row> rows) {
    batch_fold out;
    out.keys.reserve(rows.size());
    out.key_of.reserve(rows.size());
    std::unordered_map<std::string_view, std::size_t> index;  // only once the input is seen unsorted
    bool sorted = true;  // every key so far greater than the one before: all distinct, no lookup needed
    std::string_view prev_key;
    std::size_t prev = 0;
    const auto add = [&](const store_row& r) {
        out.keys.push_back({&r, &r, r.t.to == record_state::processing ? &r : nullptr});
        return out.keys.size() - 1;
    };
    for (const store_row& r : rows) {
        const std::string_view k = r.t.k.view();
        std::size_t i;
        if (!out.keys.empty() && k == prev_key) {
            i = prev;
        } else if (sorted && (out.keys.empty() || k > prev_key)) {
            i = add(r);
        } else {
            if (sorted) {
                sorted = false;
                for (std::size_t j = 0; j < out.keys.size(); ++j) index.emplace(out.keys[j].key(), j);
            }
            const auto it = index.find(k);
            i = it != index.end() ? it->second : add(r);
            if (it == index.end()) index.emplace(k, i);
        }
        prev_key = k;
        prev = i;
        key_fold& f = out.keys[i];
        if (&r != f.first && r.t.fence >= f.last->t.fence) {
            f.last = &r;
            if (r.t.to == record_state::processing) f.proc = &r;
        }
        out.key_of.push_back(i);
    }
    return out;
}

/// Whether a fold whose chain ends at fence `fence` in state `to` may overwrite the stored record
/// (fence `stored_fence`, state `stored`): the upsert guard of every store.
[[nodiscard]] constexpr bool apply_guard(std::uint64_t stored_fence, record_state stored, std::uint64_t fence,
                                         record_state to) noexcept {
    return stored_fence < fence || (stored_fence == fence && (!is_terminal(stored) || is_terminal(to)));
}

/// The key's record after the batch, given the record before it (nullptr: none). Returns nullopt
/// when the stored record stays as it is.
[[nodiscard]] inline std::optional<stored_record> folded(const key_fold& f, const stored_record* before) {
    IDEM_ASSERT(before == nullptr || before->key == f.key(), "folded() is given the stored record of the fold's own key");
    const store_row& last = *f.last;
    stored_record rec;
    if (before != nullptr) {
        if (!apply_guard(before->fence, before->state, last.t.fence, last.t.to)) return std::nullopt;
        rec = *before;
        if (f.proc != nullptr && f.proc->t.fence >= before->fence) {
            rec.lease_until_ms = f.proc->lease_until_ms;
            rec.fingerprint = f.proc->t.fingerprint;
        }
    } else {
        rec.key = std::string(f.key());
        rec.biz_type = biz_type_of(rec.key);
        rec.created_ms = f.first->at_ms;
        if (f.proc != nullptr) {
            rec.lease_until_ms = f.proc->lease_until_ms;
            rec.fingerprint = f.proc->t.fingerprint;
        }
    }
    rec.state = last.t.to;
    rec.fence = last.t.fence;
    rec.outcome = last.t.outcome;
    rec.payload.assign(last.t.payload.data(), last.t.payload.size());  // copied: the view ends at the flush
    rec.updated_ms = last.at_ms;
    return rec;
}

}  // namespace idem::detail::rows
