// idem/guard_contract.hpp: what every guard does the same way, whatever its scope.
//
//   [[maybe_unused]] auto pay_once = [](auto& g, const idem::key& k) {  // guard, global_guard, durable's guard()
//       idem::run_options ro;
//       ro.wait = std::chrono::milliseconds(50);       // a duplicate in flight: wait for its outcome
//       return g.run(k, [] { return 42; }, ro);        // at most once per key; duplicates get 42 back
//   };
//
// A scope (guard: this process; global_guard: every process sharing one PostgreSQL) supplies two
// things: begin(key, fingerprint), which claims the key or says what its record is, answered as a
// begin_result_of<its ticket>; and the ticket's finish(cause, outcome), which records the claim's end.
// Everything built on them is written here once, so it cannot drift between scopes:
//
//   * one result shape: begin_result_of<Ticket> {status, ticket, outcome, fence, payload};
//   * one back-off: wait_backoff, used by begin_wait() while another caller holds the claim;
//   * one run(): the same answer for every begin_status, the same retry of a success the queue
//     could not take yet, the same exception (idem::error) and message shape;
//   * one ticket surface: succeed(), fail() with and without a policy, and the drop of an
//     uncompleted ticket (failed per options.on_failure).
//
// Thread-safety and progress are the scope's (guard.hpp, global_guard.hpp): begin_wait() and run()
// add no shared state of their own; they block only where they wait by design.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/options.hpp"
#include "idem/payload.hpp"
#include "idem/status.hpp"
#include "idem/transition.hpp"

namespace idem {

/// The answer of begin() in every scope: a status, and a ticket when status == acquired.
template <class Ticket>
struct [[nodiscard]] begin_result_of {
    using ticket_type = Ticket;
    begin_status status;
    Ticket ticket;              ///< valid only when status == acquired
    std::uint64_t outcome = 0;  ///< the recorded outcome (succeeded), failure code (failed), or the
                                ///< newest version claimed of the key's (txid, operation) (superseded)
    std::uint64_t fence = 0;    ///< the record's fence; 0 when the scope answered without knowing it
    /// The response payload recorded with the outcome (ticket.succeed(outcome, payload)), replayed
    /// byte for byte when status is succeeded (or failed, if one was recorded); empty otherwise,
    /// and empty for a record completed without one. An empty std::string does not allocate, and
    /// process scope fills it in place (no string is moved), so an answer without a payload pays
    /// only its construction; a replayed payload longer than the string's small buffer (15 bytes
    /// with libstdc++) is one allocation.
    std::string payload{};
    explicit operator bool() const noexcept { return status == begin_status::acquired; }
};

/// How run() treats a key it meets.
struct run_options {
    duplicate_policy on_duplicate = duplicate_policy::replay;
    std::uint64_t fingerprint = 0;                                      ///< 0: no payload check
    std::chrono::nanoseconds wait{0};                                   ///< wait this long for an in-flight outcome
    std::chrono::nanoseconds record_timeout = std::chrono::seconds(5);  ///< retry recording success this long
};

/// The one back-off of begin_wait(), the same in every scope. The first pause is 1 us and each
/// pause doubles, up to 1 ms or ten times what the last attempt took, whichever is longer. An
/// attempt answered from memory costs nanoseconds, so a waiter in process scope looks again at
/// least every millisecond; one that asks a store costs a round trip, so a waiter spends at most a
/// tenth of its time asking and a loaded store is not hammered by the callers waiting on it.
struct wait_backoff {
    static constexpr std::chrono::nanoseconds first = std::chrono::microseconds(1);
    static constexpr std::chrono::nanoseconds min_cap = std::chrono::milliseconds(1);
    static constexpr int attempt_ratio = 10;

