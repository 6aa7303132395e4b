// tools/demo/processes.cpp: `idem demo --processes N`, the multi-process orchestration.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "command.hpp"
#include "demo/demo.hpp"
#include "demo/results.hpp"
#include "demo/run_loop.hpp"
#include "demo/workload.hpp"
#include "drill/report_line.hpp"
#include "ledger.hpp"
#include "report.hpp"
#include "store.hpp"
#if defined(IDEM_HAVE_POSTGRES) || defined(IDEM_HAVE_MYSQL)
#include "idem/global_guard.hpp"
#endif

extern char** environ;

namespace idem::tool::demo {

// ---- --processes N: the workload from N processes sharing one PostgreSQL or MariaDB (global scope) ----------
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

#if defined(IDEM_HAVE_POSTGRES) || defined(IDEM_HAVE_MYSQL)
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
    std::printf(
        "process elapsed_us=%lld executed=%llu blocked=%llu replayed=%llu in_flight=%llu wait_timeouts=%llu "
        "declined=%llu mismatches=%llu unexpected=%llu wrong_balances=%llu conserved=%d local=%llu sent=%llu "
        "won=%llu lost=%llu batches=%llu completion_batches=%llu store_errors=%llu\n",
        static_cast<long long>(elapsed_s * 1e6), (unsigned long long)executed, (unsigned long long)blocked,
        (unsigned long long)replayed, (unsigned long long)in_flight, (unsigned long long)wait_timeouts,
        (unsigned long long)declined, (unsigned long long)mismatches, (unsigned long long)unexpected,
        (unsigned long long)wrong_balances, accounts.total() == accounts.opening_total() ? 1 : 0,
        (unsigned long long)gs.answered_locally, (unsigned long long)gs.claims_sent, (unsigned long long)gs.claims_won,
        (unsigned long long)gs.claims_lost, (unsigned long long)gs.claim_batches, (unsigned long long)gs.completion_batches,
        (unsigned long long)gs.store_errors);
    if (!first.empty()) std::printf("note %s\n", first.c_str());
    std::fflush(stdout);
    return exit_ok;
}
#endif

