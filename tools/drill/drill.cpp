// tools/drill/drill.cpp: `idem drill`, the crash drill (the seed's "regular drills").
//
// What it does
// ------------
// A drill directory (a fresh temp directory) holds the independent ledger, the acknowledgement file
// and the request lists; the store is --store (default: sqlite:<drill dir>/idem-drill.db). Every key
// of a drill starts with "DR<run id>-", so a drill can run against a store that holds other data.
//
// For each of --cycles cycles the drill
//   1. writes a request list: --keys new keys, every key issued earlier and not yet acknowledged
//      (the client's retries after a crash), a few acknowledged keys again (late duplicates), and a
//      second copy of some new keys (racing duplicates), shuffled;
//   2. starts `idem drill-worker` (drill/worker.cpp): it recovers the store, resolves the claims the
//      previous worker left in flight from the ledger, then executes the requests in sync mode,
//      writing each effect to the ledger before ticket.succeed() and acknowledging after it;
//   3. kills it with SIGKILL after a random delay (--kill-min-ms .. --kill-max-ms, from a seeded RNG),
//      counted from the worker's "ready" line, or, one cycle in four, from its start, so some kills
//      land during recovery and compensation.
// Then a last worker runs the remaining unacknowledged keys to completion without a kill, and the
// drill checks, from the files and the store:
//   - no key has two effects in the ledger                       (double_executions)
//   - every acknowledged key is SUCCESS in the store, with the acknowledged outcome   (lost_acknowledged)
//   - every key issued is SUCCESS, with the outcome of its one effect, and no SUCCESS lacks an effect
//   - idem::verify finds every audit trail in the store legal    (violations)
// --workers N (N > 1, a postgresql:// store): each cycle starts N workers on the same request list;
// they share the store through idem::global_guard (scope::global), race on the same keys, and each is
// SIGKILLed at its own random moment. The claims a killed worker leaves are resolved from the ledger
// by the compensation of whichever live worker finds their lease expired first (in the same cycle or
// a later one); the final run is N workers racing on the retries. The checks are the same.
//
// Faults beyond a crash (SQLite stores, one worker):
// --second-writer same|disjoint: in each cycle, once the worker is ready, the drill starts a second
//   worker on the same database file, with the same request list (same) or with fresh keys of its
//   own (disjoint). The first worker runs with --hold (it keeps the file open after its last
//   request, until killed), and the drill holds its kill until the second has either been refused
//   (its open failed: it prints "refused <the store's message>" and exits 3) or has reported ready
//   (it opened the file beside the first: not refused, a failed check). A refusal must name the
//   database path. The ledger checks then show what two writers did, if they both ran.
// --delete-file: after the checks above, one more worker runs fresh keys without a kill, and after a
//   random number of its acknowledgements the drill deletes the database file (unlink(PATH), what
//   `rm PATH` does; PATH-wal, PATH-shm and PATH.lock stay). The worker reports each OK claim and
//   acknowledgement with the time its call was made, and stops at its first failed commit. A call
//   made after the unlink returned must never be confirmed: its commit could only have gone to a
//   file no restart finds. The drill counts such confirmations (must be 0), reports the store's
//   error as the worker saw it, and reports what a restart on the path finds. The records
//   acknowledged before the deletion went with the file: no store can keep them, so they are
//   reported, not judged.
// --failover-command CMD (a postgresql:// store, best a multi-host URI with
//   target_session_attrs=read-write naming a primary and its standby): in the middle cycle, once
//   every worker is ready, the drill runs CMD with /bin/sh (it should fail the primary over: kill
//   it and promote the standby, or `pg_autoctl perform failover`); no worker of that cycle is
//   killed before CMD ends, so they ride through the failover, and each is then killed at its
//   delay from there. The later cycles and the final run use whichever host is primary; the checks
//   read the store through the same URI, so every acknowledgement written before the failover
//   (counted in the report) must be on the new primary. A CMD that fails fails the drill.
// --prometheus FILE: after the report, the run's result as gauges for node-exporter's textfile
// collector (prometheus_file.hpp): failed checks, checks run, duration, time of the run.
// Exit codes: 0 all checks held (an expected refusal included), 1 a check failed (the drill
// directory is kept for inspection), 2 bad command line, 3 could not run (worker could not start,
// store could not be opened; or, with every check held, the --prometheus file could not be written).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "command.hpp"
#include "drill/files.hpp"
#include "drill/process.hpp"
#include "drill/regions_drill.hpp"
#ifdef IDEM_HAVE_POSTGRES
#include <pqxx/pqxx>

#include "idem/detail/pg/connection.hpp"
#endif
#include "drill/report_line.hpp"
#include "prometheus_file.hpp"
#include "idem/verify.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "store.hpp"

