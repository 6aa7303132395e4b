// idem/options.hpp: guard options, clocks, policies and the compensation resolver.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

#include "idem/error.hpp"

namespace idem {

using namespace std::chrono_literals;

/// What happens to a claim whose owner calls fail() without a policy, or drops the ticket.
enum class failure_policy : std::uint8_t {
    terminal,   ///< the key becomes FAILED; duplicates replay the failure
    retryable,  ///< the key becomes claimable again (a new fence); the failure is audited
};

/// What run() does with a key that already completed.
enum class duplicate_policy : std::uint8_t {
    replay,  ///< return the recorded outcome
    raise,   ///< throw idem::error(errc::duplicate_request)
};

/// The application's answer about a claim whose lease expired (the seed's checkTxStatus).
enum class resolution : std::uint8_t {
    succeeded,     ///< the operation ran; record SUCCESS with the given outcome
    failed,        ///< the operation ran and failed; record FAILED
    not_executed,  ///< the operation never ran; the key becomes claimable again
    unknown,       ///< cannot tell: the key stays PROCESSING, marked in doubt, and is asked again next pass
};

namespace detail {
/// The enumerator's name ("terminal"); nullptr for a value outside the enum.
[[nodiscard]] constexpr const char* name_of(failure_policy p) noexcept {
    switch (p) {
        case failure_policy::terminal: return "terminal";
        case failure_policy::retryable: return "retryable";
    }
    return nullptr;
}
[[nodiscard]] constexpr const char* name_of(duplicate_policy p) noexcept {
    switch (p) {
        case duplicate_policy::replay: return "replay";
        case duplicate_policy::raise: return "raise";
    }
    return nullptr;
}
[[nodiscard]] constexpr const char* name_of(resolution r) noexcept {
    switch (r) {
        case resolution::succeeded: return "succeeded";
        case resolution::failed: return "failed";
        case resolution::not_executed: return "not_executed";
        case resolution::unknown: return "unknown";
    }
    return nullptr;
}
}  // namespace detail

/// Print the enumerator's name; a value outside the enum prints as failure_policy(7).
inline std::ostream& operator<<(std::ostream& os, failure_policy p) {
    return detail::print_enum(os, detail::name_of(p), "failure_policy", p);
}
inline std::ostream& operator<<(std::ostream& os, duplicate_policy p) {
    return detail::print_enum(os, detail::name_of(p), "duplicate_policy", p);
}
inline std::ostream& operator<<(std::ostream& os, resolution r) {
    return detail::print_enum(os, detail::name_of(r), "resolution", r);
}

/// A resolver's verdict on an expired claim. With succeeded or failed, `outcome` and `payload` are
/// recorded as a completion would record them (ticket.succeed(outcome, payload)), so duplicates
/// replay the response the resolver found (at the processor, in a ledger). A payload the guard
/// cannot hold (over options.max_payload; process scope also: payload budget spent) is never
/// truncated or dropped: the claim is marked in doubt instead, as for `unknown`, and asked again
/// on the next pass.
struct resolver_answer {
    resolution verdict = resolution::unknown;
    std::uint64_t outcome = 0;
    std::string payload{};  ///< the response, for succeeded or failed; ignored otherwise
};

/// What a resolver is told about an expired claim.
struct expired_claim {
    std::string_view key;
    std::uint64_t fence;
    std::uint64_t fingerprint;
};

using resolver = std::function<resolver_answer(const expired_claim&)>;

/// The default clock: std::chrono::steady_clock in nanoseconds. Thread-safe, no state.
struct steady_clock_source {
    [[nodiscard]] std::chrono::nanoseconds now() const noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch());
    }
};

