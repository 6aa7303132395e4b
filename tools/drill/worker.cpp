// tools/drill/worker.cpp: `idem drill-worker`, the process `idem drill` starts and kills (hidden).
//
// One run of a payment service over a durable store in SYNC mode:
//
// 1. Reads the independent ledger (effects executed by earlier incarnations of the worker) and opens
//    an idem::durable_guard: recovery loads every record. The resolver (options.resolve) answers an
//    expired claim of this drill from the ledger: effect present -> succeeded with its outcome,
//    absent -> not_executed (the key becomes claimable again). A key this process is executing
//    right now is "unknown" (still running: never release a live claim), and keys of other
//    applications in the same store are "unknown" too (not ours to decide).
// 2. Waits until the recovered claims' leases (lease_until as stored by the killed worker) have
//    passed, then calls compensate() until none of this drill's claims is left PROCESSING.
//    Reports "ready ..." on stdout (recovery time, records, claims compensated).
// 3. Sends every request of the list from --threads threads. A claim that is acquired executes the
//    effect, which is appending "E key outcome" to the ledger with fdatasync, BEFORE
//    ticket.succeed(); once succeed() returns OK (sync mode: the commit holding the success is
//    durable), appends "A key outcome" to the acks file with fdatasync. That is the acknowledgement
//    the drill later holds the store to.
// 4. Reports "done ..." and exits 0; exit 1 on an answer a sync store must never give; 3 on setup
//    failure. The drill usually SIGKILLs it somewhere in steps 1-3.
//
// When the store refuses to open (for example because another process holds the SQLite file's
// writer lock: `idem drill --second-writer`), the worker prints "refused <the store's message>" on
// stdout and exits 3, so the drill can report the refusal and hold it to naming the path.
//
// With --hold (`idem drill --second-writer`) the worker does not exit after "done": it keeps the
// store open, and so the file held, until the drill kills it.
//
// With --stop-on-unavailable (`idem drill --delete-file`) every claim and every acknowledgement is
// also reported as it happens, "claim_ok t=N" and "ack_ok t=N" (N: the steady clock, in ns, when the
// begin() or succeed() call that returned OK was made; the clock is the system-wide monotonic one,
// so the drill compares it with the moment it deleted the file). After the first answer that the
// store could not commit (store_unavailable, or a succeed() that failed), the threads take no new
// request; the worker reports "done ...", then "error <the store's last error>".
//
// With --scope regional (`idem drill --region ...`, regions_drill.cpp) the worker is the process of
// one region (--self; --region NAME=URI for every region as this process reaches it, --decided-at
// after a takeover, --home-lease-ms for the home leases): an idem::regional_guard, racing the other
// regions' workers on the same requests exactly as a global worker races its peers (below), keys
// decided in their home region (drill::home_of). In both racing scopes an answer a guard must never
// give (an unexpected status, a replayed outcome that is not the request's) is also printed at once,
// "problem <what>", since a worker the drill kills never prints its counts. --no-guard (global and
// regional scope) is the
// drill's negative control: every request is executed and acknowledged without asking idem, so
// the drill's checks must fail.
//
// With --scope global (`idem drill --workers N`, PostgreSQL or MariaDB) the worker is one of N processes
// that share the store through an idem::global_guard and race on the same requests (each in its own
// order, from --worker-index). Differences: there is no recovery to wait for (the store is the
// arbiter; a claim of a killed worker is resolved by whichever worker's compensation thread finds its
// lease expired first, from the ledger, which it re-reads because other workers append to it); a
// claim is renewed (a fenced UPDATE) right before its effect is written, so a worker never writes
// the effect of a claim that was compensated meanwhile; and keys another worker holds are asked
// again until each of this worker's requests has its answer (or 120 s pass).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <random>
#include <sys/stat.h>
#include <unistd.h>

#include "command.hpp"
#include "drill/files.hpp"
#include "idem/idem.hpp"
#include "store.hpp"
#if defined(IDEM_HAVE_POSTGRES) || defined(IDEM_HAVE_MYSQL)
#include "idem/global_guard.hpp"
#endif
#ifdef IDEM_HAVE_POSTGRES
#include "idem/regional_guard.hpp"
#endif