namespace idem::tool {
namespace {

struct drill_config {
    unsigned cycles = 20;
    std::string store;  ///< empty: sqlite:<drill dir>/idem-drill.db
    std::uint64_t seed = 0;
    bool json = false;
    unsigned keys = 200;  ///< new keys per cycle
    unsigned threads = 4;
    unsigned workers = 1;  ///< > 1: worker processes that share a PostgreSQL store (global scope) and race
    double lease_ms = 200;
    double kill_min_ms = 50;
    double kill_max_ms = 500;
    bool keep = false;
    std::string second_writer;     ///< "", "same" or "disjoint": a second worker on the same SQLite file
    bool delete_file = false;      ///< delete the SQLite file under a running worker, after the checks
    std::string prometheus;        ///< --prometheus FILE; empty: none
    regions_drill_config regions;  ///< --region given: the regions drill (regions_drill.cpp)
    std::string failover_command;  ///< run in the middle cycle while the workers run (a PostgreSQL failover)
};

using clock_type = std::chrono::steady_clock;
using drill::describe_status;
using drill::self_exe;
using drill::worker_process;


struct key_info {
    std::uint64_t amount = 0;
};

struct cycle_result {
    bool killed = false;
    bool killed_before_ready = false;
    bool ready = false;
    std::optional<drill::report_line> ready_line, done_line;
    std::optional<std::string> refused;          ///< "refused <message>": the store refused to open
    std::optional<std::string> error;            ///< "error <message>": the store's last error (--stop-on-unavailable)
    std::vector<std::int64_t> claim_ok, ack_ok;  ///< call times of confirmed claims and acks (same)
    int status = 0;
};

/// The line a worker printed after its own word ("refused sqlite:/x: ..." -> "sqlite:/x: ...").
std::optional<std::string> after_word(const std::string& line, std::string_view word) {
    if (line.size() > word.size() && line.starts_with(word) && line[word.size()] == ' ') return line.substr(word.size() + 1);
    return std::nullopt;
}

/// " (the store refused: ...)" when the worker said so, for a failure message.
std::string refusal_note(const cycle_result& r) {
    return r.refused ? " (the store refused to open: " + *r.refused + ")" : std::string();
}

/// "host:port" of the server a PostgreSQL URI reaches now (with a multi-host URI and
/// target_session_attrs=read-write: the primary); "" when none answers.
std::string primary_of([[maybe_unused]] const std::string& uri) {
#ifdef IDEM_HAVE_POSTGRES
    try {
        pqxx::connection c(idem::detail::pg::session_conninfo(uri, std::chrono::seconds(5), "idem-drill"));
        pqxx::nontransaction n(c);
        const auto r = n.exec("SELECT host(inet_server_addr()) || ':' || inet_server_port()");
        return r.empty() || r[0][0].is_null() ? std::string() : std::string(r[0][0].c_str());
    } catch (const std::exception&) {
        return {};
    }
#else
    return {};
#endif
}

std::int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count();
}

int run_drill(const drill_config& c) {
    const auto started = clock_type::now();
    if (c.kill_min_ms > c.kill_max_ms) {
        std::cerr << "--kill-min-ms: " << c.kill_min_ms << " is above --kill-max-ms " << c.kill_max_ms << '\n';
        return exit_usage;
    }
    // The drill directory: ledger, acks, request lists (and the default store).
    const std::string dir = drill::make_directory();
    const std::string store_uri = c.store.empty() ? "sqlite:" + dir + "/idem-drill.db" : c.store;
    const store_spec spec = *parse_store(store_uri);
    if (c.workers > 1 && !arbitrates(spec)) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        std::cerr << "--workers: " << c.workers << " worker processes share one store through global scope, which "
                  << "needs a postgresql:// or mysql:// store (--store); the store is " << display_name(spec) << '\n';
        return exit_usage;
    }
    if ((!c.second_writer.empty() || c.delete_file) && (spec.type != store_spec::kind::sqlite || c.workers != 1)) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        std::cerr << (c.delete_file ? "--delete-file" : "--second-writer")
                  << ": the fault is one of a SQLite database file with one worker per cycle; the store is "
                  << display_name(spec) << (c.workers != 1 ? " with --workers " + std::to_string(c.workers) : "") << '\n';
        return exit_usage;
    }
    if (c.delete_file && std::filesystem::exists(spec.path)) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        std::cerr << "--delete-file: the drill deletes the database file; " << spec.path
                  << " exists already: name a path that does not exist yet, or leave --store out\n";
        return exit_usage;
    }
    if (!c.failover_command.empty() && (spec.type != store_spec::kind::postgres || c.cycles == 0)) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        std::cerr << "--failover-command: the failover is one of a PostgreSQL store (a multi-host postgresql:// URI "
                     "with target_session_attrs=read-write) in a drill of at least one cycle; the store is "
                  << display_name(spec) << " with --cycles " << c.cycles << '\n';
        return exit_usage;
    }
    const std::string ledger_path = dir + "/ledger", acks_path = dir + "/acks";
    // --failover-command: the cycle it runs in (the middle one), and what it did.
    const unsigned failover_cycle = c.failover_command.empty() ? 0 : (c.cycles + 1) / 2;
    struct failover_run {
        bool ran = false;
        int status = 0;
        double seconds = 0;
        std::uint64_t workers = 0;       ///< workers running while it ran
        std::uint64_t acked_before = 0;  ///< acknowledgements written before it started (the new primary must hold them)
        std::string primary_before, primary_after;  ///< "host:port" the store's URI reached
    } fo;

    std::mt19937_64 rng(c.seed);
    std::random_device rd;
    char run_id[16];
    std::snprintf(run_id, sizeof run_id, "%08x", static_cast<unsigned>(rd()));
    const std::string prefix = std::string("DR") + run_id + "-";
    const std::string exe = self_exe();
    const bool tty = !c.json && ::isatty(STDERR_FILENO) == 1;
    if (!c.json)
        std::cerr << "idem drill: " << c.cycles << " crash cycles against " << display_name(spec) << ", seed " << c.seed
                  << ", drill directory " << dir << '\n';

    std::vector<std::string> issued;  // keys in issue order
    std::unordered_map<std::string, key_info> info;
    std::unordered_set<std::string> acked;
    std::uint64_t next_serial = 1;
    std::uniform_int_distribution<std::uint64_t> amount_dist(0, 99'999);
    std::uniform_real_distribution<double> delay_dist(c.kill_min_ms, c.kill_max_ms);
    std::bernoulli_distribution from_start(0.25);
    std::vector<double> recovery_ms;
    std::vector<std::string> failures;
    std::uint64_t kills = 0, kills_before_ready = 0, clean_exits = 0, requests_sent = 0;
    bool final_ran = false;  // the last worker ran every retry to completion
    // --second-writer: second workers started, refused, opened beside the first, or ran after it ended.
    std::uint64_t second_started = 0, second_refused = 0, second_not_refused = 0, second_alone = 0;
    std::optional<std::string> first_refusal;
    // A second writer that was not refused fails the drill, but the cycles and the final run go on,
    // so the checks show what it did (merged into failures before the checks).
    std::vector<std::string> second_failures;

    auto refresh_acks = [&] {
        for (const drill::entry& e : drill::read_lines(acks_path).entries)
            if (e.tag == 'A') acked.insert(e.key);
    };

    auto make_requests = [&](unsigned fresh) {
        std::vector<drill::request> reqs;
        for (unsigned i = 0; i < fresh; ++i) {
            const std::string k = prefix + std::to_string(next_serial++) + "_PAY_v1";
            info[k].amount = amount_dist(rng);
            issued.push_back(k);
            reqs.push_back({k, info[k].amount});
            if (rng() % 20 == 0) reqs.push_back({k, info[k].amount});  // a racing duplicate
        }
        std::vector<std::string> done;
        for (const std::string& k : issued) {
            if (!acked.contains(k)) {
                reqs.push_back({k, info[k].amount});  // the client retries what was never acknowledged
            } else {
                done.push_back(k);
            }
        }
        const std::size_t late = std::min<std::size_t>(done.size(), std::max(1u, c.keys / 10));
        for (std::size_t i = 0; i < late; ++i) {
            const std::string& k = done[rng() % done.size()];
            reqs.push_back({k, info[k].amount});  // a late duplicate of an acknowledged request
        }
        std::shuffle(reqs.begin(), reqs.end(), rng);
        return reqs;
    };

    // New keys only. issue: the later cycles and the final run retry them until acknowledged (the
    // --delete-file run's keys are not issued: the checks of the store have run by then).
    auto fresh_requests = [&](unsigned n, bool issue) {
        std::vector<drill::request> reqs;
        for (unsigned i = 0; i < n; ++i) {
            const std::string k = prefix + std::to_string(next_serial++) + "_PAY_v1";
            info[k].amount = amount_dist(rng);
            if (issue) issued.push_back(k);
            reqs.push_back({k, info[k].amount});
        }
        return reqs;
    };

    auto worker_args = [&](const std::string& req_path, unsigned index) {
        std::vector<std::string> a{"drill-worker",
                                   "--store",
                                   store_uri,
                                   "--ledger",
                                   ledger_path,
                                   "--acks",
                                   acks_path,
                                   "--requests",
                                   req_path,
                                   "--prefix",
                                   prefix,
                                   "--threads",
                                   std::to_string(c.threads),
                                   "--lease-ms",
                                   std::to_string(c.lease_ms)};
        if (c.workers > 1) {  // N processes share the store: global scope
            a.insert(a.end(), {"--scope", "global", "--worker-index", std::to_string(index)});
        }
        return a;
    };

    auto absorb = [&](worker_process& w, cycle_result& r, std::chrono::milliseconds timeout) {
        for (const std::string& line : w.read_lines(timeout)) {
            if (auto why = after_word(line, "refused")) {
                r.refused = std::move(why);
                continue;
            }
            if (auto why = after_word(line, "error")) {
                r.error = std::move(why);
                continue;
            }
            drill::report_line rl = drill::parse_report(line);
            if (rl.word == "claim_ok" || rl.word == "ack_ok") {
                (rl.word == "claim_ok" ? r.claim_ok : r.ack_ok).push_back(rl.get("t"));
                continue;
            }
            if (rl.word == "ready") {
                r.ready = true;
                recovery_ms.push_back(static_cast<double>(rl.get("recovery_ns")) / 1e6);
                if (rl.get("pending") != 0)
                    failures.push_back("a worker found " + std::to_string(rl.get("pending")) +
                                       " claim(s) of the drill still PROCESSING 10 s after recovery");
                r.ready_line = rl;
            } else if (rl.word == "done") {
                r.done_line = rl;
            }
        }
    };

    std::atomic<std::uint64_t> cycles_done{0};  // sampled by the progress bar's thread
    progress_bar bar(
        !c.json, c.cycles, [&] { return cycles_done.load(std::memory_order_relaxed); }, "cycles");
    bar.start();
    for (unsigned cycle = 1; cycle <= c.cycles && failures.empty(); ++cycle) {
        const std::vector<drill::request> reqs = make_requests(c.keys);
        requests_sent += reqs.size() * c.workers;  // every worker sends the whole list (they race)
        const std::string req_path = dir + "/requests-" + std::to_string(cycle);
        drill::write_requests(req_path, reqs);

        // Each worker has its own kill moment: from its "ready" line, or (one in four) from its start.
        // --second-writer: once the worker is ready, a second one starts on the same file, and the
        // first is not killed before the second has been refused or has reported ready.
        struct running {
            std::unique_ptr<worker_process> w;
            cycle_result r;
            clock_type::duration delay{};
            std::optional<clock_type::time_point> kill_at;
            bool over = false;
            std::unique_ptr<worker_process> second;
            cycle_result sr;
            bool second_resolved = false;  // refused, ready, or ended
            bool overlapped = false;       // the second reported ready while the first still ran
        };
        auto resolve_second = [&](running& x, std::chrono::milliseconds timeout) {
            if (!x.second || x.second_resolved) return;
            absorb(*x.second, x.sr, timeout);
            if (x.sr.refused || x.sr.ready) {
                x.second_resolved = true;
                x.overlapped = x.sr.ready && !x.w->exited();
                // Not refused: let both writers run side by side for a kill delay before the kill,
                // so the checks show what two writers on one file cost.
                if (x.overlapped) x.kill_at = std::max(x.kill_at.value_or(clock_type::now()), clock_type::now() + x.delay);
            } else if (x.second->exited()) {
                for (int i = 0; i < 50 && !x.second->eof(); ++i) absorb(*x.second, x.sr, std::chrono::milliseconds(10));
                x.second_resolved = true;
            }
        };
        std::vector<running> ws(c.workers);
        for (unsigned i = 0; i < c.workers; ++i) {
            running& x = ws[i];
            const bool kill_from_start = from_start(rng);
            x.delay = std::chrono::duration_cast<clock_type::duration>(
                std::chrono::duration<double, std::milli>(delay_dist(rng)));
            std::vector<std::string> args = worker_args(req_path, i);
            if (!c.second_writer.empty()) args.push_back("--hold");  // holds the file until killed
            x.w = std::make_unique<worker_process>(exe, args);
            if (kill_from_start) x.kill_at = x.w->started() + x.delay;
        }
        // --failover-command, in its cycle: started once every worker is ready; no worker is killed
        // until it has finished (they live through the failover), then each at its delay from there.
        std::unique_ptr<worker_process> failover;
        clock_type::time_point failover_started{};
        const bool failover_here = cycle == failover_cycle;
        bool failover_pending = failover_here;
        const auto hang_deadline = clock_type::now() + std::chrono::seconds(failover_here ? 300 : 120);
        for (;;) {
            bool all_over = true;
            clock_type::time_point next = clock_type::now() + std::chrono::milliseconds(20);
            if (failover_here && !failover &&
                std::all_of(ws.begin(), ws.end(), [](const running& x) { return x.r.ready; })) {
                fo.primary_before = primary_of(store_uri);
                failover_started = clock_type::now();
                failover = std::make_unique<worker_process>("/bin/sh", std::vector<std::string>{"-c", c.failover_command});
                fo.workers = ws.size();
                fo.acked_before = drill::read_lines(acks_path).entries.size();
            }
            if (failover && failover_pending) {
                (void)failover->read_lines(std::chrono::milliseconds(0));  // its output, drained
                if (failover->exited()) {
                    failover->wait();
                    failover_pending = false;
                    fo.ran = true;
                    fo.status = failover->status();
                    fo.seconds = std::chrono::duration<double>(clock_type::now() - failover_started).count();
                    fo.primary_after = primary_of(store_uri);
                    for (running& x : ws) x.kill_at = clock_type::now() + x.delay;
                } else if (clock_type::now() > hang_deadline) {
                    failover->kill_now();
                    failover_pending = false;
                    failures.push_back("cycle " + std::to_string(cycle) + ": the failover command did not end within 300 s");
                }
            }
            for (running& x : ws) {
                if (x.over) continue;
                const auto now = clock_type::now();
                if (now > hang_deadline) {
                    x.w->kill_now();
                    if (x.second) x.second->kill_now();
                    failures.push_back("cycle " + std::to_string(cycle) + ": a worker made no progress for 120 s");
                    x.over = true;
                    continue;
                }
                const bool was_ready = x.r.ready;
                absorb(*x.w, x.r, std::chrono::milliseconds(0));
                if (!was_ready && x.r.ready && !x.kill_at) x.kill_at = clock_type::now() + x.delay;
                resolve_second(x, std::chrono::milliseconds(0));
                if (!c.second_writer.empty() && x.r.ready && !x.second && !x.w->exited()) {
                    std::string path2 = req_path;
                    if (c.second_writer == "disjoint") {  // keys of its own: none of the first's
                        const std::vector<drill::request> own = fresh_requests(c.keys, true);
                        path2 = dir + "/requests-" + std::to_string(cycle) + "-second";
                        drill::write_requests(path2, own);
                        requests_sent += own.size();
                    } else {
                        requests_sent += reqs.size();
                    }
                    x.second = std::make_unique<worker_process>(exe, worker_args(path2, 0), /*quiet=*/true);
                    ++second_started;
                }
                const bool second_pending = x.second && !x.second_resolved;
                const bool finished = x.r.done_line.has_value();  // --hold: done, still holding the file
                if (((x.kill_at && now >= *x.kill_at) || finished) && !second_pending && !failover_pending) {
                    x.r.killed_before_ready = !x.r.ready;
                    x.w->kill_now();
                    x.r.killed = true;
                    if (x.second) x.second->kill_now();  // not refused: it dies with the first
                    x.over = true;
                    continue;
                }
                if (x.w->exited()) {  // finished every request before the kill
                    x.over = true;
                    continue;
                }
                all_over = false;
                if (x.kill_at && !second_pending && !failover_pending) next = std::min(next, *x.kill_at);
            }
            if (all_over && !failover_pending) break;  // a failover still running is waited for (bounded above)
            std::this_thread::sleep_until(std::min(next, clock_type::now() + std::chrono::milliseconds(20)));
        }
        for (running& x : ws) {
            worker_process& w = *x.w;
            cycle_result& r = x.r;
            w.wait();
            for (int i = 0; i < 50 && !w.eof(); ++i) absorb(w, r, std::chrono::milliseconds(10));
            if (r.killed && WIFSIGNALED(w.status()) && WTERMSIG(w.status()) == SIGKILL && r.done_line) {
                ++clean_exits;  // --hold: it finished its list, then held the file until killed
            } else if (r.killed && WIFSIGNALED(w.status()) && WTERMSIG(w.status()) == SIGKILL) {
                ++kills;
                kills_before_ready += r.killed_before_ready;
            } else if (WIFEXITED(w.status()) && WEXITSTATUS(w.status()) == 0) {
                ++clean_exits;  // it finished before the kill fell
            } else {
                failures.push_back("cycle " + std::to_string(cycle) + ": the worker " + describe_status(w.status()) +
                                   refusal_note(r));
            }
            if (!x.second) continue;
            // The first finished before the second had an answer: wait for it (bounded), then stop it.
            const auto give_up = clock_type::now() + std::chrono::seconds(30);
            while (!x.second_resolved && clock_type::now() < give_up) resolve_second(x, std::chrono::milliseconds(20));
            x.second->kill_now();
            x.second->wait();
            for (int i = 0; i < 50 && !x.second->eof(); ++i) absorb(*x.second, x.sr, std::chrono::milliseconds(10));
            const std::string where = "cycle " + std::to_string(cycle) + ": ";
            if (x.sr.refused) {
                ++second_refused;
                if (!first_refusal) first_refusal = *x.sr.refused;
                if (x.sr.refused->find(spec.path) == std::string::npos)
                    failures.push_back(where +
                                       "the second writer was refused, but the message does not name the "
                                       "database file " +
                                       spec.path + ": " + *x.sr.refused);
            } else if (x.overlapped) {
                ++second_not_refused;
                second_failures.push_back(where + "a second writer opened " + spec.path +
                                          " while the first worker held it: it was not refused");
            } else if (x.sr.ready) {
                ++second_alone;  // the first had ended: one writer at a time, nothing to refuse
            } else {
                failures.push_back(where + "the second writer " + describe_status(x.second->status()) +
                                   " without reporting a refusal or ready");
            }
        }
        refresh_acks();
        cycles_done.store(cycle, std::memory_order_relaxed);  // relaxed: a progress estimate
    }

    // The final run: no kill; it resolves what the last crash left and completes every retry
    // (with --workers N, N workers race on the retries).
    if (failures.empty()) {
        const std::vector<drill::request> reqs = make_requests(0);
        requests_sent += reqs.size() * c.workers;
        const std::string req_path = dir + "/requests-final";
        drill::write_requests(req_path, reqs);
        std::vector<std::unique_ptr<worker_process>> ws;
        std::vector<cycle_result> rs(c.workers);
        for (unsigned i = 0; i < c.workers; ++i)
            ws.push_back(std::make_unique<worker_process>(exe, worker_args(req_path, i)));
        const auto deadline = clock_type::now() + std::chrono::seconds(300);
        for (;;) {
            bool all = true;
            for (unsigned i = 0; i < c.workers; ++i) {
                if (ws[i]->exited()) continue;
                all = false;
                absorb(*ws[i], rs[i], std::chrono::milliseconds(c.workers == 1 ? 50 : 5));
            }
            if (all || clock_type::now() >= deadline) break;
        }
        final_ran = true;
        for (unsigned i = 0; i < c.workers; ++i) {
            worker_process& w = *ws[i];
            cycle_result& r = rs[i];
            if (!w.exited()) {
                w.kill_now();
                failures.push_back("the final worker did not finish within 300 s");
            }
            w.wait();
            for (int k = 0; k < 50 && !w.eof(); ++k) absorb(w, r, std::chrono::milliseconds(10));
            if (!WIFEXITED(w.status()) || WEXITSTATUS(w.status()) != 0)
                failures.push_back("the final worker " + describe_status(w.status()) + refusal_note(r));
            else if (!r.done_line) failures.push_back("the final worker exited without its report");
            final_ran = final_ran && WIFEXITED(w.status()) && WEXITSTATUS(w.status()) == 0 && r.done_line.has_value();
        }
        refresh_acks();
    }
    bar.stop();
    // The checks the drill ran and how many of them failed (one check may list several failures):
    // the workers' runs (each started, was killed or finished, none hung, the final run completed),
    // the second writer's refusal, the --delete-file run, and the seven checks of the files and store.
    std::uint64_t checks = 0, failed_checks = 0;
    auto count_check = [&](bool failed) {
        ++checks;
        failed_checks += failed;
    };
    count_check(!failures.empty());
    if (!c.second_writer.empty()) count_check(!second_failures.empty());
    failures.insert(failures.end(), second_failures.begin(), second_failures.end());

    // ---- Checks: the ledger, the acknowledgements and the store, read independently ----
    if (tty) std::cerr << "idem drill: checking the ledger, the acknowledgements and the store\n";
    const drill::line_file ledger = drill::read_lines(ledger_path);
    const drill::line_file ack_file = drill::read_lines(acks_path);
    std::unordered_map<std::string, std::uint64_t> effect_count, effect_outcome;
    for (const drill::entry& e : ledger.entries) {
        if (e.tag != 'E') continue;
        if (effect_count[e.key]++ == 0) effect_outcome[e.key] = e.outcome;
    }
    std::uint64_t double_executions = 0;
    std::vector<std::string> problems;
    for (const auto& [k, n] : effect_count)
        if (n > 1) {
            ++double_executions;
            if (problems.size() < 10)
                problems.push_back("double execution: key '" + k + "' has " + std::to_string(n) + " effects in the ledger");
        }

    std::unique_ptr<idem::store> st = open_store(spec, idem::durability::sync, open_mode::existing);
    std::uint64_t lost_acknowledged = 0, acknowledged = 0;
    std::unordered_set<std::string> ack_keys;
    for (const drill::entry& e : ack_file.entries) {
        if (e.tag != 'A' || !ack_keys.insert(e.key).second) continue;
        ++acknowledged;
        const std::optional<idem::stored_record> rec = st->get(e.key);
        if (!rec || rec->state != idem::record_state::succeeded || rec->outcome != e.outcome) {
            ++lost_acknowledged;
            if (problems.size() < 10)
                problems.push_back(
                    "lost acknowledgement: key '" + e.key + "' was acknowledged with outcome " + std::to_string(e.outcome) +
                    " but the store has " +
                    (rec ? std::string(idem::to_string(rec->state)) + " outcome " + std::to_string(rec->outcome)
                         : std::string("no record")));
        }
    }
    // Every issued key: SUCCESS with the outcome of its one effect; no SUCCESS without an effect.
    std::unordered_map<std::string, idem::stored_record> records;
    st->load([&](const idem::stored_record& r) {
        if (r.key.starts_with(prefix)) records.emplace(r.key, r);
    });
    std::uint64_t unresolved = 0, phantom = 0, outcome_mismatches = 0;
    for (const std::string& k : issued) {
        const auto rec = records.find(k);
        const auto eff = effect_outcome.find(k);
        const bool success = rec != records.end() && rec->second.state == idem::record_state::succeeded;
        if (!success) {
            if (!final_ran) continue;  // the drill stopped early: keys may rightly be unfinished
            ++unresolved;
            if (problems.size() < 10)
                problems.push_back("unresolved: key '" + k + "' is " +
                                   (rec == records.end() ? std::string("absent") : idem::to_string(rec->second.state)) +
                                   " in the store after the final run" +
                                   (eff != effect_outcome.end() ? " (its effect ran)" : ""));
        } else if (eff == effect_outcome.end()) {
            ++phantom;
            if (problems.size() < 10) problems.push_back("phantom success: key '" + k + "' is SUCCESS but never executed");
        } else if (rec->second.outcome != eff->second) {
            ++outcome_mismatches;
            if (problems.size() < 10)
                problems.push_back("key '" + k + "': the store says outcome " + std::to_string(rec->second.outcome) +
                                   ", the effect produced " + std::to_string(eff->second));
        }
    }
    // Claims resolved by compensation, read from the audit trail.
    std::uint64_t resolved_succeeded = 0, resolved_not_executed = 0, resolved_other = 0, doubt_marks = 0;
    st->scan_audit([&](const idem::audit_entry& a) {
        if (!a.key.starts_with(prefix)) return;
        if (a.detail.starts_with("compensate")) {
            if (a.to == idem::record_state::succeeded) ++resolved_succeeded;
            else if (a.to == idem::record_state::released) ++resolved_not_executed;
            else ++resolved_other;
        } else if (a.detail.starts_with("doubt")) {
            ++doubt_marks;
        }
    });
    const std::uint64_t in_doubt_resolved = resolved_succeeded + resolved_not_executed + resolved_other;
    const idem::verify_report vr = idem::verify(*st);
    st.reset();

    // ---- --delete-file: the database file deleted under a running worker ----
    struct deletion_result {
        bool ran = false, deleted = false;
        std::uint64_t trigger = 0;                       // deleted after this many acknowledgements
        std::uint64_t claims = 0, acks = 0;              // confirmed in the deletion run
        std::uint64_t claims_after = 0, acks_after = 0;  // of those, calls made after the unlink
        std::string worker_error;                        // the store's error as the worker saw it
        std::string worker_status;
        std::vector<std::string> left_at_path;  // what is at PATH, PATH-wal, PATH-shm, PATH.lock afterwards
        std::string restart;                    // what a restart on the path found
        std::uint64_t acked_without_record = 0, acked_total = 0;
    } del;
    const std::size_t failures_before_delete = failures.size();
    if (c.delete_file && failures.empty()) {
        del.ran = true;
        if (tty) std::cerr << "idem drill: deleting " << spec.path << " under a running worker\n";
        const std::vector<drill::request> reqs = fresh_requests(c.keys, false);
        const std::string req_path = dir + "/requests-delete";
        drill::write_requests(req_path, reqs);
        requests_sent += reqs.size();
        del.trigger = 1 + rng() % std::max<std::uint64_t>(1, c.keys / 2);
        std::vector<std::string> args = worker_args(req_path, 0);
        args.insert(args.end(), {"--stop-on-unavailable", "--sync-timeout-ms", "2000"});
        worker_process w(exe, args, /*quiet=*/true);  // its store error is reported below
        cycle_result r;
        std::int64_t unlinked_ns = 0;
        const auto deadline = clock_type::now() + std::chrono::seconds(120);
        while (!w.exited() && clock_type::now() < deadline) {
            absorb(w, r, std::chrono::milliseconds(20));  // wakes on the worker's next line
            if (!del.deleted && r.ack_ok.size() >= del.trigger) {
                if (::unlink(spec.path.c_str()) != 0)
                    throw idem::error(idem::errc::store_error, "cannot delete " + spec.path + ": " + std::strerror(errno));
                unlinked_ns = steady_ns();  // after unlink() returned: the path no longer names the file
                del.deleted = true;
            }
        }
        if (!w.exited()) {
            w.kill_now();
            failures.push_back("--delete-file: the worker did not end within 120 s of its start");
        }
        w.wait();
        for (int i = 0; i < 50 && !w.eof(); ++i) absorb(w, r, std::chrono::milliseconds(10));
        del.worker_status = describe_status(w.status());
        del.worker_error = r.error.value_or(r.refused.value_or(""));
        del.claims = r.claim_ok.size();
        del.acks = r.ack_ok.size();
        for (const std::int64_t t : r.claim_ok) del.claims_after += t > unlinked_ns;
        for (const std::int64_t t : r.ack_ok) del.acks_after += t > unlinked_ns;
        if (!del.deleted) {
            failures.push_back("--delete-file: the worker confirmed " + grouped(del.acks) + " acknowledgement(s), " +
                               "fewer than the " + grouped(del.trigger) + " after which the file was to be deleted" +
                               (r.refused ? " (the store refused to open: " + *r.refused + ")" : std::string()));
        } else {
            if (del.claims_after || del.acks_after)
                failures.push_back("--delete-file: the store confirmed " + grouped(del.claims_after) + " claim(s) and " +
                                   grouped(del.acks_after) + " acknowledgement(s) asked for after " + spec.path +
                                   " was deleted: they went to a file no restart finds");
            if (del.worker_error.empty())
                failures.push_back("--delete-file: the worker reported no store error after " + spec.path +
                                   " was deleted (" + del.worker_status + ")");
            else if (del.worker_error.find(spec.path) == std::string::npos)
                failures.push_back("--delete-file: the store's error does not name " + spec.path + ": " + del.worker_error);
        }
        for (const char* suffix : {"", "-wal", "-shm", ".lock"}) {
            std::error_code ec;
            if (std::filesystem::exists(spec.path + suffix, ec)) del.left_at_path.push_back(spec.path + suffix);
        }
        // A restart on the path, as a worker would do it (it creates the file when it is missing).
        try {
            std::unique_ptr<idem::store> again = open_store(spec, idem::durability::sync, open_mode::create);
            std::unordered_set<std::string> present;
            std::uint64_t n = 0;
            again->load([&](const idem::stored_record& rec) {
                ++n;
                if (rec.key.starts_with(prefix) && rec.state == idem::record_state::succeeded) present.insert(rec.key);
            });
            std::unordered_set<std::string> acked_keys;
            for (const drill::entry& e : drill::read_lines(acks_path).entries)
                if (e.tag == 'A') acked_keys.insert(e.key);
            del.acked_total = acked_keys.size();
            for (const std::string& k : acked_keys) del.acked_without_record += !present.contains(k);
            del.restart = "opened with " + grouped(n) + " record(s); " + grouped(del.acked_without_record) + " of " +
                          grouped(del.acked_total) + " acknowledged key(s) have no SUCCESS record there";
        } catch (const idem::error& e) {
            del.restart = std::string("refused: ") + e.what();
        }
        // The ledger as it is now: a double execution in the deletion run counts too.
        std::unordered_map<std::string, std::uint64_t> now_count;
        for (const drill::entry& e : drill::read_lines(ledger_path).entries)
            if (e.tag == 'E') ++now_count[e.key];
        double_executions = 0;
        for (const auto& [k, n] : now_count)
            if (n > 1) {
                ++double_executions;
                if (effect_count[k] < 2 && problems.size() < 10)  // not listed above
                    problems.push_back("double execution: key '" + k + "' has " + std::to_string(n) +
                                       " effects in the ledger");
            }
    }

    if (del.ran) count_check(failures.size() > failures_before_delete);
    auto check = [&](bool failed, const std::string& what) {
        count_check(failed);
        if (failed) failures.push_back(what);
    };
    if (!c.failover_command.empty()) {
        check(!fo.ran || !WIFEXITED(fo.status) || WEXITSTATUS(fo.status) != 0,
              fo.ran ? "the failover command " + describe_status(fo.status) + ": the failover may not have happened"
                     : "the failover command did not complete in cycle " + std::to_string(failover_cycle));
        // A command that exits 0 without failing over would make this a crash drill: the server the
        // store's URI reaches must be another one afterwards.
        if (fo.ran && WIFEXITED(fo.status) && WEXITSTATUS(fo.status) == 0)
            check(fo.primary_before.empty() || fo.primary_before == fo.primary_after,
                  "the failover command exited 0, but the store's URI reached " +
                      (fo.primary_before.empty() ? std::string("no server") : fo.primary_before) + " before it and " +
                      (fo.primary_after.empty() ? std::string("no server") : fo.primary_after) + " after it: no failover");
    }
    check(double_executions != 0, grouped(double_executions) + " key(s) executed more than once");
    check(lost_acknowledged != 0, grouped(lost_acknowledged) + " acknowledged key(s) not SUCCESS in the store");
    check(unresolved != 0, grouped(unresolved) + " key(s) not SUCCESS after the final run");
    check(phantom != 0, grouped(phantom) + " key(s) SUCCESS without an effect in the ledger");
    check(outcome_mismatches != 0, grouped(outcome_mismatches) + " key(s) whose stored outcome differs from the effect's");
    check(ledger.torn || ledger.malformed || ack_file.torn || ack_file.malformed,
          "torn or malformed lines: ledger " + std::to_string(ledger.torn) + " torn bytes, " +
              std::to_string(ledger.malformed) + " malformed; acks " + std::to_string(ack_file.torn) + " torn bytes, " +
              std::to_string(ack_file.malformed) + " malformed");
    check(!vr.violations.empty(), "idem::verify found " + grouped(vr.violations.size()) + " violation(s)");
    for (std::size_t i = 0; i < vr.violations.size() && problems.size() < 20; ++i)
        problems.push_back("violation: " + vr.violations[i]);
    const bool ok = failures.empty();

    std::vector<double> rec_sorted = recovery_ms;
    const double rec_p50 = percentile(rec_sorted, 0.5);
    const double rec_max = rec_sorted.empty() ? 0.0 : rec_sorted.back();
    const double elapsed_s = std::chrono::duration<double>(clock_type::now() - started).count();

    if (c.json) {
        std::vector<std::string> first_violations;
        for (std::size_t i = 0; i < vr.violations.size() && i < 10; ++i) first_violations.push_back(vr.violations[i]);
        json j = json::object();
        j["command"] = "drill";
        j["ok"] = ok;
        j["store"] = display_name(spec);
        j["seed"] = c.seed;
        j["run_id"] = std::string(run_id);
        j["cycles"] = std::uint64_t{c.cycles};
        j["workers"] = std::uint64_t{c.workers};
        j["kills"] = kills;
        j["kills_before_ready"] = kills_before_ready;
        j["clean_exits"] = clean_exits;
        j["keys_issued"] = std::uint64_t{issued.size()};
        j["requests_sent"] = requests_sent;
        j["effects"] = std::uint64_t{ledger.entries.size()};
        j["acknowledged"] = acknowledged;
        j["double_executions"] = double_executions;
        j["lost_acknowledged"] = lost_acknowledged;
        j["unresolved"] = unresolved;
        j["phantom_successes"] = phantom;
        j["outcome_mismatches"] = outcome_mismatches;
        j["in_doubt_resolved"] = in_doubt_resolved;
        j["resolved_succeeded"] = resolved_succeeded;
        j["resolved_not_executed"] = resolved_not_executed;
        j["doubt_marks"] = doubt_marks;
        j["recovery_ms_p50"] = rec_p50;
        j["recovery_ms_max"] = rec_max;
        j["recoveries"] = std::uint64_t{recovery_ms.size()};
        j["violations"] = std::uint64_t{vr.violations.size()};
        j["violation_list"] = first_violations;
        j["verify_keys"] = vr.keys;
        j["verify_transitions"] = vr.transitions;
        j["elapsed_s"] = elapsed_s;
        j["checks"] = checks;
        j["failed_checks"] = failed_checks;
        j["failures"] = failures;
        if (!c.second_writer.empty()) {
            json sw = json::object();
            sw["mode"] = c.second_writer;
            sw["started"] = second_started;
            sw["refused"] = second_refused;
            sw["not_refused"] = second_not_refused;
            sw["ran_alone"] = second_alone;
            sw["refusal"] = first_refusal.value_or("");
            j["second_writer"] = sw;
        }
        if (del.ran) {
            json dj = json::object();
            dj["deleted"] = del.deleted;
            dj["path"] = spec.path;
            dj["deleted_after_acks"] = del.trigger;
            dj["claims_confirmed"] = del.claims;
            dj["acks_confirmed"] = del.acks;
            dj["claims_after_delete"] = del.claims_after;
            dj["acks_after_delete"] = del.acks_after;
            dj["worker_error"] = del.worker_error;
            dj["worker_status"] = del.worker_status;
            dj["left_at_path"] = del.left_at_path;
            dj["restart"] = del.restart;
            dj["acked_total"] = del.acked_total;
            dj["acked_without_record"] = del.acked_without_record;
            j["delete_file"] = dj;
        }
        if (!c.failover_command.empty()) {
            json fj = json::object();
            fj["cycle"] = std::uint64_t{failover_cycle};
            fj["ran"] = fo.ran;
            fj["exit"] = fo.ran && WIFEXITED(fo.status) ? WEXITSTATUS(fo.status) : -1;
            fj["seconds"] = fo.seconds;
            fj["workers"] = fo.workers;
            fj["acknowledged_before"] = fo.acked_before;
            fj["primary_before"] = fo.primary_before;
            fj["primary_after"] = fo.primary_after;
            j["failover"] = fj;
        }
        if (!ok || c.keep) j["drill_dir"] = dir;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem drill: " << c.cycles << " crash cycles"
                  << (c.workers > 1 ? ", " + std::to_string(c.workers) + " racing workers per cycle (global scope)" : "")
                  << ", store " << display_name(spec) << ", seed " << c.seed << ", run id " << run_id << "\n\n";
        table t;
        t.row("worker kills", grouped(kills),
              "(SIGKILL; " + grouped(kills_before_ready) + " during recovery or compensation; " + grouped(clean_exits) +
                  " cycles finished before the kill)");
        t.row("keys issued", grouped(issued.size()),
              "(" + grouped(requests_sent) + " requests with retries and duplicates)");
        t.row("effects in the ledger", grouped(ledger.entries.size()));
        t.row("acknowledged", grouped(acknowledged), "(success committed in sync mode, then written to the ack file)");
        t.row("double executions", grouped(double_executions), "(keys with two effects in the ledger)");
        t.row("lost acknowledged", grouped(lost_acknowledged), "(acknowledged but not SUCCESS in the store)");
        t.row("unresolved", grouped(unresolved), "(keys not SUCCESS after the final run)");
        t.row("in doubt resolved", grouped(in_doubt_resolved),
              "(compensated from the ledger: " + grouped(resolved_succeeded) + " had run, " +
                  grouped(resolved_not_executed) + " had not)");
        t.row("recovery", fixed(rec_p50, 2) + " ms p50",
              "(max " + fixed(rec_max, 2) + " ms over " + grouped(recovery_ms.size()) + " worker starts)");
        t.row("verify", grouped(vr.violations.size()) + " violations",
              "(" + grouped(vr.keys) + " keys, " + grouped(vr.transitions) + " audit rows)");
        if (!c.second_writer.empty())
            t.row("second writer", grouped(second_refused) + " refused",
                  "(" + c.second_writer + " keys; " + grouped(second_started) + " started while the worker held the file, " +
                      grouped(second_not_refused) + " not refused, " + grouped(second_alone) +
                      " ran after the worker had ended)");
        if (del.ran) {
            t.row("file deleted", del.deleted ? "after " + grouped(del.trigger) + " acks" : std::string("no"),
                  "(unlink of the database file under a running worker)");
            t.row("confirmed after it", grouped(del.claims_after + del.acks_after),
                  "(claims and acks asked for after the unlink that the store confirmed: " + grouped(del.claims_after) +
                      " claims, " + grouped(del.acks_after) + " acks)");
        }
        if (!c.failover_command.empty())
            t.row("failover", fo.ran ? fixed(fo.seconds, 1) + " s" : std::string("did not run"),
                  "(the command, in cycle " + std::to_string(failover_cycle) + " while " + grouped(fo.workers) +
                      " worker(s) ran, after " + grouped(fo.acked_before) + " acknowledgements; primary " +
                      fo.primary_before + " -> " + fo.primary_after + "; " +
                      (fo.ran ? describe_status(fo.status) : std::string("-")) + ")");
        t.row("elapsed", fixed(elapsed_s, 1) + " s");
        t.print(std::cout);
        if (first_refusal) std::cout << "\nsecond writer refused: " << *first_refusal << '\n';
        if (del.ran) {
            std::cout << "\nafter the deletion the worker " << (del.worker_error.empty() ? "reported no store error" : "was refused: " + del.worker_error)
                      << "\nleft at the path: " << (del.left_at_path.empty() ? std::string("nothing") : [&] {
                             std::string l;
                             for (const std::string& p : del.left_at_path) l += (l.empty() ? "" : ", ") + p;
                             return l;
                         }())
                      << "\nrestart on the path: " << del.restart
                      << "\n(the records acknowledged before the deletion went with the file: no store can keep them)\n";
        }
        std::cout << '\n'
                  << (ok ? std::string("PASS: no double execution, no lost acknowledgement, every audit trail legal") +
                               (second_refused ? "; the second writer was refused" : "") +
                               (del.deleted ? "; nothing confirmed after the file was deleted" : "") + "."
                         : "FAIL: see below; the drill directory is kept: " + dir)
                  << '\n';
    }
    for (const std::string& f : failures) std::cerr << "idem drill: FAIL: " << f << '\n';
    for (const std::string& p : problems) std::cerr << "idem drill: " << p << '\n';
    if (!ok) std::cerr << "idem drill: replay the kill schedule with --seed " << c.seed << "; files in " << dir << '\n';
    bool metrics_written = true;
    if (!c.prometheus.empty()) {
        std::cout.flush();
        if (auto why = write_drill_metrics(c.prometheus, failed_checks, checks, elapsed_s, display_name(spec))) {
            std::cerr << "idem drill: --prometheus: " << *why << '\n';
            metrics_written = false;
        }
    }
    if (ok && !c.keep) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    if (!metrics_written && ok) return exit_runtime;
    return ok ? exit_ok : exit_violation;
}

}  // namespace

