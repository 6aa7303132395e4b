// relacy_test: Relacy (relacy-dev) drives the real slot code through the guard's atomic template
// parameter, under its simulated C++ memory model (stores may be seen late, relaxed loads may read
// any value coherence allows), with a random scheduler and a context-bound (exhaustive up to K
// preemptions) scheduler.
//
// How the engine meets Relacy
// ---------------------------
// `template<class T> using rl_atomic = rl::atomic<T>` does not compile against the engine, and
// Relacy's own bridge does not either (docs/testing.md, "Relacy", has the compiler's words):
//   * rl::atomic's members take an rl::memory_order *and* a debug_info: load(mo, $). The engine calls
//     load(std::memory_order_acquire). Relacy's bridge is a macro, `#define memory_order_acquire
//     mo_acquire, $`, plus relacy_std.hpp's `namespace std { using rl::atomic; using
//     rl::memory_order; }`. Both collide with <atomic>, which the engine includes (std::atomic and
//     std::memory_order are already declared), and the macro would also rewrite the engine's plain
//     std::atomic uses (the counter stripe picker, manual_clock) into calls std::atomic rejects.
// So the engine is instantiated with `rl_std_atomic<T>` below: a thin class holding an rl::atomic<T>
// that offers std::atomic's signatures, maps std::memory_order to rl::memory_order one to one, and
// passes the *caller's* source location (std::source_location default argument) as Relacy's debug
// info, so histories name engine.hpp lines. Every atomic access of the engine reaches Relacy with the
// engine's own memory order.
//
// The engine's two thread fences, (8) acquire and (9) release, are free functions
// (std::atomic_thread_fence), not members of the template parameter. They matter: without them the
// seqlock reader could validate a torn snapshot. They are routed to rl::atomic_thread_fence by a
// preprocessor shim active only while the engine's headers are read (IDEM_RL_FENCE below). A library
// hook (the atomic policy supplying the fence) would make the shim unnecessary: see docs/testing.md.
//
// What is not modelled: the random hash secret (std::random_device) differs per iteration, so slot
// positions vary; every scenario below is symmetric in them (one key per probe chain or room for
// all keys), but Relacy's replay of a failing iteration may report "non-deterministic" when the
// placement changed. std::mutex in rotation is taken by one simulated thread only.
//
// Usage: relacy_test [iterations-scale]   (IDEM_RELACY_SCALE=N multiplies every iteration count)

// ---- everything the engine includes, before the fence shim -----------------------------------
#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <source_location>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <idem/error.hpp>
#include <idem/key.hpp>
#include <idem/options.hpp>
#include <idem/stats.hpp>
#include <idem/transition.hpp>
#include <idem/store.hpp>
#include <idem/verify.hpp>

namespace std {
// Declared here, defined below once Relacy is included. Only the engine's headers see it.
void idem_rl_thread_fence(std::memory_order mo,
                          std::source_location where = std::source_location::current()) noexcept;
}  // namespace std

#define atomic_thread_fence idem_rl_thread_fence  // IDEM_RL_FENCE: (8) and (9) go to Relacy
#include <idem/guard.hpp>
#undef atomic_thread_fence

#include <relacy/relacy.hpp>
// Relacy's convenience macros would rewrite this file's own code; the adapter below needs none.
#undef new
#undef delete
#undef malloc
#undef calloc
#undef realloc
#undef free
#undef memory_order_relaxed
#undef memory_order_consume
#undef memory_order_acquire
#undef memory_order_release
#undef memory_order_acq_rel
#undef memory_order_seq_cst