namespace idem::tool {
namespace {

struct worker_config {
    std::string store;
    std::string ledger;
    std::string acks;
    std::string requests;
    std::string prefix;  ///< keys of this drill start with it; the resolver answers only for them
    unsigned threads = 4;
    double lease_ms = 200;
    std::string scope = "process";     ///< process: durable_guard; global: global_guard (PostgreSQL or MariaDB)
    unsigned worker_index = 0;         ///< global: orders this worker's requests
    bool stop_on_unavailable = false;  ///< report each OK claim and ack; stop at the first failed commit
    double sync_timeout_ms = 10'000;   ///< store_options::sync_timeout
    bool hold = false;                 ///< after "done", keep the store open until killed (the file stays held)
    // --scope regional (`idem drill --region ...`): this worker's region, every region as it reaches
    // them (NAME=URI), key spaces moved by a takeover (SPACE=REGION), and the home leases.
    std::string self;
    std::vector<std::string> regions;
    std::vector<std::string> decided_at;
    double home_lease_ms = 0;  ///< 0: no home leases
    double home_margin_ms = 0;
    bool no_guard = false;  ///< racing scopes: execute every request without asking idem (the drill's negative control)
};

/// Steady-clock time in ns (CLOCK_MONOTONIC on Linux: comparable between processes).
std::int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// One line of free text for the drill: newlines would split it into several report lines.
std::string one_line(std::string s) {
    for (char& ch : s)
        if (ch == '\n' || ch == '\r') ch = ' ';
    return s;
}

/// An event line for the drill ("claim_ok t=N"), whole lines only: several threads print them.
void print_event(const char* word, std::int64_t t) {
    static std::mutex m;
    std::lock_guard lock(m);
    std::printf("%s t=%lld\n", word, static_cast<long long>(t));
    std::fflush(stdout);
}

/// The ledger as other processes append to it: re-read from where the last read stopped, whenever
/// the file has grown (global scope: the resolver must see effects written by other workers).
class ledger_follower {
public:
    explicit ledger_follower(std::string path) : path_(std::move(path)) {}
    std::optional<std::uint64_t> effect(const std::string& k) {
        std::lock_guard lock(m_);
        struct stat st {};
        if (::stat(path_.c_str(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) / drill::line_size > lines_) {
            const drill::line_file f = drill::read_lines(path_);  // whole lines only; a torn tail waits
            for (std::size_t i = lines_; i < f.entries.size(); ++i)
                if (f.entries[i].tag == 'E') effects_.emplace(f.entries[i].key, f.entries[i].outcome);
            lines_ = f.entries.size();
        }
        const auto it = effects_.find(k);
        return it == effects_.end() ? std::nullopt : std::optional<std::uint64_t>(it->second);
    }

private:
    std::mutex m_;
    std::string path_;
    std::size_t lines_ = 0;
    std::unordered_map<std::string, std::uint64_t> effects_;
};

/// What the application knows: the effects in the ledger, and the keys it is executing now.
class application_state {
public:
    void effect_recorded(const std::string& k, std::uint64_t outcome) {
        std::lock_guard lock(m_);
        effects_.emplace(k, outcome);
    }
    void enter(const std::string& k) {
        std::lock_guard lock(m_);
        ++in_flight_[k];
    }
    void leave(const std::string& k) {
        std::lock_guard lock(m_);
        if (--in_flight_[k] == 0) in_flight_.erase(k);
    }
    std::optional<std::uint64_t> effect(const std::string& k) {
        std::lock_guard lock(m_);
        const auto it = effects_.find(k);
        return it == effects_.end() ? std::nullopt : std::optional<std::uint64_t>(it->second);
    }
    /// The resolver: what really happened to an expired claim (the seed's checkTxStatus).
    idem::resolver_answer resolve(std::string_view key, const std::string& prefix) {
        if (!key.starts_with(prefix)) return {idem::resolution::unknown, 0};
        const std::string k(key);
        std::lock_guard lock(m_);
        if (in_flight_.contains(k)) return {idem::resolution::unknown, 0};  // still executing here
        const auto it = effects_.find(k);
        if (it != effects_.end()) return {idem::resolution::succeeded, it->second};
        return {idem::resolution::not_executed, 0};
    }

private:
    std::mutex m_;
    std::unordered_map<std::string, std::uint64_t> effects_;
    std::unordered_map<std::string, int> in_flight_;
};

struct counts {
    std::atomic<std::uint64_t> executed{0}, acked{0}, replayed{0}, busy{0}, in_doubt{0}, unavailable{0}, unacked{0},
        unexpected{0}, replay_mismatches{0};
};

/// The first problem any worker thread noted, printed to stderr at the end.
class first_problem {
public:
    void note(const std::string& what) {
        std::lock_guard lock(m_);
        if (text_.empty()) text_ = what;
    }
    void report() {
        std::lock_guard lock(m_);
        if (!text_.empty()) std::cerr << "idem drill-worker: first problem: " << text_ << '\n';
    }

private:
    std::mutex m_;
    std::string text_;
};

/// The worker's last line for the drill: "done requests=... <counts>" plus `extra` (" name=value"...).
void print_done(std::size_t requests, const counts& n, const std::string& extra) {
    auto u = [](const std::atomic<std::uint64_t>& a) { return static_cast<unsigned long long>(a.load()); };
    std::printf(
        "done requests=%zu executed=%llu acked=%llu replayed=%llu busy=%llu in_doubt=%llu unavailable=%llu "
        "unacked=%llu unexpected=%llu replay_mismatches=%llu%s\n",
        requests, u(n.executed), u(n.acked), u(n.replayed), u(n.busy), u(n.in_doubt), u(n.unavailable), u(n.unacked),
        u(n.unexpected), u(n.replay_mismatches), extra.c_str());
    std::fflush(stdout);
}

int run_worker(const worker_config& c) {
    const store_spec spec = *parse_store(c.store);
    const std::vector<drill::request> reqs = drill::read_requests(c.requests);
    for (const drill::request& r : reqs)
        if (r.key.size() > drill::max_key || !r.key.starts_with(c.prefix))
            throw idem::error(idem::errc::invalid_argument, "request key '" + r.key + "' is not a key of this drill");

    auto app = std::make_shared<application_state>();
    for (const drill::entry& e : drill::read_lines(c.ledger).entries)
        if (e.tag == 'E') app->effect_recorded(e.key, e.outcome);
    drill::line_appender ledger(c.ledger);
    drill::line_appender acks(c.acks);

    idem::options opts;
    opts.capacity = reqs.size() + 64;  // make_guard adds the records the store already holds
    opts.lease = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double, std::milli>(c.lease_ms));
    opts.maintenance_interval = std::chrono::milliseconds(50);
    opts.resolve = [app, prefix = c.prefix](const idem::expired_claim& e) { return app->resolve(e.key, prefix); };
    idem::store_options so;
    so.mode = idem::durability::sync;
    so.offer_wait = std::chrono::seconds(2);
    so.sync_timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double, std::milli>(c.sync_timeout_ms));
    std::unique_ptr<guarded_store> gs;
    try {
        gs = make_guard(spec, std::move(opts), std::move(so));
    } catch (const idem::error& e) {
        // The store refused to open (another writer holds the file, ...): say so, with its words.
        std::printf("refused %s\n", one_line(e.what()).c_str());
        std::fflush(stdout);
        return exit_runtime;
    }
    idem::durable_guard& d = *gs->durable();
    idem::guard& g = d.guard();
    const idem::recovery_report rec = d.recovery();