    /// The pause to take after an attempt that took `spent`.
    [[nodiscard]] std::chrono::nanoseconds next(std::chrono::nanoseconds spent) noexcept {
        const auto cap = std::max(min_cap, spent * attempt_ratio);
        const auto p = std::min(pause_, cap);
        pause_ = std::min(p * 2, cap);
        return p;
    }

private:
    std::chrono::nanoseconds pause_ = first;
};

namespace detail {

/// begin_wait() and run() over Guard::begin(). Guard supplies begin(key, fingerprint) and
/// refusal_message(status, key) (the scope's words for capacity_exhausted, backpressure,
/// store_unavailable and invalid_key); a Guard with now() also stops waiting at its own clock's
/// deadline (a manual clock in tests).
template <class Guard>
class guard_contract {
public:
    /// Like begin(), but while another caller holds the claim (here or, in scope::global, on another
    /// node), asks again with wait_backoff for up to `timeout`. Not lock-free: it waits by design.
    auto begin_wait(const key& k, std::uint64_t fingerprint, std::chrono::nanoseconds timeout) noexcept {
        Guard& g = self();
        const auto real_deadline = std::chrono::steady_clock::now() + timeout;
        auto clock_deadline = std::chrono::nanoseconds::max();
        if constexpr (requires { g.now(); }) clock_deadline = g.now() + timeout;
        wait_backoff backoff;
        for (;;) {
            const auto asked = std::chrono::steady_clock::now();
            auto r = g.begin(k, fingerprint);
            if (r.status != begin_status::in_progress) return r;
            const auto now = std::chrono::steady_clock::now();
            if (now >= real_deadline) return r;
            if constexpr (requires { g.now(); })
                if (g.now() >= clock_deadline) return r;
            std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(backoff.next(now - asked), real_deadline - now));
        }
    }

