// tools/demo/cli.cpp: the `idem demo` command line (docs/operations.md lists every flag).
#include <cctype>
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "command.hpp"
#include "demo/demo.hpp"
#include "store.hpp"

namespace idem::tool {

command add_demo(CLI::App& root) {
    using namespace demo;
    auto c = std::make_shared<demo_config>();
    std::random_device rd;
    c->seed = (std::uint64_t{rd()} << 32) | rd();

    CLI::App* app = root.add_subcommand(
        "demo", "Payment workload with injected duplicates; checks exactly-once execution without asking the guard");
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