namespace idem_rl {

constexpr rl::memory_order to_rl(std::memory_order mo) noexcept {
    switch (mo) {
        case std::memory_order_relaxed: return rl::mo_relaxed;
        case std::memory_order_consume: return rl::mo_consume;
        case std::memory_order_acquire: return rl::mo_acquire;
        case std::memory_order_release: return rl::mo_release;
        case std::memory_order_acq_rel: return rl::mo_acq_rel;
        case std::memory_order_seq_cst: return rl::mo_seq_cst;
    }
    return rl::mo_seq_cst;
}

inline rl::debug_info info(const std::source_location& l) noexcept {
    return rl::debug_info(l.function_name(), l.file_name(), l.line());
}

/// Bookkeeping accesses (statistics counters, the cold key bytes written beside a slot) are not
/// scheduling points: a context switch there is equivalent to one at the next protocol access, so
/// the context-bound search spends its preemptions on the slot word and fields. They still go through
/// Relacy's memory model (a relaxed load may read an old value), so the seqlock that validates the
/// key bytes in compensation is still checked. Set IDEM_RELACY_ALL_POINTS=1 to preempt everywhere.
inline bool bookkeeping(const std::source_location& l) noexcept {
    static const bool all_points = std::getenv("IDEM_RELACY_ALL_POINTS") != nullptr;
    if (all_points) return false;
    const std::string_view f = l.function_name();
    for (std::string_view name : {"::count(", "::sum(", "::note_probe(", "write_key", "read_key", "::snapshot_stats(",
                                  "this_thread_stripe"})
        if (f.find(name) != std::string_view::npos) return true;
    return false;
}

/// Runs fn with Relacy's preemption disabled when the access is bookkeeping.
template <class Fn>
auto access(const std::source_location& l, Fn&& fn) {
    if (bookkeeping(l)) {
        rl::preemption_disabler off(rl::ctx());
        return fn();
    }
    return fn();
}

/// std::atomic's interface over rl::atomic (see the header comment).
template <class T>
class rl_std_atomic {
    using loc = std::source_location;

public:
    rl_std_atomic(loc l = loc::current()) { a_.store(T(), rl::mo_relaxed, info(l)); }
    rl_std_atomic(T v, loc l = loc::current()) { a_.store(v, rl::mo_relaxed, info(l)); }
    rl_std_atomic(const rl_std_atomic&) = delete;
    rl_std_atomic& operator=(const rl_std_atomic&) = delete;

    T load(std::memory_order mo = std::memory_order_seq_cst, loc l = loc::current()) const {
        return access(l, [&] { return a_.load(to_rl(mo), info(l)); });
    }
    void store(T v, std::memory_order mo = std::memory_order_seq_cst, loc l = loc::current()) {
        access(l, [&] { a_.store(v, to_rl(mo), info(l)); });
    }
    bool compare_exchange_strong(T& e, T d, std::memory_order mo = std::memory_order_seq_cst,
                                 loc l = loc::current()) {
        return access(l, [&] { return a_.compare_exchange_strong(e, d, to_rl(mo), info(l)); });
    }
    bool compare_exchange_weak(T& e, T d, std::memory_order mo = std::memory_order_seq_cst, loc l = loc::current()) {
        return access(l, [&] { return a_.compare_exchange_weak(e, d, to_rl(mo), info(l)); });
    }
    T fetch_add(T v, std::memory_order mo = std::memory_order_seq_cst, loc l = loc::current()) {
        return access(l, [&] { return a_.fetch_add(v, to_rl(mo), info(l)); });
    }

private:
    mutable rl::atomic<T> a_;
};

}  // namespace idem_rl

void std::idem_rl_thread_fence(std::memory_order mo, std::source_location where) noexcept {
    rl::atomic_thread_fence(idem_rl::to_rl(mo), idem_rl::info(where));
}

namespace {

using idem::begin_status;
using idem::errc;
using idem::record_state;
using idem::resolution;
using rl_guard = idem::basic_guard<idem_rl::rl_std_atomic, idem::manual_clock>;
using rl_ticket = idem::basic_ticket<idem_rl::rl_std_atomic, idem::manual_clock>;

constexpr auto lease = std::chrono::seconds(1);

/// Records every transition the engine offers, in offer order. The simulated threads are fibers on
/// one OS thread that switch only at Relacy operations, so a plain array is safe here; it is the
/// audit trail the durable pipeline would write, checked with idem::verify's trail checker.
class recording_sink final : public idem::transition_sink {
public:
    std::uint64_t offer(const idem::transition& t) noexcept override {
        if (n_ == rows_.size()) return 0;
        rows_[n_++] = t;
        return n_;
    }
    bool await(std::uint64_t) noexcept override { return true; }
    bool synchronous() const noexcept override { return false; }

