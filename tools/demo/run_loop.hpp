// tools/demo/run_loop.hpp: the demo's worker threads. They take the next send from a shared cursor,
// ask the guard, execute the transfer on the ledger when the claim is theirs, and count every answer
// in arrays the guard never sees, for the checks after the join.
#pragma once

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <latch>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "demo/demo.hpp"
#include "demo/workload.hpp"
#include "idem/idem.hpp"
#include "ledger.hpp"
#include "naive_guard.hpp"
#include "progress.hpp"

namespace idem::tool::demo {

/// One worker's counts: written by that worker only, read after join (except `done`).
struct alignas(64) tally {
    std::atomic<std::uint64_t> done{0};  ///< sends finished; sampled by the progress bar
    std::uint64_t executed = 0;          ///< claims acquired and executed
    std::uint64_t blocked = 0;           ///< sends not executed because the key was taken
    std::uint64_t replayed = 0;          ///< of those, answered with the recorded outcome
    std::uint64_t in_flight = 0;         ///< sends that found the original still executing
    std::uint64_t wait_timeouts = 0;     ///< of those, still executing after --wait-ms
    std::uint64_t declined = 0;          ///< transfers refused by the ledger (insufficient funds)
    std::uint64_t outcome_mismatches = 0;
    std::uint64_t unexpected = 0;  ///< statuses or errors a memory-only run never gives
    std::uint64_t backpressure_retries = 0;
    std::string first_unexpected;
};

/// The workers' counts added up (done excepted); `problems` gets the first few unexpected answers.
struct tally_sum {
    std::uint64_t executed = 0, blocked = 0, replayed = 0, in_flight = 0, wait_timeouts = 0, declined = 0, mismatches = 0,
                  unexpected = 0, retries = 0;
    std::vector<std::string> problems;
};
inline tally_sum sum_tallies(const std::vector<tally>& tallies) {
    tally_sum s;
    for (const tally& t : tallies) {
        s.executed += t.executed;
        s.blocked += t.blocked;
        s.replayed += t.replayed;
        s.in_flight += t.in_flight;
        s.wait_timeouts += t.wait_timeouts;
        s.declined += t.declined;
        s.mismatches += t.outcome_mismatches;
        s.unexpected += t.unexpected;
        s.retries += t.backpressure_retries;
        if (!t.first_unexpected.empty() && s.problems.size() < 5) s.problems.push_back(t.first_unexpected);
    }
    return s;
}

/// Guard is idem::guard (one process) or idem::global_guard (--processes: one of several processes
/// sharing a PostgreSQL store; this process sends the stream positions offset, offset + stride, ...).
template <class Guard>
class demo_run {
public:
    /// Exactly one of `g` and `naive` is non-null. Request i is keyed "<txid_prefix><i+1>_TRANSFER_v1".
    demo_run(const demo_config& c, const workload& w, Guard* g, naive_guard* naive, ledger& l, std::string txid_prefix,
             std::size_t stride = 1, std::size_t offset = 0)
        : c_(c),
          w_(w),
          g_(g),
          naive_(naive),
          ledger_(l),
          prefix_(std::move(txid_prefix)),
          tallies_(c.threads),
          stride_(stride),
          offset_(offset),
          exec_count_(std::make_unique<std::atomic<std::uint32_t>[]>(w.requests.size())),
          applied_count_(std::make_unique<std::atomic<std::uint32_t>[]>(w.requests.size())),
          outcome_(std::make_unique<std::atomic<std::uint64_t>[]>(w.requests.size())),
          replayed_(std::make_unique<std::atomic<std::uint64_t>[]>(w.requests.size())),
          work_(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double, std::micro>(c.work_us))),
          wait_(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double, std::milli>(c.wait_ms))) {
    }

    /// Runs the workload on c.threads threads; returns the wall time from start signal to last join.
    std::chrono::duration<double> run() {
        const std::size_t mine = w_.stream.size() > offset_ ? (w_.stream.size() - offset_ + stride_ - 1) / stride_ : 0;
        progress_bar bar(
            !c_.json, mine, [this] { return sent(); }, "requests");
        std::latch go(1);
        std::vector<std::thread> threads;
        std::vector<std::exception_ptr> errors(c_.threads);
        threads.reserve(c_.threads);
        for (unsigned t = 0; t < c_.threads; ++t)
            threads.emplace_back([&, t] {
                go.wait();
                try {
                    work(t);
                } catch (...) {
                    errors[t] = std::current_exception();
                }
            });
        bar.start();
        const auto start = std::chrono::steady_clock::now();
        go.count_down();
        for (auto& th : threads) th.join();
        const auto elapsed = std::chrono::steady_clock::now() - start;
        bar.stop();
        for (auto& e : errors)
            if (e) std::rethrow_exception(e);
        return elapsed;
    }

    [[nodiscard]] std::uint64_t sent() const noexcept {
        std::uint64_t n = 0;
        for (const tally& t : tallies_) n += t.done.load(std::memory_order_relaxed);  // relaxed: a progress estimate
        return n;
    }
    [[nodiscard]] const std::vector<tally>& tallies() const noexcept { return tallies_; }
    [[nodiscard]] std::uint32_t executions_of(std::size_t i) const noexcept {
        return exec_count_[i].load(std::memory_order_relaxed);  // relaxed: read after join
    }
    [[nodiscard]] std::uint32_t applied_of(std::size_t i) const noexcept {
        return applied_count_[i].load(std::memory_order_relaxed);  // relaxed: read after join
    }
    [[nodiscard]] std::uint64_t outcome_of(std::size_t i) const noexcept {
        return outcome_[i].load(std::memory_order_relaxed);  // relaxed: read after join
    }
    /// The outcome a duplicate was answered with when another process executed the request (0: none).
    [[nodiscard]] std::uint64_t replayed_of(std::size_t i) const noexcept {
        return replayed_[i].load(std::memory_order_relaxed);  // relaxed: read after join
    }

