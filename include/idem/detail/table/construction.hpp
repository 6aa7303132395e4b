// idem/detail/table/construction.hpp: how a record table is built: the options' rules (each refusal
// an idem::error naming the option), both generations mapped up front (the hot path never
// allocates), the hash secret drawn, and the toucher started for a guard without prefault.
//
// Included by record_table.hpp, whose class declares these members: each definition is `inline`, as
// a definition in the class is, except those the class declares [[gnu::noinline]] (never inlined).
//
// Memory is mapped once, 2 MiB aligned, arenas (and an index up to 32 MiB) in huge pages, and
// committed lazily; a thread (arena_toucher) populates each arena a little ahead of the claims,
// without writing, so they do not fault on the hot path (docs/design.md, "Memory").
//
// Invariant: a table exists only with options it can keep: capacity within max_capacity (every
// slot nameable by a 32-bit position ref), max_payload within the 1 MiB hard maximum every store
// accepts (record_image.hpp ties the two), a payload budget that holds one payload of the largest
// size. Everything is mapped and zeroed before the table is shared.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "idem/detail/table/record_table.hpp"

namespace idem::detail::table {

/// The options' rules, in the order they are checked; each refusal names the option.
template <template <class> class Atomic, class Clock>
inline void record_table<Atomic, Clock>::check_options(const options& o) {
    if (o.capacity == 0) throw error(errc::invalid_argument, "options.capacity is 0; it must be at least 1");
    if (o.capacity > max_capacity)
        throw error(errc::invalid_argument,
                    "options.capacity " + std::to_string(o.capacity) + " exceeds the limit of 2^30 records");
    if (o.max_probe == 0) throw error(errc::invalid_argument, "options.max_probe is 0; it must be at least 1");
    if (o.lease <= std::chrono::nanoseconds::zero()) throw error(errc::invalid_argument, "options.lease must be positive");
    if (o.retention < std::chrono::nanoseconds::zero())
        throw error(errc::invalid_argument, "options.retention must not be negative");
    if (o.adaptive.enabled) check_adaptive_lease(o.adaptive);
    static_assert(options::max_payload_limit == std::size_t{1} << 20, "the message below says 1 MiB");
    if (o.max_payload > options::max_payload_limit)
        throw error(errc::invalid_argument, "options.max_payload " + std::to_string(o.max_payload) +
                                                " exceeds the hard maximum of 1 MiB (" +
                                                std::to_string(options::max_payload_limit) + " bytes)");
    if (o.payload_budget != 0 && o.payload_budget < o.max_payload)
        throw error(errc::invalid_argument, "options.payload_budget " + std::to_string(o.payload_budget) +
                                                " is below options.max_payload " + std::to_string(o.max_payload) +
                                                "; it must hold one payload of the largest size (or be 0: no payloads)");
    if (o.payload_budget > (std::size_t{1} << 40))
        throw error(errc::invalid_argument,
                    "options.payload_budget " + std::to_string(o.payload_budget) + " exceeds the limit of 2^40 bytes");
}

template <template <class> class Atomic, class Clock>
inline record_table<Atomic, Clock>::record_table(options opts, Clock clock, transition_sink* sink)
    : opts_(std::move(opts)), clock_(clock), sink_(sink) {
    check_options(opts_);
    if (opts_.adaptive.enabled) leases_ = std::make_unique<operation_leases>(opts_.adaptive);
    std::size_t slots = 2;
    while (slots < 2 * opts_.capacity) slots <<= 1;
    gens_[0] = std::make_unique<generation<Atomic>>(slots, opts_.prefault, opts_.payload_budget, opts_.max_payload);
    gens_[1] = std::make_unique<generation<Atomic>>(slots, opts_.prefault, opts_.payload_budget, opts_.max_payload);
    std::random_device rd;
    for (auto& b : secret_) b = static_cast<unsigned char>(rd());
    for (auto& st : stripes_)
        for (auto& c : st.v) c.store(0, std::memory_order_relaxed);    // relaxed: before publication
    for (auto& b : fill_base_) b.store(0, std::memory_order_relaxed);  // relaxed: before publication
    if (opts_.ordered_versions)  // one map per generation, sized like it (version_map.hpp)
        for (auto& v : versions_) v = std::make_unique<version_map<Atomic>>(slots, opts_.prefault);
    if constexpr (std::is_same_v<Atomic<std::uint64_t>, std::atomic<std::uint64_t>>) {
        if (!opts_.prefault) {
            // Generation 0 takes the first claims: its arenas' first pages now, and its index if
            // it is small enough to be in huge pages (a few dozen claims would touch all of it).
            generation<Atomic>& g0 = *gens_[0];
            const bool small_index = g0.index_bytes() <= huge_index_limit;
            // The payload arenas come last: not populated now (a guard may never store a
            // payload); the toucher keeps one ahead once it is in use.
            std::vector<arena_toucher::span> spans{g0.slots().span(), g0.keys().span(), gens_[1]->slots().span(),
                                                   gens_[1]->keys().span()};
            for (auto& g : gens_)
                if (g->payloads().capacity_bytes() != 0) spans.push_back(g->payloads().span());
            toucher_ = std::make_unique<arena_toucher>(std::move(spans), 2, small_index ? g0.index_memory() : nullptr,
                                                       small_index ? g0.index_bytes() : 0);
        }
    }
}

}  // namespace idem::detail::table