    /// Runs the trail through idem::detail::trail_checker; returns the violations.
    std::vector<std::string> violations() const {
        idem::verify_report report;
        idem::detail::trail_checker checker(report);
        for (std::size_t i = 0; i < n_; ++i) {
            const auto& t = rows_[i];
            idem::audit_entry a;
            a.sequence = static_cast<std::int64_t>(i + 1);
            a.key = t.k.str();
            a.from = t.from;
            a.to = t.to;
            a.fence = t.fence;
            checker.row(a);
        }
        return report.violations;
    }
    [[nodiscard]] std::size_t count(record_state to, const idem::key& k) const {
        std::size_t c = 0;
        for (std::size_t i = 0; i < n_; ++i) c += rows_[i].to == to && rows_[i].k == k;
        return c;
    }

private:
    std::array<idem::transition, 32> rows_{};
    std::size_t n_ = 0;
};

idem::options rl_options(std::size_t capacity = 1) {
    idem::options o;
    o.capacity = capacity;
    o.max_probe = 64;
    o.lease = lease;
    o.retention = std::chrono::nanoseconds(0);
    o.maintenance_interval = {};
    return o;
}

/// The trail a scenario produced must be a legal path of the state machine (verify.hpp).
#define IDEM_RL_CHECK_TRAIL(sink)                                   \
    do {                                                            \
        const auto v_ = (sink).violations();                        \
        for (const auto& s_ : v_) std::fprintf(stderr, "%s\n", s_.c_str()); \
        RL_ASSERT(v_.empty());                                      \
    } while (0)

// ---- claim vs claim: exactly one acquires; the loser sees in_progress or the replayed outcome -----
struct claim_vs_claim : rl::test_suite<claim_vs_claim, 3> {
    recording_sink sink;
    idem::manual_clock clock;
    std::optional<rl_guard> g;
    const idem::key k{"TX1_PAY_v1"};
    int acquired = 0;
    int replayed = 0;

    void before() { g.emplace(rl_options(), clock, &sink); }
    void thread(unsigned) {
        auto r = g->begin(k, 99);
        if (r.status == begin_status::acquired) {
            ++acquired;
            RL_ASSERT(!r.ticket.succeed(42));
        } else if (r.status == begin_status::succeeded) {
            RL_ASSERT(r.outcome == 42);  // a replay carries the published outcome, never a torn one
            ++replayed;
        } else {
            RL_ASSERT(r.status == begin_status::in_progress);
        }
    }
    void after() {
        RL_ASSERT(acquired == 1);
        const auto v = g->query(k);
        RL_ASSERT(v.state == record_state::succeeded && v.outcome == 42 && v.fingerprint == 99);
        RL_ASSERT(sink.count(record_state::processing, k) == 1);
        IDEM_RL_CHECK_TRAIL(sink);
        g.reset();
    }
};

// ---- claim vs complete vs compensation ------------------------------------------------------------
// The owner holds a claim whose lease has expired and has executed the effect; it records success
// while compensation (truthful resolver: "it ran, outcome 7") resolves the same claim and a third
// caller begins the key. Exactly one completion is recorded; the loser of owner vs compensation is
// told stale_ticket (owner) or skips (compensation); nobody acquires the key again.
template <resolution Verdict>
struct complete_vs_compensate : rl::test_suite<complete_vs_compensate<Verdict>, 3> {
    recording_sink sink;
    idem::manual_clock clock;
    std::optional<rl_guard> g;
    std::optional<rl_ticket> owner;
    const idem::key k{"TX2_PAY_v1"};
    std::error_code owner_ec;
    std::size_t resolved = 0;
    begin_status third = begin_status::acquired;

    void before() {
        auto o = rl_options();
        o.resolve = [](const idem::expired_claim&) { return idem::resolver_answer{Verdict, 7}; };
        g.emplace(std::move(o), clock, &sink);
        auto r = g->begin(k);
        RL_ASSERT(r.status == begin_status::acquired);
        owner.emplace(std::move(r.ticket));
        clock.advance(2 * lease);  // expired: compensation may take it
    }
    void thread(unsigned i) {
        if (i == 0) {
            do owner_ec = owner->succeed(7);
            while (owner_ec == errc::busy);  // compensation holds it for a moment
        } else if (i == 1) {
            resolved = g->compensate();
        } else {
            auto r = g->begin(k);
            third = r.status;
            RL_ASSERT(r.status != begin_status::acquired);
        }
    }
    void after() {
        const auto v = g->query(k);
        if (!owner_ec) {
            RL_ASSERT(resolved == 0 || Verdict == resolution::unknown);
            RL_ASSERT(v.state == record_state::succeeded && v.outcome == 7 && !v.in_doubt);
        } else {
            RL_ASSERT(owner_ec == errc::stale_ticket);  // a stale fence never completes
            RL_ASSERT(resolved == 1);
            RL_ASSERT(v.state == record_state::succeeded && v.outcome == 7);
        }
        RL_ASSERT(sink.count(record_state::succeeded, k) == 1);
        RL_ASSERT(sink.count(record_state::processing, k) <= 2);  // the claim, maybe a doubt mark
        IDEM_RL_CHECK_TRAIL(sink);
        owner.reset();
        g.reset();
    }
};

// ---- renewal vs compensation: a renewed lease is never compensated --------------------------------
// The owner renews (extend) an expired lease and completes while compensation, whose resolver would
// say not_executed, scans. Either compensation wins before the renewal (the owner's renewal and
// completion are refused as stale and the key is claimable again) or the renewal wins and
// compensation must skip the claim (its lease re-check under `completing`).
struct extend_vs_compensate : rl::test_suite<extend_vs_compensate, 2> {
    recording_sink sink;
    idem::manual_clock clock;
    std::optional<rl_guard> g;
    std::optional<rl_ticket> owner;
    const idem::key k{"TX3_PAY_v1"};
    std::error_code extend_ec, succeed_ec;
    std::size_t resolved = 0;