    /// Runs fn at most once per key and returns its result; a duplicate gets the recorded result
    /// back without running fn. What fn may return and how it is stored is in payload.hpp: void,
    /// integral and enum results are the 64-bit outcome and run() returns std::uint64_t (as
    /// always; bool is integral: true is 1); std::string, std::vector<std::byte>, byte spans,
    /// trivially copyable classes and types with an idem::codec are stored as the response payload
    /// and run() returns the type (a span: std::vector<std::byte>). Anything else, double
    /// included, does not compile. Payload results need a scope whose ticket stores payloads
    /// (process and global scope do; a static_assert says so for any other).
    ///
    /// A duplicate of a success returns the recorded result, or throws errc::duplicate_request
    /// when ro.on_duplicate == raise; a key whose operation failed terminally throws
    /// errc::already_failed (fn is not run again). Throws idem::error for in progress (after
    /// ro.wait), in doubt, payload mismatch, capacity and store errors, each naming the key. If fn
    /// throws, the claim fails per options.on_failure and the exception propagates. Once fn
    /// returned, its success is recorded, retried while the scope answers backpressure or busy for
    /// up to ro.record_timeout; a success that could not be recorded throws its errc. A payload
    /// the guard cannot keep (over options.max_payload, or options.payload_budget spent) is never
    /// truncated: fn ran, so the claim is recorded as failed terminally (code 0: it must not run
    /// again) and run() throws errc::invalid_argument or errc::capacity_exhausted naming the size
    /// and the limit.
    template <class Fn>
    auto run(const key& k, Fn&& fn, const run_options& ro = {}) {
        using R = std::remove_cvref_t<std::invoke_result_t<Fn>>;
        static_assert(storable<R>,
                      "idem::run: fn's result type cannot be stored. Return void or an integral/enum (the "
                      "64-bit outcome), std::string, std::vector<std::byte>, a std::span of bytes or a "
                      "trivially copyable class (stored as the response payload), or specialize "
                      "idem::codec<T> with encode/decode (see idem/payload.hpp). Floating point is refused: "
                      "it would be narrowed to the integer outcome");
        constexpr bool as_payload = payload_result<R>;
        using result_t = detail::run_result_t<R>;
        Guard& g = self();
        auto r = ro.wait > std::chrono::nanoseconds::zero() ? begin_wait(k, ro.fingerprint, ro.wait)
                                                            : g.begin(k, ro.fingerprint);
        if constexpr (as_payload)
            static_assert(detail::carries_payloads_v<typename decltype(r)::ticket_type>,
                          "idem::run: this scope's ticket does not store payloads; return an integral "
                          "outcome there");
        if constexpr (detail::trivial_result<R> && !has_codec<R>)
            static_assert(sizeof(R) <= options::max_payload_limit,
                          "idem::run: this trivially copyable result is larger than the 1 MiB payload limit");
        auto name = [&k] { return "key '" + key::printable(k.view()) + "'"; };  // only on the error paths
        switch (r.status) {
            case begin_status::acquired: break;
            case begin_status::succeeded:
                if (ro.on_duplicate == duplicate_policy::replay) {
                    if constexpr (as_payload) return detail::decode_result<R>(r.payload, name());
                    else return result_t{r.outcome};
                }
                throw error(errc::duplicate_request,
                            name() + " already succeeded" +
                                (r.fence != 0 ? " (fence " + std::to_string(r.fence) + ")" : std::string()));
            case begin_status::failed:
                throw error(errc::already_failed, name() + " already failed terminally with code " +
                                                      std::to_string(r.outcome) + "; the operation is not run again");
            case begin_status::in_progress: throw error(errc::in_progress, name() + " is being executed by another caller");
            case begin_status::in_doubt:
                throw error(errc::in_doubt, name() + " has an expired claim whose outcome is unknown");
            case begin_status::payload_mismatch:
                throw error(errc::payload_mismatch, name() + " was used before with a different request payload");
            case begin_status::capacity_exhausted: throw error(errc::capacity_exhausted, g.refusal_message(r.status, k));
            case begin_status::backpressure: throw error(errc::backpressure, g.refusal_message(r.status, k));
            case begin_status::store_unavailable: throw error(errc::store_unavailable, g.refusal_message(r.status, k));
            case begin_status::invalid_key: throw error(errc::invalid_key, g.refusal_message(r.status, k));
            case begin_status::superseded:
                throw error(errc::superseded, name() + " is superseded: version " + std::to_string(r.outcome) +
                                                  " of its transaction's operation was claimed; not executed");
        }
        // The effect happened: the success must be recorded. Retry while the queue is full or
        // compensation holds the record; give up after ro.record_timeout (the lease and the
        // resolver then decide, and the caller learns it from the exception).
        auto record = [&](auto&& succeed) {
            std::error_code ec = succeed();
            const auto give_up = std::chrono::steady_clock::now() + ro.record_timeout;
            while ((ec == errc::backpressure || ec == errc::busy) && std::chrono::steady_clock::now() < give_up) {
                std::this_thread::yield();
                ec = succeed();
            }
            return ec;
        };
        if constexpr (as_payload) {
            auto value = std::invoke(std::forward<Fn>(fn));
            const auto enc = detail::encode_result<R>(value);
            const std::error_code ec = record([&] { return r.ticket.succeed(0, enc.bytes); });
            if (ec == errc::invalid_argument || ec == errc::capacity_exhausted) {
                // Nothing was recorded and the ticket is still ours. fn ran: it must not run again,
                // the result must not be cut, and it must not be recorded as a failure (every
                // duplicate would be told it failed): the claim is left in doubt for the resolver.
                r.ticket.leave_in_doubt();
                const std::string why =
                    ec == errc::invalid_argument
                        ? "its result's payload of " + std::to_string(enc.bytes.size()) +
                              " bytes exceeds options.max_payload = " + std::to_string(g.opts().max_payload)
                        : "its result's payload of " + std::to_string(enc.bytes.size()) +
                              " bytes does not fit: options.payload_budget = " + std::to_string(g.opts().payload_budget) +
                              " is spent in this generation";
                throw error(static_cast<errc>(ec.value()),
                            name() + ": it ran, but " + why +
                                "; the claim is left in doubt (duplicates answer in_doubt) until options.resolve "
                                "decides it, so that it does not run again");
            }
            if (ec) {
                r.ticket.leave_in_doubt();  // still held (the queue stayed full): fn ran, never release
                throw error(static_cast<errc>(ec.value()), name() + ": " + ec.message());
            }
            return detail::returned<R>(std::move(value));
        } else {
            std::uint64_t outcome = 0;
            if constexpr (std::is_void_v<R>) {
                std::invoke(std::forward<Fn>(fn));
            } else {
                outcome = detail::outcome_of<R>(std::invoke(std::forward<Fn>(fn)));
            }
            const std::error_code ec = record([&] { return r.ticket.succeed(outcome); });
            if (ec) {
                r.ticket.leave_in_doubt();  // still held (the queue stayed full): fn ran, never release
                throw error(static_cast<errc>(ec.value()), name() + ": " + ec.message());
            }
            return outcome;
        }
    }

protected:
    guard_contract() = default;
    ~guard_contract() = default;

private:
    Guard& self() noexcept { return static_cast<Guard&>(*this); }
};

/// succeed() and fail() over Ticket's finish(cause, outcome), valid(), on_failure() and forget().
/// finish() records the end (transition_cause::succeed, fail or release), leaving the ticket valid
/// only when it answers backpressure or busy (retry); forget() empties the ticket without recording.
template <class Ticket>
class ticket_contract {
public:
    explicit operator bool() const noexcept { return self().valid(); }

    /// Records success with an outcome replayed to duplicates. The ticket is empty afterwards,
    /// unless the answer is errc::backpressure or errc::busy (nothing changed: retry).
    std::error_code succeed(std::uint64_t outcome = 0) noexcept {
        if (!self().valid()) return errc::empty_ticket;
        return ran(self().finish(transition_cause::succeed, outcome));
    }

