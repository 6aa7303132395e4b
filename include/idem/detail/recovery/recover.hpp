// idem/detail/recovery/recover.hpp: recovery, a guard's table rebuilt from its store at start. Every
// stored record is classified once, as it streams by (store::load):
//
//   claim in flight  PROCESSING: into the table, always (compensation must find it); no room fails
//                    the start (capacity_exhausted)
//   hot              released, or decided inside the hot window (options.retention): into the table
//                    while it has room (at most options.capacity of them, and options.payload_budget
//                    bytes of their payloads), else cold
//   cold             the rest of the idempotency window: the cold window's filter only (its hash and
//                    time: 24 bytes each while loading, 1.5 bytes after); a claim of one reads the store
//   expired          past the idempotency window: nowhere (the key is new; the flusher prunes it)
//
// then the fence floor: new fences start above the largest fence the store ever held (the largest
// loaded, or store::max_fence() when a prune may have removed larger ones). So memory and start-up
// follow the windows, not the store's lifetime.
//
// Thread-free: it runs on the constructing thread before the guard is shared. The durable guard
// calls recover(); the simulation (verify/sim_test.cpp) calls the same steps (load, fence_floor,
// install), replacing one of them in its mutations of recovery.
//
// Invariant: a claim never finds the table filled by decided records. Claims go into the table as
// they stream by; decided records of the hot window wait and go in afterwards, and one that does
// not fit then goes to the cold window, where the store answers for it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/recovery/clock_map.hpp"
#include "idem/detail/table/window_filter.hpp"
#include "idem/error.hpp"
#include "idem/guard.hpp"
#include "idem/key.hpp"
#include "idem/store.hpp"