    // Recovered claims keep the lease_until the killed worker stored: wait for it, then compensate.
    const auto wait_start = std::chrono::steady_clock::now();
    const auto give_up = wait_start + std::chrono::seconds(10);
    std::size_t compensated = 0, pending = 0;
    for (;;) {
        pending = 0;
        std::chrono::nanoseconds latest{0};
        g.for_each([&](const std::string& k, const idem::record_view& v) {
            if (v.state != idem::record_state::processing || !k.starts_with(c.prefix)) return;
            ++pending;
            latest = std::max(latest, v.lease_until);
        });
        if (pending == 0 || std::chrono::steady_clock::now() > give_up) break;
        const auto now = g.now();
        if (latest > now) std::this_thread::sleep_for(latest - now + std::chrono::milliseconds(2));
        compensated += g.compensate();
    }
    const auto waited_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - wait_start).count();
    std::printf(
        "ready recovery_ns=%lld records=%zu processing=%zu compensated_at_open=%zu compensated_after_wait=%zu "
        "waited_ms=%lld pending=%zu\n",
        static_cast<long long>(rec.elapsed.count()), rec.records, rec.processing, rec.compensated, compensated,
        static_cast<long long>(waited_ms), pending);
    std::fflush(stdout);

    counts n;
    std::atomic<std::size_t> cursor{0};
    std::atomic<bool> stop{false};  // --stop-on-unavailable: the store could not commit
    first_problem problem;
    auto note = [&](const std::string& what) { problem.note(what); };
    auto work = [&] {
        for (;;) {
            if (stop.load()) return;
            const std::size_t i = cursor.fetch_add(1, std::memory_order_relaxed);  // relaxed: distinct positions only
            if (i >= reqs.size()) return;
            const drill::request& rq = reqs[i];
            const idem::key k(rq.key);
            const std::uint64_t fp = idem::fingerprint_of("amount=" + std::to_string(rq.amount));
            const std::uint64_t outcome = rq.amount;
            app->enter(rq.key);
            std::int64_t called = steady_ns();
            idem::begin_result r = g.begin(k, fp);
            while (r.status == idem::begin_status::backpressure) {
                std::this_thread::yield();
                called = steady_ns();
                r = g.begin(k, fp);
            }
            switch (r.status) {
                case idem::begin_status::acquired: {
                    if (c.stop_on_unavailable) print_event("claim_ok", called);
                    // The effect, durable before the success is recorded: if we die between the two,
                    // the resolver finds it and answers succeeded.
                    ledger.append(drill::make_line('E', rq.key, outcome));
                    app->effect_recorded(rq.key, outcome);
                    ++n.executed;
                    called = steady_ns();
                    std::error_code ec = r.ticket.succeed(outcome);
                    while (ec == idem::errc::backpressure || ec == idem::errc::busy) {
                        std::this_thread::yield();
                        called = steady_ns();
                        ec = r.ticket.succeed(outcome);
                    }
                    if (!ec) {
                        acks.append(drill::make_line('A', rq.key, outcome));  // committed: acknowledge
                        ++n.acked;
                        if (c.stop_on_unavailable) print_event("ack_ok", called);
                    } else {
                        ++n.unacked;  // e.g. store_unavailable: not known durable, so not acknowledged
                        note(rq.key + ": succeed() answered " + ec.message());
                        if (c.stop_on_unavailable) stop.store(true);
                    }
                    break;
                }
                case idem::begin_status::succeeded:
                    ++n.replayed;
                    if (r.outcome != outcome) {
                        ++n.replay_mismatches;
                        note(rq.key + ": replayed outcome " + std::to_string(r.outcome) + ", expected " +
                             std::to_string(outcome));
                    }
                    break;
                case idem::begin_status::in_progress: ++n.busy; break;
                case idem::begin_status::in_doubt: ++n.in_doubt; break;
                case idem::begin_status::store_unavailable:
                    ++n.unavailable;
                    if (c.stop_on_unavailable) stop.store(true);
                    break;
                default: ++n.unexpected; note(rq.key + ": begin() answered " + idem::to_string(r.status));
            }
            app->leave(rq.key);
        }
    };
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < c.threads; ++t) threads.emplace_back(work);
    for (auto& t : threads) t.join();

    print_done(reqs.size(), n, "");
    if (c.hold) {
        // `idem drill --second-writer`: this worker holds the file until the drill has seen how a
        // second writer fares, and then kills it; it must not let go of the file by finishing.
        for (;;) ::pause();
    }
    if (c.stop_on_unavailable) {
        if (const std::string why = d.last_store_error(); !why.empty()) {
            std::printf("error %s\n", one_line(why).c_str());
            std::fflush(stdout);
        }
    }
    problem.report();
    gs.reset();  // drains the flusher (up to sync_timeout for rows it cannot commit) and closes the store
    return n.unexpected == 0 && n.replay_mismatches == 0 ? exit_ok : exit_violation;
}