    /// Records success with an outcome and a response payload, both replayed to duplicates
    /// (begin_result_of::payload). The payload is bytes: NUL and non-UTF-8 bytes round trip
    /// exactly; empty means none. It is copied before succeed() returns. Besides succeed()'s
    /// answers: errc::invalid_argument when payload.size() > options.max_payload, and
    /// errc::capacity_exhausted when options.payload_budget is spent (retryable once a rotation
    /// recycled a generation); both change nothing and leave the ticket valid, the payload is
    /// never truncated. A scope whose ticket cannot store payloads answers
    /// errc::invalid_argument for a non-empty payload, and changes nothing (global_ticket stores
    /// them, and never answers capacity_exhausted: global_guard.hpp).
    std::error_code succeed(std::uint64_t outcome, std::string_view payload) noexcept {
        if (!self().valid()) return errc::empty_ticket;
        if constexpr (carries_payloads_v<Ticket>) {
            return ran(self().finish(transition_cause::succeed, outcome, payload));
        } else {
            if (!payload.empty()) return ran(errc::invalid_argument);
            return ran(self().finish(transition_cause::succeed, outcome));
        }
    }

    /// Records failure with the guard's failure policy (options.on_failure).
    std::error_code fail(std::uint64_t code = 0) noexcept {
        return self().valid() ? fail(code, self().on_failure()) : make_error_code(errc::empty_ticket);
    }

    /// Records failure: terminal (duplicates see FAILED, replayed) or retryable (the key may be
    /// claimed again, with a new fence).
    std::error_code fail(std::uint64_t code, failure_policy policy) noexcept {
        if (!self().valid()) return errc::empty_ticket;
        if (policy != failure_policy::terminal) return self().finish(transition_cause::release, code);
        return ran(self().finish(transition_cause::fail, code));
    }

    /// Records a terminal failure with a response payload (an error response: a declined payment's
    /// 402 and its body), both replayed to duplicates like a success's. Only terminal failures
    /// keep a response: with failure_policy::retryable the key is released and its retry runs
    /// again, so a non-empty payload there is errc::invalid_argument. Otherwise the answers of
    /// succeed(outcome, payload); every refusal changes nothing and leaves the ticket valid.
    std::error_code fail(std::uint64_t code, failure_policy policy, std::string_view payload) noexcept {
        if (!self().valid()) return errc::empty_ticket;
        if (payload.empty()) return fail(code, policy);
        if (policy != failure_policy::terminal) return errc::invalid_argument;
        if constexpr (carries_payloads_v<Ticket>) {
            return ran(self().finish(transition_cause::fail, code, payload));
        } else {
            return ran(errc::invalid_argument);
        }
    }

    /// Gives the claim up without recording anything: the record stays PROCESSING until its lease
    /// expires, and then compensation asks options.resolve what happened. For an operation whose
    /// effect is unknown (a call to a payment processor that timed out): fail() would release the
    /// key, and a retry could run the effect twice. The ticket is empty afterwards.
    void abandon() noexcept { self().forget(); }

    /// The operation ran (or may have run) and its completion could not be recorded (succeed()
    /// refused: backpressure that did not end, a payload the guard cannot keep): the claim is
    /// marked in doubt now, so duplicates answer in_doubt instead of running it, and the resolver
    /// (options.resolve) decides once the lease expires. The key is never released by it. The
    /// ticket is empty afterwards. A ticket dropped after succeed() or a terminal fail() was
    /// refused does the same: the caller said the effect happened, so the drop must not free the
    /// key for a second run.
    void leave_in_doubt() noexcept {
        if (self().valid()) self().hold();
    }

protected:
    ticket_contract() = default;
    ~ticket_contract() = default;

    /// A ticket dropped without completion fails per options.on_failure, so a claim does not stay
    /// PROCESSING until its lease runs out. Retried briefly while compensation holds the record;
    /// under backpressure the lease and compensation take over.
    void drop() noexcept {
        if (self().valid() && self().ran_) {  // a completion was refused: the effect happened
            self().hold();
            return;
        }
        for (int i = 0; i < 64 && self().valid(); ++i) {
            if (fail(0, self().on_failure()) != errc::busy) break;
            std::this_thread::yield();
        }
        self().forget();
    }

private:
    /// Notes that the caller reported the effect (a success, or a terminal failure) and it was
    /// refused with the ticket still held: from now on a drop leaves the claim in doubt.
    std::error_code ran(std::error_code ec) noexcept {
        if (ec && self().valid()) self().ran_ = true;
        return ec;
    }

    Ticket& self() noexcept { return static_cast<Ticket&>(*this); }
    const Ticket& self() const noexcept { return static_cast<const Ticket&>(*this); }
};

}  // namespace detail
}  // namespace idem
