// tools/demo.cpp: `idem demo`, a payment workload with injected duplicates.
//
// What it does
// ------------
// 1. Generates, before timing, R requests: U unique transfers (TX<n>, payer, payee, amount) and
//    D = round(R x dup-rate) duplicate sends of them. A duplicate either races its original (it is put
//    right after it in the stream, so the next free worker sends it at about the same moment) or
//    comes later (put thousands of positions further on, usually after the original finished).
// 2. T worker threads take the next send from a shared cursor, as servers behind a load balancer
//    take requests, so a racing duplicate is picked up by another thread while its original is
//    still executing. For each send: key = key::compose("TX<n>", "TRANSFER", 1), fingerprint = fingerprint_of(payload),
//    then guard.begin(key, fingerprint):
//      acquired     execute: apply the transfer to the ledger (the application), count the execution
//                   in an array the guard never sees, then ticket.succeed(outcome)
//      in_progress  the original is executing right now: wait for its outcome (begin_wait, up to
//                   --wait-ms); the duplicate is blocked either way
//      succeeded    the duplicate is blocked and gets the recorded outcome, which is checked
// 3. After the threads are joined, checks without asking the guard: every unique request executed
//    exactly once, money conserved, every balance equal to the opening balance plus the transfers
//    the application recorded as applied, every replayed outcome the original's.
//
// --naive replaces the guard with the naive check-then-set (naive_guard.hpp): the
// same checks then find the double executions that idem prevents, and the run exits 1.
//
// Durable stores (the default, sqlite:idem-demo.db; or postgresql://...): the guard is an
// idem::durable_guard, async durability by default (--durability sync for group commit). Each run
// gets a run id (random, or --run-id) that prefixes every transaction id, so a rerun on the same
// store never meets the previous run's keys; the table is sized for the records recovered from the
// store plus this run's requests. After the workers are joined the demo waits for the flusher to
// drain, closes the guard, reopens the store and checks it: every request of this run has a SUCCESS
// record carrying the outcome the application recorded, and idem::verify finds every key's audit
// trail legal and matching its record (0 violations), else the run exits 1.
//
// Exit codes (command.hpp): 0 all checks held, 1 a check failed, 2 usage error, 3 could not run.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "command.hpp"
#include "drill.hpp"
#include "idem/idem.hpp"
#include "idem/verify.hpp"
#include "ledger.hpp"
#include "naive_guard.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "store.hpp"
#ifdef IDEM_HAVE_POSTGRES
#include "idem/global_guard.hpp"
#endif

extern char** environ;