#if defined(IDEM_HAVE_POSTGRES) || defined(IDEM_HAVE_MYSQL)
/// A claim's lease in global scope is at least this long: the worker renews it right before writing
/// the effect, and the effect (a write and an fdatasync, on a loaded machine) must land well within
/// the renewed lease, or another worker's compensation could find the claim expired and not executed.
inline constexpr std::chrono::milliseconds global_min_lease{2000};

/// The racing worker of global and regional scope: `open(opts)` opens the guard (a global_guard on
/// the shared store, or a regional_guard in this worker's region) and returns it with its
/// compensation, run once at start; `extra(g)` is what the "done" line adds.
template <class Guard, class Open, class Extra>
int run_racing_worker(const worker_config& c, Open open, Extra extra) {
    std::vector<drill::request> reqs = drill::read_requests(c.requests);
    for (const drill::request& r : reqs)
        if (r.key.size() > drill::max_key || !r.key.starts_with(c.prefix))
            throw idem::error(idem::errc::invalid_argument, "request key '" + r.key + "' is not a key of this drill");
    std::mt19937_64 order(0x9e3779b97f4a7c15ull * (c.worker_index + 1));
    std::shuffle(reqs.begin(), reqs.end(), order);  // the workers race on the same keys in different orders

    auto app = std::make_shared<application_state>();  // in-flight keys of this process
    auto follower = std::make_shared<ledger_follower>(c.ledger);
    drill::line_appender ledger(c.ledger);
    drill::line_appender acks(c.acks);

    idem::options opts;
    opts.capacity = reqs.size() * 2 + 64;
    opts.lease = std::max<std::chrono::nanoseconds>(
        global_min_lease,
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double, std::milli>(c.lease_ms)));
    opts.maintenance_interval = std::chrono::milliseconds(50);
    opts.resolve = [app, follower, prefix = c.prefix](const idem::expired_claim& e) -> idem::resolver_answer {
        if (!e.key.starts_with(prefix)) return {idem::resolution::unknown, 0};
        const std::string k(e.key);
        if (app->resolve(e.key, prefix).verdict == idem::resolution::unknown) return {idem::resolution::unknown, 0};
        if (const auto out = follower->effect(k)) return {idem::resolution::succeeded, *out};
        return {idem::resolution::not_executed, 0};
    };
    const std::chrono::nanoseconds lease = opts.lease;
    const auto t0 = std::chrono::steady_clock::now();
    auto opened = open(std::move(opts));  // not a structured binding: clang 14 cannot capture one
    std::unique_ptr<Guard> g = std::move(opened.first);
    const std::size_t compensated = opened.second;
    const auto open_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
    std::printf(
        "ready recovery_ns=%lld records=0 processing=0 compensated_at_open=%zu compensated_after_wait=0 "
        "waited_ms=0 pending=0\n",
        static_cast<long long>(open_ns.count()), compensated);
    std::fflush(stdout);

    counts n;
    std::atomic<std::uint64_t> fenced_out{0};
    std::atomic<std::size_t> cursor{0};
    first_problem problem;
    auto note = [&](const std::string& what) { problem.note(what); };
    // An answer a guard must never give, reported at once ("problem <what>"): a worker killed
    // later never prints its "done" counts.
    auto violation = [&](const std::string& what) {
        note(what);
        static std::mutex m;
        std::lock_guard lock(m);
        std::printf("problem %s\n", one_line(what).c_str());
        std::fflush(stdout);
    };
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    // One request: true when it has its answer (executed and acknowledged, or replayed).
    auto one = [&](const drill::request& rq) -> bool {
        const idem::key k(rq.key);
        const std::uint64_t fp = idem::fingerprint_of("amount=" + std::to_string(rq.amount));
        const std::uint64_t outcome = rq.amount;
        if (c.no_guard) {  // the negative control: the effect runs without asking idem
            ledger.append(drill::make_line('E', rq.key, outcome));
            ++n.executed;
            acks.append(drill::make_line('A', rq.key, outcome));
            ++n.acked;
            return true;
        }
        app->enter(rq.key);
        struct leave_guard {
            application_state& a;
            const std::string& k;
            ~leave_guard() { a.leave(k); }
        } leave{*app, rq.key};
        idem::global_begin_result r = g->begin(k, fp);
        switch (r.status) {
            case idem::begin_status::acquired: {
                // Fence the effect: renew the claim first. A refused renewal means the claim was
                // compensated (this worker stalled past its lease): the key is someone else's now.
                if (const std::error_code ec = r.ticket.extend(lease)) {
                    ++fenced_out;
                    if (ec != idem::errc::stale_ticket) ++n.unavailable;
                    return false;
                }
                ledger.append(drill::make_line('E', rq.key, outcome));
                ++n.executed;
                const std::error_code ec = r.ticket.succeed(outcome);
                if (!ec) {
                    acks.append(drill::make_line('A', rq.key, outcome));
                    ++n.acked;
                    return true;
                }
                ++n.unacked;  // stale (compensated as executed) or not confirmed: ask again
                note(rq.key + ": succeed() answered " + ec.message());
                return false;
            }
            case idem::begin_status::succeeded:
                ++n.replayed;
                if (r.outcome != outcome) {
                    ++n.replay_mismatches;
                    violation(rq.key + ": replayed outcome " + std::to_string(r.outcome) + ", expected " +
                              std::to_string(outcome));
                }
                return true;
            case idem::begin_status::in_progress: ++n.busy; return false;
            case idem::begin_status::in_doubt: ++n.in_doubt; return false;
            case idem::begin_status::store_unavailable: ++n.unavailable; return false;
            default:
                ++n.unexpected;
                violation(rq.key + ": begin() answered " + idem::to_string(r.status));
                return true;
        }
    };
    auto work = [&] {
        std::vector<const drill::request*> again;
        for (;;) {
            const std::size_t i = cursor.fetch_add(1, std::memory_order_relaxed);  // relaxed: distinct positions only
            if (i >= reqs.size()) break;
            if (!one(reqs[i])) again.push_back(&reqs[i]);
        }
        while (!again.empty() && std::chrono::steady_clock::now() < give_up) {  // held elsewhere: ask again
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            std::vector<const drill::request*> still;
            for (const drill::request* rq : again)
                if (!one(*rq)) still.push_back(rq);
            again.swap(still);
        }
    };
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < c.threads; ++t) threads.emplace_back(work);
    for (auto& t : threads) t.join();

    print_done(reqs.size(), n, " fenced_out=" + std::to_string(fenced_out.load()) + extra(*g));
    problem.report();
    g.reset();
    return n.unexpected == 0 && n.replay_mismatches == 0 ? exit_ok : exit_violation;
}