    void before() {
        auto o = rl_options();
        o.resolve = [](const idem::expired_claim&) { return idem::resolver_answer{resolution::not_executed, 0}; };
        g.emplace(std::move(o), clock, &sink);
        auto r = g->begin(k);
        owner.emplace(std::move(r.ticket));
        clock.advance(2 * lease);
    }
    void thread(unsigned i) {
        if (i == 0) {
            do extend_ec = owner->extend(10 * lease);
            while (extend_ec == errc::busy);
            if (!extend_ec) {
                do succeed_ec = owner->succeed(5);
                while (succeed_ec == errc::busy);
            }
        } else {
            resolved = g->compensate();
        }
    }
    void after() {
        const auto v = g->query(k);
        if (!extend_ec) {
            RL_ASSERT(resolved == 0);  // renewed before compensation decided: never compensated
            RL_ASSERT(!succeed_ec);
            RL_ASSERT(v.state == record_state::succeeded && v.outcome == 5);
        } else {
            RL_ASSERT(extend_ec == errc::stale_ticket);
            RL_ASSERT(resolved == 1);
            RL_ASSERT(v.state == record_state::absent);  // released: claimable again
        }
        IDEM_RL_CHECK_TRAIL(sink);
        owner.reset();
        g.reset();
    }
};

// ---- lookup during claim: readers never see a torn or backwards record ----------------------------
struct lookup_during_claim : rl::test_suite<lookup_during_claim, 3> {
    recording_sink sink;
    idem::manual_clock clock;
    std::optional<rl_guard> g;
    const idem::key k{"TX4_PAY_v1"};

    void before() { g.emplace(rl_options(), clock, &sink); }
    void thread(unsigned i) {
        if (i == 0) {
            auto r = g->begin(k, 1234);
            RL_ASSERT(r.status == begin_status::acquired);
            RL_ASSERT(!r.ticket.succeed(42));
            return;
        }
        // Two observations in a row by the same reader: the state only moves forward, and every
        // published view carries the fields written with it.
        int last = 0;  // 0 absent, 1 processing, 2 succeeded
        for (int n = 0; n < 2; ++n) {
            const auto v = g->query(k);
            int now = 0;
            if (v.state == record_state::processing) {
                RL_ASSERT(v.fingerprint == 1234 && v.lease_until.count() > 0);
                now = 1;
            } else if (v.state == record_state::succeeded) {
                RL_ASSERT(v.outcome == 42 && v.fingerprint == 1234);
                now = 2;
            } else {
                RL_ASSERT(v.state == record_state::absent);
            }
            RL_ASSERT(now >= last);
            last = now;
        }
    }
    void after() {
        RL_ASSERT(g->query(k).state == record_state::succeeded);
        IDEM_RL_CHECK_TRAIL(sink);
        g.reset();
    }
};

// ---- claim vs generation rotation: a rotation never lets a key be claimed twice -------------------
// Before: key A completed in generation 0, rotation 1, key C completed in generation 1, so the next
// rotation recycles generation 0 (A is evicted) and makes it current. Two callers claim key B
// while that rotation runs: exactly one acquires, and the claim survives the rotation.
struct claim_vs_rotation : rl::test_suite<claim_vs_rotation, 3> {
    recording_sink sink;
    idem::manual_clock clock;
    std::optional<rl_guard> g;
    const idem::key a{"TXA_PAY_v1"}, b{"TXB_PAY_v1"}, c{"TXC_PAY_v1"};
    int acquired = 0;
    bool rotated = false;