command add_drill(CLI::App& root) {
    auto c = std::make_shared<drill_config>();
    std::random_device rd;
    c->seed = (std::uint64_t{rd()} << 32) | rd();
    CLI::App* app = root.add_subcommand(
        "drill", "Crash drill: SIGKILLs a worker at random moments, recovers, and checks an independent ledger");
    app->footer(
        "Each cycle starts `idem drill-worker` on the store in sync mode, kills it with SIGKILL after a random "
        "delay, and starts the next one, which recovers and resolves the claims left in flight from the ledger. "
        "A final worker completes every retry; then the drill checks that no effect ran twice, every "
        "acknowledged key is SUCCESS in the store, and idem::verify finds no violation.\n"
        "Exit codes: 0 all checks held, 1 a check failed, 2 bad command line, 3 could not run (or, with every "
        "check held, the --prometheus file could not be written).");
    app->add_option("--cycles", c->cycles, "Crash cycles (worker start, random SIGKILL)")
        ->check(in_range(0u, 100'000u, "crash cycles"))
        ->capture_default_str();
    app->add_option("--store", c->store,
                    std::string("Store URI: ") + durable_stores + " (default: sqlite:<drill dir>/idem-drill.db)")
        ->check(store_check(/*durable_only=*/true));
    app->add_option("--seed", c->seed, "Seed of the kill schedule and the requests (default: random; printed)");
    app->add_flag("--json", c->json, "Print the summary as one JSON object on stdout");
    app->add_option("--keys", c->keys, "New keys per cycle")
        ->check(in_range(1u, 1'000'000u, "keys per cycle"))
        ->capture_default_str();
    app->add_option("--threads", c->threads, "Threads in the worker")
        ->check(in_range(1u, 256u, "worker threads"))
        ->capture_default_str();
    app->add_option("--workers", c->workers,
                    "Worker processes per cycle; more than 1 share a postgresql:// store in global scope, race on "
                    "the same keys and are each SIGKILLed at their own random moment")
        ->check(in_range(1u, 64u, "worker processes"))
        ->capture_default_str();
    app->add_option("--lease-ms", c->lease_ms, "Claim lease in the worker, in ms")
        ->check(in_range(1.0, 60'000.0, "milliseconds"))
        ->capture_default_str();
    app->add_option("--kill-min-ms", c->kill_min_ms, "Shortest delay before the SIGKILL, in ms")
        ->check(in_range(0.0, 600'000.0, "milliseconds"))
        ->capture_default_str();
    app->add_option("--kill-max-ms", c->kill_max_ms, "Longest delay before the SIGKILL, in ms")
        ->check(in_range(0.0, 600'000.0, "milliseconds"))
        ->capture_default_str();
    app->add_flag("--keep", c->keep, "Keep the drill directory (ledger, acks, request lists, default store)");
    app->add_option("--second-writer", c->second_writer,
                    "SQLite: in each cycle start a second worker on the same file once the first is ready, with the "
                    "same requests (same) or keys of its own (disjoint); it must be refused")
        ->check(CLI::IsMember({"same", "disjoint"}));
    app->add_flag("--delete-file", c->delete_file,
                  "SQLite: after the checks, delete the database file under a running worker; nothing asked for "
                  "after the deletion may be confirmed (the path must not exist before the drill)");
    app->add_option("--prometheus", c->prometheus, prometheus_option_help)->type_name("FILE");
    app->add_option("--failover-command", c->failover_command,
                    "PostgreSQL: a shell command that fails the primary over (kill it and promote the standby, or "
                    "'pg_autoctl perform failover'), run in the middle cycle once the workers are ready; they are "
                    "killed only after it ends. The store must be a multi-host URI with "
                    "target_session_attrs=read-write")
        ->type_name("CMD");
    auto* region = app->add_option("--region", c->regions.regions,
                                   "The regions drill (PostgreSQL): NAME=URI of each region's cluster on loopback, 3 or 4 "
                                   "times; the drill sets regions up in them with fault-injecting proxies between them, "
                                   "runs --cycles cycles of faults and kills, and drops what it set up")
                       ->type_name("NAME=URI");
    app->add_flag("--synchronous", c->regions.synchronous,
                  "Regions drill: synchronous replication between regions, and a region lost, taken over and rebuilt")
        ->needs(region);
    app->add_option("--rtt-ms", c->regions.rtt_ms, "Regions drill: round trip injected between regions, in ms")
        ->check(in_range(0.0, 1000.0, "milliseconds"))
        ->capture_default_str()
        ->needs(region);
    app->add_option("--home-lease-ms", c->regions.home_lease_ms, "Regions drill: the home leases' length, in ms")
        ->check(in_range(500.0, 60'000.0, "milliseconds"))
        ->capture_default_str()
        ->needs(region);
    app->add_flag("--no-guard", c->regions.no_guard,
                  "Regions drill, negative control: the workers run every request without idem; the checks must fail")
        ->needs(region)
        ->group("");  // hidden: for the tests that show the checks can fail
    return {app, [c, app] {
                if (c->regions.regions.empty()) return run_drill(*c);
#ifdef IDEM_HAVE_POSTGRES
                for (const char* alone :
                     {"--store", "--workers", "--second-writer", "--delete-file", "--lease-ms", "--failover-command"})
                    if (app->count(alone) > 0) {
                        std::cerr << alone << ": not an option of the regions drill (--region)\n";
                        return int{exit_usage};
                    }
                regions_drill_config r = c->regions;
                r.seed = c->seed;
                r.json = c->json;
                r.keep = c->keep;
                r.prometheus = c->prometheus;
                if (app->count("--cycles") > 0) r.cycles = c->cycles;
                if (app->count("--keys") > 0) r.keys = c->keys;
                if (app->count("--threads") > 0) r.threads = c->threads;
                if (app->count("--kill-min-ms") > 0) r.kill_min_ms = c->kill_min_ms;
                if (app->count("--kill-max-ms") > 0) r.kill_max_ms = c->kill_max_ms;
                return run_regions_drill(r);
#else
                std::cerr << "--region: the regions drill needs the PostgreSQL build of idem\n";
                return int{exit_usage};
#endif
            }};
}

}  // namespace idem::tool
