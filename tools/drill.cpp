// tools/drill.cpp: `idem drill`, the crash drill (the seed's "regular drills").
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
//   2. starts `idem drill-worker` (drill_worker.cpp): it recovers the store, resolves the claims the
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
// Exit codes: 0 all checks held, 1 a check failed (the drill directory is kept for inspection),
// 2 bad command line, 3 could not run (worker could not start, store could not be opened).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
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
#include "drill.hpp"
#include "idem/verify.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "store.hpp"

extern char** environ;

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
};

using clock_type = std::chrono::steady_clock;

std::string self_exe() {
    std::error_code ec;
    const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) throw idem::error(idem::errc::invalid_argument, "cannot find the idem executable (/proc/self/exe): " + ec.message());
    return p.string();
}

/// A worker process with its stdout on a pipe.
class worker_process {
public:
    worker_process(const std::string& exe, const std::vector<std::string>& args) {
        int fds[2];
        if (::pipe2(fds, O_CLOEXEC) != 0)
            throw idem::error(idem::errc::invalid_argument, std::string("pipe: ") + std::strerror(errno));
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);  // dup2 clears CLOEXEC on stdout
        std::vector<std::string> argv_s{exe};
        argv_s.insert(argv_s.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (std::string& s : argv_s) argv.push_back(s.data());
        argv.push_back(nullptr);
        const int rc = ::posix_spawn(&pid_, exe.c_str(), &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        ::close(fds[1]);
        fd_ = fds[0];
        if (rc != 0) {
            ::close(fd_);
            throw idem::error(idem::errc::invalid_argument, "cannot start '" + exe + " drill-worker': " + std::strerror(rc));
        }
        ::fcntl(fd_, F_SETFL, O_NONBLOCK);
        started_ = clock_type::now();
    }
    ~worker_process() {
        if (pid_ > 0 && !reaped_) {
            ::kill(pid_, SIGKILL);
            wait();
        }
        if (fd_ >= 0) ::close(fd_);
    }
    worker_process(const worker_process&) = delete;
    worker_process& operator=(const worker_process&) = delete;

    /// Reads what the worker wrote, waiting up to `timeout` for something; returns complete lines.
    std::vector<std::string> read_lines(std::chrono::milliseconds timeout) {
        pollfd p{fd_, POLLIN, 0};
        if (!eof_) ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, timeout.count())));
        char buf[4096];
        for (;;) {
            const ssize_t n = ::read(fd_, buf, sizeof buf);
            if (n > 0) {
                pending_.append(buf, static_cast<std::size_t>(n));
                continue;
            }
            if (n == 0) eof_ = true;
            break;  // EAGAIN: nothing more for now
        }
        std::vector<std::string> out;
        std::size_t nl;
        while ((nl = pending_.find('\n')) != std::string::npos) {
            out.push_back(pending_.substr(0, nl));
            pending_.erase(0, nl + 1);
        }
        return out;
    }

    /// True once the process has exited (reaps it).
    bool exited() {
        if (reaped_) return true;
        int status = 0;
        const pid_t r = ::waitpid(pid_, &status, WNOHANG);
        if (r == pid_) {
            reaped_ = true;
            status_ = status;
        }
        return reaped_;
    }
    void kill_now() {
        if (!reaped_) ::kill(pid_, SIGKILL);
    }
    void wait() {
        if (reaped_) return;
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        reaped_ = true;
        status_ = status;
    }
    [[nodiscard]] bool eof() const noexcept { return eof_; }
    [[nodiscard]] int status() const noexcept { return status_; }
    [[nodiscard]] clock_type::time_point started() const noexcept { return started_; }

private:
    pid_t pid_ = -1;
    int fd_ = -1;
    bool reaped_ = false;
    bool eof_ = false;
    int status_ = 0;
    std::string pending_;
    clock_type::time_point started_;
};

std::string describe_status(int status) {
    if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("killed by signal ") + ::strsignal(WTERMSIG(status));
    return "ended with status " + std::to_string(status);
}

struct key_info {
    std::uint64_t amount = 0;
};