    void before() {
        g.emplace(rl_options(2), clock, &sink);
        { auto r = g->begin(a); RL_ASSERT(!r.ticket.succeed(1)); }
        clock.advance(std::chrono::seconds(1));
        RL_ASSERT(g->collect());
        { auto r = g->begin(c); RL_ASSERT(!r.ticket.succeed(3)); }
        clock.advance(std::chrono::seconds(1));
    }
    void thread(unsigned i) {
        if (i == 2) {
            rotated = g->collect();
            return;
        }
        auto r = g->begin(b);
        if (r.status == begin_status::acquired) {
            ++acquired;
            RL_ASSERT(!r.ticket.succeed(2));
        } else {
            RL_ASSERT(r.status == begin_status::in_progress || (r.status == begin_status::succeeded && r.outcome == 2));
        }
    }
    void after() {
        RL_ASSERT(acquired == 1);
        const auto v = g->query(b);
        RL_ASSERT(v.state == record_state::succeeded && v.outcome == 2);
        RL_ASSERT(g->query(c).state == record_state::succeeded);  // C lives in the generation kept
        IDEM_RL_CHECK_TRAIL(sink);
        g.reset();
    }
};

struct outcome {
    const char* name;
    const char* scheduler;
    unsigned long long iterations;
    bool ok;
};

template <class Test>
outcome run(const char* name, rl::scheduler_type_e sched, unsigned long long iterations, unsigned bound = 1) {
    rl::test_params p;
    p.search_type = sched;
    p.iteration_count = static_cast<rl::iteration_t>(iterations);
    p.context_bound = bound;
    p.execution_depth_limit = 20000;
    std::ostringstream quiet;
    p.output_stream = &std::cout;
    p.progress_stream = &quiet;
    std::printf("== %s (%s%s)\n", name, sched == rl::random_scheduler_type ? "random" : "context bound ",
                sched == rl::random_scheduler_type ? "" : std::to_string(bound).c_str());
    std::fflush(stdout);
    const bool ok = rl::simulate<Test>(p);
    return {name, sched == rl::random_scheduler_type ? "random" : "context-bound", static_cast<unsigned long long>(p.stop_iteration), ok};
}

}  // namespace

int main(int argc, char** argv) {
    unsigned long long scale = 1;
    if (const char* s = std::getenv("IDEM_RELACY_SCALE")) scale = std::strtoull(s, nullptr, 10);
    if (argc > 1) scale = std::strtoull(argv[1], nullptr, 10);
    if (scale == 0) scale = 1;
    const auto R = rl::random_scheduler_type;
    const auto B = rl::fair_context_bound_scheduler_type;
    const unsigned long long n = 2000 * scale;
    std::vector<outcome> results;
    results.push_back(run<claim_vs_claim>("claim vs claim", R, n));
    results.push_back(run<claim_vs_claim>("claim vs claim", B, n));
    results.push_back(run<complete_vs_compensate<resolution::succeeded>>("complete vs compensate (succeeded)", R, n));
    results.push_back(run<complete_vs_compensate<resolution::succeeded>>("complete vs compensate (succeeded)", B, n));
    results.push_back(run<complete_vs_compensate<resolution::unknown>>("complete vs compensate (unknown)", R, n));
    results.push_back(run<complete_vs_compensate<resolution::unknown>>("complete vs compensate (unknown)", B, n));
    results.push_back(run<extend_vs_compensate>("extend vs compensate", R, n));
    results.push_back(run<extend_vs_compensate>("extend vs compensate", B, n));
    results.push_back(run<lookup_during_claim>("lookup during claim", R, n));
    results.push_back(run<lookup_during_claim>("lookup during claim", B, n));
    results.push_back(run<claim_vs_rotation>("claim vs rotation", R, n));
    results.push_back(run<claim_vs_rotation>("claim vs rotation", B, n));
    bool ok = true;
    unsigned long long total = 0;
    std::printf("\nrelacy summary\n");
    for (const auto& r : results) {
        std::printf("  %-40s %-14s %10llu iterations  %s\n", r.name, r.scheduler, r.iterations, r.ok ? "ok" : "FAILED");
        total += r.iterations;
        ok = ok && r.ok;
    }
    std::printf("  total %llu iterations, %s\n", total, ok ? "0 violations" : "VIOLATIONS FOUND");
    return ok ? 0 : 1;
}