private:
    void work(unsigned t) {
        tally& my = tallies_[t];
        std::uint64_t count = 0;
        for (;;) {
            // relaxed: the cursor only hands out distinct positions; the stream it indexes was written
            // before the threads started (thread creation synchronizes).
            const std::size_t p = offset_ + stride_ * cursor_.fetch_add(1, std::memory_order_relaxed);
            if (p >= w_.stream.size()) break;
            const std::uint32_t i = w_.stream[p];
            const transfer& tr = w_.requests[i];
            // The request as a client would send it: a transaction id and a payload.
            char txid[64];
            std::memcpy(txid, prefix_.data(), prefix_.size());  // at most 40 bytes (run id + "-TX")
            const auto [txend, ec] = std::to_chars(txid + prefix_.size(), txid + sizeof txid, std::uint64_t{i} + 1);
            (void)ec;
            const idem::key k = idem::key::compose(std::string_view(txid, static_cast<std::size_t>(txend - txid)),
                                                   "TRANSFER", 1);
            char payload[96];
            const int len = std::snprintf(payload, sizeof payload, "from=ACC%u;to=ACC%u;amount=%lld;currency=EUR", tr.from,
                                          tr.to, static_cast<long long>(tr.amount));
            const std::uint64_t fp = idem::fingerprint_of(std::string_view(payload, static_cast<std::size_t>(len)));
            if (g_) {
                handle(my, i, k, fp);
            } else {
                handle_naive(my, i, k);
            }
            my.done.store(++count, std::memory_order_relaxed);  // relaxed: a progress estimate
        }
    }

    void handle(tally& my, std::uint32_t i, const idem::key& k, std::uint64_t fp) {
        Guard& g = *g_;
        auto r = g.begin(k, fp);
        while (r.status == idem::begin_status::backpressure) {  // durable stores only: nothing changed, retry
            ++my.backpressure_retries;
            std::this_thread::yield();
            r = g.begin(k, fp);
        }
        if (r.status == idem::begin_status::in_progress) {
            ++my.in_flight;
            if (wait_ > std::chrono::nanoseconds::zero()) r = g.begin_wait(k, fp, wait_);
            if (r.status == idem::begin_status::in_progress) {  // still running: the client is told "busy"
                if (wait_ > std::chrono::nanoseconds::zero()) ++my.wait_timeouts;
                ++my.blocked;
                return;
            }
        }
        switch (r.status) {
            case idem::begin_status::acquired: execute(my, i, std::move(r.ticket)); return;
            case idem::begin_status::succeeded: {
                ++my.blocked;
                ++my.replayed;
                // The replayed outcome must be this request's: it names the request, and equals what the
                // executor recorded (the guard's succeed() released it, our begin() acquired it).
                const std::uint64_t expected = outcome_[i].load(std::memory_order_relaxed);
                if (expected == 0 && stride_ > 1) {  // executed by another process: checked by the parent
                    replayed_[i].store(r.outcome, std::memory_order_relaxed);  // relaxed: read after join
                    if (r.outcome >> 1 != std::uint64_t{i} + 1) ++my.outcome_mismatches;
                    return;
                }
                if (r.outcome >> 1 != std::uint64_t{i} + 1 || r.outcome != expected) ++my.outcome_mismatches;
                return;
            }
            default:
                ++my.unexpected;
                if (my.first_unexpected.empty())
                    my.first_unexpected = std::string(k.view()) + ": begin() answered " + idem::to_string(r.status);
                return;
        }
    }

    /// The naive check-then-set; racing duplicates both pass the check.
    void handle_naive(tally& my, std::uint32_t i, const idem::key& k) {
        if (naive_->exists(k.view())) {
            ++my.blocked;
            return;
        }
        (void)apply(my, i);
        naive_->set_done(k.view());
        ++my.executed;
    }

    template <class Ticket>
    void execute(tally& my, std::uint32_t i, Ticket ticket) {
        const std::uint64_t outcome = apply(my, i);
        std::error_code ec = ticket.succeed(outcome);
        while (ec == idem::errc::backpressure) {  // the transfer happened: its success must be recorded
            ++my.backpressure_retries;
            std::this_thread::yield();
            ec = ticket.succeed(outcome);
        }
        ++my.executed;
        if (ec) {
            ++my.unexpected;
            if (my.first_unexpected.empty())
                my.first_unexpected = std::string(ticket.get_key().view()) + ": succeed() answered " + ec.message();
        }
    }

    /// The application: processes the payment and applies it to the ledger. Returns the outcome.
    std::uint64_t apply(tally& my, std::uint32_t i) {
        exec_count_[i].fetch_add(1, std::memory_order_relaxed);  // relaxed: counted, read after join
        if (work_ > std::chrono::nanoseconds::zero()) {          // the payment's own processing time
            const auto until = std::chrono::steady_clock::now() + work_;
            while (std::chrono::steady_clock::now() < until) {
            }
        }
        const transfer& tr = w_.requests[i];
        const bool applied = ledger_.transfer(tr.from, tr.to, tr.amount);
        if (applied) {
            applied_count_[i].fetch_add(1, std::memory_order_relaxed);  // relaxed: read after join
        } else {
            ++my.declined;
        }
        // Outcome: request number and whether the transfer was applied; replayed to every duplicate.
        const std::uint64_t outcome = ((std::uint64_t{i} + 1) << 1) | (applied ? 1u : 0u);
        outcome_[i].store(outcome, std::memory_order_relaxed);  // relaxed: published by the caller's succeed()
        return outcome;
    }

    const demo_config& c_;
    const workload& w_;
    Guard* g_;
    naive_guard* naive_;
    ledger& ledger_;
    std::string prefix_;
    std::vector<tally> tallies_;
    std::size_t stride_, offset_;                                  ///< this process sends positions offset_ + k * stride_
    alignas(64) std::atomic<std::size_t> cursor_{0};               ///< next k
    std::unique_ptr<std::atomic<std::uint32_t>[]> exec_count_;     ///< executions per request (the application's count)
    std::unique_ptr<std::atomic<std::uint32_t>[]> applied_count_;  ///< transfers applied per request
    std::unique_ptr<std::atomic<std::uint64_t>[]> outcome_;        ///< outcome the executor recorded
    std::unique_ptr<std::atomic<std::uint64_t>[]> replayed_;       ///< --processes: outcome replayed from elsewhere
    std::chrono::nanoseconds work_;
    std::chrono::nanoseconds wait_;
};

}  // namespace idem::tool::demo