/// A clock the test moves by hand, so lease tests need no sleeps. Copies share one time.
class manual_clock {
public:
    manual_clock() : now_(std::make_shared<std::atomic<std::int64_t>>(1'000'000'000)) {}
    [[nodiscard]] std::chrono::nanoseconds now() const noexcept {
        return std::chrono::nanoseconds(now_->load(std::memory_order_relaxed));  // relaxed: a test-only time source
    }
    void advance(std::chrono::nanoseconds d) noexcept { now_->fetch_add(d.count(), std::memory_order_relaxed); }

private:
    std::shared_ptr<std::atomic<std::int64_t>> now_;
};

/// The adaptive lease (opt-in, options.adaptive): each new claim of an operation gets
/// clamp(k x p99, min, max), where p99 is that operation's claim-to-completion time observed in
/// this process (the OPERATION of a key::compose'd "TXID_OPERATION_vN"). It protects both ways:
///  * a lease shorter than the real work means compensation of work still running: the resolver is
///    asked about a claim whose owner is still executing (and with reclaim_expired a second owner
///    may run it again: a double execution), or the claim is reported in doubt;
///  * a lease far longer than the work delays the recovery of a claim whose owner crashed.
/// A static lease must be set for the slowest operation, so it is far too long for the fast ones;
/// per operation, it follows each one's measured tail instead.
/// Limits: a claim's lease is fixed when it is granted (extend() still renews it); leases are
/// recomputed by maintain() (the background thread, every maintenance_interval), not per claim;
/// the histograms are per process (nothing is shared through the store); keys that do not split,
/// and operations beyond the first 64 distinct ones (they share one "other" histogram), keep
/// options.lease. Layout, error bound and thread-safety: detail/table/lease_histogram.hpp.
struct adaptive_lease {
    bool enabled = false;
    /// Lease = k x p99. 3 by default: the article planned 3 x the mean; the p99 is a tail already,
    /// so with k = 3 a live claim is compensated only when it runs 3 times longer than 99% of its
    /// operation's completions (the histogram reports p99 up to 12.5% high, never low). Latency
    /// tails are long (a p99.9 is often 2-3 x the p99), and a lease too short costs a double
    /// execution while one too long costs only a later recovery, so k errs long. At least 1.
    double k = 3.0;
    /// Floor: 1 s. Pauses that have nothing to do with the operation (scheduling, page faults, a VM
    /// stolen from) do not show in its p99, and compensation runs only every maintenance_interval
    /// (1 s by default), so a shorter lease would not recover a crash any sooner.
    std::chrono::nanoseconds min = std::chrono::seconds(1);
    /// Ceiling: 10 min, so one slow outlier stream cannot hold crashed claims for hours.
    std::chrono::nanoseconds max = std::chrono::minutes(10);
    /// Completions an operation needs before its p99 sets its lease; before that, options.lease.
    /// 1000 puts 10 samples above the p99.
    std::uint64_t min_samples = 1000;
    /// Ageing: when an operation holds more than `window` samples, maintain() halves its counts, so
    /// its p99 follows roughly the last `window` completions. 0: never age. At least 2 x min_samples.
    std::uint64_t window = 100000;
};

struct options {
    /// Live records each generation is sized for, 1 to 2^30. Each generation holds next_pow2(2 *
    /// capacity) index positions and slots.
    std::size_t capacity = 1u << 20;
    /// Fault in every page of the table at construction instead of on first touch: slower start
    /// and the whole mapping resident at once (0.8 to 1.7 KB per unit of capacity, README), but no
    /// page fault on the hot path. Latency-critical users turn it on.
    bool prefault = false;
    /// Longest probe sequence; begin() answers capacity_exhausted when no free slot is found within it.
    std::size_t max_probe = 64;
    /// How long a claim stays valid without extend().
    std::chrono::nanoseconds lease = 30s;
    /// Opt-in: per-operation leases from observed claim-to-completion times (adaptive_lease above).
    /// Off: every claim gets `lease`, at the cost of one predictable branch.
    adaptive_lease adaptive{};
    /// Terminal records stay in memory at least this long; whole generations are recycled after it.
    std::chrono::nanoseconds retention = 24h;
    /// Applied by fail() without a policy and by a ticket dropped without completion.
    failure_policy on_failure = failure_policy::retryable;
    /// Opt-in: an expired, unresolved claim may be taken over by a new caller with a new fence.
    /// Dangerous: the old owner may already have executed. Off by default.
    bool reclaim_expired = false;
    /// Opt-in: keys made by key::compose ("TXID_OPERATION_vN") are ordered by version. Once version
    /// N of a (txid, operation) was claimed, a claim of a lower version answers
    /// begin_status::superseded with N, and is not run. Other keys are not affected.
    bool ordered_versions = false;
    /// Asked about each expired claim by compensate(). Without one, expired claims stay in doubt.
    resolver resolve;
    /// How often a background thread runs maintain() (compensation, then generation recycling).
    /// Zero: no thread; the application calls maintain() itself (tests with a manual clock do).
    std::chrono::nanoseconds maintenance_interval = 1s;
    /// Largest response payload one completion may carry (ticket::succeed(outcome, payload)), in
    /// bytes: 0 to max_payload_limit (1 MiB). A larger payload is refused with
    /// errc::invalid_argument and changes nothing. Default 64 KiB.
    std::size_t max_payload = std::size_t{64} << 10;
    /// Payload bytes each generation can hold (its payload arena, mapped lazily, committed as it
    /// fills): 0 turns payloads off (a completion with one answers errc::capacity_exhausted), else
    /// at least max_payload and at most 2^40. Rounded up to whole chunks of max(64 KiB,
    /// max_payload); a payload that does not fit its thread's chunk starts the next one. When it is
    /// spent, a completion with a payload answers errc::capacity_exhausted (retryable: nothing
    /// changes, the ticket stays valid) until a rotation recycles a generation. Default 64 MiB.
    std::size_t payload_budget = std::size_t{64} << 20;
    /// The hard maximum of max_payload.
    static constexpr std::size_t max_payload_limit = std::size_t{1} << 20;
};

}  // namespace idem