int run_worker_global(const worker_config& c) {
    return run_racing_worker<idem::global_guard>(
        c,
        [&](idem::options opts) {
            idem::global_options go;
            go.call_deadline = postgres_call_deadline;
            go.wait_timeout = std::chrono::seconds(10);
            auto g = std::make_unique<idem::global_guard>(c.store, std::move(opts), go);
            const std::size_t compensated = g->compensate();
            return std::pair{std::move(g), compensated};
        },
        [](idem::global_guard& g) { return " compensated=" + std::to_string(g.snapshot().compensated); });
}
#ifdef IDEM_HAVE_POSTGRES
/// --scope regional: one process of region --self, racing the other regions' workers on the same
/// keys through an idem::regional_guard (each key decided in its home region: drill::home_of).
int run_worker_regional(const worker_config& c) {
    idem::regional_options ro;
    ro.self = c.self;
    for (const std::string& a : c.regions) {
        const auto eq = a.find('=');
        if (eq == std::string::npos) throw idem::error(idem::errc::invalid_argument, "--region '" + a + "' is not NAME=URI");
        ro.regions.push_back({a.substr(0, eq), a.substr(eq + 1)});
    }
    for (const std::string& a : c.decided_at) {
        const auto eq = a.find('=');
        if (eq == std::string::npos)
            throw idem::error(idem::errc::invalid_argument, "--decided-at '" + a + "' is not SPACE=REGION");
        ro.decided_at[a.substr(0, eq)] = a.substr(eq + 1);
    }
    ro.home = [prefix = c.prefix](std::string_view k) { return drill::home_of(k, prefix); };
    ro.local.call_deadline = postgres_call_deadline;
    ro.local.wait_timeout = std::chrono::seconds(10);
    ro.forward.call_deadline = std::chrono::seconds(2);
    ro.forward.wait_timeout = std::chrono::seconds(5);
    ro.forward.max_backoff = std::chrono::milliseconds(200);
    if (c.home_lease_ms > 0) {
        idem::lease_options lo;
        lo.lease = std::chrono::milliseconds(static_cast<std::int64_t>(c.home_lease_ms));
        lo.margin = std::chrono::milliseconds(static_cast<std::int64_t>(c.home_margin_ms));
        lo.call_deadline = lo.lease / 4;
        ro.leases = lo;
    }
    // The key spaces this worker's region decides: their guards compensate (the others forward).
    std::vector<std::string> decided;
    for (const idem::region& r : ro.regions) {
        const auto moved = ro.decided_at.find(r.name);
        if ((moved == ro.decided_at.end() ? r.name : moved->second) == c.self) decided.push_back(r.name);
    }
    return run_racing_worker<idem::regional_guard>(
        c,
        [&](idem::options opts) {
            auto g = std::make_unique<idem::regional_guard>(std::move(opts), ro);
            std::size_t compensated = 0;
            for (const std::string& space : decided) compensated += g->region_guard(space).compensate();
            return std::pair{std::move(g), compensated};
        },
        [decided](idem::regional_guard& g) {
            const idem::regional_stats s = g.snapshot();
            std::uint64_t compensated = 0;
            for (const auto& [name, gs] : s.regions)
                if (std::find(decided.begin(), decided.end(), name) != decided.end()) compensated += gs.compensated;
            return " compensated=" + std::to_string(compensated) + " foreign=" + std::to_string(s.foreign_begins) +
                   " by_replica=" + std::to_string(s.answered_by_replica) +
                   " lease_refused=" + std::to_string(s.lease_refused);
        });
}
#endif
#endif

}  // namespace

