// tools/demo/demo.hpp: `idem demo`, a payment workload with injected duplicates: its settings and
// the entry points of its parts.
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
//
// The parts, one concern per file:
//   demo.hpp       the settings (demo_config, the defaults) and the entry points below
//   workload.hpp   the requests a run sends, generated before timing
//   run_loop.hpp   the worker threads that send them through a guard, and their counts
//   results.hpp    the store read back after a run, and the JSON fields every run reports
//   run.cpp        one process: set-up, run, checks, the summary
//   processes.cpp  --processes N: N processes sharing one PostgreSQL store (global scope)
//   cli.cpp        the command line
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "store.hpp"

namespace idem::tool::demo {

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

/// One process: the whole run, or one of --processes N (run.cpp).
int run_demo(const demo_config& given);
/// --processes N: starts N demo processes on one PostgreSQL or MariaDB store and adds up what they saw (processes.cpp).
int run_demo_processes(const demo_config& given, const store_spec& spec);
#if defined(IDEM_HAVE_POSTGRES) || defined(IDEM_HAVE_MYSQL)
/// One of those N processes: --process-index i (processes.cpp).
int run_demo_process(const demo_config& c, const store_spec& spec);
#endif

}  // namespace idem::tool::demo
