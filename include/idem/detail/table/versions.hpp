// idem/detail/table/versions.hpp: the table's steps for two options off by default: ordered versions
// (options.ordered_versions: the version step before a claim, the recheck after it; version_map.hpp
// holds the argument) and adaptive leases (options.adaptive: a claim's lease from its operation's
// measured latency; lease_histogram.hpp).
//
// Included by record_table.hpp, whose class declares these members: each definition is `inline`, as
// a definition in the class is, except those the class declares [[gnu::noinline]] (never inlined).
//
// Invariant: with an option off, its step costs the claim one predictable branch (lease_for's, and
// the claim's test of versions_[0]); every step past that branch is out of line ([[gnu::noinline]]),
// so the claim stays small enough for the compiler to inline its own steps (measured with callgrind:
// scripts/count-instructions).
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "idem/detail/table/record_table.hpp"

namespace idem::detail::table {

/// The lease of a new claim of k: options.lease, or with options.adaptive its operation's
/// (detail/table/lease_histogram.hpp). Off, one predictable branch.
template <template <class> class Atomic, class Clock>
inline std::chrono::nanoseconds record_table<Atomic, Clock>::lease_for(const key& k) const noexcept {
    if (leases_ == nullptr) [[likely]]
        return opts_.lease;
    return adaptive_lease_for(k);
}

/// lease_for() with options.adaptive. Out of line, like every step of an option that is off by
/// default: inlined, its key parsing would make the claim too large for the compiler to inline
/// the claim's own small steps (measured with callgrind: the counters' adds became calls).
template <template <class> class Atomic, class Clock>
std::chrono::nanoseconds record_table<Atomic, Clock>::adaptive_lease_for(const key& k) const noexcept {
    const auto parts = k.split();
    const auto l = parts ? leases_->lease(parts->operation) : std::chrono::nanoseconds::zero();
    return l.count() != 0 ? l : opts_.lease;
}

/// Records a terminal completion's claim-to-completion time (options.adaptive).
template <template <class> class Atomic, class Clock>
void record_table<Atomic, Clock>::observe(const key& k, std::chrono::nanoseconds took) noexcept {
    if (const auto parts = k.split()) leases_->record(parts->operation, took);
}

/// Recomputes the adaptive leases (guard::maintain()); nothing when options.adaptive is off.
template <template <class> class Atomic, class Clock>
inline void record_table<Atomic, Clock>::refresh_leases() noexcept {
    if (leases_ != nullptr) leases_->refresh();
}

/// Each measured operation's latencies and lease in force; empty when options.adaptive is off.
template <template <class> class Atomic, class Clock>
inline std::vector<operation_latency> record_table<Atomic, Clock>::operation_latencies() const {
    return leases_ != nullptr ? leases_->snapshot(opts_.lease) : std::vector<operation_latency>{};
}

/// The key's (txid, operation) identity and version, or nullopt for a key key::compose could
/// not have made. The identity hashes "TXID_OPERATION", the key up to its last '_'.
template <template <class> class Atomic, class Clock>
inline std::optional<version_claim> record_table<Atomic, Clock>::version_claim_of(const key& k) const noexcept {
    const auto parts = k.split();
    if (!parts) return std::nullopt;
    const std::size_t prefix = static_cast<std::size_t>(parts->operation.data() - k.view().data()) + parts->operation.size();
    return version_claim::of(hash_text(k.view().substr(0, prefix)), parts->version);
}

/// The version step (version_map.hpp) of a claim that would be granted in epoch `epoch`:
/// nullopt to go on claiming, or superseded (a newer version was claimed), or capacity_exhausted
/// (the current map has no room for the identity; nothing changed).
/// The key is split and hashed on each call (a claim retried after a lost race calls it again):
/// nothing is kept on the stack of a claim that never asks.
template <template <class> class Atomic, class Clock>
auto record_table<Atomic, Clock>::version_step_of(const key& k, std::uint64_t epoch) noexcept
    -> std::optional<begin_answer> {
    const std::optional<version_claim> claim = version_claim_of(k);  // nullopt: not composed, no ordering
    if (!claim) return std::nullopt;
    const version_map<Atomic>* previous = epoch != 0 ? versions_[(epoch + 1) & 1].get() : nullptr;
    const auto r = version_step(*versions_[epoch & 1], previous, *claim, opts_.max_probe);
    switch (r.what) {
        case version_map<Atomic>::raised::granted: return std::nullopt;
        case version_map<Atomic>::raised::superseded:
            count(c_superseded);
            return begin_answer{begin_status::superseded, {}, r.newest, 0};
        case version_map<Atomic>::raised::full: break;
    }
    count(c_capacity);
    return begin_answer{begin_status::capacity_exhausted, {}, 0, 0};
}

/// The version step for a claim of a key memory may not know (`unknown`: no record in either
/// generation). A newer version supersedes k only if k itself never ran: a version that ran
/// and left memory is in the cold window, and its duplicate must get its recorded answer, not
/// superseded ("not executed" for a charge that ran would have it charged again by other
/// means). So a superseded answer for a key the cold window may hold asks the store first:
/// its record (replayed, nothing installed) or store_unavailable when it cannot be read.
template <template <class> class Atomic, class Clock>
auto record_table<Atomic, Clock>::version_step_after_recall(const key& k, hash128 h, std::uint64_t epoch, bool unknown,
                                                            std::uint64_t fingerprint, std::string* payload) noexcept
    -> std::optional<begin_answer> {
    std::optional<begin_answer> v = version_step_of(k, epoch);
    if (!v || v->status != begin_status::superseded || !unknown || cold_ == nullptr || !cold_->may_contain(h.lo, h.hi))
        return v;
    if (auto recalled = recall_without_slot(k, fingerprint, payload)) return recalled;
    return v;  // the store has no record of k (or only a released one): it never ran
}

/// The recheck: the newest version of k's (txid, operation), if newer than k's own version.
/// `gen` is the generation of the claim, whose map was current at its step. While it is still
/// current (a claim it holds keeps it from being recycled, so the parity tells), a newer version
/// granted after our step took its own step there: a step in a later epoch follows the rotation
/// (7) that this load (6) would see, and a step in an earlier epoch fails its epoch check and is
/// taken again here. Otherwise the other map is read too.
template <template <class> class Atomic, class Clock>
std::optional<std::uint32_t> record_table<Atomic, Clock>::newer_version(const key& k,
                                                                        const generation<Atomic>& gen) const noexcept {
    const auto c = version_claim_of(k);
    if (!c) return std::nullopt;
    const unsigned g = &gen == gens_[0].get() ? 0 : 1;
    std::int64_t newest = versions_[g]->newest(*c, opts_.max_probe);
    if ((epoch_.load(std::memory_order_seq_cst) & 1) != g)  // (6)
        newest = std::max(newest, versions_[g ^ 1]->newest(*c, opts_.max_probe));
    if (newest <= static_cast<std::int64_t>(c->version)) return std::nullopt;
    return static_cast<std::uint32_t>(newest);
}

}  // namespace idem::detail::table