namespace idem::tool {
namespace {

// Defaults. 500k requests of 40 us each take about 10 s of CPU on 2 cores (docs/operations.md has the
// measured figures). The guard is sized from --requests and allocates its whole table up front
// (about 0.8 KB per request: 420 MiB at 500k), which is what bounds R rather than time.
// A durable store adds the flusher, which needs about a core of its own at ~100k transitions/s (two
// per request), and its table also holds every record recovered from earlier runs; so its defaults
// are smaller. Sync durability waits for a commit per claim and per success (group commit across
// the threads), so it runs fewer requests again.
constexpr std::uint64_t default_requests = 500'000;
constexpr std::uint64_t default_requests_async = 200'000;
constexpr std::uint64_t default_requests_sync = 4'000;
constexpr const char* default_store = "sqlite:idem-demo.db";
constexpr auto default_offer_wait = std::chrono::seconds(5);  // a full flush queue waits, then backpressure
constexpr std::size_t many_recovered = 1'000'000;             // above this, suggest --fresh
constexpr double default_work_us = 40.0;
constexpr double default_dup_rate = 0.0015;  // the seed's production duplicate rate, 0.15%
constexpr std::uint32_t default_accounts = 1000;
constexpr double default_race_share = 0.5;
constexpr double default_wait_ms = 100.0;
constexpr std::int64_t opening_balance_cents = 5'000'000;  // 50,000.00 per account
constexpr std::int64_t max_amount_cents = 100'000;         // transfers of 0.01 .. 1,000.00

struct demo_config {
    unsigned threads = std::max(2u, std::thread::hardware_concurrency());
    std::uint64_t requests = 0;  ///< 0: the default for the store and durability
    double dup_rate = default_dup_rate;
    std::uint64_t seed = 0;
    std::string store = default_store;
    std::string durability = "async";
    std::string run_id;  ///< empty: random for a durable store, none for memory
    bool fresh = false;
    bool json = false;
    bool naive = false;
    double work_us = default_work_us;
    std::uint32_t accounts = default_accounts;
    double race_share = default_race_share;
    double wait_ms = default_wait_ms;
    unsigned processes = 1;  ///< > 1: that many processes share a PostgreSQL store (global scope)
    int process_index = -1;  ///< hidden: this process is worker number i of --processes
    std::string results;     ///< hidden: where a worker process writes its per-request results
};

struct transfer {
    std::uint32_t from;
    std::uint32_t to;
    std::int64_t amount;  // cents
};

/// Everything a run sends, generated before timing.
struct workload {
    std::vector<transfer> requests;    ///< unique requests; index i is TX<i+1>
    std::vector<std::uint32_t> stream; ///< request index of each send, in dispatch order
    std::uint64_t concurrent = 0;      ///< duplicates placed right after their original
    std::uint64_t later = 0;           ///< duplicates placed further on
};

workload make_workload(const demo_config& c, std::uint64_t unique, std::uint64_t duplicates) {
    std::mt19937_64 rng(c.seed);
    workload w;
    w.requests.resize(unique);
    std::uniform_int_distribution<std::uint32_t> account(0, c.accounts - 1);
    std::uniform_int_distribution<std::int64_t> amount(1, max_amount_cents);
    for (transfer& t : w.requests) {
        t.from = account(rng);
        do t.to = account(rng); while (t.to == t.from);
        t.amount = amount(rng);
    }

    // Each duplicate is anchored to an original and sent right after the anchor. A racing duplicate
    // is anchored to its own original, so the next free worker takes it while the original is still
    // executing; a later one is anchored `lag` originals further on (at least 64 per thread).
    struct dup {
        std::uint64_t anchor;
        std::uint32_t request;
    };
    std::vector<dup> dups;
    dups.reserve(duplicates);
    std::uniform_int_distribution<std::uint64_t> pick(0, unique - 1);
    std::bernoulli_distribution racing(c.race_share);
    const std::uint64_t min_lag = 64ull * c.threads;
    std::uniform_int_distribution<std::uint64_t> lag(min_lag, std::max(min_lag, unique / 4));
    for (std::uint64_t d = 0; d < duplicates; ++d) {
        const std::uint64_t orig = pick(rng);
        if (racing(rng)) {
            dups.push_back({orig, static_cast<std::uint32_t>(orig)});
            ++w.concurrent;
        } else {
            dups.push_back({std::min(unique - 1, orig + lag(rng)), static_cast<std::uint32_t>(orig)});
            ++w.later;
        }
    }
    std::sort(dups.begin(), dups.end(), [](const dup& a, const dup& b) { return a.anchor < b.anchor; });

    w.stream.reserve(unique + duplicates);
    std::size_t next = 0;
    for (std::uint64_t i = 0; i < unique; ++i) {
        w.stream.push_back(static_cast<std::uint32_t>(i));
        while (next < dups.size() && dups[next].anchor == i) w.stream.push_back(dups[next++].request);
    }
    return w;
}

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
    std::uint64_t executed = 0, blocked = 0, replayed = 0, in_flight = 0, wait_timeouts = 0, declined = 0,
                  mismatches = 0, unexpected = 0, retries = 0;
    std::vector<std::string> problems;
};
tally_sum sum_tallies(const std::vector<tally>& tallies) {
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
    demo_run(const demo_config& c, const workload& w, Guard* g, naive_guard* naive, ledger& l,
             std::string txid_prefix, std::size_t stride = 1, std::size_t offset = 0)
        : c_(c), w_(w), g_(g), naive_(naive), ledger_(l), prefix_(std::move(txid_prefix)), tallies_(c.threads),
          stride_(stride), offset_(offset),
          exec_count_(std::make_unique<std::atomic<std::uint32_t>[]>(w.requests.size())),
          applied_count_(std::make_unique<std::atomic<std::uint32_t>[]>(w.requests.size())),
          outcome_(std::make_unique<std::atomic<std::uint64_t>[]>(w.requests.size())),
          replayed_(std::make_unique<std::atomic<std::uint64_t>[]>(w.requests.size())),
          work_(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double, std::micro>(c.work_us))),
          wait_(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double, std::milli>(c.wait_ms))) {}

    /// Runs the workload on c.threads threads; returns the wall time from start signal to last join.
    std::chrono::duration<double> run() {
        const std::size_t mine = w_.stream.size() > offset_ ? (w_.stream.size() - offset_ + stride_ - 1) / stride_ : 0;
        progress_bar bar(!c_.json, mine, [this] { return sent(); }, "requests");
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
            const int len = std::snprintf(payload, sizeof payload, "from=ACC%u;to=ACC%u;amount=%lld;currency=EUR",
                                          tr.from, tr.to, static_cast<long long>(tr.amount));
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
        if (work_ > std::chrono::nanoseconds::zero()) {            // the payment's own processing time
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
    std::size_t stride_, offset_;                     ///< this process sends positions offset_ + k * stride_
    alignas(64) std::atomic<std::size_t> cursor_{0};  ///< next k
    std::unique_ptr<std::atomic<std::uint32_t>[]> exec_count_;     ///< executions per request (the application's count)
    std::unique_ptr<std::atomic<std::uint32_t>[]> applied_count_;  ///< transfers applied per request
    std::unique_ptr<std::atomic<std::uint64_t>[]> outcome_;        ///< outcome the executor recorded
    std::unique_ptr<std::atomic<std::uint64_t>[]> replayed_;       ///< --processes: outcome replayed from elsewhere
    std::chrono::nanoseconds work_;
    std::chrono::nanoseconds wait_;
};

double peak_rss_mib() {
    rusage u{};
    if (::getrusage(RUSAGE_SELF, &u) != 0) return 0.0;
    return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux reports KiB
}


/// A fresh run id: 8 hex digits from the OS entropy source.
std::string random_run_id() {
    std::random_device rd;
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    return buf;
}

/// Removes a SQLite database, its WAL files and its writer lock file (--fresh: a new history on
/// purpose; the store refuses a missing database whose lock file records a writer). A missing file
/// is fine.
void remove_sqlite_files(const std::string& path) {
    for (const std::string& f : {path, path + "-wal", path + "-shm", path + ".lock"})
        if (::unlink(f.c_str()) != 0 && errno != ENOENT)
            throw idem::error(idem::errc::store_error,
                              "--fresh: cannot remove '" + f + "': " + std::strerror(errno));
}

/// What the durable store did during the run, and what the demo found in it afterwards.
struct durable_report {
    std::size_t recovered = 0;             ///< records recovery loaded at start
    std::size_t recovered_processing = 0;  ///< of those, claims in flight when an earlier process stopped
    std::size_t recovered_cold = 0;        ///< records older than the hot window: in the cold window's filter only
    double recovery_ms = 0;
    bool drained = true;    ///< the flusher committed every transition after the workers were joined
    double drain_s = 0;     ///< how long that took
    std::string last_store_error;
    std::uint64_t records_ok = 0;       ///< this run's keys whose record is SUCCESS with the executed outcome
    std::uint64_t records_wrong = 0;    ///< this run's keys whose record says something else
    std::uint64_t records_missing = 0;  ///< this run's keys with no record at all
    std::vector<std::string> record_problems;  ///< the first few wrong records
    idem::verify_report verify;
    double verify_s = 0;
};

/// What every demo run reports, whatever its scope: the request counts, the checks and the rate.
/// One helper so that the process and global scope summaries cannot drift apart.
struct run_summary {
    std::uint64_t requests, unique, executed, duplicates, concurrent, later, blocked, replayed, in_flight,
        wait_timeouts, double_executions, lost, mismatches, unexpected, declined;
    bool conserved, balances_match;
    double ops, elapsed_s;
};

void add_run_summary(json& j, const run_summary& r, const demo_config& c) {
    j["requests"] = r.requests;
    j["unique_keys"] = r.unique;
    j["executions"] = r.executed;
    j["duplicates_injected"] = r.duplicates;
    j["duplicates_concurrent"] = r.concurrent;
    j["duplicates_later"] = r.later;
    j["duplicates_blocked"] = r.blocked;
    j["duplicates_replayed"] = r.replayed;
    j["in_flight_hits"] = r.in_flight;
    j["wait_timeouts"] = r.wait_timeouts;
    j["double_executions"] = r.double_executions;
    j["lost_requests"] = r.lost;
    j["outcome_mismatches"] = r.mismatches;
    j["unexpected_answers"] = r.unexpected;
    j["declined"] = r.declined;
    j["money_conserved"] = r.conserved;
    j["balances_match"] = r.balances_match;
    j["ops_per_sec"] = r.ops;
    j["elapsed_s"] = r.elapsed_s;
    j["dup_rate"] = c.dup_rate;
    j["race_share"] = c.race_share;
    j["work_us"] = c.work_us;
    j["wait_ms"] = c.wait_ms;
}

/// The store checks of a report, as JSON fields (the first ten violations in full).
void add_store_checks(json& j, const durable_report& dr) {
    std::vector<std::string> first_violations;
    for (std::size_t i = 0; i < dr.verify.violations.size() && i < 10; ++i) first_violations.push_back(dr.verify.violations[i]);
    j["store_records_ok"] = dr.records_ok;
    j["store_records_missing"] = dr.records_missing;
    j["store_records_wrong"] = dr.records_wrong;
    j["verify_keys"] = dr.verify.keys;
    j["verify_transitions"] = dr.verify.transitions;
    j["violations"] = std::uint64_t{dr.verify.violations.size()};
    j["violation_list"] = first_violations;
}

/// Reads the store back after the guard closed: this run's records and the whole store's trails.
void check_store(const store_spec& spec, idem::durability mode, const std::string& prefix,
                 const std::function<std::uint64_t(std::size_t)>& outcome_of, std::size_t unique, durable_report& dr) {
    std::unique_ptr<idem::store> st = open_store(spec, mode, open_mode::existing);
    std::vector<std::uint8_t> seen(unique, 0);
    static constexpr std::string_view suffix = "_TRANSFER_v1";
    st->load([&](const idem::stored_record& r) {
        const std::string_view k = r.key;
        if (!k.starts_with(prefix) || !k.ends_with(suffix)) return;
        const std::string_view digits = k.substr(prefix.size(), k.size() - prefix.size() - suffix.size());
        std::uint64_t n = 0;
        const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
        if (ec != std::errc{} || p != digits.data() + digits.size() || n == 0 || n > unique) return;
        seen[n - 1] = 1;
        const std::uint64_t want = outcome_of(n - 1);
        if (r.state == idem::record_state::succeeded && r.outcome == want) {
            ++dr.records_ok;
            return;
        }
        ++dr.records_wrong;
        if (dr.record_problems.size() < 5)
            dr.record_problems.push_back("key '" + r.key + "' is " + idem::to_string(r.state) + " with outcome " +
                                         std::to_string(r.outcome) + "; the application recorded outcome " +
                                         std::to_string(want));
    });
    for (std::uint8_t s : seen) dr.records_missing += s == 0;
    const auto t0 = std::chrono::steady_clock::now();
    dr.verify = idem::verify(*st);
    dr.verify_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}


// ---- --processes N: the workload from N processes sharing one PostgreSQL (global scope) ----------
//
// The parent generates nothing itself but the run id; it starts N copies of `idem demo` with the same
// seed (so the same workload) and --process-index i. Process i sends stream positions i, i + N,
// i + 2N, ..., as N servers behind a round-robin load balancer would: a racing duplicate (the
// position after its original) lands on another process, so the store's unique key must stop it.
// Each process has its own ledger (its own accounts), checked by itself: money conserved, balances
// equal to the transfers it applied. It writes, per request, how often it executed it, the outcome it
// recorded, and the outcome it was replayed when another process executed it. The parent adds them
// up: every request executed exactly once across all processes, every replay the executor's outcome,
// every duplicate blocked; then it reads the store back (every record SUCCESS with the executor's
// outcome) and runs idem::verify.

/// One worker process's per-request results file: for each unique request, 24 bytes:
/// executions (u32), applied (u32), outcome recorded (u64, 0 = not executed here), outcome replayed
/// from another process (u64, 0 = none).
struct process_result {
    std::vector<std::uint32_t> exec, applied;
    std::vector<std::uint64_t> outcome, replayed;
};

#ifdef IDEM_HAVE_POSTGRES
int run_demo_process(const demo_config& c, const store_spec& spec) {
    std::uint64_t duplicates = static_cast<std::uint64_t>(std::llround(static_cast<double>(c.requests) * c.dup_rate));
    if (duplicates >= c.requests) duplicates = c.requests - 1;
    const std::uint64_t unique = c.requests - duplicates;
    const workload w = make_workload(c, unique, duplicates);
    const std::string prefix = c.run_id + "-TX";
    idem::options opts;
    opts.capacity = c.requests;
    idem::global_options go;
    go.call_deadline = postgres_call_deadline;
    idem::global_guard g(spec.uri, opts, go);
    ledger accounts(c.accounts, opening_balance_cents);
    demo_run<idem::global_guard> run(c, w, &g, nullptr, accounts, prefix, c.processes,
                                     static_cast<std::size_t>(c.process_index));
    const double elapsed_s = run.run().count();

    const auto [executed, blocked, replayed, in_flight, wait_timeouts, declined, mismatches, unexpected, retries,
                problems] = sum_tallies(run.tallies());
    const std::string first = problems.empty() ? std::string() : problems.front();
    std::vector<std::int64_t> expected(c.accounts, opening_balance_cents);
    std::ofstream out(c.results, std::ios::binary | std::ios::trunc);
    for (std::size_t i = 0; i < w.requests.size(); ++i) {
        const std::int64_t moved = static_cast<std::int64_t>(run.applied_of(i)) * w.requests[i].amount;
        expected[w.requests[i].from] -= moved;
        expected[w.requests[i].to] += moved;
        const std::uint32_t e = run.executions_of(i), a = run.applied_of(i);
        const std::uint64_t o = run.outcome_of(i), r = run.replayed_of(i);
        out.write(reinterpret_cast<const char*>(&e), 4).write(reinterpret_cast<const char*>(&a), 4);
        out.write(reinterpret_cast<const char*>(&o), 8).write(reinterpret_cast<const char*>(&r), 8);
    }
    out.close();
    if (!out) throw idem::error(idem::errc::store_error, "cannot write the results file '" + c.results + "'");
    std::uint64_t wrong_balances = 0;
    for (std::size_t a = 0; a < c.accounts; ++a)
        if (accounts.balance(a) != expected[a]) ++wrong_balances;
    const idem::global_stats gs = g.snapshot();
    std::printf("process elapsed_us=%lld executed=%llu blocked=%llu replayed=%llu in_flight=%llu wait_timeouts=%llu "
                "declined=%llu mismatches=%llu unexpected=%llu wrong_balances=%llu conserved=%d local=%llu sent=%llu "
                "won=%llu lost=%llu batches=%llu completion_batches=%llu store_errors=%llu\n",
                static_cast<long long>(elapsed_s * 1e6), (unsigned long long)executed, (unsigned long long)blocked,
                (unsigned long long)replayed, (unsigned long long)in_flight, (unsigned long long)wait_timeouts,
                (unsigned long long)declined, (unsigned long long)mismatches, (unsigned long long)unexpected,
                (unsigned long long)wrong_balances, accounts.total() == accounts.opening_total() ? 1 : 0,
                (unsigned long long)gs.answered_locally, (unsigned long long)gs.claims_sent,
                (unsigned long long)gs.claims_won, (unsigned long long)gs.claims_lost,
                (unsigned long long)gs.claim_batches, (unsigned long long)gs.completion_batches,
                (unsigned long long)gs.store_errors);
    if (!first.empty()) std::printf("note %s\n", first.c_str());
    std::fflush(stdout);
    return exit_ok;
}
#endif

int run_demo_processes(const demo_config& given, const store_spec& spec) {
    demo_config c = given;
    if (spec.type != store_spec::kind::postgres || c.naive) {
        std::cerr << "--processes: " << c.processes << " processes share one key space through global scope, which "
                  << "needs a postgresql:// store (--store)" << (c.naive ? " and no --naive" : "") << '\n';
        return exit_usage;
    }
    if (c.durability == "sync")
        std::cerr << "idem demo: --durability does not apply to --processes: every claim and completion waits for "
                     "its commit (global scope)\n";
    if (c.requests == 0) c.requests = default_requests_sync * 5;
    if (c.run_id.empty()) c.run_id = random_run_id();
    const std::string prefix = c.run_id + "-TX";
    std::uint64_t duplicates = static_cast<std::uint64_t>(std::llround(static_cast<double>(c.requests) * c.dup_rate));
    if (duplicates >= c.requests) duplicates = c.requests - 1;
    const std::uint64_t unique = c.requests - duplicates;
    const workload w = make_workload(c, unique, duplicates);  // the same as every process generates

    std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                       "/idem-demo-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
        throw idem::error(idem::errc::store_error, "cannot create a directory from '" + tmpl + "': " + std::strerror(errno));
    const std::string dir = tmpl;
    std::error_code ec;
    const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) throw idem::error(idem::errc::invalid_argument, "cannot find the idem executable: " + ec.message());
    const bool tty = !c.json && ::isatty(STDERR_FILENO) == 1;
    if (!c.json)
        std::cerr << "idem demo: " << grouped(c.requests) << " requests from " << c.processes << " processes x "
                  << c.threads << " threads, store " << display_name(spec) << " (global scope, run id " << c.run_id
                  << "), seed " << c.seed << '\n';

    const auto t0 = std::chrono::steady_clock::now();
    std::vector<pid_t> pids;
    for (unsigned i = 0; i < c.processes; ++i) {
        std::vector<std::string> a{exe, "demo", "--store", c.store, "--run-id", c.run_id, "--seed", std::to_string(c.seed),
                                   "--requests", std::to_string(c.requests), "--threads", std::to_string(c.threads),
                                   "--dup-rate", std::to_string(c.dup_rate), "--work-us", std::to_string(c.work_us),
                                   "--accounts", std::to_string(c.accounts), "--race-share", std::to_string(c.race_share),
                                   "--wait-ms", std::to_string(c.wait_ms), "--processes", std::to_string(c.processes),
                                   "--process-index", std::to_string(i), "--results", dir + "/results." + std::to_string(i),
                                   "--json"};
        std::vector<char*> argv;
        for (auto& s : a) argv.push_back(s.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        const std::string out = dir + "/out." + std::to_string(i);
        posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        pid_t pid = -1;
        const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) {
            for (pid_t p : pids) ::kill(p, SIGKILL);
            throw idem::error(idem::errc::invalid_argument, "cannot start a demo process: " + std::string(std::strerror(rc)));
        }
        pids.push_back(pid);
    }
    std::vector<std::string> failures, problems;
    for (unsigned i = 0; i < c.processes; ++i) {
        int st = 0;
        while (::waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failures.push_back("process " + std::to_string(i) + " ended with status " + std::to_string(st) +
                               " (its stderr is above)");
    }
    const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // ---- add up what the processes saw ----
    std::vector<std::uint32_t> exec(unique, 0);
    std::vector<std::uint64_t> outcome(unique, 0);
    std::vector<process_result> res(c.processes);
    std::map<std::string, std::int64_t> sum;
    double elapsed_s = 0;
    bool conserved = true;
    for (unsigned i = 0; i < c.processes; ++i) {
        std::ifstream in(dir + "/out." + std::to_string(i));
        std::string line;
        while (std::getline(in, line)) {
            const drill::report_line rl = drill::parse_report(line);
            if (rl.word == "process") {
                for (const auto& [k, v] : rl.fields) sum[k] += v;
                elapsed_s = std::max(elapsed_s, static_cast<double>(rl.get("elapsed_us")) / 1e6);
                conserved = conserved && rl.get("conserved") == 1;
            } else if (rl.word == "note" && problems.size() < 5) {
                problems.push_back("process " + std::to_string(i) + ": " + line.substr(5));
            }
        }
        std::ifstream rf(dir + "/results." + std::to_string(i), std::ios::binary);
        process_result& r = res[i];
        r.exec.resize(unique);
        r.applied.resize(unique);
        r.outcome.resize(unique);
        r.replayed.resize(unique);
        for (std::size_t k = 0; k < unique && rf; ++k) {
            rf.read(reinterpret_cast<char*>(&r.exec[k]), 4).read(reinterpret_cast<char*>(&r.applied[k]), 4);
            rf.read(reinterpret_cast<char*>(&r.outcome[k]), 8).read(reinterpret_cast<char*>(&r.replayed[k]), 8);
        }
        if (!rf) failures.push_back("process " + std::to_string(i) + " left no complete results file");
        for (std::size_t k = 0; k < unique; ++k) {
            exec[k] += r.exec[k];
            if (r.exec[k] != 0) outcome[k] = r.outcome[k];
        }
    }
    std::uint64_t executed = 0, double_executions = 0, lost = 0, cross_mismatches = 0;
    for (std::size_t k = 0; k < unique; ++k) {
        executed += exec[k];
        if (exec[k] > 1) ++double_executions;
        if (exec[k] == 0) ++lost;
        for (const process_result& r : res)
            if (r.replayed[k] != 0 && r.replayed[k] != outcome[k]) ++cross_mismatches;
    }
    durable_report dr;
    if (failures.empty()) {
        if (tty) std::cerr << "idem demo: reading the store back and verifying every audit trail\n";
        check_store(spec, idem::durability::sync, prefix, [&outcome](std::size_t k) { return outcome[k]; }, unique, dr);
    }
    const std::uint64_t blocked = static_cast<std::uint64_t>(sum["blocked"]);
    const std::uint64_t mismatches = static_cast<std::uint64_t>(sum["mismatches"]) + cross_mismatches;
    const std::uint64_t unexpected = static_cast<std::uint64_t>(sum["unexpected"]);
    auto requests_n = [](std::uint64_t n) { return grouped(n) + (n == 1 ? " request" : " requests"); };
    if (double_executions) failures.push_back(requests_n(double_executions) + " executed more than once");
    if (lost) failures.push_back(requests_n(lost) + " never executed");
    if (!conserved) failures.push_back("money not conserved in some process's ledger");
    if (sum["wrong_balances"]) failures.push_back(grouped(sum["wrong_balances"]) + " account balance(s) differ from the applied transfers");
    if (blocked != duplicates)
        failures.push_back("duplicates blocked " + grouped(blocked) + " != duplicates injected " + grouped(duplicates));
    if (mismatches) failures.push_back(grouped(mismatches) + " duplicate(s) replayed a wrong outcome");
    if (unexpected) failures.push_back(grouped(unexpected) + " unexpected answer(s) from the guard");
    if (dr.records_missing) failures.push_back(requests_n(dr.records_missing) + " of this run have no record in the store");
    if (dr.records_wrong) failures.push_back(grouped(dr.records_wrong) + " record(s) of this run are not SUCCESS with the executor's outcome");
    if (!dr.verify.violations.empty())
        failures.push_back("idem::verify found " + grouped(dr.verify.violations.size()) + " violation(s) in the store's audit trails");
    const bool ok = failures.empty();
    const double ops = elapsed_s > 0 ? static_cast<double>(c.requests) / elapsed_s : 0.0;

    if (c.json) {
        json guard_stats = json::object();
        guard_stats["answered_locally"] = static_cast<std::uint64_t>(sum["local"]);
        guard_stats["claims_sent"] = static_cast<std::uint64_t>(sum["sent"]);
        guard_stats["claims_won"] = static_cast<std::uint64_t>(sum["won"]);
        guard_stats["claims_lost"] = static_cast<std::uint64_t>(sum["lost"]);
        guard_stats["claim_batches"] = static_cast<std::uint64_t>(sum["batches"]);
        guard_stats["completion_batches"] = static_cast<std::uint64_t>(sum["completion_batches"]);
        guard_stats["store_errors"] = static_cast<std::uint64_t>(sum["store_errors"]);
        json j = json::object();
        j["command"] = "demo";
        j["ok"] = ok;
        j["store"] = display_name(spec);
        j["mode"] = "idem";
        j["scope"] = "global";
        j["processes"] = c.processes;
        j["threads"] = c.threads;
        j["seed"] = c.seed;
        j["run_id"] = c.run_id;
        add_run_summary(j,
                        {c.requests, unique, executed, duplicates, w.concurrent, w.later, blocked,
                         static_cast<std::uint64_t>(sum["replayed"]), static_cast<std::uint64_t>(sum["in_flight"]),
                         static_cast<std::uint64_t>(sum["wait_timeouts"]), double_executions, lost, mismatches,
                         unexpected, static_cast<std::uint64_t>(sum["declined"]), conserved,
                         sum["wrong_balances"] == 0, ops, elapsed_s},
                        c);
        j["wall_s"] = wall_s;
        add_store_checks(j, dr);
        j["guard"] = guard_stats;
        j["failures"] = failures;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem demo: payment transfers from " << c.processes << " processes x " << c.threads
                  << " threads sharing store " << display_name(spec) << " (global scope, run id " << c.run_id
                  << "), seed " << c.seed << ", " << fixed(c.work_us, 1) << " us per transfer\n\n";
        table t;
        t.row("requests", grouped(c.requests), "(process i sends positions i, i + " + std::to_string(c.processes) + ", ...)");
        t.row("unique keys", grouped(unique));
        t.row("executed", grouped(executed), "(across all processes, from each process's own count)");
        t.row("duplicates injected", grouped(duplicates),
              "(" + grouped(w.concurrent) + " racing their original, usually on another process; " + grouped(w.later) + " later)");
        t.row("duplicates blocked", grouped(blocked),
              "(" + grouped(sum["in_flight"]) + " caught in flight, " + grouped(sum["replayed"]) + " answered with the recorded outcome)");
        t.row("double executions", grouped(double_executions));
        t.row("money conserved", conserved ? "yes" : "NO", "(each process's own ledger)");
        t.row("balances match", sum["wrong_balances"] == 0 ? "yes" : "NO");
        t.row("throughput", grouped(static_cast<std::uint64_t>(ops)) + " ops/s", "(slowest process " + fixed(elapsed_s, 2) + " s)");
        t.row("store traffic", grouped(sum["sent"]) + " claims",
              "(" + grouped(sum["batches"]) + " claim batches, " + grouped(sum["completion_batches"]) +
                  " completion batches; " + grouped(sum["local"]) + " answers from the local tables; " +
                  grouped(sum["store_errors"]) + " store errors)");
        t.row("records in store", grouped(dr.records_ok) + " / " + grouped(unique), "(SUCCESS with the executor's outcome)");
        t.row("verify", grouped(dr.verify.violations.size()) + " violations",
              "(" + grouped(dr.verify.keys) + " keys, " + grouped(dr.verify.transitions) + " audit rows in the whole store)");
        t.print(std::cout);
        std::cout << '\n'
                  << (ok ? "PASS: every request executed exactly once across all processes; every duplicate blocked; "
                           "every audit trail legal."
                         : "FAIL: an invariant was broken (see below).")
                  << '\n';
    }
    for (const std::string& f : failures) std::cerr << "idem demo: FAIL: " << f << '\n';
    for (const std::string& p : problems) std::cerr << "idem demo: first unexpected answer: " << p << '\n';
    for (const std::string& p : dr.record_problems) std::cerr << "idem demo: wrong record: " << p << '\n';
    if (ok) std::filesystem::remove_all(dir, ec);
    else std::cerr << "idem demo: per-process outputs kept in " << dir << "; replay with --seed " << c.seed << '\n';
    return ok ? exit_ok : exit_violation;
}

int run_demo(const demo_config& given) {
    demo_config c = given;
    const store_spec spec = *parse_store(c.store);  // validated by the flag's check
    if (c.process_index >= 0) {
#ifdef IDEM_HAVE_POSTGRES
        if (spec.type == store_spec::kind::postgres && !c.run_id.empty() && !c.results.empty() &&
            static_cast<unsigned>(c.process_index) < c.processes)
            return run_demo_process(c, spec);
#endif
        std::cerr << "--process-index: only `idem demo --processes N` starts demo processes itself\n";
        return exit_usage;
    }
    if (c.processes > 1) return run_demo_processes(c, spec);
    const bool durable = !c.naive && spec.durable();
    const idem::durability mode = c.durability == "sync" ? idem::durability::sync : idem::durability::async;
    if (c.requests == 0)
        c.requests = !durable ? default_requests
                     : mode == idem::durability::sync ? default_requests_sync
                                                      : default_requests_async;
    if (durable && c.run_id.empty()) c.run_id = random_run_id();
    if (c.fresh) {
        if (spec.type != store_spec::kind::sqlite) {
            std::cerr << "--fresh: only a sqlite:PATH store can be started over (the demo deletes its file); "
                         "the store is " << display_name(spec) << '\n';
            return exit_usage;
        }
        if (!c.naive) remove_sqlite_files(spec.path);
    }
    // Request n of this run is "<run id>-TX<n>_TRANSFER_v1" (or "TX<n>_TRANSFER_v1" without a run id).
    const std::string prefix = c.run_id.empty() ? std::string("TX") : c.run_id + "-TX";
    const auto setup_start = std::chrono::steady_clock::now();

    std::uint64_t duplicates = static_cast<std::uint64_t>(std::llround(static_cast<double>(c.requests) * c.dup_rate));
    if (duplicates >= c.requests) duplicates = c.requests - 1;  // at least one unique request
    const std::uint64_t unique = c.requests - duplicates;
    const workload w = make_workload(c, unique, duplicates);

    const bool tty = !c.json && ::isatty(STDERR_FILENO) == 1;
    std::unique_ptr<guarded_store> store;
    std::unique_ptr<naive_guard> naive;
    durable_report dr;
    if (c.naive) {
        naive = std::make_unique<naive_guard>();
    } else {
        if (durable && tty) std::cerr << "idem demo: opening " << display_name(spec) << " and recovering its records\n";
        idem::options opts;
        opts.capacity = c.requests;  // every key of the run stays live (make_guard adds the recovered records)
        idem::store_options so;
        so.mode = mode;
        so.offer_wait = default_offer_wait;  // a full queue makes the worker wait, not fail
        store = make_guard(spec, std::move(opts), std::move(so));
        if (idem::durable_guard* d = store->durable()) {
            const idem::recovery_report& rec = d->recovery();
            dr.recovered = rec.records;
            dr.recovered_processing = rec.processing;
            dr.recovered_cold = rec.cold;
            dr.recovery_ms = std::chrono::duration<double, std::milli>(rec.elapsed).count();
            const idem::key first = idem::key::compose(prefix + "1", "TRANSFER", 1);
            if (store->guard().query(first).state != idem::record_state::absent) {
                std::cerr << "--run-id: '" << c.run_id << "' was already used in " << display_name(spec) << " (key '"
                          << first.view() << "' exists); choose another run id, or leave --run-id out for a random one\n";
                return exit_usage;
            }
            if (dr.recovered > many_recovered && !c.json)
                std::cerr << "idem demo: the store holds " << grouped(dr.recovered)
                          << " records of the last 24 h (the hot window) from earlier runs; recovery loads them "
                             "into memory, older ones only into the cold window. --fresh starts from an empty "
                             "database.\n";
        }
    }
    ledger accounts(c.accounts, opening_balance_cents);
    demo_run<idem::guard> run(c, w, store ? &store->guard() : nullptr, naive.get(), accounts, prefix);
    const double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();

    if (tty)
        std::cerr << "idem demo: " << grouped(c.requests) << " requests on " << c.threads << " threads, store "
                  << display_name(spec) << (durable ? std::string(" (") + c.durability + ", run id " + c.run_id + ")" : "")
                  << ", seed " << c.seed << '\n';
    const double elapsed_s = run.run().count();
    idem::stats gs = store ? store->snapshot() : idem::stats{};

    // ---- Durable store: drain, close, reopen and read back ----
    if (idem::durable_guard* d = store ? store->durable() : nullptr) {
        const auto t0 = std::chrono::steady_clock::now();
        dr.drained = d->flush(std::chrono::seconds(120));
        dr.drain_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        gs = store->snapshot();
        dr.last_store_error = d->last_store_error();
        store.reset();  // stops maintenance and the flusher, closes the store
        if (tty) std::cerr << "idem demo: reading the store back and verifying every audit trail\n";
        check_store(spec, mode, prefix, [&run](std::size_t i) { return run.outcome_of(i); }, unique, dr);
    }
    const char* mode_name = c.naive ? "naive" : "idem";

    // ---- Checks, from the application's own records (never from the guard) ----
    tally_sum ts = sum_tallies(run.tallies());
    const std::uint64_t tallied_executions = ts.executed, replayed = ts.replayed, blocked = ts.blocked,
                        in_flight = ts.in_flight, wait_timeouts = ts.wait_timeouts, declined = ts.declined,
                        mismatches = ts.mismatches, unexpected = ts.unexpected, retries = ts.retries;
    std::uint64_t executed = 0;
    std::vector<std::string> problems = std::move(ts.problems);
    std::uint64_t double_executions = 0, lost = 0;
    std::vector<std::int64_t> expected(c.accounts, opening_balance_cents);
    for (std::size_t i = 0; i < w.requests.size(); ++i) {
        const std::uint32_t n = run.executions_of(i);
        executed += n;
        if (n > 1) ++double_executions;
        if (n == 0) ++lost;
        const std::int64_t moved = static_cast<std::int64_t>(run.applied_of(i)) * w.requests[i].amount;
        expected[w.requests[i].from] -= moved;
        expected[w.requests[i].to] += moved;
    }
    std::uint64_t wrong_balances = 0;
    for (std::size_t a = 0; a < c.accounts; ++a)
        if (accounts.balance(a) != expected[a]) ++wrong_balances;
    const std::int64_t total = accounts.total();
    const bool conserved = total == accounts.opening_total();

    auto requests_n = [](std::uint64_t n) { return grouped(n) + (n == 1 ? " request" : " requests"); };
    std::vector<std::string> failures;
    if (double_executions) failures.push_back(requests_n(double_executions) + " executed more than once");
    if (lost) failures.push_back(requests_n(lost) + " never executed");
    if (!conserved)
        failures.push_back("money not conserved: total " + grouped_signed(total) + " cents, opened with " +
                           grouped_signed(accounts.opening_total()));
    if (wrong_balances)
        failures.push_back(grouped(wrong_balances) + " account balance(s) differ from the applied transfers");
    if (blocked != duplicates)
        failures.push_back("duplicates blocked " + grouped(blocked) + " != duplicates injected " + grouped(duplicates));
    if (mismatches) failures.push_back(grouped(mismatches) + " duplicate(s) replayed a wrong outcome");
    if (unexpected) failures.push_back(grouped(unexpected) + " unexpected answer(s) from the guard");
    if (tallied_executions != executed) failures.push_back("execution counts disagree between workers and ledger");
    if (durable) {
        if (!dr.drained)
            failures.push_back("the flusher did not commit every transition within 120 s (" +
                               grouped(gs.queue_depth) + " still queued; last store error: " +
                               (dr.last_store_error.empty() ? std::string("none") : dr.last_store_error) + ")");
        if (dr.records_missing) failures.push_back(requests_n(dr.records_missing) + " of this run have no record in the store");
        if (dr.records_wrong)
            failures.push_back(grouped(dr.records_wrong) +
                               " record(s) of this run are not SUCCESS with the outcome the application recorded");
        if (!dr.verify.violations.empty())
            failures.push_back("idem::verify found " + grouped(dr.verify.violations.size()) +
                               " violation(s) in the store's audit trails");
    }
    const bool ok = failures.empty();
    const double ops = elapsed_s > 0 ? static_cast<double>(c.requests) / elapsed_s : 0.0;
    const double records_per_ms = dr.recovery_ms > 0 ? static_cast<double>(dr.recovered) / dr.recovery_ms : 0.0;

    if (c.json) {
        json guard_stats = json::object();
        guard_stats["acquired"] = gs.acquired;
        guard_stats["duplicates"] = gs.duplicates;
        guard_stats["in_progress_hits"] = gs.in_progress_hits;
        guard_stats["succeeded"] = gs.succeeded;
        guard_stats["payload_mismatches"] = gs.payload_mismatches;
        guard_stats["capacity_exhausted"] = gs.capacity_exhausted;
        guard_stats["max_probe"] = gs.max_probe;
        if (durable) {
            guard_stats["backpressure"] = gs.backpressure;
            guard_stats["in_doubt"] = gs.in_doubt;
        }
        json j = json::object();
        j["command"] = "demo";
        j["ok"] = ok;
        j["store"] = display_name(spec);
        j["mode"] = mode_name;
        j["threads"] = c.threads;
        j["seed"] = c.seed;
        add_run_summary(j,
                        {c.requests, unique, executed, duplicates, w.concurrent, w.later, blocked, replayed, in_flight,
                         wait_timeouts, double_executions, lost, mismatches, unexpected, declined, conserved,
                         wrong_balances == 0, ops, elapsed_s},
                        c);
        j["accounts"] = c.accounts;
        j["total_money_cents"] = total;
        j["setup_s"] = setup_s;
        j["peak_rss_mib"] = peak_rss_mib();
        if (durable) {
            j["durability"] = c.durability;
            j["run_id"] = c.run_id;
            j["recovered_records"] = std::uint64_t{dr.recovered};
            j["recovered_processing"] = std::uint64_t{dr.recovered_processing};
            j["recovery_ms"] = dr.recovery_ms;
            j["recovered_cold"] = dr.recovered_cold;
            j["recovery_records_per_ms"] = records_per_ms;
            j["flush_batches"] = gs.flush_batches;
            j["flushed_transitions"] = gs.flushed_transitions;
            j["store_errors"] = gs.store_errors;
            j["rejected_rows"] = gs.rejected_rows;
            j["backpressure_retries"] = retries;
            j["drained"] = dr.drained;
            j["drain_s"] = dr.drain_s;
            j["verify_s"] = dr.verify_s;
            add_store_checks(j, dr);
        }
        j["guard"] = guard_stats;
        j["failures"] = failures;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem demo: payment transfers, "
                  << (c.naive ? "NAIVE check-then-set guard (--naive), no idem" : "store " + display_name(spec))
                  << (durable ? " (" + c.durability + " durability, run id " + c.run_id + ")" : std::string()) << ", "
                  << c.threads << " threads, seed " << c.seed << ", " << fixed(c.work_us, 1) << " us per transfer\n\n";
        table t;
        t.row("requests", grouped(c.requests));
        t.row("unique keys", grouped(unique));
        t.row("executed", grouped(executed),
              declined ? "(" + grouped(declined) + " declined for insufficient funds, still executed once)" : "");
        t.row("duplicates injected", grouped(duplicates),
              "(" + grouped(w.concurrent) + " racing their original, " + grouped(w.later) + " later)");
        t.row("duplicates blocked", grouped(blocked),
              c.naive ? std::string("(found DONE by the check)") : "(" + grouped(in_flight) + " caught in flight, " + grouped(replayed) + " answered with the recorded outcome" +
                  (wait_timeouts ? ", " + grouped(wait_timeouts) + " told busy after the wait" : "") + ")");
        t.row("double executions", grouped(double_executions));
        t.row("money conserved", conserved ? "yes" : "NO",
              "(" + grouped(c.accounts) + " accounts, " + grouped_signed(total / 100) + "." +
                  (total % 100 < 10 ? "0" : "") + std::to_string(total % 100) + " in total)");
        t.row("balances match", wrong_balances == 0 ? "yes" : "NO",
              wrong_balances ? "(" + grouped(wrong_balances) + " accounts differ)" : "(each = opening + applied transfers)");
        t.row("throughput", grouped(static_cast<std::uint64_t>(ops)) + " ops/s");
        t.row("elapsed", fixed(elapsed_s, 2) + " s", "(setup " + fixed(setup_s, 2) + " s, peak memory " +
                                                         grouped(static_cast<std::uint64_t>(peak_rss_mib())) + " MiB)");
        if (!c.naive)
            t.row("guard", "", "acquired " + grouped(gs.acquired) + ", duplicates " + grouped(gs.duplicates) +
                               ", in-progress hits " + grouped(gs.in_progress_hits) + ", longest probe " +
                               grouped(gs.max_probe));
        if (durable) {
            t.row("recovery", grouped(dr.recovered) + " records",
                  "(" + fixed(dr.recovery_ms, 1) + " ms, " + grouped(static_cast<std::uint64_t>(records_per_ms)) +
                      " records/ms" +
                      (dr.recovered_processing ? ", " + grouped(dr.recovered_processing) + " claims in flight" : "") +
                      (dr.recovered_cold ? ", " + grouped(dr.recovered_cold) + " older ones in the cold window" : "") + ")");
            const double per_batch =
                gs.flush_batches ? static_cast<double>(gs.flushed_transitions) / static_cast<double>(gs.flush_batches) : 0;
            t.row("flushed", grouped(gs.flushed_transitions) + " transitions",
                  "(" + grouped(gs.flush_batches) + " batches, " + fixed(per_batch, 0) + " per batch; drained " +
                      fixed(dr.drain_s, 2) + " s after the last request; " + grouped(gs.store_errors) +
                      " store errors" + (gs.rejected_rows ? ", " + grouped(gs.rejected_rows) + " rows set aside" : "") +
                      (retries ? ", " + grouped(retries) + " backpressure retries" : "") + ")");
            t.row("records in store", grouped(dr.records_ok) + " / " + grouped(unique),
                  "(SUCCESS with the executed outcome" +
                      (dr.records_missing ? ", " + grouped(dr.records_missing) + " missing" : std::string()) +
                      (dr.records_wrong ? ", " + grouped(dr.records_wrong) + " wrong" : std::string()) + ")");
            t.row("verify", grouped(dr.verify.violations.size()) + " violations",
                  "(" + grouped(dr.verify.keys) + " keys, " + grouped(dr.verify.transitions) +
                      " audit rows in the whole store, " + fixed(dr.verify_s, 2) + " s)");
        }
        t.print(std::cout);
        std::cout << '\n'
                  << (ok ? durable ? "PASS: every request executed exactly once; every duplicate blocked; every "
                                     "transition durable and its audit trail legal."
                                   : "PASS: every request executed exactly once; every duplicate blocked."
                         : c.naive ? "FAIL, as expected with --naive: check-then-set let racing duplicates execute twice."
                                   : "FAIL: an invariant was broken (see below).")
                  << '\n';
    }
    for (const std::string& f : failures) std::cerr << "idem demo: FAIL: " << f << '\n';
    for (const std::string& p : problems) std::cerr << "idem demo: first unexpected answer: " << p << '\n';
    for (const std::string& p : dr.record_problems) std::cerr << "idem demo: wrong record: " << p << '\n';
    for (std::size_t i = 0; i < dr.verify.violations.size() && i < 10; ++i)
        std::cerr << "idem demo: violation: " << dr.verify.violations[i] << '\n';
    if (!ok) std::cerr << "idem demo: replay the workload with --seed " << c.seed << '\n';
    return ok ? exit_ok : exit_violation;
}

}  // namespace