command add_drill_worker(CLI::App& root) {
    auto c = std::make_shared<worker_config>();
    CLI::App* app = root.add_subcommand("drill-worker", "Worker process of `idem drill` (started by the drill)");
    app->group("");  // hidden from --help: only the drill runs it
    app->add_option("--store", c->store)->required()->check(store_check(/*durable_only=*/true));
    app->add_option("--ledger", c->ledger, "Independent ledger of executed effects")->required();
    app->add_option("--acks", c->acks, "Acknowledgement file")->required();
    app->add_option("--requests", c->requests, "Request list, one 'KEY AMOUNT' per line")->required();
    app->add_option("--prefix", c->prefix, "Key prefix of this drill")->required();
    app->add_option("--threads", c->threads)->check(in_range(1u, 256u, "worker threads"));
    app->add_option("--lease-ms", c->lease_ms)->check(in_range(1.0, 600'000.0, "milliseconds"));
    app->add_option("--scope", c->scope)->check(CLI::IsMember({"process", "global", "regional"}));
    app->add_option("--self", c->self, "regional: this worker's region");
    app->add_option("--region", c->regions, "regional: every region, NAME=URI as this worker reaches it");
    app->add_option("--decided-at", c->decided_at, "regional: SPACE=REGION, a key space taken over");
    app->add_option("--home-lease-ms", c->home_lease_ms)->check(in_range(0.0, 600'000.0, "milliseconds"));
    app->add_option("--home-margin-ms", c->home_margin_ms)->check(in_range(0.0, 600'000.0, "milliseconds"));
    app->add_flag("--no-guard", c->no_guard, "global, regional: execute every request without asking idem");
    app->add_option("--worker-index", c->worker_index);
    app->add_flag("--stop-on-unavailable", c->stop_on_unavailable,
                  "Report each OK claim and ack with its call time; stop at the first failed commit");
    app->add_flag("--hold", c->hold, "After 'done', keep the store open until killed");
    app->add_option("--sync-timeout-ms", c->sync_timeout_ms)->check(in_range(1.0, 600'000.0, "milliseconds"));
    return {app, [c]() -> int {
                if (c->scope == "regional") {
#ifdef IDEM_HAVE_POSTGRES
                    return run_worker_regional(*c);
#else
                    throw idem::error(idem::errc::invalid_argument, "--scope regional needs the PostgreSQL store");
#endif
                }
                if (c->scope == "global") {
#if defined(IDEM_HAVE_POSTGRES) || defined(IDEM_HAVE_MYSQL)
                    if (!arbitrates(*parse_store(c->store)))
                        throw idem::error(idem::errc::invalid_argument,
                                          "--scope global needs a postgresql:// or mysql:// store");
                    return run_worker_global(*c);
#else
                    throw idem::error(idem::errc::invalid_argument, "--scope global needs the PostgreSQL or MySQL store");
#endif
                }
                return run_worker(*c);
            }};
}

}  // namespace idem::tool