namespace idem::detail::recovery {

/// What recovery found (durable.hpp's recovery_report takes these).
struct tally {
    std::size_t seen = 0;                      ///< records the store returned
    std::size_t records = 0;                   ///< put into the table (the hot window and every claim)
    std::size_t processing = 0;                ///< of those, claims in flight
    std::size_t refused = 0;                   ///< claims the table had no room for (the start then fails)
    std::size_t cold = 0;                      ///< given to the cold window
    std::size_t expired = 0;                   ///< past the idempotency window: forgotten
    std::chrono::nanoseconds elapsed{0};       ///< recover(): from the first read to the end
    std::chrono::nanoseconds cold_elapsed{0};  ///< of that, building the cold window's filter
};

/// What load() leaves for the steps after it.
struct loaded {
    tally counts;
    std::uint64_t max_fence = 0;                    ///< the largest fence read
    std::vector<table::window_filter::entry> cold;  ///< the cold window's keys, for install()
};

/// A no-op observer of restores.
struct no_observer {
    void operator()(const stored_record&) const noexcept {}
};

/// One record into the table, its times on the guard's clock (the one place recovery installs a
/// record). What restore answers: acquired, or capacity_exhausted (no slot, no room for its payload).
template <class G>
begin_status install_record(G& g, const key& k, const stored_record& r, std::chrono::nanoseconds updated,
                            const clock_map& clock, const store& st) {
    const begin_status s = guard_access::restore(g, k,
                                                 {r.state, r.fence, r.outcome, r.fingerprint,
                                                  clock.from_wall_ms(r.lease_until_ms, r.key, "lease_until", st), updated,
                                                  r.payload});
    // The store checked the record's fence and status (record_rules.hpp, record_fault), which is all
    // restore refuses besides room.
    IDEM_ASSERT(s == begin_status::acquired || s == begin_status::capacity_exhausted,
                "a record the store checked (fence 1 .. 2^52-1, a record's status) is one the table takes");
    return s;
}

/// A claim in flight into the table, counted in `n`; one that finds no room fails the start
/// (capacity_exhausted naming the key): compensation must find every claim.
template <class G>
void install_claim(G& g, const key& k, const stored_record& r, std::chrono::nanoseconds updated, const clock_map& clock,
                   const store& st, tally& n) {
    if (install_record(g, k, r, updated, clock, st) == begin_status::capacity_exhausted) {
        ++n.refused;
        throw error(errc::capacity_exhausted, st.name() +
                                                  ": recovery found more claims in flight than "
                                                  "options.capacity allows (at key '" +
                                                  key::printable(r.key) + "'); raise options.capacity");
    }
    ++n.records;
    ++n.processing;
}

/// Streams every record of `st` into `g` (claims, then the hot window) and collects the cold
/// window's keys; calls before_restore(record) before each record goes into the table. Throws what
/// store::load throws, corrupt_record for a stored time the mapping cannot hold, and
/// capacity_exhausted when the claims in flight do not fit.
template <class G, class Observe = no_observer>
loaded load(G& g, store& st, const clock_map& clock, const window& w, Observe&& before_restore = {}) {
    loaded out;
    tally& n = out.counts;
    const std::int64_t now_ms = clock.to_wall_ms(g.now());  // the mapping was just taken: the wall clock's now
    const auto retention_ms = std::chrono::duration_cast<std::chrono::milliseconds>(g.opts().retention).count();
    const std::int64_t hot_since_ms = retention_ms > now_ms ? INT64_MIN : now_ms - retention_ms;
    // Decided records of the hot window wait here (the invariant above). At most options.capacity
    // of them wait: the rest could not fit anyway. Their payloads wait too, at most
    // options.payload_budget bytes of them (what the arena could take); a record whose payload would
    // pass that goes to the cold window at once.
    std::vector<stored_record> hot;
    const std::size_t hot_limit = g.opts().capacity;
    std::size_t hot_payload_bytes = 0;
    const std::size_t hot_payload_limit = g.opts().payload_budget;
    st.load([&](const stored_record& r) {
        const auto k = key::parse(r.key);
        IDEM_ASSERT(k.has_value(), "store::load returns keys that pass key::check (else it throws corrupt_record)");
        ++n.seen;
        out.max_fence = std::max(out.max_fence, r.fence);
        const auto updated = clock.from_wall_ms(r.updated_ms, r.key, "updated_time", st);
        const bool claim = r.state == record_state::processing;
        if (!claim && w.past(r.updated_ms, now_ms)) {
            ++n.expired;
            return;
        }
        if (!claim && (r.updated_ms < hot_since_ms || hot.size() >= hot_limit ||
                       r.payload.size() > hot_payload_limit - hot_payload_bytes)) {
            out.cold.push_back(guard_access::cold_entry(g, *k, updated));
            return;
        }
        if (!claim) {
            hot_payload_bytes += r.payload.size();
            hot.push_back(r);
            return;
        }
        before_restore(r);
        install_claim(g, *k, r, updated, clock, st, n);
    });
    for (const stored_record& r : hot) {
        const auto k = key::parse(r.key);
        const auto updated = clock.from_wall_ms(r.updated_ms, r.key, "updated_time", st);
        before_restore(r);
        // The payload is copied into the guard's payload arena; a record whose payload does not fit
        // (over options.max_payload, or the budget spent) goes to the cold window as one the table
        // has no room for: a duplicate then reads it, bytes included, from the store.
        if (install_record(g, *k, r, updated, clock, st) == begin_status::capacity_exhausted) {
            out.cold.push_back(guard_access::cold_entry(g, *k, updated));
            continue;
        }
        ++n.records;
    }
    n.cold = out.cold.size();
    return out;
}

/// The fence new claims start above: the largest fence loaded, or, when the store was pruned (it
/// may have removed the records with the largest fences), the store's max_fence(), which remembers
/// them (a full read of the fences, so only then).
[[nodiscard]] inline std::uint64_t fence_floor(store& st, std::uint64_t loaded_max) {
    if (st.horizon().records_ms != prune_limits::keep_all) return std::max(loaded_max, st.max_fence());
    return loaded_max;
}

/// Gives the cold window its keys and sets the fence floor. Restored records keep their fences;
/// only claims made from now on need the floor. Throws capacity_exhausted when the filter gets no memory.
template <class G>
void install(G& g, const store& st, loaded& l, std::uint64_t floor) {
    const auto cold_started = std::chrono::steady_clock::now();
    if (!guard_access::remember_cold(g, l.cold))
        throw error(errc::capacity_exhausted,
                    st.name() + ": no memory for the cold window's filter of " + std::to_string(l.cold.size()) + " keys");
    l.cold = {};
    guard_access::set_fence_floor(g, floor);
    l.counts.cold_elapsed = std::chrono::steady_clock::now() - cold_started;
}

/// The whole of recovery: load, fence_floor, install.
template <class G, class Observe = no_observer>
tally recover(G& g, store& st, const clock_map& clock, const window& w, Observe&& before_restore = {}) {
    const auto started = std::chrono::steady_clock::now();
    loaded l = load(g, st, clock, w, before_restore);
    install(g, st, l, fence_floor(st, l.max_fence));
    l.counts.elapsed = std::chrono::steady_clock::now() - started;
    return l.counts;
}

// ---- recovery_start::claims_first ------------------------------------------------------------------
//
// The same classification, split in time. Before the guard serves: every claim in flight into the
// table (store::load_claims) and the fence floor from store::max_fence(), the largest fence the
// store ever wrote (the decided records' fences are not read now). The cold window is made partial
// first, so from the first claim on, a key memory does not hold is read from the store. After the
// guard serves, on another connection: every key of the window (store::load_window_keys, key and
// time only) into the filter in one slice, which completes it. A decided record is never in memory
// at start: a duplicate of one is answered from the store and its record comes back into memory
// (recall); the hot window fills again that way.

/// Loads the claims in flight into `g` and sets the fence floor; the cold window stays partial
/// until stream_window_keys completes it. Throws as load() does.
template <class G>
tally load_claims(G& g, store& st, const clock_map& clock) {
    const auto started = std::chrono::steady_clock::now();
    tally n;
    guard_access::begin_partial_cold(g);
    std::uint64_t max_fence = 0;
    st.load_claims([&](const stored_record& r) {
        const auto k = key::parse(r.key);
        IDEM_ASSERT(k.has_value(), "store::load_claims returns keys that pass key::check (else it throws corrupt_record)");
        IDEM_ASSERT(r.state == record_state::processing, "store::load_claims returns PROCESSING records only");
        ++n.seen;
        max_fence = std::max(max_fence, r.fence);
        install_claim(g, *k, r, clock.from_wall_ms(r.updated_ms, r.key, "updated_time", st), clock, st, n);
    });
    guard_access::set_fence_floor(g, std::max(max_fence, st.max_fence()));
    n.elapsed = std::chrono::steady_clock::now() - started;
    return n;
}

/// Thrown out of a store's stream to end it early (the guard is being destroyed).
struct stream_stopped {};

/// Streams every key of the window from `reader` (a second connection) into the cold window and
/// completes it. `stop` ends it early (stream_stopped), leaving the filter partial. Safe beside
/// the serving guard: remember_cold takes the rotation mutex, and a partial filter sends every
/// claim it is asked about to the store meanwhile. Returns the keys added (cold) and the time the
/// filter took (cold_elapsed); throws what the store throws, or capacity_exhausted when the filter
/// gets no memory (the filter stays partial: correct, every miss keeps reading the store).
template <class G, class Stop>
tally stream_window_keys(G& g, store& reader, const clock_map& clock, const window& w, std::int64_t now_ms, Stop&& stop) {
    const auto started = std::chrono::steady_clock::now();
    tally n;
    const std::int64_t since_ms = w.length == forever || w.length.count() > now_ms ? prune_limits::keep_all
                                                                                   : now_ms - w.length.count();
    std::vector<table::window_filter::entry> keys;
    std::size_t polled = 0;
    reader.load_window_keys(since_ms, [&](std::string_view k, std::int64_t updated_ms) {
        if ((++polled & 4095) == 0 && stop()) throw stream_stopped{};
        ++n.seen;
        if (w.past(updated_ms, now_ms)) {
            ++n.expired;
            return;
        }
        keys.push_back(guard_access::cold_entry(g, k, clock.from_wall_ms(updated_ms, k, "updated_time", reader)));
    });
    if (stop()) throw stream_stopped{};
    const auto filled = std::chrono::steady_clock::now();
    if (!guard_access::remember_cold(g, keys, /*completes=*/true))
        throw error(errc::capacity_exhausted,
                    reader.name() + ": no memory for the cold window's filter of " + std::to_string(keys.size()) + " keys");
    n.cold = keys.size();
    const auto done = std::chrono::steady_clock::now();
    n.cold_elapsed = done - filled;
    n.elapsed = done - started;
    return n;
}

}  // namespace idem::detail::recovery