command add_demo(CLI::App& root) {
    auto c = std::make_shared<demo_config>();
    std::random_device rd;
    c->seed = (std::uint64_t{rd()} << 32) | rd();

    CLI::App* app = root.add_subcommand(
        "demo",
        "Payment workload with injected duplicates; checks exactly-once execution without asking the guard");
    app->footer(
        "Sends --requests transfers on an in-memory ledger, --dup-rate of them duplicates (some racing their "
        "original, some later), and checks from the application's own records that every request executed "
        "exactly once, money is conserved and every duplicate was blocked. With a durable store it then "
        "reads the store back: every request has a SUCCESS record and idem::verify finds 0 violations.\n"
        "Exit codes: 0 all checks held, 1 a check failed, 2 bad command line, 3 could not run.");
    app->add_option("--threads", c->threads, "Worker threads (default: hardware threads, at least 2)")
        ->check(in_range(1u, 4096u, "worker threads"))
        ->capture_default_str();
    app->add_option("--requests", c->requests,
                    "Requests sent, duplicates included; the guard is sized for this many keys (default: " +
                        show_number(default_requests) + " with memory, " + show_number(default_requests_async) +
                        " with a durable store in async mode, " + show_number(default_requests_sync) + " in sync mode)")
        ->check(in_range(std::uint64_t{1}, std::uint64_t{1} << 30, "requests per run"));
    app->add_option("--dup-rate", c->dup_rate,
                    "Fraction of the requests that are duplicates (0.0015 = the seed's production 0.15%)")
        ->check(in_range(0.0, 0.9, "fraction of the requests that are duplicates"))
        ->capture_default_str();
    app->add_option("--seed", c->seed, "Seed of the workload generator (default: random; printed for replay)");
    app->add_option("--store", c->store, std::string("Store URI; accepted: ") + accepted_stores)
        ->check(store_check())
        ->capture_default_str();
    app->add_option("--durability", c->durability,
                    "Durable stores: async (acknowledge at once, flush behind) or sync (acknowledge after the "
                    "commit, group commit)")
        ->check(CLI::IsMember({"async", "sync"}))
        ->capture_default_str();
    app->add_option("--run-id", c->run_id,
                    "Prefix of this run's transaction ids, so reruns on a durable store use new keys "
                    "(default: random with a durable store, none with memory)")
        ->check(CLI::Validator(
            [](std::string& v) -> std::string {
                if (v.empty() || v.size() > 32) return "'" + v + "' is not 1 to 32 letters, digits or '-'";
                for (char ch : v)
                    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-')
                        return "'" + v + "' holds '" + std::string(1, ch) + "'; a run id is letters, digits and '-'";
                return {};
            },
            "ID"));
    app->add_flag("--fresh", c->fresh, "sqlite stores: delete the database file first, so nothing is recovered");
    app->add_flag("--json", c->json, "Print the summary as one JSON object on stdout (no progress bar)");
    app->add_option("--work-us", c->work_us, "Simulated processing time of one transfer, in microseconds (busy CPU)")
        ->check(in_range(0.0, 1e6, "microseconds of simulated work per transfer"))
        ->capture_default_str();
    app->add_option("--accounts", c->accounts, "Accounts in the ledger")
        ->check(in_range(std::uint32_t{2}, std::uint32_t{10'000'000}, "accounts in the ledger"))
        ->capture_default_str();
    app->add_option("--race-share", c->race_share,
                    "Share of the duplicates sent at the same moment as their original (the rest come later)")
        ->check(in_range(0.0, 1.0, "share of duplicates racing their original"))
        ->capture_default_str();
    app->add_flag("--naive", c->naive,
                  "Use the naive check-then-set guard instead of idem, to see the double executions idem "
                  "prevents (exits 1; the store is not used)");
    app->add_option("--processes", c->processes,
                    "Processes that run the workload together against one postgresql:// store (global scope); "
                    "process i sends requests i, i + N, ..., so racing duplicates meet on different processes")
        ->check(in_range(1u, 64u, "processes"))
        ->capture_default_str();
    app->add_option("--process-index", c->process_index)->group("");  // hidden: set by --processes
    app->add_option("--results", c->results)->group("");
    app->add_option("--wait-ms", c->wait_ms,
                    "How long a duplicate that finds its original executing waits for the outcome, in ms (0: no wait)")
        ->check(in_range(0.0, 60'000.0, "milliseconds"))
        ->capture_default_str();

    return {app, [c] { return run_demo(*c); }};
}

}  // namespace idem::tool