int run_demo_processes(const demo_config& given, const store_spec& spec) {
    demo_config c = given;
    if (!arbitrates(spec) || c.naive) {
        std::cerr << "--processes: " << c.processes << " processes share one key space through global scope, which "
                  << "needs a postgresql:// or mysql:// store (--store)" << (c.naive ? " and no --naive" : "") << '\n';
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
        std::cerr << "idem demo: " << grouped(c.requests) << " requests from " << c.processes << " processes x " << c.threads
                  << " threads, store " << display_name(spec) << " (global scope, run id " << c.run_id << "), seed "
                  << c.seed << '\n';

    const auto t0 = std::chrono::steady_clock::now();
    std::vector<pid_t> pids;
    for (unsigned i = 0; i < c.processes; ++i) {
        std::vector<std::string> a{exe,
                                   "demo",
                                   "--store",
                                   c.store,
                                   "--run-id",
                                   c.run_id,
                                   "--seed",
                                   std::to_string(c.seed),
                                   "--requests",
                                   std::to_string(c.requests),
                                   "--threads",
                                   std::to_string(c.threads),
                                   "--dup-rate",
                                   std::to_string(c.dup_rate),
                                   "--work-us",
                                   std::to_string(c.work_us),
                                   "--accounts",
                                   std::to_string(c.accounts),
                                   "--race-share",
                                   std::to_string(c.race_share),
                                   "--wait-ms",
                                   std::to_string(c.wait_ms),
                                   "--processes",
                                   std::to_string(c.processes),
                                   "--process-index",
                                   std::to_string(i),
                                   "--results",
                                   dir + "/results." + std::to_string(i),
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
            throw idem::error(idem::errc::invalid_argument,
                              "cannot start a demo process: " + std::string(std::strerror(rc)));
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
        check_store(
            spec, idem::durability::sync, prefix, [&outcome](std::size_t k) { return outcome[k]; }, unique, dr);
    }
    const std::uint64_t blocked = static_cast<std::uint64_t>(sum["blocked"]);
    const std::uint64_t mismatches = static_cast<std::uint64_t>(sum["mismatches"]) + cross_mismatches;
    const std::uint64_t unexpected = static_cast<std::uint64_t>(sum["unexpected"]);
    auto requests_n = [](std::uint64_t n) { return grouped(n) + (n == 1 ? " request" : " requests"); };
    if (double_executions) failures.push_back(requests_n(double_executions) + " executed more than once");
    if (lost) failures.push_back(requests_n(lost) + " never executed");
    if (!conserved) failures.push_back("money not conserved in some process's ledger");
    if (sum["wrong_balances"])
        failures.push_back(grouped(sum["wrong_balances"]) + " account balance(s) differ from the applied transfers");
    if (blocked != duplicates)
        failures.push_back("duplicates blocked " + grouped(blocked) + " != duplicates injected " + grouped(duplicates));
    if (mismatches) failures.push_back(grouped(mismatches) + " duplicate(s) replayed a wrong outcome");
    if (unexpected) failures.push_back(grouped(unexpected) + " unexpected answer(s) from the guard");
    if (dr.records_missing) failures.push_back(requests_n(dr.records_missing) + " of this run have no record in the store");
    if (dr.records_wrong)
        failures.push_back(grouped(dr.records_wrong) + " record(s) of this run are not SUCCESS with the executor's outcome");
    if (!dr.verify.violations.empty())
        failures.push_back("idem::verify found " + grouped(dr.verify.violations.size()) +
                           " violation(s) in the store's audit trails");
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
                         static_cast<std::uint64_t>(sum["wait_timeouts"]), double_executions, lost, mismatches, unexpected,
                         static_cast<std::uint64_t>(sum["declined"]), conserved, sum["wrong_balances"] == 0, ops, elapsed_s},
                        c);
        j["wall_s"] = wall_s;
        add_store_checks(j, dr);
        j["guard"] = guard_stats;
        j["failures"] = failures;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem demo: payment transfers from " << c.processes << " processes x " << c.threads
                  << " threads sharing store " << display_name(spec) << " (global scope, run id " << c.run_id << "), seed "
                  << c.seed << ", " << fixed(c.work_us, 1) << " us per transfer\n\n";
        table t;
        t.row("requests", grouped(c.requests),
              "(process i sends positions i, i + " + std::to_string(c.processes) + ", ...)");
        t.row("unique keys", grouped(unique));
        t.row("executed", grouped(executed), "(across all processes, from each process's own count)");
        t.row("duplicates injected", grouped(duplicates),
              "(" + grouped(w.concurrent) + " racing their original, usually on another process; " + grouped(w.later) +
                  " later)");
        t.row("duplicates blocked", grouped(blocked),
              "(" + grouped(sum["in_flight"]) + " caught in flight, " + grouped(sum["replayed"]) +
                  " answered with the recorded outcome)");
        t.row("double executions", grouped(double_executions));
        t.row("money conserved", conserved ? "yes" : "NO", "(each process's own ledger)");
        t.row("balances match", sum["wrong_balances"] == 0 ? "yes" : "NO");
        t.row("throughput", grouped(static_cast<std::uint64_t>(ops)) + " ops/s",
              "(slowest process " + fixed(elapsed_s, 2) + " s)");
        t.row("store traffic", grouped(sum["sent"]) + " claims",
              "(" + grouped(sum["batches"]) + " claim batches, " + grouped(sum["completion_batches"]) +
                  " completion batches; " + grouped(sum["local"]) + " answers from the local tables; " +
                  grouped(sum["store_errors"]) + " store errors)");
        t.row("records in store", grouped(dr.records_ok) + " / " + grouped(unique), "(SUCCESS with the executor's outcome)");
        t.row("verify", grouped(dr.verify.violations.size()) + " violations",
              "(" + grouped(dr.verify.keys) + " keys, " + grouped(dr.verify.transitions) +
                  " audit rows in the whole store)");
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

}  // namespace idem::tool::demo
