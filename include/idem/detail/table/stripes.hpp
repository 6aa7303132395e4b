// idem/detail/table/stripes.hpp: per-thread stripes of counters and arena cursors.
//
// A counter (or an arena's cursor) is split over stripe_count cache lines; each thread writes the
// stripe it was handed, and a sum over all stripes is the value.
//
// Invariants
// ----------
// * An ownable stripe (64 of them) has at most one writing thread at a time. stripe_owner hands it
//   to a thread by an acquire CAS on its bitmap and takes it back at thread exit with a release
//   RMW, so the next owner sees every value the last one wrote. Its owner advances it with a plain
//   load and store (stripe_add), never a locked RMW.
// * Threads beyond 64 live ones share the 8 shared stripes, and write there with RMWs only. So do
//   the threads of another copy of this code (record_table::my_stripe).
// * A thread's stripe_ref stays readable while its other thread_locals are destroyed, and turns
//   shared before its owned stripe is given back: a late write never lands on a stripe that
//   another thread may own by then.
// * Counters are statistics: every access is relaxed, and a sum over stripes is not a snapshot.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>

namespace idem::detail::table {

enum counter : unsigned {
    c_acquired,
    c_duplicates,
    c_in_progress,
    c_mismatch,
    c_succeeded,
    c_failed,
    c_released,
    c_stale,
    c_in_doubt,
    c_compensated,
    c_reclaimed,
    c_capacity,
    c_backpressure,
    c_evicted,
    c_fill0,
    c_fill1,
    c_rotation_blocked,
    c_restored_processing,
    c_recalls,
    c_recalled,
    c_recall_failed,
    c_superseded,  // ordered versions: claims refused for a newer version
    c_count
};

template <template <class> class Atomic>
struct alignas(64) counter_stripe {
    Atomic<std::uint64_t> v[c_count];
};

/// Stripes a thread can own (one writer), and stripes shared by the threads beyond them.
inline constexpr unsigned owned_stripes = 64;
inline constexpr unsigned shared_stripes = 8;
inline constexpr unsigned stripe_count = owned_stripes + shared_stripes;

/// The stripe of counters (and arena cursors) a thread writes. `owned`: no other thread writes it
/// while this thread lives, so an add is a plain load and store instead of a locked RMW (which on
/// x86 is a full barrier: it waits for the thread's pending stores, such as a new slot's cache
/// misses, at every counter and cursor).
struct stripe_ref {
    unsigned index;
    bool owned;
};

/// Hands each thread, at its first use, one of the 64 ownable stripes nobody holds, and takes it
/// back when the thread exits (release; the next owner's acquire sees every value written). Threads
/// beyond 64 live ones share the 8 shared stripes round robin and use RMWs there.
///
/// The thread's stripe_ref is a trivially destructible thread_local, so it stays readable while the
/// thread's other thread_locals (and, on the main thread, statics) are destroyed; a separate
/// releaser's destructor first turns it into a shared stripe and only then gives the owned one
/// back, so a guard or ticket destroyed later on this thread never writes a stripe that another
/// thread may own by then.
class stripe_owner {
public:
    [[nodiscard]] static stripe_ref take() noexcept {
        std::atomic<std::uint64_t>& held = taken();
        std::uint64_t seen = held.load(std::memory_order_relaxed);  // relaxed: the CAS decides
        while (seen != ~std::uint64_t{0}) {
            const auto i = static_cast<unsigned>(std::countr_one(seen));
            if (held.compare_exchange_weak(seen, seen | (std::uint64_t{1} << i), std::memory_order_acquire,
                                           std::memory_order_relaxed))
                return {i, true};
        }
        return shared(next_shared().fetch_add(1, std::memory_order_relaxed));  // relaxed: any value will do
    }

    /// Gives `ref` back at thread exit, after making it a shared stripe.
    struct releaser {
        stripe_ref* ref;
        ~releaser() {
            const stripe_ref was = *ref;
            if (!was.owned) return;
            *ref = shared(was.index);
            taken().fetch_and(~(std::uint64_t{1} << was.index), std::memory_order_release);
        }
    };

    /// Which copy of this code handed out the thread's owned stripe. Each copy has its own (two
    /// shared objects built with hidden visibility each instantiate their own statics), so an
    /// table lets only one of them use its owned stripes (record_table::my_stripe).
    [[nodiscard]] static const void* registry() noexcept { return &taken(); }
    /// The shared stripe standing in for `ref` (RMWs only).
    [[nodiscard]] static stripe_ref as_shared(stripe_ref ref) noexcept { return shared(ref.index); }

private:
    [[nodiscard]] static stripe_ref shared(unsigned n) noexcept { return {owned_stripes + n % shared_stripes, false}; }
    static std::atomic<std::uint64_t>& taken() noexcept {
        static std::atomic<std::uint64_t> bits{0};  // trivially destructible: usable until the end
        static_assert(owned_stripes == 64, "one bit per ownable stripe");
        return bits;
    }
    static std::atomic<unsigned>& next_shared() noexcept {
        static std::atomic<unsigned> next{0};
        return next;
    }
};

inline stripe_ref this_thread_stripe() noexcept {
    thread_local stripe_ref ref{0, false};  // constant-initialized, never destroyed
    thread_local bool assigned = false;
    if (!assigned) [[unlikely]] {
        assigned = true;
        ref = stripe_owner::take();
        thread_local stripe_owner::releaser give_back{&ref};
        (void)give_back;
    }
    return ref;
}

/// Adds n to a counter or cursor of a stripe: a plain load and store when the calling thread owns
/// the stripe (record_table::stripe() says when), else a relaxed RMW.
template <class A>
void stripe_add(A& a, std::uint64_t n, bool owned) noexcept {
    if (owned)
        a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);  // relaxed: one writer; a statistic
    else a.fetch_add(n, std::memory_order_relaxed);                                 // relaxed: a statistic
}
}  // namespace idem::detail::table
