// tools/demo/run.cpp: one demo process: set-up (store, recovery, ledger), the run, the checks from
// the application's own records, the store read back, and the summary (a table or one JSON object).
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "command.hpp"
#include "demo/demo.hpp"
#include "demo/results.hpp"
#include "demo/run_loop.hpp"
#include "demo/workload.hpp"
#include "idem/idem.hpp"
#include "ledger.hpp"
#include "naive_guard.hpp"
#include "report.hpp"
#include "store.hpp"

namespace idem::tool::demo {
namespace {

/// Removes a SQLite database, its WAL files and its writer lock file (--fresh: a new history on
/// purpose; the store refuses a missing database whose lock file records a writer). A missing file
/// is fine.
void remove_sqlite_files(const std::string& path) {
    for (const std::string& f : {path, path + "-wal", path + "-shm", path + ".lock"})
        if (::unlink(f.c_str()) != 0 && errno != ENOENT)
            throw idem::error(idem::errc::store_error, "--fresh: cannot remove '" + f + "': " + std::strerror(errno));
}

}  // namespace

int run_demo(const demo_config& given) {
    demo_config c = given;
    const store_spec spec = *parse_store(c.store);  // validated by the flag's check
    if (c.process_index >= 0) {
#if defined(IDEM_HAVE_POSTGRES) || defined(IDEM_HAVE_MYSQL)
        if (arbitrates(spec) && !c.run_id.empty() && !c.results.empty() &&
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
        c.requests = !durable                         ? default_requests
                     : mode == idem::durability::sync ? default_requests_sync
                                                      : default_requests_async;
    if (durable && c.run_id.empty()) c.run_id = random_run_id();
    if (c.fresh) {
        if (spec.type != store_spec::kind::sqlite) {
            std::cerr << "--fresh: only a sqlite:PATH store can be started over (the demo deletes its file); "
                         "the store is "
                      << display_name(spec) << '\n';
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
        check_store(
            spec, mode, prefix, [&run](std::size_t i) { return run.outcome_of(i); }, unique, dr);
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
            failures.push_back("the flusher did not commit every transition within 120 s (" + grouped(gs.queue_depth) +
                               " still queued; last store error: " +
                               (dr.last_store_error.empty() ? std::string("none") : dr.last_store_error) + ")");
        if (dr.records_missing)
            failures.push_back(requests_n(dr.records_missing) + " of this run have no record in the store");
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
              c.naive ? std::string("(found DONE by the check)")
                      : "(" + grouped(in_flight) + " caught in flight, " + grouped(replayed) +
                            " answered with the recorded outcome" +
                            (wait_timeouts ? ", " + grouped(wait_timeouts) + " told busy after the wait" : "") + ")");
        t.row("double executions", grouped(double_executions));
        t.row("money conserved", conserved ? "yes" : "NO",
              "(" + grouped(c.accounts) + " accounts, " + grouped_signed(total / 100) + "." + (total % 100 < 10 ? "0" : "") +
                  std::to_string(total % 100) + " in total)");
        t.row("balances match", wrong_balances == 0 ? "yes" : "NO",
              wrong_balances ? "(" + grouped(wrong_balances) + " accounts differ)" : "(each = opening + applied transfers)");
        t.row("throughput", grouped(static_cast<std::uint64_t>(ops)) + " ops/s");
        t.row("elapsed", fixed(elapsed_s, 2) + " s",
              "(setup " + fixed(setup_s, 2) + " s, peak memory " + grouped(static_cast<std::uint64_t>(peak_rss_mib())) +
                  " MiB)");
        if (!c.naive)
            t.row("guard", "",
                  "acquired " + grouped(gs.acquired) + ", duplicates " + grouped(gs.duplicates) + ", in-progress hits " +
                      grouped(gs.in_progress_hits) + ", longest probe " + grouped(gs.max_probe));
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
                      fixed(dr.drain_s, 2) + " s after the last request; " + grouped(gs.store_errors) + " store errors" +
                      (gs.rejected_rows ? ", " + grouped(gs.rejected_rows) + " rows set aside" : "") +
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
                  << (ok        ? durable ? "PASS: every request executed exactly once; every duplicate blocked; every "
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

}  // namespace idem::tool::demo