struct cycle_result {
    bool killed = false;
    bool killed_before_ready = false;
    bool ready = false;
    std::optional<drill::report_line> ready_line, done_line;
    int status = 0;
};

int run_drill(const drill_config& c) {
    const auto started = clock_type::now();
    if (c.kill_min_ms > c.kill_max_ms) {
        std::cerr << "--kill-min-ms: " << c.kill_min_ms << " is above --kill-max-ms " << c.kill_max_ms << '\n';
        return exit_usage;
    }
    // The drill directory: ledger, acks, request lists (and the default store).
    std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                       "/idem-drill-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
        throw idem::error(idem::errc::store_error, "cannot create a drill directory from '" + tmpl + "': " +
                                                       std::strerror(errno));
    const std::string dir = tmpl;
    const std::string store_uri = c.store.empty() ? "sqlite:" + dir + "/idem-drill.db" : c.store;
    const store_spec spec = *parse_store(store_uri);
    if (c.workers > 1 && spec.type != store_spec::kind::postgres) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        std::cerr << "--workers: " << c.workers << " worker processes share one store through global scope, which "
                  << "needs a postgresql:// store (--store); the store is " << display_name(spec) << '\n';
        return exit_usage;
    }
    const std::string ledger_path = dir + "/ledger", acks_path = dir + "/acks";

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

    auto worker_args = [&](const std::string& req_path, unsigned index) {
        std::vector<std::string> a{"drill-worker", "--store", store_uri, "--ledger", ledger_path, "--acks", acks_path,
                                   "--requests", req_path, "--prefix", prefix, "--threads",
                                   std::to_string(c.threads), "--lease-ms", std::to_string(c.lease_ms)};
        if (c.workers > 1) {  // N processes share the store: global scope
            a.insert(a.end(), {"--scope", "global", "--worker-index", std::to_string(index)});
        }
        return a;
    };

    auto absorb = [&](worker_process& w, cycle_result& r, std::chrono::milliseconds timeout) {
        for (const std::string& line : w.read_lines(timeout)) {
            drill::report_line rl = drill::parse_report(line);
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
    progress_bar bar(!c.json, c.cycles, [&] { return cycles_done.load(std::memory_order_relaxed); }, "cycles");
    bar.start();
    for (unsigned cycle = 1; cycle <= c.cycles && failures.empty(); ++cycle) {
        const std::vector<drill::request> reqs = make_requests(c.keys);
        requests_sent += reqs.size() * c.workers;  // every worker sends the whole list (they race)
        const std::string req_path = dir + "/requests-" + std::to_string(cycle);
        drill::write_requests(req_path, reqs);

        // Each worker has its own kill moment: from its "ready" line, or (one in four) from its start.
        struct running {
            std::unique_ptr<worker_process> w;
            cycle_result r;
            clock_type::duration delay{};
            std::optional<clock_type::time_point> kill_at;
            bool over = false;
        };
        std::vector<running> ws(c.workers);
        for (unsigned i = 0; i < c.workers; ++i) {
            running& x = ws[i];
            const bool kill_from_start = from_start(rng);
            x.delay = std::chrono::duration_cast<clock_type::duration>(
                std::chrono::duration<double, std::milli>(delay_dist(rng)));
            x.w = std::make_unique<worker_process>(exe, worker_args(req_path, i));
            if (kill_from_start) x.kill_at = x.w->started() + x.delay;
        }
        const auto hang_deadline = clock_type::now() + std::chrono::seconds(120);
        for (;;) {
            bool all_over = true;
            clock_type::time_point next = clock_type::now() + std::chrono::milliseconds(20);
            for (running& x : ws) {
                if (x.over) continue;
                const auto now = clock_type::now();
                if (x.kill_at && now >= *x.kill_at) {
                    x.r.killed_before_ready = !x.r.ready;
                    x.w->kill_now();
                    x.r.killed = true;
                    x.over = true;
                    continue;
                }
                if (now > hang_deadline) {
                    x.w->kill_now();
                    failures.push_back("cycle " + std::to_string(cycle) + ": a worker made no progress for 120 s");
                    x.over = true;
                    continue;
                }
                const bool was_ready = x.r.ready;
                absorb(*x.w, x.r, std::chrono::milliseconds(0));
                if (!was_ready && x.r.ready && !x.kill_at) x.kill_at = clock_type::now() + x.delay;
                if (x.w->exited()) {  // finished every request before the kill
                    x.over = true;
                    continue;
                }
                all_over = false;
                if (x.kill_at) next = std::min(next, *x.kill_at);
            }
            if (all_over) break;
            std::this_thread::sleep_until(std::min(next, clock_type::now() + std::chrono::milliseconds(20)));
        }
        for (running& x : ws) {
            worker_process& w = *x.w;
            cycle_result& r = x.r;
            w.wait();
            for (int i = 0; i < 50 && !w.eof(); ++i) absorb(w, r, std::chrono::milliseconds(10));
            if (r.killed && WIFSIGNALED(w.status()) && WTERMSIG(w.status()) == SIGKILL) {
                ++kills;
                kills_before_ready += r.killed_before_ready;
            } else if (WIFEXITED(w.status()) && WEXITSTATUS(w.status()) == 0) {
                ++clean_exits;  // it finished before the kill fell
            } else {
                failures.push_back("cycle " + std::to_string(cycle) + ": the worker " + describe_status(w.status()));
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
        for (unsigned i = 0; i < c.workers; ++i) ws.push_back(std::make_unique<worker_process>(exe, worker_args(req_path, i)));
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
                failures.push_back("the final worker " + describe_status(w.status()));
            else if (!r.done_line)
                failures.push_back("the final worker exited without its report");
            final_ran = final_ran && WIFEXITED(w.status()) && WEXITSTATUS(w.status()) == 0 && r.done_line.has_value();
        }
        refresh_acks();
    }
    bar.stop();

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
            if (problems.size() < 10) problems.push_back("double execution: key '" + k + "' has " + std::to_string(n) + " effects in the ledger");
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
                problems.push_back("lost acknowledgement: key '" + e.key + "' was acknowledged with outcome " +
                                   std::to_string(e.outcome) + " but the store has " +
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
                                   " in the store after the final run" + (eff != effect_outcome.end() ? " (its effect ran)" : ""));
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

    if (double_executions) failures.push_back(grouped(double_executions) + " key(s) executed more than once");
    if (lost_acknowledged) failures.push_back(grouped(lost_acknowledged) + " acknowledged key(s) not SUCCESS in the store");
    if (unresolved) failures.push_back(grouped(unresolved) + " key(s) not SUCCESS after the final run");
    if (phantom) failures.push_back(grouped(phantom) + " key(s) SUCCESS without an effect in the ledger");
    if (outcome_mismatches) failures.push_back(grouped(outcome_mismatches) + " key(s) whose stored outcome differs from the effect's");
    if (ledger.torn || ledger.malformed || ack_file.torn || ack_file.malformed)
        failures.push_back("torn or malformed lines: ledger " + std::to_string(ledger.torn) + " torn bytes, " +
                           std::to_string(ledger.malformed) + " malformed; acks " + std::to_string(ack_file.torn) +
                           " torn bytes, " + std::to_string(ack_file.malformed) + " malformed");
    if (!vr.violations.empty()) failures.push_back("idem::verify found " + grouped(vr.violations.size()) + " violation(s)");
    for (std::size_t i = 0; i < vr.violations.size() && problems.size() < 20; ++i) problems.push_back("violation: " + vr.violations[i]);
    const bool ok = failures.empty();

    std::vector<double> rec_sorted = recovery_ms;
    const double rec_p50 = percentile(rec_sorted, 0.5);
    const double rec_max = rec_sorted.empty() ? 0.0 : rec_sorted.back();
    const double elapsed_s = std::chrono::duration<double>(clock_type::now() - started).count();

    if (c.json) {
        std::vector<std::string> first_violations;
        for (std::size_t i = 0; i < vr.violations.size() && i < 10; ++i) first_violations.push_back(vr.violations[i]);
        json_object j;
        j.add("command", "drill")
            .add("ok", ok)
            .add("store", display_name(spec))
            .add("seed", c.seed)
            .add("run_id", std::string(run_id))
            .add("cycles", std::uint64_t{c.cycles})
            .add("workers", std::uint64_t{c.workers})
            .add("kills", kills)
            .add("kills_before_ready", kills_before_ready)
            .add("clean_exits", clean_exits)
            .add("keys_issued", std::uint64_t{issued.size()})
            .add("requests_sent", requests_sent)
            .add("effects", std::uint64_t{ledger.entries.size()})
            .add("acknowledged", acknowledged)
            .add("double_executions", double_executions)
            .add("lost_acknowledged", lost_acknowledged)
            .add("unresolved", unresolved)
            .add("phantom_successes", phantom)
            .add("outcome_mismatches", outcome_mismatches)
            .add("in_doubt_resolved", in_doubt_resolved)
            .add("resolved_succeeded", resolved_succeeded)
            .add("resolved_not_executed", resolved_not_executed)
            .add("doubt_marks", doubt_marks)
            .add("recovery_ms_p50", rec_p50)
            .add("recovery_ms_max", rec_max)
            .add("recoveries", std::uint64_t{recovery_ms.size()})
            .add("violations", std::uint64_t{vr.violations.size()})
            .add("violation_list", first_violations)
            .add("verify_keys", vr.keys)
            .add("verify_transitions", vr.transitions)
            .add("elapsed_s", elapsed_s)
            .add("failures", failures);
        if (!ok || c.keep) j.add("drill_dir", dir);
        std::cout << j.str() << std::endl;
    } else {
        std::cout << "idem drill: " << c.cycles << " crash cycles"
                  << (c.workers > 1 ? ", " + std::to_string(c.workers) + " racing workers per cycle (global scope)" : "")
                  << ", store " << display_name(spec) << ", seed " << c.seed
                  << ", run id " << run_id << "\n\n";
        table t;
        t.row("worker kills", grouped(kills), "(SIGKILL; " + grouped(kills_before_ready) +
                                                  " during recovery or compensation; " + grouped(clean_exits) +
                                                  " cycles finished before the kill)");
        t.row("keys issued", grouped(issued.size()), "(" + grouped(requests_sent) + " requests with retries and duplicates)");
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
        t.row("elapsed", fixed(elapsed_s, 1) + " s");
        t.print(std::cout);
        std::cout << '\n'
                  << (ok ? "PASS: no double execution, no lost acknowledgement, every audit trail legal."
                         : "FAIL: see below; the drill directory is kept: " + dir)
                  << '\n';
    }
    for (const std::string& f : failures) std::cerr << "idem drill: FAIL: " << f << '\n';
    for (const std::string& p : problems) std::cerr << "idem drill: " << p << '\n';
    if (!ok) std::cerr << "idem drill: replay the kill schedule with --seed " << c.seed << "; files in " << dir << '\n';
    if (ok && !c.keep) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
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
        "Exit codes: 0 all checks held, 1 a check failed, 2 bad command line, 3 could not run.");
    app->add_option("--cycles", c->cycles, "Crash cycles (worker start, random SIGKILL)")
        ->check(in_range(0u, 100'000u, "crash cycles"))
        ->capture_default_str();
    app->add_option("--store", c->store,
                    std::string("Store URI: ") + durable_stores + " (default: sqlite:<drill dir>/idem-drill.db)")
        ->check(store_check(/*durable_only=*/true));
    app->add_option("--seed", c->seed, "Seed of the kill schedule and the requests (default: random; printed)");
    app->add_flag("--json", c->json, "Print the summary as one JSON object on stdout");
    app->add_option("--keys", c->keys, "New keys per cycle")->check(in_range(1u, 1'000'000u, "keys per cycle"))->capture_default_str();
    app->add_option("--threads", c->threads, "Threads in the worker")->check(in_range(1u, 256u, "worker threads"))->capture_default_str();
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
    return {app, [c] { return run_drill(*c); }};
}

}  // namespace idem::tool
