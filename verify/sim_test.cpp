// sim_test: deterministic simulation of idem under store faults and crashes (FoundationDB style).
//
// Layer A (the seeds): one thread runs everything, so a seed replays exactly.
//   * The real guard (engine, tickets, compensation, rotation) on a manual clock.
//   * `sim_pipeline`: the real pipeline core (detail/pipeline/pipeline_core.hpp: admission by reservation,
//     the bounded queue, batches of up to max_batch rows sorted by (key, seq), one store
//     transaction per batch with a batch id, commit_unknown resolved by store::committed(),
//     rejected rows isolated by halving, the contiguous watermark) stepped by hand in simulated
//     time, with flush_pipeline's backoff, sync await with a deadline, durable() and accepts()
//     around it.
//   * `fault_store`: an idem::store over a "disk" that survives crashes (a memory_store; in test
//     seeds_on_file_stores, a real sqlite_store or rocksdb_store in a temporary directory), injecting
//     seeded write failures, in-doubt commits that did or did not commit, failures of the
//     committed() question, read failures during recovery, latency in simulated time, outages that
//     end (shorter and up to four times longer than sync_timeout), and poison keys whose rows it can
//     never take (apply() throws rejected_row; some are also declared through store::accepts).
//   * Clients (state machines) that claim keys, execute an effect in a downstream ledger that
//     survives crashes and honours fences, pause, renew, complete, fail, drop tickets; some spin on
//     backpressure (retry at once, many times), with queues as small as 2 rows in some seeds.
//   * A truthful resolver answering from the ledger (or "unknown" at a seeded rate).
//   * Crashes: memory and queue lost; recovery by durable_guard's own code, detail/recovery/
//     (recover.hpp: fence floor above the store's largest fence; claims, released records and the
//     hot window restored into the table, terminal records that do not fit and the rest of the
//     idempotency window into the cold window through remember_cold, records past the window
//     nowhere; then compensation), on the simulation's wall mapping (clock_map.hpp: the manual
//     clock in ms). A recall converts the store's record with the same code (to_recalled).
//   * Payloads: in most seeds completions carry response bytes (a key's own, NUL and high bytes
//     included; the resolver finds the same), so recovery restores them, the cold window's recall
//     brings them back, and the audit rows name them (idem::verify checks their size and hash); a
//     duplicate answered succeeded must get the key's bytes back, and the store and memory must
//     hold them at the end.
//   * The two windows: options.retention (the hot window, 0 to 3 s) and the idempotency window
//     (store_options::window: forever, 7 days, or 4 to 15 s so keys legitimately expire and are
//     claimed again). The guard has the cold window enabled; small tables (capacity 3 to 8, 2 to
//     96 keys, some seeds 4 to 8 times more keys than capacity) rotate often, so terminal records
//     go to the filter and a claim of one reads the store through `sim_pipeline::recall`
//     (fault_store::get: seeded read failures answer unavailable, latency in simulated time). The
//     flusher's turn prunes the store every prune_interval (store::prune, bounded by max_rows; some
//     seeds also with an audit_window) and clients retry keys that completed long before (after
//     evictions, restarts, long pauses of the clock past the window).
//   The checker, for every seed: exactly-once effects (sync mode; async tolerates only re-executions
//   of claims a crash lost, and counts them), no lost acknowledgement (sync: every transition
//   acknowledged to a client is in the store at every crash and at the end; async: at the end,
//   nothing acknowledged since the last crash was dropped), a complete audit trail (idem::verify:
//   every key's trail is a legal path that ends at its record, no record without a trail), memory
//   agreeing with the store after the final flush, and on the durable path:
//     - durable before visible (sync): a terminal result a client sees (begin(), query(), its own
//       succeed()) is already in the store;
//     - poison rows: set aside, never in the store, never taking an innocent row with them; a
//       declared key answers invalid_key and never reaches the queue; in sync mode no claim of a
//       poison key is granted (so no effect runs for it);
//     - refusals (backpressure) change nothing: query() reads the same, no seq is taken, and the claim
//       after a spin gets the fence it would have got; the queue depth never exceeds
//       queue_capacity + max_batch;
//     - liveness: after every outage and at the end, a key nobody holds is acquired within 20 s;
//     - the idempotency window: no claim is granted while the store holds a terminal decision of
//       the key updated inside the window (a grant past the window is legal and starts a new life
//       of the key), and a claim from ABSENT of a key whose last decision the simulation saw is
//       legal only past the window (terminal) or after a rotation or the window (released). Acks,
//       visibility and verify accept what a prune removed (the store's horizon).
//   The rotation (rotate_if_due) under what it once got wrong:
//     - the guard gets the durable pipeline's flush marks (set_flush_marks: issued() and decided(seq)),
//       as durable_guard wires them, not "everything drained";
//     - confirms racing rotations: in some seeds the guard runs on sim_atomic, whose load() is a
//       preemption point, and a sync owner's succeed() runs on a worker thread that holds a baton
//       (coop: one of the two threads runs at a time, so a seed still replays exactly); the owner
//       stops between its wait and its confirm, and the confirm runs inside a rotation at a seeded
//       re-load of an atomic (tearing a seqlock read); the client then asks for its key again. A
//       record the rotation lets leave memory without the cold window learning it is granted
//       again (check_grant, observe: a claim from ABSENT inside the window);
//     - ordered versions (options.ordered_versions) in some seeds: the keys are versions of a few
//       (txid, operation) pairs (key::compose); superseded names a newer version some begin() of
//       the process life asked for (or recovery restored), and is never the answer while the store
//       holds a decision of the key inside the window; a version is not granted while a newer one
//       granted in the process life is in memory's version maps (fewer than two rotations ago);
//     - steady load (async seeds, at the end): rows always in the queue when collect() runs, claims
//       of new keys in a table that holds only decided records: every claim is granted (never
//       capacity_exhausted) and rotations happen.
//   Each of these checks but the refusal checks and the confirm race has a mutation (enum mutation)
//   that test checker_has_teeth must see fail; the refusal checks guard the engine's admission,
//   which no mutation of the sink can break without hanging the pipeline, and the confirm race is
//   inside the engine (docs/testing.md records the engine mutations the seeds catch).
//
// Layer B (test real_pipeline): the real durable_guard and flush_pipeline threads over the same
// fault_store; the store answers deterministically per call index but batch contents depend on
// thread timing, so the checker is tolerant of timing and a seed replays its fault schedule, not its
// interleaving.
//
// Flags (or environment): --seeds=N (IDEM_SIM_SEEDS, default 1000), --first=S (IDEM_SIM_FIRST),
// --seed=S to replay one seed with a full trace (IDEM_SIM_SEED), --real-seeds=N (IDEM_SIM_REAL_SEEDS),
// --no-committed-faults (IDEM_SIM_COMMITTED_FAULTS=0) to keep store::committed() healthy,
// --teeth-all (IDEM_SIM_TEETH_ALL=1) to run every mutation of checker_has_teeth over all 200 seeds,
// --windows=0 (IDEM_SIM_WINDOWS=0) to run the seeds without the window features (one table size,
// retention 3 s, nothing pruned, no long pauses, and none of the rotation's features), --help,
// IDEM_SIM_DISK=sqlite|rocksdb to run sim.seeds over a real file store, IDEM_SIM_FILE_SEEDS=N for
// the seeds of test seeds_on_file_stores (default 100 per file store).
#include <idem/idem.hpp>
#include <idem/detail/recovery/clock_map.hpp>
#include <idem/detail/recovery/recover.hpp>
#include <idem/durable.hpp>
#include <idem/store.hpp>
#include <idem/verify.hpp>
#include <idem/stores/sqlite_store.hpp>
#ifdef IDEM_SIM_ROCKSDB
#include <idem/stores/rocksdb_store.hpp>
#endif

#include <gtest/gtest.h>
#include <filesystem>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <tuple>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::errc;
using idem::record_state;
using idem::resolution;

// ---- determinism of the hash secret ------------------------------------------------------------------
// The engine draws its hash secret from std::random_device, so two runs of a seed would place keys in
// different slots, and compensation (which scans slots in order) would ask about expired claims in a
// different order, queue their rows in a different order and so meet the store's faults differently.
// This binary replaces libstdc++'s random_device::_M_getval with a generator reset from the seed at
// each simulation, so a seed replays exactly. (A library hook, a secret or seed in options, would make
// this unnecessary: docs/testing.md.)
std::uint64_t g_entropy = 1;
}  // namespace
#if defined(__GLIBCXX__)
std::random_device::result_type std::random_device::_M_getval() {
    g_entropy ^= g_entropy << 13;  // xorshift64
    g_entropy ^= g_entropy >> 7;
    g_entropy ^= g_entropy << 17;
    return static_cast<result_type>(g_entropy >> 32);
}
#endif
namespace {

// ---- configuration ---------------------------------------------------------------------------------
struct flags {
    std::uint64_t seeds = 1000, first = 1, real_seeds = 8;
    std::optional<std::uint64_t> one;
    /// Let store::committed() fail too (the question about an in-doubt commit). On by default;
    /// --no-committed-faults turns it off.
    bool committed_faults = true;
    /// checker_has_teeth: run all 200 seeds per mutation (default: stop at the first caught).
    bool teeth_all = false;
    /// Seeds draw the window features (small tables, short retention and windows, prunes, retries of
    /// old keys, long pauses). --windows=0 turns them off.
    bool windows = true;
};
flags g_flags;

/// Deliberate bugs, to show that the checker catches what it claims to (test checker_has_teeth).
enum class mutation {
    none,
    lying_resolver,         ///< the resolver says "not executed" after the effect ran
    dropped_row,            ///< the pipeline silently loses one row in seven
    durable_lies,           ///< the sink's durable() always says yes: sync results visible before durable
    leaked_reservation,     ///< a sync wait that times out keeps a unit of queue room forever
    rejected_as_committed,  ///< the sink reports a row the store set aside as committed
    accepts_ignored,        ///< the sink does not forward store::accepts
    oversized_queue,        ///< the pipeline's queue is larger than store_options.queue_capacity
    recall_forgets,         ///< the sink's recall() answers "no record" without reading the store
    cold_dropped,           ///< recovery does not give the rest of the window to the cold window
    /// Recovery floors new fences at the largest fence it loaded, not at store::max_fence() (which
    /// counts pruned records): after a prune a key can be claimed again with a fence it already had.
    /// This is what durable_guard::recover does as of ce2a4e4 (docs/testing.md, section 4, finding F6).
    loaded_fence_floor,
    /// The sink's recall() answers a record without its payload: a duplicate of an evicted key
    /// gets its outcome without the response bytes.
    payload_dropped,
    /// The guard's rotation waits until every row offered so far is decided (the guard wired with
    /// set_all_flushed(drained), the old rotation condition): a steady load starves rotation.
    drained_marks,
    /// recovery_start::claims_first with the cold window complete (and empty) before the window's
    /// keys are streamed in: until the stream, a decided key memory does not hold is granted again.
    stream_completed_early,
};
const char* to_string(mutation m) {
    switch (m) {
        case mutation::none: return "none";
        case mutation::lying_resolver: return "lying_resolver";
        case mutation::dropped_row: return "dropped_row";
        case mutation::durable_lies: return "durable_lies";
        case mutation::leaked_reservation: return "leaked_reservation";
        case mutation::rejected_as_committed: return "rejected_as_committed";
        case mutation::accepts_ignored: return "accepts_ignored";
        case mutation::oversized_queue: return "oversized_queue";
        case mutation::recall_forgets: return "recall_forgets";
        case mutation::cold_dropped: return "cold_dropped";
        case mutation::stream_completed_early: return "stream_completed_early";
        case mutation::loaded_fence_floor: return "loaded_fence_floor";
        case mutation::drained_marks: return "drained_marks";
        case mutation::payload_dropped: return "payload_dropped";
    }
    return "?";
}
mutation g_mutation = mutation::none;

/// What the simulated disk is: the reference memory_store, or a real file store (a fresh one per
/// seed, in a temporary directory), so the same faults, crashes and checks run over its apply(),
/// committed(), load() and audit trail.
enum class disk_kind { memory, sqlite, rocksdb };
disk_kind g_disk = disk_kind::memory;

/// The disk for one seed; a file store's directory is removed with it.
struct sim_disk {
    std::filesystem::path dir;
    std::unique_ptr<idem::store> st;
    explicit sim_disk(disk_kind kind) {
        if (kind == disk_kind::memory) {
            st = std::make_unique<idem::memory_store>();
            return;
        }
        std::string pattern = (std::filesystem::temp_directory_path() / "idem-sim.XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        dir = pattern;
        if (kind == disk_kind::sqlite) st = std::make_unique<idem::sqlite_store>((dir / "sim.db").string());
#ifdef IDEM_SIM_ROCKSDB
        else st = std::make_unique<idem::rocksdb_store>((dir / "sim").string());
#endif
        if (!st) throw std::runtime_error("this build has no RocksDB store");
    }
    ~sim_disk() {
        st.reset();
        std::error_code ec;
        if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
};

std::uint64_t env_or(const char* name, std::uint64_t v) {
    const char* s = std::getenv(name);
    return s ? std::strtoull(s, nullptr, 10) : v;
}

// ---- deterministic randomness ----------------------------------------------------------------------
struct rng {
    std::uint64_t s;
    // The state starts at a hash of the seed. (It used to be seed * 0x9e37... + c, and next() adds
    // 0x9e37..., so seed n + 1 drew seed n's stream shifted by one draw; since a step takes a varying
    // number of draws, the two runs soon read the same draws at the same steps: neighbouring seeds
    // were largely the same run.)
    explicit rng(std::uint64_t seed) : s(seed ^ 0x632be59bd9b4e019ull) { s = next(); }
    std::uint64_t next() {  // splitmix64
        std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    std::uint64_t below(std::uint64_t n) { return n ? next() % n : 0; }
    bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
};

/// A pure function of its inputs (for decisions whose call order may depend on hash placement).
std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0) {
    rng r(a ^ (b * 0xff51afd7ed558ccdull) ^ (c * 0xc4ceb9fe1a85ec53ull));
    return r.next();
}

// ---- interleavings inside the engine: an owner's sync confirm racing a rotation ---------------------
// Layer A runs one thing at a time, so a scan of the table never sees a slot change under it. In
// sync mode an owner publishes its terminal record with the unconfirmed mark, waits for its row,
// and then confirms (clears the mark, or records that it gave up): a rotation that reads the slot
// in between two loads of its word sees a torn snapshot. To put that interleaving in the seeds
// without giving up determinism, some seeds instantiate the guard with `sim_atomic`, an atomic
// whose load() is a preemption point, and run an owner's succeed() on `coop`'s worker thread, which
// runs only while the simulation's thread waits for it (a baton: exactly one of the two runs at any
// time, so a seed still replays exactly):
//   1. the owner's succeed() runs on the worker until its sync wait is over (the row decided);
//      sim_pipeline::await then hands the baton back: the owner sits between its wait and its
//      confirm;
//   2. the simulation runs maintenance with the preemption point armed: at a seeded re-load of an
//      atomic the thread loaded a moment before (the validation load of a seqlock read: the owner's
//      confirm then tears that read) the baton goes to the owner, which confirms, returns from
//      succeed() and hands the baton back, and the rotation goes on;
//   3. if the point was not reached, the owner confirms after maintenance;
//   4. the client asks for its key again at once: a record the rotation let leave memory without
//      the cold window learning it is granted again (check_grant, observe).
// The other seeds run the guard on std::atomic, the production instantiation.
thread_local bool t_on_worker = false;

/// The baton between the simulation's thread and one worker thread (a coroutine by other means).
class coop {
public:
    coop() : th_([this] { loop(); }) {}
    ~coop() {
        {
            std::lock_guard l(m_);
            stop_ = true;
            turn_ = worker;
        }
        cv_.notify_all();
        th_.join();
    }
    coop(const coop&) = delete;
    coop& operator=(const coop&) = delete;
    /// Simulation thread: runs job on the worker until it yields or ends.
    void run(std::function<void()> job) {
        std::unique_lock l(m_);
        job_ = std::move(job);
        busy_ = true;
        pass(l, worker);
    }
    /// Simulation thread: lets a yielded job go on until it yields again or ends.
    void resume() {
        std::unique_lock l(m_);
        if (busy_) pass(l, worker);
    }
    /// Simulation thread: a job has yielded and not ended.
    [[nodiscard]] bool suspended() {
        std::lock_guard l(m_);
        return busy_;
    }
    /// Worker: hands the baton back until resume().
    void yield() {
        std::unique_lock l(m_);
        pass(l, main);
    }

private:
    enum side { main, worker };
    void pass(std::unique_lock<std::mutex>& l, side to) {
        turn_ = to;
        cv_.notify_all();
        cv_.wait(l, [&] { return turn_ != to || (to == main && stop_); });
    }
    void loop() {
        t_on_worker = true;
        std::unique_lock l(m_);
        for (;;) {
            cv_.wait(l, [&] { return turn_ == worker; });
            if (stop_) return;
            auto job = std::move(job_);
            l.unlock();
            job();
            l.lock();
            busy_ = false;
            turn_ = main;
            cv_.notify_all();
        }
    }
    std::mutex m_;
    std::condition_variable cv_;
    side turn_ = main;
    bool busy_ = false, stop_ = false;
    std::function<void()> job_;
    std::thread th_;
};
coop& the_coop() {
    static coop c;
    return c;
}

/// The preemption point of sim_atomic::load (simulation thread only; the worker runs only while
/// that thread waits in coop, so these plain variables are handed over by coop's mutex).
struct preemption {
    bool armed = false;
    const void* recent[12] = {};  ///< the atomics the thread loaded last
    unsigned at = 0;
    std::uint64_t candidates = 0;  ///< re-loads of a recent atomic seen while armed
    std::uint64_t target = 0;      ///< the candidate at which the worker runs
    std::function<void()> fire;
};
preemption g_preempt;

[[gnu::noinline]] void preemption_point(const void* a) {
    if (t_on_worker) return;
    bool again = false;
    for (const void* r : g_preempt.recent) again |= r == a;
    g_preempt.recent[g_preempt.at++ % std::size(g_preempt.recent)] = a;
    if (again && g_preempt.candidates++ == g_preempt.target) {
        g_preempt.armed = false;
        g_preempt.fire();
    }
}

/// std::atomic whose load() is a preemption point (the engine's Atomic parameter, as Relacy's).
template <class T>
struct sim_atomic : std::atomic<T> {
    using std::atomic<T>::atomic;
    using std::atomic<T>::operator=;
    sim_atomic() noexcept = default;
    T load(std::memory_order o = std::memory_order_seq_cst) const noexcept {
        if (g_preempt.armed) [[unlikely]]
            preemption_point(this);
        return std::atomic<T>::load(o);
    }
};

/// The run's trace: every action, in order. Printed for --seed; its hash proves a replay is exact.
struct trace {
    bool print = false;
    std::uint64_t hash = 1469598103934665603ull;
    void operator()(const std::string& line) {
        for (unsigned char c : line) hash = (hash ^ c) * 1099511628211ull;
        hash = (hash ^ '\n') * 1099511628211ull;
        if (print) std::printf("  %s\n", line.c_str());
    }
};

// ---- the fault-injecting store ------------------------------------------------------------------
struct fault_rates {
    double fail_before = 0;                ///< apply throws store_unavailable; nothing written
    double unknown_done = 0;               ///< apply commits, then throws commit_unknown
    double unknown_lost = 0;               ///< apply throws commit_unknown; nothing written
    double committed_fail = 0;             ///< committed() throws (the question cannot be asked)
    double read_fail = 0;                  ///< load() / max_fence() throw during recovery; get() (recall) and prune() throw
    std::chrono::milliseconds latency{0};  ///< simulated time one apply takes
};

/// An idem::store over a disk that survives crashes. Used by one thread at a time.
class fault_store final : public idem::store {
public:
    fault_store(idem::store& disk, fault_rates rates, std::uint64_t seed, trace* log,
                std::function<void(std::chrono::nanoseconds)> spend = {})
        : disk_(disk), rates_(rates), rng_(seed), log_(log), spend_(std::move(spend)) {}

    void set_healthy(bool h) { healthy_ = h; }
    /// Every call fails until the clock passes `until` (an outage of the database).
    void set_outage(std::function<bool()> down) { down_ = std::move(down); }
    void set_dead(bool d) { dead_ = d; }  ///< refuse everything (layer B's crash)
    /// Keys the store can never take: apply() throws rejected_row for a batch holding one of their
    /// rows. `declared` ones are also refused by accepts(), so the guard answers invalid_key up front.
    void set_poison(std::vector<std::string> poison, std::vector<std::string> declared) {
        poison_ = std::move(poison);
        declared_ = std::move(declared);
    }
    [[nodiscard]] std::uint64_t calls() const { return calls_; }

    bool accepts(const idem::key& k, std::string* why = nullptr) const noexcept override {
        for (const auto& d : declared_)
            if (d == k.view()) {
                if (why) *why = "key '" + d + "' breaks the fault store's declared rule";
                return false;
            }
        return true;
    }

    void apply(std::span<const idem::store_row> rows, std::uint64_t batch_id) override {
        ++calls_;
        if (spend_) spend_(rates_.latency);
        if (dead_) throw idem::error(errc::store_unavailable, "fault store: dead");
        if (down_ && down_()) {
            note("apply#" + std::to_string(calls_) + " fails: outage");
            throw idem::error(errc::store_unavailable, "fault store: outage");
        }
        const double r = healthy_ ? 1.0 : static_cast<double>(rng_.next() >> 11) * 0x1.0p-53;
        if (r < rates_.fail_before) {
            note("apply#" + std::to_string(calls_) + " fails (nothing written)");
            throw idem::error(errc::store_unavailable, "fault store: injected failure");
        }
        if (r < rates_.fail_before + rates_.unknown_lost) {
            note("apply#" + std::to_string(calls_) + " in doubt, not committed");
            throw idem::commit_unknown("fault store: connection lost during COMMIT (not committed)");
        }
        // A poison row fails its statement: the transaction rolls back, nothing of the batch is
        // written (PostgreSQL SQLSTATE class 22/23), however often it is tried.
        for (const idem::store_row& row : rows)
            if (poisoned(row.t.k.view())) {
                note("apply#" + std::to_string(calls_) + " rejects the batch of " + std::to_string(rows.size()) +
                     " rows: key " + std::string(row.t.k.view()) + " can never be stored");
                throw idem::rejected_row("fault store: key '" + std::string(row.t.k.view()) + "' can never be stored");
            }
        if (r < rates_.fail_before + rates_.unknown_lost + rates_.unknown_done) {
            disk_.apply(rows, batch_id);
            note("apply#" + std::to_string(calls_) + " in doubt, committed " + std::to_string(rows.size()) + " rows");
            throw idem::commit_unknown("fault store: connection lost during COMMIT (committed)");
        }
        disk_.apply(rows, batch_id);
        note("apply#" + std::to_string(calls_) + " commits " + std::to_string(rows.size()) + " rows");
    }
    bool committed(std::uint64_t batch_id) override {
        ++calls_;
        if (dead_ || (down_ && down_()) || (!healthy_ && rng_.chance(rates_.committed_fail))) {
            note("committed? fails");
            throw idem::error(errc::store_unavailable, "fault store: cannot ask");
        }
        const bool c = disk_.committed(batch_id);
        note(std::string("committed? ") + (c ? "yes" : "no"));
        return c;
    }
    void load(const std::function<void(const idem::stored_record&)>& fn) override {
        ++calls_;
        if (dead_ || (down_ && down_()) || (!healthy_ && rng_.chance(rates_.read_fail))) {
            note("load fails");
            throw idem::error(errc::store_unavailable, "fault store: read failure");
        }
        disk_.load(fn);
    }
    /// A recall's read (transition_sink::recall): latency, outages and seeded read failures.
    std::optional<idem::stored_record> get(std::string_view key) override {
        ++calls_;
        if (spend_) spend_(rates_.latency);
        if (dead_ || (down_ && down_()) || (!healthy_ && rng_.chance(rates_.read_fail))) {
            note("get " + std::string(key) + " fails");
            throw idem::error(errc::store_unavailable, "fault store: read failure");
        }
        return disk_.get(key);
    }
    std::vector<idem::audit_entry> audit(std::string_view key) override { return disk_.audit(key); }
    void scan_audit(const std::function<void(const idem::audit_entry&)>& fn) override { disk_.scan_audit(fn); }
    idem::prune_result prune(const idem::prune_limits& limits) override {
        ++calls_;
        if (dead_ || (down_ && down_()) || (!healthy_ && rng_.chance(rates_.fail_before))) {
            note("prune fails");
            throw idem::error(errc::store_unavailable, "fault store: prune failed");
        }
        const idem::prune_result r = disk_.prune(limits);
        note("prune removes " + std::to_string(r.records) + " records, " + std::to_string(r.audit_rows) + " audit rows" +
             (r.more ? ", more" : ""));
        return r;
    }
    idem::prune_horizon horizon() override { return disk_.horizon(); }
    std::string name() const override { return "fault"; }
    std::uint64_t max_fence() override {
        ++calls_;
        if (dead_ || (down_ && down_()) || (!healthy_ && rng_.chance(rates_.read_fail))) {
            note("max_fence fails");
            throw idem::error(errc::store_unavailable, "fault store: read failure");
        }
        return disk_.max_fence();
    }

private:
    void note(const std::string& s) {
        if (log_) (*log_)("store: " + s);
    }
    [[nodiscard]] bool poisoned(std::string_view k) const {
        for (const auto& p : poison_)
            if (p == k) return true;
        return false;
    }
    idem::store& disk_;
    fault_rates rates_;
    rng rng_;
    trace* log_;
    std::function<void(std::chrono::nanoseconds)> spend_;
    std::function<bool()> down_;
    std::vector<std::string> poison_, declared_;
    bool healthy_ = false;
    bool dead_ = false;
    std::uint64_t calls_ = 0;
};

// ---- flush_pipeline's logic, stepped ------------------------------------------------------------
struct pipeline_options {
    bool sync = false;
    std::size_t queue_capacity = 64;
    std::size_t max_batch = 16;
    std::chrono::nanoseconds sync_timeout = 3s;
    std::chrono::nanoseconds max_backoff = 200ms;
    // The two windows' store side (store_options): the idempotency window, the audit window, and
    // the flusher's prune (every prune_interval, at most prune_rows rows of each kind per call,
    // again at the next turn while the store says there is more). Zero interval: never pruned.
    std::chrono::milliseconds window = idem::forever;
    std::chrono::milliseconds audit_window = idem::forever;
    std::chrono::nanoseconds prune_interval{0};
    std::size_t prune_rows = 10'000;
};

/// The simulation's wall clock is the manual clock in ms: the mapping (detail/recovery/clock_map.hpp)
/// whose base is 0 on both sides. Every stored time is written and read back through it, as a
/// durable guard does through the mapping it takes at start.
constexpr idem::detail::recovery::clock_map sim_wall{std::chrono::nanoseconds(0), 0};
/// A duration in ms; with sim_wall's zero bases, also a manual-clock time's Unix ms.
std::int64_t ms_of(std::chrono::nanoseconds t) { return std::chrono::duration_cast<std::chrono::milliseconds>(t).count(); }

/// The real pipeline core (detail/pipeline/pipeline_core.hpp) driven by hand: what flush_pipeline's thread
/// does, in simulated time. A sync wait runs the flusher in the caller's place.
class sim_pipeline final : public idem::transition_sink {
public:
    sim_pipeline(idem::store& st, pipeline_options o, idem::manual_clock clock, std::uint64_t prefix, trace& log)
        : store_(st),
          o_(o),
          clock_(clock),
          core_(g_mutation == mutation::oversized_queue ? 2 * (o.queue_capacity + o.max_batch) : o.queue_capacity,
                o.max_batch, prefix),
          log_(log) {}

    // transition_sink -------------------------------------------------------------------------
    bool reserve() noexcept override {
        if (dead_) return false;  // the process is gone: nothing reaches the queue
        return core_.try_reserve();
    }
    void unreserve() noexcept override { core_.unreserve(); }
    std::uint64_t offer(const idem::transition& t) noexcept override {
        if (on_offer) on_offer(t);
        if (g_mutation == mutation::dropped_row && ++offers_ % 7 == 0) {  // a pipeline bug: silently lost
            core_.unreserve();
            return std::max<std::uint64_t>(1, core_.issued());
        }
        idem::store_row row;
        row.t = t;
        row.at_ms = sim_wall.to_wall_ms(t.at);
        row.lease_until_ms = t.to == record_state::processing ? sim_wall.to_wall_ms(t.lease_until) : 0;
        const std::uint64_t seq = core_.push(row);
        pending_.push_back({seq, poison && poison(t.k)});
        check_depth();
        return seq;
    }
    idem::durability_wait await(std::uint64_t seq) noexcept override {
        // The caller blocks; here the flusher runs in its place until the row is decided or
        // sync_timeout of simulated time has gone by.
        const auto deadline = clock_.now() + o_.sync_timeout;
        auto done = [&](idem::durability_wait w) {
            if (after_wait) after_wait();  // a racing owner stops here, before its confirm
            return w;
        };
        while (core_.watermark() < seq) {
            if (clock_.now() >= deadline) {
                if (g_mutation == mutation::leaked_reservation) (void)core_.try_reserve();  // never given back
                return done(idem::durability_wait::timed_out);
            }
            if (!step()) clock_.advance(1ms);  // idle_poll
        }
        if (g_mutation == mutation::rejected_as_committed) return done(idem::durability_wait::committed);
        return done(core_.fate(seq) == idem::detail::pipeline::row_fate::rejected ? idem::durability_wait::rejected
                                                                                  : idem::durability_wait::committed);
    }
    bool durable(std::uint64_t seq) const noexcept override {
        if (g_mutation == mutation::durable_lies) return true;
        if (g_mutation == mutation::rejected_as_committed)
            return core_.fate(seq) != idem::detail::pipeline::row_fate::pending;
        return core_.fate(seq) == idem::detail::pipeline::row_fate::committed;
    }
    bool synchronous() const noexcept override { return o_.sync; }
    bool accepts(const idem::key& k, std::string* why) const noexcept override {
        if (g_mutation == mutation::accepts_ignored) return true;
        return store_.accepts(k, why);  // as flush_pipeline does
    }
    /// flush_pipeline::recall: the flusher reads the key's record between two batches and the
    /// caller blocks until it has the answer; here the read runs at once in the caller's place (its
    /// latency spent in simulated time). The record converts as the durable guard converts it
    /// (detail/recovery/clock_map.hpp, to_recalled): a terminal or released record past the window
    /// is no record; its payload comes along. A read that fails: unavailable.
    idem::recalled recall(const idem::key& k) noexcept override {
        ++recalls_;
        idem::recalled none;
        none.found = idem::recalled::kind::unavailable;
        if (dead_) return none;
        std::optional<idem::stored_record> rec;
        try {
            rec = store_.get(k.view());
        } catch (const std::exception&) {
            log_("recall " + std::string(k.view()) + ": unavailable");
            return none;
        }
        if (g_mutation == mutation::recall_forgets) return {};  // a sink bug: the store's answer is ignored
        idem::recalled out;
        try {
            out = idem::detail::recovery::to_recalled(rec ? &*rec : nullptr, sim_wall, {o_.window},
                                                      sim_wall.to_wall_ms(clock_.now()), store_);
        } catch (const std::exception& e) {  // a stored time the mapping cannot hold (flush_pipeline: unavailable)
            log_("recall " + std::string(k.view()) + ": " + e.what());
            return none;
        }
        if (out.found != idem::recalled::kind::record) {
            log_("recall " + std::string(k.view()) + ": " + (rec ? "past the window" : "no record"));
            return out;
        }
        if (g_mutation == mutation::payload_dropped) out.payload.clear();  // a sink bug: the bytes are lost
        log_("recall " + std::string(k.view()) + ": " + idem::to_string(rec->state) + " fence " +
             std::to_string(rec->fence) +
             (out.payload.empty() ? "" : ", " + std::to_string(out.payload.size()) + " payload bytes"));
        ++recalled_;
        return out;
    }

    /// Called with every transition offered, in offer order (the simulation's observer).
    std::function<void(const idem::transition&)> on_offer;
    /// Whether the store can never take rows of this key (the simulation's poison keys).
    std::function<bool(const idem::key&)> poison;
    /// Called with every violation the pipeline's own checks find.
    std::function<void(const std::string&)> on_problem;
    /// Called before every prune (the simulation notes the fences the store holds).
    std::function<void(const idem::prune_limits&)> before_prune;
    /// Called when a sync wait ends, before await() returns to the owner (the confirm race).
    std::function<void()> after_wait;

    // the flusher ----------------------------------------------------------------------------
    /// One turn of flush_pipeline::run: one step of the core, backing off on failure. True when
    /// something was attempted.
    bool step() {
        prune_if_due();
        const auto result = core_.step(store_);
        settle();
        check_depth();
        switch (result) {
            case idem::detail::pipeline::pipeline_core::step_result::idle: return false;
            case idem::detail::pipeline::pipeline_core::step_result::progress: backoff_ = 1ms; return true;
            case idem::detail::pipeline::pipeline_core::step_result::failed: break;
        }
        clock_.advance(backoff_);
        backoff_ = std::min<std::chrono::nanoseconds>(backoff_ * 2, o_.max_backoff);
        store_.reconnect();
        return true;
    }
    [[nodiscard]] bool drained() const { return core_.drained(); }
    /// The guard's flush marks (flush_pipeline::issued and decided_through): the last sequence
    /// number handed out, and whether every row up to seq is decided (committed or set aside).
    [[nodiscard]] std::uint64_t issued() const { return core_.issued(); }
    [[nodiscard]] bool decided(std::uint64_t seq) const { return core_.watermark() >= seq; }
    [[nodiscard]] std::uint64_t depth() const { return core_.depth(); }
    [[nodiscard]] std::uint64_t max_depth() const { return max_depth_; }
    [[nodiscard]] std::uint64_t in_doubt() const { return core_.snapshot().commit_unknown; }
    [[nodiscard]] std::uint64_t unanswered() const { return core_.snapshot().unanswered; }
    [[nodiscard]] std::uint64_t rejected() const { return core_.snapshot().rejected; }
    [[nodiscard]] std::uint64_t recalls() const { return recalls_; }
    [[nodiscard]] std::uint64_t recalled_records() const { return recalled_; }
    [[nodiscard]] std::uint64_t prunes() const { return prunes_; }
    [[nodiscard]] std::uint64_t pruned_records() const { return pruned_records_; }
    [[nodiscard]] std::uint64_t pruned_audit_rows() const { return pruned_audit_; }
    void crash() {
        dead_ = true;
        (void)core_.abandon();
    }

private:
    /// flush_pipeline::prune_if_due in simulated time: one bounded store::prune every
    /// prune_interval, again at the next turn while the store reports more; a failure waits for the
    /// next interval.
    void prune_if_due() {
        if (o_.prune_interval <= std::chrono::nanoseconds::zero() || dead_) return;
        const bool records = o_.window != idem::forever, audit = o_.audit_window != idem::forever;
        if (!records && !audit) return;
        const auto now = clock_.now();
        if (now < next_prune_) return;
        idem::prune_limits limits;
        limits.max_rows = o_.prune_rows;
        if (records) limits.records_before_ms = ms_of(now) - o_.window.count();
        if (audit) limits.audit_before_ms = ms_of(now) - o_.audit_window.count();
        next_prune_ = now + o_.prune_interval;
        if (before_prune) before_prune(limits);
        try {
            const idem::prune_result r = store_.prune(limits);
            ++prunes_;
            pruned_records_ += r.records;
            pruned_audit_ += r.audit_rows;
            if (r.more) next_prune_ = now;
        } catch (const std::exception&) {
        }
    }

    /// Every row the watermark passed was decided as the store demands: set aside when it holds a
    /// poison key, committed otherwise (so a poison row never takes innocent rows down with it).
    void settle() {
        const std::uint64_t w = core_.watermark();
        while (!pending_.empty() && pending_.front().seq <= w) {
            const auto [seq, poisoned] = pending_.front();
            pending_.pop_front();
            const bool rejected = core_.fate(seq) == idem::detail::pipeline::row_fate::rejected;
            if (rejected != poisoned && on_problem)
                on_problem("row seq " + std::to_string(seq) +
                           (poisoned ? " of a poison key was not set aside" : " of a storable key was set aside"));
        }
    }
    /// Rows pushed and undecided never exceed queue_capacity + max_batch (store_options' bound).
    void check_depth() {
        const std::uint64_t d = core_.depth();
        max_depth_ = std::max(max_depth_, d);
        if (d > o_.queue_capacity + o_.max_batch && on_problem)
            on_problem("queue depth " + std::to_string(d) +
                       " exceeds queue_capacity + max_batch = " + std::to_string(o_.queue_capacity + o_.max_batch));
    }

    struct pending_row {
        std::uint64_t seq;
        bool poison;
    };

    idem::store& store_;
    pipeline_options o_;
    idem::manual_clock clock_;
    idem::detail::pipeline::pipeline_core core_;
    trace& log_;
    std::chrono::nanoseconds backoff_ = 1ms;
    std::uint64_t offers_ = 0, max_depth_ = 0;
    std::uint64_t recalls_ = 0, recalled_ = 0, prunes_ = 0, pruned_records_ = 0, pruned_audit_ = 0;
    std::chrono::nanoseconds next_prune_{0};
    std::deque<pending_row> pending_;  ///< pushed rows not yet passed by the watermark, in seq order
    bool dead_ = false;
};

// ---- the downstream system the effects happen in ------------------------------------------------
constexpr std::size_t key_count = 96;  ///< the clients' keys at most (a seed uses nkeys_ of them)
constexpr std::size_t no_key = ~std::size_t{0};
std::uint64_t outcome_of(std::size_t k) { return 1000 + k; }

struct execution {
    std::uint64_t fence;
    bool orphan = false;  ///< async: a crash lost the claim it ran under (the store never heard of it)
};

/// The downstream's view of one key. A key evicted from memory and claimed again starts a new life
/// (the state machine: "retention elapsed ... evicted"; idem::verify counts it as reopened), in
/// which its operation may run once more. Lives are delimited by the claims offered to the pipeline
/// from ABSENT while the key's last transition left it terminal or released; the simulation checks
/// that each such reopening was allowed (the record could have been evicted), so that a wrong
/// ABSENT claim cannot hide a double execution.
struct key_ledger {
    std::vector<std::uint64_t> life_starts{0};  ///< the fence that opened each life
    std::vector<execution> executed;            ///< the effects that happened, by fence
    std::uint64_t floor = 0;                    ///< the downstream refuses fences below
    // the simulation's view of the key's last transition
    record_state last = record_state::absent;
    std::chrono::nanoseconds last_at{0};
    std::uint64_t rotations_at = 0;
    std::uint64_t max_fence = 0;  ///< the largest fence offered for the key in this process life
    /// A restart found no record of a key whose last transition the simulation saw (a prune removed
    /// it, or an async crash lost it): its next claim from ABSENT opens a new life.
    bool reopen_next = false;
    std::uint64_t max_fence_ever = 0;     ///< the largest fence offered for the key in any process life
    std::uint64_t stored_fence = 0;       ///< the largest fence the store held for the key (read before every prune)
    std::int64_t decided_ms = INT64_MIN;  ///< the time of its latest terminal transition (any process life)
    [[nodiscard]] std::size_t life_of(std::uint64_t fence) const {
        return static_cast<std::size_t>(std::upper_bound(life_starts.begin(), life_starts.end(), fence) -
                                        life_starts.begin()) -
               1;
    }
    [[nodiscard]] bool ran_in_life_of(std::uint64_t fence) const {
        const std::size_t l = life_of(fence);
        return std::any_of(executed.begin(), executed.end(), [&](const execution& e) { return life_of(e.fence) == l; });
    }
};

// ---- one seed -------------------------------------------------------------------------------------
struct outcome {
    bool ok = true;
    std::vector<std::string> problems;
    std::uint64_t trace_hash = 0;
    std::uint64_t steps = 0, crashes = 0, executions = 0, async_losses = 0, store_calls = 0, faults = 0;
    std::uint64_t in_doubt_batches = 0, unanswered = 0, orphans = 0, store_unavailable = 0, reopened = 0, outages = 0;
    // the durable path under overload and faults
    std::uint64_t long_outages = 0;  ///< outages longer than sync_timeout
    std::uint64_t probes = 0;        ///< liveness probes passed (a key acquired after an outage, and at the end)
    std::uint64_t fresh_probes = 0;  ///< ... with a key the table did not know (a new index position)
    std::uint64_t probe_ms_max = 0;  ///< longest simulated time a probe needed
    std::uint64_t poison_keys = 0, rejected_rows = 0;
    std::uint64_t invalid_declared = 0;  ///< begin() answered invalid_key up front (store::accepts)
    std::uint64_t invalid_rejected = 0;  ///< sync begin() answered invalid_key after the store set the claim aside
    std::uint64_t set_aside_acks = 0;    ///< async acknowledgements of poison keys, set aside (allowed)
    std::uint64_t refusals = 0;          ///< backpressure answers checked to change nothing
    std::uint64_t spins = 0;             ///< immediate retries after backpressure
    std::uint64_t fence_checks = 0;      ///< claims after refusals whose fence was checked
    std::uint64_t max_depth = 0, depth_bound = 0;
    std::uint64_t visible_checks = 0;  ///< sync terminal results seen and found in the store
    // the two windows
    bool short_window = false;                ///< the seed's idempotency window is seconds long
    bool audit_pruned = false;                ///< ... and it has an audit window
    bool big_store = false;                   ///< the seed has at least 4 times more keys than capacity
    std::uint64_t recalls = 0, recalled = 0;  ///< recall() calls of the sink; records it answered with
    std::uint64_t prunes = 0, pruned_records = 0, pruned_audit_rows = 0;
    std::uint64_t cold_at_start = 0;        ///< records recovery gave to the cold window
    std::uint64_t expired_at_start = 0;     ///< records recovery skipped (past the window)
    std::uint64_t hot_at_start = 0;         ///< terminal and released records recovery put in memory
    std::uint64_t claims_first_starts = 0;  ///< starts by recovery_start::claims_first (claims, then the stream)
    std::uint64_t streams_retried = 0;      ///< window streams the store broke, started again later
    std::uint64_t max_store_records = 0;    ///< the largest store a recovery read (records)
    std::uint64_t grant_checks = 0;         ///< grants checked against the store's decisions in the window
    std::uint64_t window_reopened = 0;      ///< claims granted after a terminal decision went past the window
    std::uint64_t old_retries = 0;          ///< begin() of a key that completed before
    std::uint64_t old_duplicates = 0;       ///< ... answered with its decision
    std::uint64_t long_pauses = 0;          ///< clock jumps of seconds to minutes (past retention or the window)
    // the rotation's fixes
    bool interleaved = false;             ///< the guard ran on sim_atomic
    bool versioned = false;               ///< ordered versions
    std::uint64_t races = 0;              ///< sync confirms that waited while maintenance ran
    std::uint64_t races_in_rotation = 0;  ///< ... that ran inside a rotation (between two loads of one atomic)
    std::uint64_t superseded = 0;         ///< superseded answers checked
    std::uint64_t superseded_ran = 0;     ///< ... given while the store held the key's record (violations)
    std::uint64_t steady_runs = 0, steady_skipped = 0, steady_claims = 0, steady_collects = 0, steady_rotations = 0;
    // payloads
    bool payloads = false;             ///< completions carry response bytes
    std::uint64_t payload_checks = 0;  ///< succeeded answers whose (non-empty) bytes were checked
    std::uint64_t payload_bytes_checked = 0;
    idem::stats guard;  ///< the guards' counters, summed over the seed's process lives
};

void add(idem::stats& a, const idem::stats& b) {
    a.acquired += b.acquired;
    a.duplicates += b.duplicates;
    a.in_progress_hits += b.in_progress_hits;
    a.succeeded += b.succeeded;
    a.released += b.released;
    a.stale_tickets += b.stale_tickets;
    a.in_doubt += b.in_doubt;
    a.compensated += b.compensated;
    a.backpressure += b.backpressure;
    a.evicted += b.evicted;
    a.rotations += b.rotations;
    a.recalls += b.recalls;
    a.recalled += b.recalled;
    a.recall_failures += b.recall_failures;
    a.capacity_exhausted += b.capacity_exhausted;
    a.cold_keys = std::max(a.cold_keys, b.cold_keys);
}

bool same(const idem::record_view& a, const idem::record_view& b) {
    return a.state == b.state && a.fence == b.fence && a.outcome == b.outcome && a.fingerprint == b.fingerprint &&
           a.in_doubt == b.in_doubt && a.lease_until == b.lease_until;
}

std::string show(const idem::record_view& v) {
    return std::string(idem::to_string(v.state)) + (v.in_doubt ? " in doubt" : "") + " fence " + std::to_string(v.fence) +
           " outcome " + std::to_string(v.outcome);
}

template <template <class> class Atomic>
class simulation {
    using sim_guard = idem::basic_guard<Atomic, idem::manual_clock>;
    using sim_ticket = idem::basic_ticket<Atomic, idem::manual_clock>;

public:
    /// The guard runs on sim_atomic: owners' sync confirms can race rotations (see coop).
    static constexpr bool interleaved = !std::is_same_v<Atomic<std::uint64_t>, std::atomic<std::uint64_t>>;

    simulation(std::uint64_t seed, bool print) : seed_(seed), r_(seed), rx_(mix(seed, 0x5eed)) {
        g_entropy = seed * 0x9e3779b97f4a7c15ull | 1;  // every guard of this seed hashes the same way
        log_.print = print;
        // Ordered versions (options.ordered_versions): the clients' keys are versions 1 to V of a
        // few (txid, operation) pairs, key k being version 1 + k % V of TX<k / V>_PAY. The new
        // features draw from rx_, so the other draws of a seed stay as they were.
        if (g_flags.windows && rx_.chance(0.25)) versions_ = 2 + rx_.below(3);
        for (std::size_t k = 0; k < key_count; ++k)
            remember(versions_ != 0 ? idem::key::compose("TX" + std::to_string(k / versions_), "PAY",
                                                         static_cast<std::uint32_t>(1 + k % versions_))
                                    : idem::key("TX" + std::to_string(k) + "_PAY_v1"));
        sync_ = r_.chance(0.5);
        // Fault mix: some seeds are calm, some stormy.
        const auto pick = [&](std::initializer_list<double> v) { return *(v.begin() + r_.below(v.size())); };
        rates_.fail_before = pick({0.0, 0.05, 0.3});
        rates_.unknown_done = pick({0.0, 0.05, 0.2});
        rates_.unknown_lost = pick({0.0, 0.05, 0.2});
        rates_.committed_fail = pick({0.0, 0.3, 0.9});
        if (!g_flags.committed_faults) rates_.committed_fail = 0;
        rates_.read_fail = pick({0.0, 0.3});
        rates_.latency = std::chrono::milliseconds(static_cast<std::int64_t>(pick({0, 5, 50})));
        po_.sync = sync_;
        // Small queues (2 to 4 rows) make backpressure common, so refusals and spinning callers
        // meet every fault.
        po_.queue_capacity = r_.chance(0.35) ? 2 + r_.below(3) : 64;
        po_.max_batch = 1 + r_.below(16);
        po_.sync_timeout = r_.chance(0.3) ? 300ms : 3s;
        unknown_rate_ = pick({0.0, 0.2, 0.6});
        clients_ = 2 + r_.below(3);
        steps_ = 200 + r_.below(400);
        crashes_left_ = r_.below(3);
        // The two windows. Tables: the old one (capacity 8: 16 slots a generation for 12 keys), small
        // ones that rotate every few claims, and big stores (4 to 12 times more keys than capacity,
        // up to 96) that recovery cannot hold in memory. Retention (the hot window) from 3 s down to
        // 0; the idempotency window forever, 7 days, or a few seconds so keys expire and are claimed
        // again; prunes every 0.5 or 2 s, some bounded to 1 or 3 rows a call, some seeds with an
        // audit window; clients that retry keys which completed; long pauses of the clock.
        if (g_flags.windows) {
            const std::uint64_t table = r_.below(20);
            if (table >= 8) capacity_ = 3 + r_.below(table >= 13 ? 6 : 3);
            if (table >= 13) {
                nkeys_ = std::min<std::size_t>(key_count, capacity_ * (4 + r_.below(9)));
                out_.big_store = true;
                crashes_left_ = 1 + r_.below(3);
            } else if (r_.chance(0.15)) {
                nkeys_ = 2 + r_.below(3);  // a few hot keys, retried all the time
            }
            retention_ = std::chrono::milliseconds(static_cast<std::int64_t>(pick({3000, 1000, 200, 0})));
            const std::uint64_t w = r_.below(20);
            if (w >= 12) {
                po_.window = std::chrono::milliseconds(4000 + 1000 * static_cast<std::int64_t>(r_.below(12)));
                out_.short_window = true;
            } else if (w >= 6) {
                po_.window = std::chrono::hours(24 * 7);  // store_options' default
            }
            if ((out_.short_window && r_.chance(0.4)) || r_.chance(0.05)) {
                po_.audit_window = std::chrono::milliseconds(6000 + 1000 * static_cast<std::int64_t>(r_.below(15)));
                out_.audit_pruned = true;
            }
            po_.prune_interval = std::chrono::milliseconds(static_cast<std::int64_t>(pick({500, 2000, 2000, 0})));
            po_.prune_rows = static_cast<std::size_t>(pick({1, 3, 10000, 10000}));
            retry_old_ = pick({0.0, 0.3, 0.6});
            pause_rate_ = pick({0.0, 0.01, 0.03});
        }
        // Poison keys: rows the store can never take. Some are declared through store::accepts
        // (begin answers invalid_key up front), the others only apply() finds.
        std::vector<std::string> poison, declared;
        if (r_.chance(0.4)) {
            for (std::uint64_t n = 1 + r_.below(2); n > 0; --n) {
                const std::size_t k = r_.below(nkeys_);
                if (poison_[k]) continue;
                poison_[k] = true;
                declared_[k] = r_.chance(0.5);
                poison.emplace_back(keys_[k].view());
                if (declared_[k]) declared.emplace_back(keys_[k].view());
                ++out_.poison_keys;
            }
        }
        // Spinning callers retry begin() and succeed() at once on backpressure, up to spin_limit_
        // times; the flusher (a thread of its own in flush_pipeline) gets a turn between two
        // retries at a seeded rate.
        for (std::uint64_t i = 0; i < clients_; ++i) cl_[i].spinner = r_.chance(0.35);
        spin_limit_ = 16 + r_.below(240);
        spin_step_ = pick({1.0 / 32, 1.0 / 8, 0.5});
        // The features for the rotation's fixes (docs/testing.md): confirms racing rotations in
        // sync seeds of the interleaving engine (mostly with retention 0, so a record whose owner
        // is confirming is old enough to leave); ordered-version seeds mostly with small tables
        // (versions evicted into the cold window while a newer one is in memory); and in async
        // seeds, a steady load at the end that keeps rows in the queue while rotation must go on.
        if (interleaved && sync_ && g_flags.windows) {
            race_rate_ = rx_.chance(0.5) ? 1.0 : 0.5;
            if (rx_.chance(0.7)) retention_ = 0ms;
        }
        if (versions_ != 0 && !out_.big_store && rx_.chance(0.7)) capacity_ = 3 + rx_.below(3);
        steady_ = g_flags.windows && !sync_;
        // Payloads draw from a stream of their own, so every other draw of a seed stays as it was.
        // Not on the interleaving engine: a table on other atomic types than std::atomic keeps one
        // 64-byte chunk of payload per index position and hands the sink an empty view of the bytes
        // (detail/table/arenas.hpp, payload_arena: sized for model checkers, which run without a sink).
        {
            rng rp(mix(seed, 0xb17e5));
            const std::uint64_t mode = rp.below(4);
            payload_max_ = interleaved || mode == 0 ? 0 : mode == 1 ? 15 : 3000;
            out_.payloads = payload_max_ != 0;
        }
        out_.depth_bound = po_.queue_capacity + po_.max_batch;
        std::string poison_text;
        for (std::size_t k = 0; k < nkeys_; ++k)
            if (poison_[k]) poison_text += " " + std::to_string(k) + (declared_[k] ? "(declared)" : "");
        log_("seed " + std::to_string(seed) + (sync_ ? " sync" : " async") + " clients " + std::to_string(clients_) +
             " steps " + std::to_string(steps_) + " crashes<=" + std::to_string(crashes_left_) + " queue " +
             std::to_string(po_.queue_capacity) + " batch " + std::to_string(po_.max_batch) +
             " poison keys:" + (poison_text.empty() ? " none" : poison_text) + " spin limit " + std::to_string(spin_limit_) +
             " keys " + std::to_string(nkeys_) + " capacity " + std::to_string(capacity_) + " retention " +
             std::to_string(retention_.count()) + "ms window " +
             (po_.window == idem::forever ? std::string("forever") : std::to_string(po_.window.count()) + "ms") +
             " audit window " +
             (po_.audit_window == idem::forever ? std::string("forever") : std::to_string(po_.audit_window.count()) + "ms") +
             " prune every " + std::to_string(ms_of(po_.prune_interval)) + "ms (" + std::to_string(po_.prune_rows) +
             " rows)" + (versions_ ? " versions " + std::to_string(versions_) : std::string()) +
             (race_rate_ > 0 ? " confirm races " + std::to_string(race_rate_) : std::string()) +
             (interleaved ? " (interleaving engine)" : "") +
             (payload_max_ ? " payloads up to " + std::to_string(payload_max_) + " bytes" : ""));
        store_ = std::make_unique<fault_store>(disk_, rates_, mix(seed, 7), &log_,
                                               [this](std::chrono::nanoseconds d) { clock_.advance(d); });
        store_->set_outage([this] { return clock_.now() < outage_until_; });
        store_->set_poison(std::move(poison), std::move(declared));
        out_.interleaved = interleaved;
        out_.versioned = versions_ != 0;
        start();
    }

    outcome run() {
        for (std::uint64_t s = 0; s < steps_; ++s) {
            ++out_.steps;
            if (stream_pending_ && out_.steps >= stream_at_) stream_cold();
            if (outage_active_ && clock_.now() >= outage_until_) {
                outage_active_ = false;
                log_("outage over");
                probe();
            }
            if (sync_ && (s & 15) == 0) sweep();
            if (pause_rate_ > 0 && r_.chance(pause_rate_)) {
                // A long pause: past the retention, and in short-window seeds up to twice the window
                // (keys expire and are claimed again).
                const std::uint64_t most = po_.window == idem::forever || po_.window > 60s
                                               ? 30'000
                                               : 2 * static_cast<std::uint64_t>(po_.window.count());
                const auto d = std::chrono::milliseconds(1000 + r_.below(most));
                clock_.advance(d);
                ++out_.long_pauses;
                log_("clock +" + std::to_string(d.count()) + "ms (a long pause)");
                if (out_.short_window && crashes_left_ > 0 && r_.chance(0.3)) {
                    // An idle process restarted after the window went by: its flusher pruned first.
                    for (int n = 0; n < 200; ++n) pipe_->step();
                    --crashes_left_;
                    crash();
                }
            }
            const std::uint64_t a = r_.below(100);
            if (a < 55) {
                client_step(r_.below(clients_));
            } else if (a < 65) {
                const auto d = std::chrono::milliseconds(r_.below(600));
                clock_.advance(d);
                log_("clock +" + std::to_string(d.count()) + "ms");
            } else if (a < 73) {
                maintain();
            } else if (a < 90) {
                pipe_->step();
            } else if (a < 96) {
                store_->set_healthy(!r_.chance(0.6));
            } else if (a < 97) {
                // Outages of every length: shorter than sync_timeout, and up to four times longer
                // (sync waits time out; the queue fills; callers see backpressure).
                const auto to = std::chrono::duration_cast<std::chrono::milliseconds>(po_.sync_timeout);
                const auto d = r_.chance(0.5)
                                   ? std::chrono::milliseconds(r_.below(static_cast<std::uint64_t>(to.count())))
                                   : to + std::chrono::milliseconds(r_.below(3 * static_cast<std::uint64_t>(to.count())));
                outage_until_ = std::max(outage_until_, clock_.now() + d);
                outage_active_ = true;
                ++out_.outages;
                out_.long_outages += d > po_.sync_timeout;
                log_("store outage for " + std::to_string(d.count()) + "ms");
            } else if (crashes_left_ > 0 && a < 99) {
                --crashes_left_;
                crash();
            }
        }
        finish();
        out_.trace_hash = log_.hash;
        out_.store_calls = store_->calls();
        return out_;
    }

private:
    struct client {
        enum { idle, holding, executed } st = idle;
        std::optional<sim_ticket> t;
        std::size_t k = 0;
        std::uint64_t fence = 0;
        bool spinner = false;           ///< retries at once on backpressure
        std::size_t next_key = no_key;  ///< the key of its next begin() (after a confirm race)
    };

    void problem(const std::string& p) {
        out_.ok = false;
        out_.problems.push_back(p);
        log_("PROBLEM: " + p);
    }
    void dump_trail(std::size_t k) {
        for (const auto& a : disk_.audit(key(k).view()))
            log_("  audit " + std::to_string(a.sequence) + ": " + idem::to_string(a.from) + " -> " + idem::to_string(a.to) +
                 " fence " + std::to_string(a.fence) + " (" + a.detail + ")");
    }

    /// Keys 0..key_count-1 are the clients' (TXk_PAY_v1, or the versions of ordered seeds);
    /// key_count and key_count + 1 are the liveness probe's (NEW0_PAY_v1, NEW1_PAY_v1); from
    /// load_base on, the steady load's fresh keys (LDn_PAY_v1).
    static constexpr std::size_t load_base = key_count + 2;
    const idem::key& key(std::size_t k) {
        while (keys_.size() <= k) {
            const std::size_t n = keys_.size();
            remember(idem::key(n < load_base ? "NEW" + std::to_string(n - key_count) + "_PAY_v1"
                                             : "LD" + std::to_string(n - load_base) + "_PAY_v1"));
        }
        return keys_[k];
    }
    void remember(idem::key k) {
        index_.emplace(std::string(k.view()), keys_.size());
        keys_.push_back(std::move(k));
    }
    [[nodiscard]] std::size_t index_of(std::string_view text) const {
        const auto it = index_.find(std::string(text));
        return it == index_.end() ? no_key : it->second;
    }
    [[nodiscard]] bool poisoned(std::size_t k) const { return k < key_count && poison_[k]; }

    /// Whether a record last updated at `updated_ms` is past the idempotency window at `now_ms`: the
    /// durable guard's rule (detail/recovery/clock_map.hpp, window).
    [[nodiscard]] bool past_window(std::int64_t updated_ms, std::int64_t now_ms) const {
        return idem::detail::recovery::window{po_.window}.past(updated_ms, now_ms);
    }

    /// The response bytes a completion of key k records (and the resolver finds): none in seeds
    /// without payloads, else 1 to 15 bytes (a string's small buffer) or up to 3,000, NUL and high
    /// bytes included. A function of the key, so a duplicate's bytes can be checked at any time.
    [[nodiscard]] std::string payload_of(std::size_t k) const {
        if (payload_max_ == 0 || k >= key_count) return {};
        const std::size_t n = 1 + (k * 2654435761u + seed_) % payload_max_;
        std::string p(n, '\0');
        for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<char>((k * 131 + i * 7 + seed_) & 0xff);
        return p;
    }
    /// A succeeded answer (begin(), query()) of key k carries k's bytes.
    void check_payload(std::size_t k, const std::string& got, const char* via) {
        const std::string want = payload_of(k);
        if (!want.empty()) {
            ++out_.payload_checks;
            out_.payload_bytes_checked += want.size();
        }
        if (got == want) return;
        problem("key " + std::to_string(k) + ": " + via + " replayed payload of " + std::to_string(got.size()) +
                " bytes, not its " + std::to_string(want.size()) + " recorded bytes");
        dump_trail(k);
    }

    idem::options guard_options() {
        idem::options o;
        o.capacity = capacity_;  // 8: 16 slots a generation for 12 keys; 4 new keys make it due for rotation
        o.lease = 1s;
        o.retention = retention_;
        o.maintenance_interval = {};
        o.on_failure = idem::failure_policy::retryable;
        o.ordered_versions = versions_ != 0;
        o.resolve = [this](const idem::expired_claim& c) { return resolve(c); };
        return o;
    }

    /// A process start: pipeline, guard, recovery (durable_guard::recover), compensation.
    void start() {
        tried_.clear();  // memory's versions die with the process; recovery restores the store's
        granted_.clear();
        ++life_;
        for (int attempt = 0;; ++attempt) {
            // flush_pipeline: batch ids are a random 31-bit prefix per process | a counter
            pipe_ = std::make_unique<sim_pipeline>(
                *store_, po_, clock_, (mix(seed_, 11, incarnation_ * 64 + attempt) << 32) & 0x7fffffff00000000ull, log_);
            pipe_->on_offer = [this](const idem::transition& t) { observe(t); };
            pipe_->poison = [this](const idem::key& k) { return poisoned(index_of(k.view())); };
            pipe_->on_problem = [this](const std::string& p) { problem(p); };
            pipe_->before_prune = [this](const idem::prune_limits& l) { note_before_prune(l); };
            pipe_->after_wait = [] {
                if (t_on_worker) the_coop().yield();  // a racing owner: its wait is over, its confirm to come
            };
            g_.emplace(guard_options(), clock_, pipe_.get(), /*defer_maintenance=*/true);
            idem::detail::guard_access::enable_cold_window(*g_, idem::detail::recovery::window{po_.window}.on_clock());
            try {
                // Recovery by the durable guard's code (detail/recovery/recover.hpp), each restored
                // record's version noted first (note_restored). Two mutations replace one step.
                namespace rec = idem::detail::recovery;
                const rec::window w{po_.window};
                const auto note = [this](const idem::stored_record& r) { note_restored(r.key); };
                rec::tally t;
                // recovery_start::claims_first in one start of three without ordered versions (as
                // durable_guard: versions are seeded from every record): the claims in flight and
                // the fence floor now, the window's keys streamed into the cold window at a later
                // step (stream_cold), every miss read from the store until then.
                stream_pending_ = false;
                const bool claims_first =
                    versions_ == 0 && (mix(seed_, 19, incarnation_ * 64 + static_cast<std::uint64_t>(attempt)) % 3 == 0 ||
                                       g_mutation == mutation::stream_completed_early);
                if (claims_first) {
                    t = rec::load_claims(*g_, *store_, sim_wall);
                    if (g_mutation == mutation::stream_completed_early)
                        (void)idem::detail::guard_access::remember_cold(*g_, {}, /*completes=*/true);
                    stream_pending_ = true;
                    stream_at_ = out_.steps + mix(seed_, 23, incarnation_) % 300;
                    ++out_.claims_first_starts;
                } else if (g_mutation == mutation::cold_dropped || g_mutation == mutation::loaded_fence_floor) {
                    rec::loaded l = rec::load(*g_, *store_, sim_wall, w, note);
                    if (g_mutation == mutation::cold_dropped) l.cold.clear();  // the cold window learns nothing
                    const std::uint64_t floor = g_mutation == mutation::loaded_fence_floor
                                                    ? l.max_fence  // pruned fences forgotten
                                                    : rec::fence_floor(*store_, l.max_fence);
                    rec::install(*g_, *store_, l, floor);
                    t = l.counts;
                } else {
                    t = rec::recover(*g_, *store_, sim_wall, w, note);
                }
                out_.cold_at_start += t.cold;
                out_.expired_at_start += t.expired;
                out_.hot_at_start += t.records;
                out_.max_store_records = std::max<std::uint64_t>(out_.max_store_records, t.seen);
                log_("recovery: " + std::to_string(t.seen) + " records (" + std::to_string(t.processing) + " claims), " +
                     std::to_string(t.records) + " in memory, " + std::to_string(t.cold) + " cold, " +
                     std::to_string(t.expired) + " past the window");
                break;
            } catch (const idem::error& e) {
                if (e.kind() == errc::capacity_exhausted) {  // more claims in flight than the table holds
                    problem(std::string("recovery: ") + e.what());
                    break;
                }
                // The process restarts, backing off (100 ms doubling up to 1.6 s) while the store
                // refuses reads.
                log_(std::string("recovery failed: ") + e.what() + "; restarting");
                g_.reset();
                clock_.advance(100ms * (std::int64_t{1} << std::min(attempt, 4)));
                if (attempt > 50) store_->set_healthy(true);
            }
        }
        // The rotation's durability condition, as durable_guard wires it: a mark (issued() after a
        // passing scan) and whether the store decided every row up to it. The mutation
        // drained_marks wires the old condition (everything offered so far decided).
        if (g_mutation == mutation::drained_marks)
            idem::detail::guard_access::set_all_flushed(*g_, [this] { return pipe_->drained(); });
        else
            idem::detail::guard_access::set_flush_marks(
                *g_, [this] { return pipe_->issued(); }, [this](std::uint64_t seq) { return pipe_->decided(seq); });

        // The simulation's view of every key restarts from the store, as the new table does.
        for (auto& [k, kl] : ledger_) {
            const auto rec = disk_.get(key(k).view());
            if (!rec && kl.last != record_state::absent) kl.reopen_next = true;
            if (rec) kl.stored_fence = std::max(kl.stored_fence, rec->fence);
            kl.last = rec ? rec->state : record_state::absent;
            kl.last_at = rec ? std::chrono::milliseconds(rec->updated_ms) : clock_.now();
            kl.rotations_at = rotations_;
            kl.max_fence = rec ? rec->fence : 0;
        }
        ++incarnation_;
        log_("start #" + std::to_string(incarnation_) + ", compensated " + std::to_string(g_->compensate()));
    }

    /// claims_first: the window's keys streamed into the cold window, by the durable guard's code
    /// (detail/recovery/recover.hpp, stream_window_keys), at one step of the life (the guard's
    /// thread does it beside the callers; here the operations before it meet a partial filter). A
    /// stream the store breaks starts again 50 steps later, as the guard's does after a pause.
    void stream_cold() {
        namespace rec = idem::detail::recovery;
        try {
            const rec::tally t = rec::stream_window_keys(*g_, *store_, sim_wall, rec::window{po_.window},
                                                         sim_wall.to_wall_ms(g_->now()), [] { return false; });
            stream_pending_ = false;
            out_.cold_at_start += t.cold;
            out_.expired_at_start += t.expired;
            log_("cold window streamed: " + std::to_string(t.cold) + " keys, " + std::to_string(t.expired) +
                 " past the window");
        } catch (const idem::error& e) {
            stream_at_ = out_.steps + 50;
            ++out_.streams_retried;
            log_(std::string("cold window stream failed: ") + e.what() + "; again later");
        }
    }

    /// Every transition the queue took. A claim from ABSENT on a key whose last transition left it
    /// terminal or released opens a new life, and is allowed only when memory could have forgotten
    /// the record: a released record after a rotation (rotation evicts it, the cold window does not
    /// take it) or past the idempotency window; a terminal record only past the window (rotation
    /// gives it to the cold window, which answers from the store until then). A poison key's
    /// records never reach the store, so memory is their only record: a rotation since is enough
    /// (with a cold window, a rotation under pressure, a current generation holding
    /// options.capacity records, evicts terminal records whatever their age). A claim from ABSENT
    /// after a restart found the key's record gone (pruned, or lost by an async crash) opens a new
    /// life, whatever its fence: an async claim a crash lost may have had a higher fence than the
    /// new process gives (its fences start above the store's), and the lives merge as below.
    void observe(const idem::transition& t) {
        const std::size_t k = index_of(t.k.view());
        if (k == no_key) return problem("a transition for an unknown key");
        if (k < key_count && declared_[k])
            problem("a transition of key " + std::to_string(k) + ", which store::accepts refuses, reached the queue");
        key_ledger& kl = ledger_[k];
        kl.max_fence = std::max(kl.max_fence, t.fence);
        if (t.to == record_state::processing && t.from == record_state::absent && t.fence <= kl.stored_fence)
            problem("key " + std::to_string(k) + " claimed from ABSENT with fence " + std::to_string(t.fence) +
                    ", not above the fence " + std::to_string(kl.stored_fence) + " the store held for it");
        if (t.to == record_state::processing && t.from == record_state::absent &&
            (kl.last != record_state::absent || kl.reopen_next)) {
            if (kl.last != record_state::absent) {
                const bool terminal = kl.last == record_state::succeeded || kl.last == record_state::failed;
                // Now, not t.at: the claim's time was read before a recall's latency.
                const bool past = past_window(ms_of(kl.last_at), ms_of(clock_.now()));
                const bool rotated = rotations_ > kl.rotations_at;
                const bool legal = kl.last == record_state::released ? rotated || past
                                   : !terminal                       ? false
                                   : poisoned(k)                     ? rotated
                                                                     : past;
                if (!legal)
                    problem("key " + std::to_string(k) + " claimed from ABSENT (fence " + std::to_string(t.fence) +
                            ") while its " + idem::to_string(kl.last) + " record of " + std::to_string(ms_of(kl.last_at)) +
                            " ms could not have been forgotten (" +
                            (terminal ? "inside the idempotency window" : "no rotation since") + ", now " +
                            std::to_string(ms_of(clock_.now())) + " ms)");
                if (terminal && past) ++out_.window_reopened;
            }
            kl.reopen_next = false;
            // Lives opened by claims that never reached the store (lost in a crash, withdrawn) may
            // start above this fence (the new process's fences start above the store's): merged.
            while (kl.life_starts.size() > 1 && kl.life_starts.back() >= t.fence) kl.life_starts.pop_back();
            kl.life_starts.push_back(t.fence);
            ++out_.reopened;
            log_("key " + std::to_string(k) + " reopened, fence " + std::to_string(t.fence));
        }
        kl.max_fence_ever = std::max(kl.max_fence_ever, t.fence);
        if (t.from != t.to) {  // a doubt mark (PROCESSING -> PROCESSING) changes nothing here
            kl.last = t.to;
            kl.last_at = t.at;
            kl.rotations_at = rotations_;
            if (t.to == record_state::succeeded || t.to == record_state::failed) {
                kl.decided_ms = ms_of(t.at);
                if (k < key_count && !completed_flag_[k]) {
                    completed_flag_[k] = true;
                    completed_.push_back(k);
                }
            }
        }
    }

    /// The largest fence the store holds for every key, noted before a prune may remove it (and at
    /// every start): a claim of a key from ABSENT must get a fence above it.
    /// ... and the audit rows the prune may remove (archived: acks and visibility accept them).
    void note_before_prune(const idem::prune_limits& l) {
        if (l.records_before_ms != idem::prune_limits::keep_all)
            disk_.load([&](const idem::stored_record& rec) {  // one scan (a file store's gets cost a query each)
                const std::size_t k = index_of(rec.key);
                if (k == no_key) return;
                key_ledger& kl = ledger_[k];
                kl.stored_fence = std::max(kl.stored_fence, rec.fence);
            });
        if (l.audit_before_ms != idem::prune_limits::keep_all)
            disk_.scan_audit([&](const idem::audit_entry& a) {
                if (a.at_ms < l.audit_before_ms) archived_.insert({index_of(a.key), static_cast<int>(a.to), a.fence});
            });
    }

    /// A claim granted to a caller: the store holds no terminal decision of the key inside the
    /// idempotency window (memory, the cold window and recall together remember every one).
    void check_grant(std::size_t k, std::uint64_t fence) {
        if (poisoned(k)) return;  // its rows never reach the store
        ++out_.grant_checks;
        const auto rec = disk_.get(key(k).view());
        if (!rec || (rec->state != record_state::succeeded && rec->state != record_state::failed)) return;
        const std::int64_t now_ms = ms_of(clock_.now());
        if (past_window(rec->updated_ms, now_ms)) return;
        problem("key " + std::to_string(k) + " granted (fence " + std::to_string(fence) + ") while the store holds its " +
                idem::to_string(rec->state) + " decision (fence " + std::to_string(rec->fence) + ", updated " +
                std::to_string(rec->updated_ms) + " ms, now " + std::to_string(now_ms) +
                " ms) inside the idempotency window");
        dump_trail(k);
    }

    idem::resolver_answer resolve(const idem::expired_claim& c) {
        const std::size_t k = index_of(c.key);
        if (k == no_key) {
            problem("resolver asked about an unknown key");
            return {};
        }
        // "Unknown" is decided by a pure function of the claim, not a sequential draw: compensation
        // visits slots in hash order, which differs between runs (per-instance hash secret).
        if (static_cast<double>(mix(seed_, c.fence, ++asked_[{k, c.fence}]) >> 11) * 0x1.0p-53 < unknown_rate_) {
            log_("resolver: key " + std::to_string(k) + " fence " + std::to_string(c.fence) + " unknown");
            return {resolution::unknown, 0};
        }
        if (ledger_[k].ran_in_life_of(c.fence) && g_mutation != mutation::lying_resolver) {
            log_("resolver: key " + std::to_string(k) + " fence " + std::to_string(c.fence) + " succeeded");
            return {resolution::succeeded, outcome_of(k), payload_of(k)};
        }
        // Not executed: the answer is binding, the downstream now refuses this fence and older ones.
        ledger_[k].floor = std::max(ledger_[k].floor, c.fence + 1);
        log_("resolver: key " + std::to_string(k) + " fence " + std::to_string(c.fence) + " not executed");
        return {resolution::not_executed, 0};
    }

    void ack(std::size_t k, record_state st, std::uint64_t fence) { acked_.push_back({k, st, fence}); }

    /// Sync mode, durable before visible: a terminal result a caller sees (begin()'s answer, query(),
    /// an acknowledged completion) is already in the store at that moment.
    void check_visible(std::size_t k, record_state st, std::uint64_t fence, const char* via) {
        if (!sync_) return;
        ++out_.visible_checks;
        const std::string_view name = key(k).view();
        if (const auto rec = disk_.get(name); rec && rec->state == st && rec->fence == fence) return;
        for (const auto& a : disk_.audit(name))
            if (a.to == st && a.fence == fence) return;
        if (pruned_row(k, st, fence)) return;
        problem("sync: " + std::string(via) + " showed key " + std::to_string(k) + " " + idem::to_string(st) + " fence " +
                std::to_string(fence) + " before the store held it (durable before visible)");
    }

    /// Sync mode: every terminal record query() shows is in the store.
    void sweep() {
        for (std::size_t k = 0; k < nkeys_; ++k) {
            const idem::record_view v = g_->query(key(k));
            if (v.state == record_state::succeeded || v.state == record_state::failed)
                check_visible(k, v.state, v.fence, "query()");
        }
    }

    /// A refusal (backpressure) changes nothing: the key reads as before and no sequence number was
    /// taken. `before` was read just before the refused call.
    void check_refusal(std::size_t k, const idem::record_view& before, std::uint64_t issued, const char* what) {
        ++out_.refusals;
        const idem::record_view now = g_->query(key(k));
        if (!same(now, before))
            problem(std::string("a refused ") + what + " changed key " + std::to_string(k) + ": " + show(before) +
                    " before, " + show(now) + " after");
        if (pipe_->issued() != issued)
            problem(std::string("a refused ") + what + " of key " + std::to_string(k) + " took a sequence number");
        if (std::string_view(what) == "begin" && before.state != record_state::absent)
            problem("begin refused with backpressure for key " + std::to_string(k) + ", which is " + show(before) +
                    " (only a claim needs room)");
    }

    /// The claim that follows refusals (with nothing but flusher turns in between) gets the fence a
    /// claim without them would have got: the released record's fence + 1, or the first fence of a
    /// generation above every fence the key had in this process life.
    void check_fence_after_refusal(std::size_t k, const idem::record_view& before, std::uint64_t max_fence,
                                   const typename sim_guard::result_type& r) {
        if (r.fence == 0) return;  // refused before any claim (capacity, invalid key)
        // A key memory did not know answered from the store (the cold window's recall): no claim.
        if (before.state == record_state::absent && r.status != begin_status::acquired) return;
        ++out_.fence_checks;
        const bool ok = before.fence != 0 ? r.fence == before.fence + 1
                                          : (r.fence & 0xffffffffull) == 1 && r.fence > max_fence;
        if (!ok)
            problem("key " + std::to_string(k) + " claimed with fence " + std::to_string(r.fence) + " (" +
                    idem::to_string(r.status) + ") after refusals; before them it was " + show(before));
    }

    void client_step(std::size_t i) {
        client& c = cl_[i];
        switch (c.st) {
            case client::idle: {
                // Some clients retry a key that completed before (after evictions, restarts, past
                // the window): its decision must come back from memory, the cold window or the store.
                // A client whose confirm raced maintenance asks for its key again at once.
                const bool again = c.next_key != no_key;
                const bool old = again || (retry_old_ > 0 && !completed_.empty() && r_.chance(retry_old_));
                c.k = again ? c.next_key : old ? completed_[r_.below(completed_.size())] : r_.below(nkeys_);
                c.next_key = no_key;
                out_.old_retries += old;
                const idem::key& k = key(c.k);
                idem::record_view before = g_->query(k);
                std::uint64_t issued = pipe_->issued();
                const std::uint64_t max_fence = ledger_[c.k].max_fence;               // before this claim is offered
                if (versions_ != 0) tried_[c.k / versions_].insert(version_of(c.k));  // its step comes first
                auto r = g_->begin(k, 77 + c.k);
                std::uint64_t spins = 0;
                for (; r.status == begin_status::backpressure; ++spins) {
                    check_refusal(c.k, before, issued, "begin");
                    if (!c.spinner || spins >= spin_limit_) break;
                    if (spin_step_ > 0 && r_.chance(spin_step_)) {  // the flusher's turn
                        pipe_->step();
                        before = g_->query(k);
                        issued = pipe_->issued();
                    }
                    r = g_->begin(k, 77 + c.k);
                }
                out_.spins += spins;
                log_("client " + std::to_string(i) + " begin key " + std::to_string(c.k) + ": " + idem::to_string(r.status) +
                     " fence " + std::to_string(r.fence) + (spins ? " after " + std::to_string(spins) + " refusals" : ""));
                if (spins != 0 && r.status != begin_status::backpressure)
                    check_fence_after_refusal(c.k, before, max_fence, r);
                if (poison_[c.k]) {
                    if (declared_[c.k] && r.status != begin_status::invalid_key)
                        problem("key " + std::to_string(c.k) + ", which store::accepts refuses, answered " +
                                idem::to_string(r.status));
                    if (sync_ && r.status == begin_status::acquired)
                        problem("sync: a claim of poison key " + std::to_string(c.k) + " was granted (fence " +
                                std::to_string(r.fence) + ")");
                    if (r.status == begin_status::invalid_key)
                        ++(declared_[c.k] ? out_.invalid_declared : out_.invalid_rejected);
                } else if (r.status == begin_status::invalid_key) {
                    problem("key " + std::to_string(c.k) + ", which the store can hold, answered invalid_key");
                }
                if (old && (r.status == begin_status::succeeded || r.status == begin_status::failed)) ++out_.old_duplicates;
                if (r.status == begin_status::superseded) check_superseded(c.k, r.outcome);
                if (r.status == begin_status::acquired) {
                    check_grant(c.k, r.fence);
                    check_version_order(c.k, r.fence);
                    c.t.emplace(std::move(r.ticket));
                    c.fence = r.fence;
                    c.st = client::holding;
                    ack(c.k, record_state::processing, r.fence);
                } else if (r.status == begin_status::succeeded || r.status == begin_status::failed) {
                    check_visible(c.k, r.status == begin_status::succeeded ? record_state::succeeded : record_state::failed,
                                  r.fence, "begin()");
                    if (r.status == begin_status::succeeded && r.outcome != outcome_of(c.k))
                        problem("key " + std::to_string(c.k) + " replayed outcome " + std::to_string(r.outcome));
                    if (r.status == begin_status::succeeded) check_payload(c.k, r.payload, "begin()");
                } else if (r.status == begin_status::store_unavailable) {
                    ++out_.store_unavailable;
                }
                break;
            }
            case client::holding: {
                const std::uint64_t a = r_.below(10);
                if (a < 6) {  // execute the effect in the downstream
                    if (c.fence >= ledger_[c.k].floor) {
                        ledger_[c.k].executed.push_back({c.fence});
                        ++out_.executions;
                        log_("client " + std::to_string(i) + " EXECUTES key " + std::to_string(c.k) + " fence " +
                             std::to_string(c.fence));
                        c.st = client::executed;
                    } else {
                        log_("client " + std::to_string(i) + " refused by the downstream (fence closed)");
                        (void)c.t->fail(0);
                        c.t.reset();
                        c.st = client::idle;
                    }
                } else if (a < 8) {
                    const auto ec = c.t->extend(1s);
                    log_("client " + std::to_string(i) + " extend: " + (ec ? ec.message() : "ok"));
                    if (ec == errc::stale_ticket) {
                        c.t.reset();
                        c.st = client::idle;
                    }
                } else if (a < 9) {
                    log_("client " + std::to_string(i) + " drops its ticket");
                    c.t.reset();
                    c.st = client::idle;
                }  // else: paused, time passes
                break;
            }
            case client::executed: {
                const idem::key& k = key(c.k);
                idem::record_view before = g_->query(k);
                std::uint64_t issued = pipe_->issued();
                const bool race = race_rate_ > 0 && rx_.chance(race_rate_);
                auto ec = race ? raced_succeed(c) : c.t->succeed(outcome_of(c.k), payload_of(c.k));
                std::uint64_t spins = 0;
                for (; ec == errc::backpressure; ++spins) {  // the ticket stays valid: retry
                    check_refusal(c.k, before, issued, "succeed");
                    if (!c.spinner || spins >= spin_limit_) break;
                    if (spin_step_ > 0 && r_.chance(spin_step_)) {
                        pipe_->step();
                        before = g_->query(k);
                        issued = pipe_->issued();
                    }
                    ec = c.t->succeed(outcome_of(c.k), payload_of(c.k));
                }
                out_.spins += spins;
                log_("client " + std::to_string(i) + " succeed key " + std::to_string(c.k) + ": " +
                     (ec ? ec.message() : "ok") + (spins ? " after " + std::to_string(spins) + " refusals" : ""));
                // The ticket stays valid: retry later (a payload refusal too: over max_payload, budget spent).
                if (ec == errc::backpressure || ec == errc::busy ||
                    ((ec == errc::capacity_exhausted || ec == errc::invalid_argument) && c.t && c.t->valid()))
                    break;
                if (!ec) {
                    ack(c.k, record_state::succeeded, c.fence);
                    check_visible(c.k, record_state::succeeded, c.fence, "succeed()");
                }
                c.t.reset();
                c.st = client::idle;
                if (race) {  // the duplicate that finds a record the rotation lost
                    c.next_key = c.k;
                    client_step(i);
                }
                break;
            }
        }
    }

    void maintain() {
        const std::size_t n = g_->compensate();
        const bool rotated = g_->collect();
        rotations_ += rotated;
        log_("maintain: compensated " + std::to_string(n) + (rotated ? ", rotated" : ""));
    }

    /// Sync mode, the confirm race (see coop): the owner's succeed() runs on the worker until its
    /// wait is over; maintenance runs with the preemption point armed, so the owner's confirm may
    /// land inside a rotation's read of its slot; then the owner finishes.
    std::error_code raced_succeed(client& c) {
        coop& co = the_coop();
        std::error_code ec;
        co.run([&] { ec = c.t->succeed(outcome_of(c.k), payload_of(c.k)); });
        if (!co.suspended()) return ec;  // refused before any wait (backpressure, stale, busy)
        ++out_.races;
        const std::size_t n = g_->compensate();
        g_preempt = {};
        g_preempt.target = rx_.below(std::max<std::uint64_t>(4, race_span_));
        bool fired = false;
        g_preempt.fire = [&] {
            fired = true;
            co.resume();  // the owner confirms between two loads of this thread
        };
        g_preempt.armed = true;
        const bool rotated = g_->collect();
        g_preempt.armed = false;
        if (!fired) race_span_ = std::max<std::uint64_t>(4, g_preempt.candidates);
        rotations_ += rotated;
        out_.races_in_rotation += fired && rotated;
        log_("maintain while key " + std::to_string(c.k) + "'s owner confirms: compensated " + std::to_string(n) +
             (rotated ? ", rotated" : "") +
             (fired ? ", the confirm ran at re-load " + std::to_string(g_preempt.target) : ", the confirm came after"));
        if (co.suspended()) co.resume();
        return ec;
    }

    [[nodiscard]] std::uint64_t version_of(std::size_t k) const { return 1 + k % versions_; }
    /// Recovery restores a record: its version goes into memory's map with it (the store knows it).
    void note_restored(std::string_view text) {
        const std::size_t k = index_of(text);
        if (versions_ != 0 && k < key_count) tried_[k / versions_].insert(version_of(k));
    }

    /// Ordered versions: a superseded answer names a newer version of the key's (txid, operation)
    /// that a begin() of this process life asked for, and is never given while the store holds a
    /// decision of the key inside the idempotency window: a duplicate of a version
    /// that ran must get its recorded answer ("not executed" for a charge that ran would have it
    /// charged again by other means).
    void check_superseded(std::size_t k, std::uint64_t newest) {
        ++out_.superseded;
        if (versions_ == 0 || k >= key_count)
            return problem("key " + std::to_string(k) + " without versions answered superseded");
        const std::uint64_t v = version_of(k);
        if (newest <= v || tried_[k / versions_].count(newest) == 0)
            problem("key " + std::to_string(k) + " (version " + std::to_string(v) + ") superseded by version " +
                    std::to_string(newest) + ", which no begin() of this process life asked for");
        // A claim or released record in the store may lag memory (async), where the key can be
        // released and then superseded; a decision is final inside the window.
        if (poisoned(k)) return;  // its rows never reach the store
        const auto rec = disk_.get(key(k).view());
        if (!rec || (rec->state != record_state::succeeded && rec->state != record_state::failed)) return;
        if (past_window(rec->updated_ms, ms_of(clock_.now()))) return;
        ++out_.superseded_ran;
        problem("key " + std::to_string(k) + " (version " + std::to_string(v) + ") answered superseded by version " +
                std::to_string(newest) + " while the store holds its " + idem::to_string(rec->state) + " record (fence " +
                std::to_string(rec->fence) + ", updated " + std::to_string(rec->updated_ms) + " ms, now " +
                std::to_string(ms_of(clock_.now())) + " ms) inside the idempotency window");
        dump_trail(k);
    }

    /// Ordered versions: a claim of version N is not granted while a claim of a newer version M
    /// granted in this process life is still in memory's version maps: M's map (the generation
    /// current at its grant) is recycled only by the second rotation after it.
    void check_version_order(std::size_t k, std::uint64_t fence) {
        if (versions_ == 0 || k >= key_count) return;
        const std::uint64_t v = version_of(k);
        auto& granted = granted_[k / versions_];
        for (const auto& [m, at] : granted)
            if (m > v && rotations_ - at < 2)
                problem("key " + std::to_string(k) + " (version " + std::to_string(v) + ") granted (fence " +
                        std::to_string(fence) + ") although version " + std::to_string(m) + " of its txid was granted " +
                        std::to_string(rotations_ - at) + " rotations ago in this process life");
        granted[v] = rotations_;
    }

    /// Liveness, after an outage ends and at the end of the run: with the store healthy and
    /// maintenance running, a key nobody holds is acquired within 20 s of simulated time. A wedge
    /// (a queue that stays full, a table that never rotates, a flusher that stopped) fails here.
    /// The probe keys are two keys of their own, given back at once (RELEASED: the store holds at
    /// most two more records, which recovery must fit in the table); a rotation evicts them, so a
    /// probe often claims one the table has never seen, which takes a new index position.
    void probe() {
        store_->set_healthy(true);
        const auto started = clock_.now();
        begin_status last = begin_status::backpressure;
        for (int round = 0; round < 80; ++round) {
            for (int n = 0; n < 400 && !pipe_->drained(); ++n) pipe_->step();
            // Prefer a probe key the table does not know.
            std::size_t k = key_count + (probes_ & 1);
            if (g_->query(key(k)).fence != 0 && g_->query(key(k ^ 1)).fence == 0) k ^= 1;
            const bool fresh = g_->query(key(k)).fence == 0;
            auto r = g_->begin(key(k));
            last = r.status;
            if (r.status == begin_status::acquired) {
                check_grant(k, r.fence);
                ack(k, record_state::processing, r.fence);
                std::error_code ec;
                for (int n = 0; n < 400; ++n) {
                    ec = r.ticket.fail(0, idem::failure_policy::retryable);
                    if (ec != errc::backpressure && ec != errc::busy) break;
                    pipe_->step();
                }
                if (!ec) ack(k, record_state::released, r.fence);
                const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_.now() - started).count();
                out_.probe_ms_max = std::max(out_.probe_ms_max, static_cast<std::uint64_t>(took));
                ++out_.probes;
                out_.fresh_probes += fresh;
                ++probes_;
                log_("probe: key " + std::to_string(k) + (fresh ? " (new to the table)" : "") + " acquired after " +
                     std::to_string(took) + "ms, fence " + std::to_string(r.fence) +
                     ", given back: " + (ec ? ec.message() : "ok"));
                return;
            }
            maintain();
            clock_.advance(250ms);
        }
        problem("liveness: no key acquired within 20 s with the store healthy (last answer " +
                std::string(idem::to_string(last)) + ", queue depth " + std::to_string(pipe_->depth()) + ")");
    }

    /// Async seeds, at the end (every claim decided, the store healthy): a steady load. Each round:
    /// maintenance while rows of the round before are still in the queue (it is never empty when
    /// collect() runs), the flusher's turns down to a small backlog, a claim of a key the table has
    /// never seen, its effect, its success (queued, not yet flushed). Memory holds only decided
    /// records, whose rows the store decides a round or two later, so rotation must keep making
    /// room: every claim is granted (never capacity_exhausted) and rotations happen. A guard that
    /// waits for an empty queue before it rotates fails here (mutation drained_marks).
    void steady_load() {
        for (const auto& [k, kl] : ledger_)
            if (g_->query(key(k)).state == record_state::processing) {
                ++out_.steady_skipped;  // a claim in memory may hold a rotation back: not this check's case
                log_("steady load skipped: key " + std::to_string(k) + " is claimed");
                return;
            }
        const std::uint64_t rounds = 8 * capacity_ + 16;
        const std::uint64_t backlog = std::min<std::uint64_t>(rx_.below(3), po_.queue_capacity - 2);
        const std::uint64_t rotations_before = rotations_;
        log_("steady load: " + std::to_string(rounds) + " new keys, backlog " + std::to_string(backlog));
        ++out_.steady_runs;
        for (std::uint64_t n = 0; n < rounds; ++n) {
            if (n > 0) {
                if (pipe_->depth() == 0) problem("steady load: the queue was empty at maintenance");
                ++out_.steady_collects;
            }
            maintain();
            for (int s = 0; s < 100 && pipe_->depth() > backlog; ++s) pipe_->step();
            clock_.advance(std::chrono::milliseconds(rx_.below(20)));
            const std::size_t k = load_base + loads_++;
            auto r = g_->begin(key(k));
            for (int s = 0; s < 100 && r.status == begin_status::backpressure; ++s) {
                pipe_->step();
                r = g_->begin(key(k));
            }
            if (r.status != begin_status::acquired) {
                problem("liveness: steady load: a new key answered " + std::string(idem::to_string(r.status)) + " after " +
                        std::to_string(n) + " claims and " + std::to_string(rotations_ - rotations_before) +
                        " rotations (every record in memory decided, queue depth " + std::to_string(pipe_->depth()) + ")");
                return;
            }
            ++out_.steady_claims;
            check_grant(k, r.fence);
            ack(k, record_state::processing, r.fence);
            ledger_[k].executed.push_back({r.fence});
            std::error_code ec;
            for (int s = 0; s < 100; ++s) {
                ec = r.ticket.succeed(outcome_of(k));
                if (ec != errc::backpressure && ec != errc::busy) break;
                pipe_->step();
            }
            if (ec) return problem("steady load: succeed() of key " + std::to_string(k) + ": " + ec.message());
            ack(k, record_state::succeeded, r.fence);
        }
        const std::uint64_t rotated = rotations_ - rotations_before;
        out_.steady_rotations += rotated;
        if (rotated == 0) problem("liveness: steady load: no rotation in " + std::to_string(rounds) + " rounds");
    }

    /// Is the acknowledged transition (or a later one of the key) in the store?
    bool durable(const idem::audit_entry& want_like, std::size_t k) {
        for (const auto& a : disk_.audit(key(k).view()))
            if (a.to == want_like.to && a.fence == want_like.fence) return true;
        return pruned_row(k, want_like.to, want_like.fence);
    }

    /// Whether the audit row of this transition was in the store when a prune may have removed it
    /// (the rows past a prune's bound are archived just before it).
    bool pruned_row(std::size_t k, record_state to, std::uint64_t fence) {
        return archived_.count({k, static_cast<int>(to), fence}) != 0;
    }

    /// Sync mode: every acknowledged transition is in the store, at every crash and at the end.
    /// Async mode: a crash may lose what was still queued (counted); at the end nothing may be missing.
    /// Acknowledged transitions of poison keys (async only) are set aside, never in the store.
    void check_acks(bool at_crash) {
        for (const auto& a : acked_) {
            if (poisoned(a.k)) {
                if (sync_) problem("sync: a transition of poison key " + std::to_string(a.k) + " was acknowledged");
                ++out_.set_aside_acks;
                continue;
            }
            idem::audit_entry e;
            e.to = a.st;
            e.fence = a.fence;
            if (durable(e, a.k)) continue;
            if (sync_ || !at_crash)
                problem(std::string("acknowledged transition lost (") + (at_crash ? "at a crash" : "at the end") +
                        "): key " + std::to_string(a.k) + " " + idem::to_string(a.st) + " fence " + std::to_string(a.fence));
            else ++out_.async_losses;
        }
        if (!at_crash) return;
        // Effects whose claim the store never heard of are orphans of the crash: async's contract
        // allows the key to run again. In sync mode a claim is durable before anyone executes.
        for (auto& [k, kl] : ledger_)
            for (auto& ex : kl.executed) {
                if (ex.orphan) continue;
                idem::audit_entry e;
                e.to = record_state::processing;
                e.fence = ex.fence;
                if (durable(e, k)) continue;
                if (sync_)
                    problem("key " + std::to_string(k) + " executed under fence " + std::to_string(ex.fence) +
                            " whose claim is not in the store");
                ex.orphan = true;
            }
    }

    /// The current pipeline's counters, before it is replaced or the run ends.
    void collect_pipeline() {
        out_.in_doubt_batches += pipe_->in_doubt();
        out_.unanswered += pipe_->unanswered();
        out_.rejected_rows += pipe_->rejected();
        out_.max_depth = std::max(out_.max_depth, pipe_->max_depth());
        out_.recalls += pipe_->recalls();
        out_.recalled += pipe_->recalled_records();
        out_.prunes += pipe_->prunes();
        out_.pruned_records += pipe_->pruned_records();
        out_.pruned_audit_rows += pipe_->pruned_audit_rows();
    }

    void crash() {
        ++out_.crashes;
        log_("CRASH");
        check_acks(true);
        acked_.clear();
        pipe_->crash();
        collect_pipeline();
        add(out_.guard, g_->snapshot());
        for (auto& c : cl_) {  // the process dies: tickets vanish (their release reaches no queue)
            c.t.reset();
            c.st = client::idle;
        }
        g_.reset();
        clock_.advance(std::chrono::milliseconds(r_.below(3000)));
        start();
    }

    void finish() {
        // Heal the store, let every claim run out, resolve everything, flush everything.
        store_->set_healthy(true);
        outage_until_ = std::chrono::nanoseconds(0);
        outage_active_ = false;
        for (auto& c : cl_)
            if (c.st == client::executed) {
                for (int n = 0; n < 100 && c.t && c.t->valid(); ++n) {
                    const auto ec = c.t->succeed(outcome_of(c.k), payload_of(c.k));
                    if (!ec) ack(c.k, record_state::succeeded, c.fence);
                    if (ec != errc::backpressure && ec != errc::busy) break;
                    pipe_->step();
                }
            }
        for (auto& c : cl_) {
            if (c.t) {
                // Park the ticket: an abandoned owner (its claim runs out and is compensated).
                parked_.push_back(std::move(*c.t));
                c.t.reset();
            }
            c.st = client::idle;
        }
        unknown_rate_ = 0;
        probe();
        for (int round = 0; round < 20; ++round) {
            clock_.advance(2s);
            g_->compensate();
            for (int n = 0; n < 1000 && !pipe_->drained(); ++n) pipe_->step();
        }
        if (steady_) steady_load();
        for (int n = 0; n < 1000 && !pipe_->drained(); ++n) pipe_->step();
        if (!pipe_->drained()) problem("the pipeline did not drain after the store healed");
        if (sync_) sweep();
        check_acks(false);
        collect_pipeline();

        // Exactly once: every key ran at most once, apart from orphans of an async crash, and a key
        // that ran (not as an orphan) is recorded SUCCESS with its outcome. A poison key is never in
        // the store; in sync mode it never ran.
        const idem::prune_horizon horizon = disk_.horizon();
        for (std::size_t k = 0; k < nkeys_; ++k) {
            const auto rec = disk_.get(key(k).view());
            const key_ledger& kl = ledger_[k];
            std::vector<std::size_t> per_life(kl.life_starts.size(), 0);
            for (const auto& e : kl.executed)
                if (e.orphan) ++out_.orphans;
                else ++per_life[kl.life_of(e.fence)];
            for (std::size_t l = 0; l < per_life.size(); ++l)
                if (per_life[l] > 1) {
                    problem("key " + std::to_string(k) + " executed " + std::to_string(per_life[l]) + " times in life " +
                            std::to_string(l));
                    dump_trail(k);
                }
            if (poison_[k]) {
                if (rec || !disk_.audit(key(k).view()).empty())
                    problem("poison key " + std::to_string(k) + " is in the store");
                if (sync_ && !kl.executed.empty()) problem("sync: poison key " + std::to_string(k) + " executed");
                continue;
            }
            // A record past the window may have been pruned (its decision older than the horizon).
            const bool pruned = !rec && horizon.records_ms != idem::prune_limits::keep_all &&
                                kl.decided_ms < horizon.records_ms;
            if (per_life.back() == 1 && !pruned && (!rec || rec->state != record_state::succeeded)) {
                problem("key " + std::to_string(k) + " executed but its record is " +
                        (rec ? idem::to_string(rec->state) : "missing"));
                dump_trail(k);
            }
            if (rec && rec->state == record_state::succeeded && !kl.ran_in_life_of(rec->fence))
                problem("key " + std::to_string(k) + " is SUCCESS but never executed in that life");
            if (rec && rec->state == record_state::succeeded && rec->outcome != outcome_of(k))
                problem("key " + std::to_string(k) + " recorded outcome " + std::to_string(rec->outcome));
            if (rec && rec->state == record_state::succeeded && rec->payload != payload_of(k))
                problem("key " + std::to_string(k) + " recorded a payload of " + std::to_string(rec->payload.size()) +
                        " bytes, not its " + std::to_string(payload_of(k).size()) + " bytes");
            // Memory agrees with the store.
            const idem::record_view v = g_->query(key(k));
            if (rec && v.state != record_state::absent && (v.state != rec->state || v.fence != rec->fence))
                problem("key " + std::to_string(k) + ": memory says " + idem::to_string(v.state) + " fence " +
                        std::to_string(v.fence) + ", the store " + idem::to_string(rec->state) + " fence " +
                        std::to_string(rec->fence));
            if (v.state == record_state::succeeded) check_payload(k, v.payload, "query()");
        }
        // The audit trail is complete and legal.
        const idem::verify_report rep = idem::verify(disk_);
        for (const auto& v : rep.violations) problem("audit: " + v);
        parked_.clear();  // their releases are refused as stale: the claims were compensated
        add(out_.guard, g_->snapshot());
        g_.reset();
    }

    struct acked_transition {
        std::size_t k;
        record_state st;
        std::uint64_t fence;
    };

    std::uint64_t seed_;
    rng r_;
    rng rx_;  ///< the draws of the features added with the rotation's fixes (versions, races, steady load)
    trace log_;
    bool sync_ = false;
    fault_rates rates_;
    pipeline_options po_;
    double unknown_rate_ = 0;
    std::uint64_t clients_ = 2, steps_ = 0, crashes_left_ = 0, incarnation_ = 0;
    std::chrono::nanoseconds outage_until_{0};
    bool outage_active_ = false;   ///< an outage began and the probe after its end has not run yet
    bool stream_pending_ = false;  ///< claims_first: the window's keys are not streamed in yet
    std::uint64_t stream_at_ = 0;  ///< the step at which stream_cold runs
    std::uint64_t rotations_ = 0;  ///< rotations so far, over every process life
    std::deque<idem::key> keys_;   ///< by index: the clients' keys, then the probes', then the steady load's
    std::unordered_map<std::string, std::size_t> index_;  ///< a key's index in keys_
    bool poison_[key_count] = {};                         ///< the store can never take the key's rows
    bool declared_[key_count] = {};                       ///< ... and store::accepts says so
    std::uint64_t spin_limit_ = 0, probes_ = 0;
    double spin_step_ = 0;
    idem::manual_clock clock_;
    sim_disk disk_owner_{g_disk};
    idem::store& disk_ = *disk_owner_.st;
    std::unique_ptr<fault_store> store_;
    std::unique_ptr<sim_pipeline> pipe_;
    std::optional<sim_guard> g_;
    client cl_[4];
    std::vector<sim_ticket> parked_;
    std::map<std::size_t, key_ledger> ledger_;
    std::vector<acked_transition> acked_;
    std::map<std::pair<std::size_t, std::uint64_t>, std::uint64_t> asked_;
    std::set<std::tuple<std::size_t, int, std::uint64_t>> archived_;  ///< audit rows a prune may have removed
    // the two windows
    std::size_t nkeys_ = 12, capacity_ = 8;
    std::chrono::milliseconds retention_ = 3s;
    double retry_old_ = 0, pause_rate_ = 0;
    // the rotation's fixes
    std::uint64_t versions_ = 0;    ///< ordered versions: versions per (txid, operation); 0: off
    double race_rate_ = 0;          ///< sync: the share of succeed() calls whose confirm races maintenance
    bool steady_ = false;           ///< async: a steady load at the end (rotation under a non-empty queue)
    std::uint64_t loads_ = 0;       ///< the steady load's keys so far
    std::uint64_t race_span_ = 16;  ///< the candidates of the last armed rotation that did not fire
    std::uint64_t life_ = 0;        ///< the process life (incarnation) the version model is about
    /// Ordered versions, per txid: the versions begin() was called with in this process life (a
    /// version counts from its step, even when refused), and the rotation count at each grant.
    std::map<std::size_t, std::set<std::uint64_t>> tried_;
    std::map<std::size_t, std::map<std::uint64_t, std::uint64_t>> granted_;
    std::size_t payload_max_ = 0;         ///< payload_of's largest payload; 0: completions carry none
    std::vector<std::size_t> completed_;  ///< keys with a terminal transition, in the order they got one
    bool completed_flag_[key_count] = {};
    outcome out_;
};

/// The seeds whose guard runs on sim_atomic (confirms racing rotations in their sync runs); the
/// others run the production instantiation (std::atomic).
bool interleaved_seed(std::uint64_t seed) { return g_flags.windows && rng(mix(seed, 0x1a7e)).chance(0.4); }

outcome run_seed(std::uint64_t seed, bool print) {
    if (interleaved_seed(seed)) return simulation<sim_atomic>(seed, print).run();
    return simulation<std::atomic>(seed, print).run();
}

// ---- layer A ---------------------------------------------------------------------------------------
TEST(sim, seeds) {
    if (g_flags.one) {
        std::printf("replaying seed %llu\n", static_cast<unsigned long long>(*g_flags.one));
        const outcome o = run_seed(*g_flags.one, true);
        for (const auto& p : o.problems) ADD_FAILURE() << p;
        return;
    }
    std::uint64_t failed = 0, steps = 0, crashes = 0, executions = 0, losses = 0, calls = 0, doubt = 0, unanswered = 0,
                  orphans = 0;
    std::uint64_t unavailable = 0, reopened = 0, outages = 0;
    outcome d;  // the durable path's counters, summed (max_depth: the largest; depth_bound: its bound)
    std::uint64_t sync_seeds = 0, poison_seeds = 0, depth_at_bound = 0;
    outcome w;  // the two windows' counters, summed
    std::uint64_t short_window_seeds = 0, audit_seeds = 0, big_seeds = 0;
    outcome x;  // the rotation's fixes, summed
    std::uint64_t interleaved_seeds = 0, race_seeds = 0, versioned_seeds = 0;
    std::uint64_t payload_seeds = 0, payload_checks = 0, payload_bytes = 0;
    idem::stats gs;
    std::uint64_t first_failure = 0;
    for (std::uint64_t s = g_flags.first; s < g_flags.first + g_flags.seeds; ++s) {
        const outcome o = run_seed(s, false);
        steps += o.steps;
        crashes += o.crashes;
        executions += o.executions;
        losses += o.async_losses;
        calls += o.store_calls;
        doubt += o.in_doubt_batches;
        unanswered += o.unanswered;
        orphans += o.orphans;
        unavailable += o.store_unavailable;
        reopened += o.reopened;
        outages += o.outages;
        d.long_outages += o.long_outages;
        d.probes += o.probes;
        d.fresh_probes += o.fresh_probes;
        d.probe_ms_max = std::max(d.probe_ms_max, o.probe_ms_max);
        d.poison_keys += o.poison_keys;
        poison_seeds += o.poison_keys != 0;
        d.rejected_rows += o.rejected_rows;
        d.invalid_declared += o.invalid_declared;
        d.invalid_rejected += o.invalid_rejected;
        d.set_aside_acks += o.set_aside_acks;
        d.refusals += o.refusals;
        d.spins += o.spins;
        d.fence_checks += o.fence_checks;
        d.visible_checks += o.visible_checks;
        sync_seeds += o.visible_checks != 0;
        if (o.max_depth * d.depth_bound > d.max_depth * o.depth_bound || d.depth_bound == 0) {
            d.max_depth = o.max_depth;
            d.depth_bound = o.depth_bound;
        }
        depth_at_bound += o.max_depth == o.depth_bound;
        short_window_seeds += o.short_window;
        audit_seeds += o.audit_pruned;
        big_seeds += o.big_store;
        w.recalls += o.recalls;
        w.recalled += o.recalled;
        w.prunes += o.prunes;
        w.pruned_records += o.pruned_records;
        w.pruned_audit_rows += o.pruned_audit_rows;
        w.cold_at_start += o.cold_at_start;
        w.expired_at_start += o.expired_at_start;
        w.hot_at_start += o.hot_at_start;
        w.claims_first_starts += o.claims_first_starts;
        w.streams_retried += o.streams_retried;
        w.max_store_records = std::max(w.max_store_records, o.max_store_records);
        w.grant_checks += o.grant_checks;
        w.window_reopened += o.window_reopened;
        w.old_retries += o.old_retries;
        w.old_duplicates += o.old_duplicates;
        w.long_pauses += o.long_pauses;
        x.races += o.races;
        x.races_in_rotation += o.races_in_rotation;
        x.superseded += o.superseded;
        x.superseded_ran += o.superseded_ran;
        x.steady_runs += o.steady_runs;
        x.steady_skipped += o.steady_skipped;
        x.steady_claims += o.steady_claims;
        x.steady_collects += o.steady_collects;
        x.steady_rotations += o.steady_rotations;
        interleaved_seeds += o.interleaved;
        race_seeds += o.races != 0;
        versioned_seeds += o.versioned;
        payload_seeds += o.payloads;
        payload_checks += o.payload_checks;
        payload_bytes += o.payload_bytes_checked;
        add(gs, o.guard);
        if (!o.ok) {
            if (failed++ == 0) first_failure = s;
            if (failed <= 5)
                ADD_FAILURE() << "seed " << s << ": " << o.problems.front() << " (" << o.problems.size()
                              << " problems; replay: sim_test --seed=" << s << ")";
        }
    }
    std::printf(
        "[ sim     ] %llu seeds from %llu: %llu steps, %llu crashes, %llu effects, %llu store calls, "
        "%llu acknowledged async transitions lost in crashes and %llu effects orphaned by them (allowed), "
        "%llu in-doubt commits (%llu committed() questions unanswered and asked again), "
        "%llu seeds with violations%s\n",
        static_cast<unsigned long long>(g_flags.seeds), static_cast<unsigned long long>(g_flags.first),
        static_cast<unsigned long long>(steps), static_cast<unsigned long long>(crashes),
        static_cast<unsigned long long>(executions), static_cast<unsigned long long>(calls),
        static_cast<unsigned long long>(losses), static_cast<unsigned long long>(orphans),
        static_cast<unsigned long long>(doubt), static_cast<unsigned long long>(unanswered),
        static_cast<unsigned long long>(failed),
        failed ? (" (first: seed " + std::to_string(first_failure) + ")").c_str() : "");
    std::printf(
        "[ sim     ] guard: %llu claims, %llu duplicates replayed, %llu in-progress answers, %llu completions, "
        "%llu stale tickets refused, %llu doubt marks, %llu compensated, %llu backpressure, "
        "%llu sync claims refused as not durable, %llu rotations, %llu evictions, %llu keys reopened, "
        "%llu store outages\n",
        static_cast<unsigned long long>(gs.acquired), static_cast<unsigned long long>(gs.duplicates),
        static_cast<unsigned long long>(gs.in_progress_hits), static_cast<unsigned long long>(gs.succeeded + gs.released),
        static_cast<unsigned long long>(gs.stale_tickets), static_cast<unsigned long long>(gs.in_doubt),
        static_cast<unsigned long long>(gs.compensated), static_cast<unsigned long long>(gs.backpressure),
        static_cast<unsigned long long>(unavailable), static_cast<unsigned long long>(gs.rotations),
        static_cast<unsigned long long>(gs.evicted), static_cast<unsigned long long>(reopened),
        static_cast<unsigned long long>(outages));
    std::printf(
        "[ sim     ] durable path: %llu outages longer than sync_timeout, %llu liveness probes passed "
        "(a key acquired after an outage and at the end, %llu of them new to the table; the slowest took %llu ms), "
        "%llu poison keys in %llu seeds, %llu rows set aside, %llu invalid_key answers up front "
        "(store::accepts) and %llu after the store set the claim aside (sync), %llu async "
        "acknowledgements of poison keys set aside (allowed), %llu backpressure refusals checked "
        "to change nothing (%llu immediate retries), %llu fences checked after refusals, "
        "deepest queue %llu of a bound of %llu (reached in %llu seeds), %llu sync results checked "
        "durable before visible (in %llu seeds)\n",
        static_cast<unsigned long long>(d.long_outages), static_cast<unsigned long long>(d.probes),
        static_cast<unsigned long long>(d.fresh_probes), static_cast<unsigned long long>(d.probe_ms_max),
        static_cast<unsigned long long>(d.poison_keys), static_cast<unsigned long long>(poison_seeds),
        static_cast<unsigned long long>(d.rejected_rows), static_cast<unsigned long long>(d.invalid_declared),
        static_cast<unsigned long long>(d.invalid_rejected), static_cast<unsigned long long>(d.set_aside_acks),
        static_cast<unsigned long long>(d.refusals), static_cast<unsigned long long>(d.spins),
        static_cast<unsigned long long>(d.fence_checks), static_cast<unsigned long long>(d.max_depth),
        static_cast<unsigned long long>(d.depth_bound), static_cast<unsigned long long>(depth_at_bound),
        static_cast<unsigned long long>(d.visible_checks), static_cast<unsigned long long>(sync_seeds));
    std::printf(
        "[ sim     ] two windows: %llu seeds with a window of seconds (%llu with an audit window), %llu with "
        "4+ times more keys than capacity (largest store read at a start: %llu records); %llu claims of keys "
        "the cold window may hold read the store (%llu answered from a record, %llu store_unavailable; "
        "guard: %llu recalled), %llu capacity_exhausted answers; recovery put %llu records in memory, %llu in "
        "the cold window, skipped %llu past the window (%llu starts claims first, %llu window streams broken "
        "and started again); %llu prunes removed %llu records and %llu audit rows; "
        "%llu retries of completed keys (%llu answered with the decision), %llu long pauses, %llu keys "
        "claimed again past the window, %llu grants checked against the store's decisions in the window\n",
        static_cast<unsigned long long>(short_window_seeds), static_cast<unsigned long long>(audit_seeds),
        static_cast<unsigned long long>(big_seeds), static_cast<unsigned long long>(w.max_store_records),
        static_cast<unsigned long long>(w.recalls), static_cast<unsigned long long>(w.recalled),
        static_cast<unsigned long long>(gs.recall_failures), static_cast<unsigned long long>(gs.recalled),
        static_cast<unsigned long long>(gs.capacity_exhausted), static_cast<unsigned long long>(w.hot_at_start),
        static_cast<unsigned long long>(w.cold_at_start), static_cast<unsigned long long>(w.expired_at_start),
        static_cast<unsigned long long>(w.claims_first_starts), static_cast<unsigned long long>(w.streams_retried),
        static_cast<unsigned long long>(w.prunes), static_cast<unsigned long long>(w.pruned_records),
        static_cast<unsigned long long>(w.pruned_audit_rows), static_cast<unsigned long long>(w.old_retries),
        static_cast<unsigned long long>(w.old_duplicates), static_cast<unsigned long long>(w.long_pauses),
        static_cast<unsigned long long>(w.window_reopened), static_cast<unsigned long long>(w.grant_checks));
    std::printf(
        "[ sim     ] rotation: %llu seeds on the interleaving engine, %llu of them with %llu sync confirms "
        "racing maintenance (%llu ran inside a rotation, between two loads of one atomic); %llu seeds with "
        "ordered versions, %llu superseded answers checked (%llu while the store held the key's record); "
        "steady load in %llu async seeds (%llu skipped: a claim in memory): %llu new keys granted, %llu "
        "collects with rows in the queue, %llu rotations\n",
        static_cast<unsigned long long>(interleaved_seeds), static_cast<unsigned long long>(race_seeds),
        static_cast<unsigned long long>(x.races), static_cast<unsigned long long>(x.races_in_rotation),
        static_cast<unsigned long long>(versioned_seeds), static_cast<unsigned long long>(x.superseded),
        static_cast<unsigned long long>(x.superseded_ran), static_cast<unsigned long long>(x.steady_runs),
        static_cast<unsigned long long>(x.steady_skipped), static_cast<unsigned long long>(x.steady_claims),
        static_cast<unsigned long long>(x.steady_collects), static_cast<unsigned long long>(x.steady_rotations));
    std::printf(
        "[ sim     ] payloads: %llu seeds whose completions carry response bytes; %llu succeeded answers "
        "(duplicates from memory, recovery and recall, and query() at the end) carried their key's bytes "
        "(%llu bytes checked)\n",
        static_cast<unsigned long long>(payload_seeds), static_cast<unsigned long long>(payload_checks),
        static_cast<unsigned long long>(payload_bytes));
}

// The same seeds over real file stores as the disk: every fault, crash, recovery and check of
// layer A, with the store's own apply() (fold and fence guard), committed(), load() and audit trail
// (idem::verify) instead of the reference's. IDEM_SIM_FILE_SEEDS seeds per store (default 100).
TEST(sim, seeds_on_file_stores) {
    const std::uint64_t n = env_or("IDEM_SIM_FILE_SEEDS", 100);
    std::vector<std::pair<disk_kind, const char*>> disks{{disk_kind::sqlite, "sqlite"}};
#ifdef IDEM_SIM_ROCKSDB
    disks.emplace_back(disk_kind::rocksdb, "rocksdb");
#endif
    for (const auto& [kind, name] : disks) {
        g_disk = kind;
        std::uint64_t failed = 0, crashes = 0, calls = 0, doubt = 0;
        for (std::uint64_t s = g_flags.first; s < g_flags.first + n; ++s) {
            const outcome o = run_seed(s, false);
            crashes += o.crashes;
            calls += o.store_calls;
            doubt += o.in_doubt_batches;
            if (!o.ok && failed++ < 5)
                ADD_FAILURE() << name << " disk, seed " << s << ": " << o.problems.front()
                              << " (replay: IDEM_SIM_DISK=" << name << " sim_test --seed=" << s << ")";
        }
        std::printf(
            "[ sim     ] %llu seeds on a %s disk: %llu crashes, %llu store calls, %llu in-doubt commits, "
            "%llu seeds with violations\n",
            static_cast<unsigned long long>(n), name, static_cast<unsigned long long>(crashes),
            static_cast<unsigned long long>(calls), static_cast<unsigned long long>(doubt),
            static_cast<unsigned long long>(failed));
        EXPECT_GT(calls, n) << "the seeds on the " << name << " disk made no store calls";
    }
    g_disk = disk_kind::memory;
}

TEST(sim, a_seed_replays_exactly) {
    // 147: the interleaving engine, sync, ordered versions, confirms racing rotations (the worker
    // thread's baton must not make a run depend on thread timing).
    for (std::uint64_t s : {3ull, 42ull, 147ull, 977ull}) {
        const outcome a = run_seed(s, false), b = run_seed(s, false);
        EXPECT_EQ(a.trace_hash, b.trace_hash) << "seed " << s << " did not replay exactly";
        EXPECT_EQ(a.steps, b.steps);
        EXPECT_EQ(a.store_calls, b.store_calls);
    }
}

TEST(sim, checker_has_teeth) {
    // Each mutation is a deliberate bug; the checker must fail seeds with it, and for the newer
    // ones through the check written for that bug (the problem text names it).
    struct case_ {
        mutation m;
        const char* check;     ///< a phrase of the problem the check reports; nullptr: any problem
        bool windows = false;  ///< only the window features' seeds can show it (--windows=0 skips it)
    };
    for (const case_ c :
         {case_{mutation::lying_resolver, nullptr}, case_{mutation::dropped_row, nullptr},
          case_{mutation::durable_lies, "durable before visible"}, case_{mutation::leaked_reservation, "liveness"},
          case_{mutation::rejected_as_committed, "poison key"}, case_{mutation::accepts_ignored, "store::accepts refuses"},
          case_{mutation::oversized_queue, "queue depth"}, case_{mutation::recall_forgets, "while the store holds its"},
          case_{mutation::cold_dropped, "while the store holds its"},
          case_{mutation::stream_completed_early, "while the store holds its"},
          case_{mutation::loaded_fence_floor, "not above the fence", true},
          case_{mutation::drained_marks, "steady load", true}, case_{mutation::payload_dropped, "replayed payload", true},
          // with ordered versions, a recall that forgets makes a version that ran look
          // never run: superseded while the store holds its decision
          case_{mutation::recall_forgets, "answered superseded", true}}) {
        if (c.windows && !g_flags.windows) {
            std::printf("[ sim     ] mutation %s: skipped (--windows=0)\n", to_string(c.m));
            continue;
        }
        // By default each mutation stops at the first seed its check catches (the CI budget);
        // --teeth-all runs all 200 seeds and reports how many fail.
        g_mutation = c.m;
        std::uint64_t failed = 0, by_check = 0, tried = 0, first = 0;
        for (std::uint64_t s = 1; s <= 200 && (g_flags.teeth_all || by_check == 0); ++s) {
            const outcome o = run_seed(s, false);
            ++tried;
            failed += !o.ok;
            const bool caught = std::any_of(o.problems.begin(), o.problems.end(), [&](const std::string& p) {
                return c.check == nullptr || p.find(c.check) != std::string::npos;
            });
            if (caught && by_check++ == 0) first = s;
        }
        g_mutation = mutation::none;
        EXPECT_GT(by_check, 0u) << "the checker did not notice mutation " << to_string(c.m) << " in 200 seeds";
        std::printf(
            "[ sim     ] mutation %s: %llu of %llu seeds fail, %llu of them through the check \"%s\" "
            "(first: seed %llu)\n",
            to_string(c.m), static_cast<unsigned long long>(failed), static_cast<unsigned long long>(tried),
            static_cast<unsigned long long>(by_check), c.check ? c.check : "(any)", static_cast<unsigned long long>(first));
    }
}

// ---- the real pipeline under a scripted store; regression tests of fixed findings (docs/testing.md) --

/// An idem::store over a memory_store whose answers follow a script: apply #n may commit and then
/// throw commit_unknown, committed() may fail.
class scripted_store final : public idem::store {
public:
    explicit scripted_store(idem::memory_store& disk) : disk_(disk) {}
    std::function<int(std::uint64_t)> apply_script;  ///< 0 commit, 1 commit then commit_unknown
    int committed_failures = 0;                      ///< committed() throws this many times
    void apply(std::span<const idem::store_row> rows, std::uint64_t id) override {
        const int what = apply_script ? apply_script(++applies_) : 0;
        disk_.apply(rows, id);
        if (what == 1) throw idem::commit_unknown("scripted: connection lost during COMMIT (committed)");
    }
    bool committed(std::uint64_t id) override {
        if (committed_failures > 0) {
            --committed_failures;
            throw idem::error(errc::store_unavailable, "scripted: cannot ask");
        }
        return disk_.committed(id);
    }
    void load(const std::function<void(const idem::stored_record&)>& fn) override { disk_.load(fn); }
    std::optional<idem::stored_record> get(std::string_view k) override { return disk_.get(k); }
    std::vector<idem::audit_entry> audit(std::string_view k) override { return disk_.audit(k); }
    void scan_audit(const std::function<void(const idem::audit_entry&)>& fn) override { disk_.scan_audit(fn); }
    std::string name() const override { return "scripted"; }
    std::uint64_t max_fence() override { return disk_.max_fence(); }

private:
    idem::memory_store& disk_;
    std::uint64_t applies_ = 0;
};

// An in-doubt commit whose committed() question fails three times in a row must not be applied
// again blindly (an earlier flush_pipeline did that, and the store held every row twice).
TEST(sim, in_doubt_batch_is_never_applied_twice) {
    idem::memory_store disk;
    auto st = std::make_unique<scripted_store>(disk);
    st->apply_script = [](std::uint64_t n) { return n == 1 ? 1 : 0; };
    st->committed_failures = 3;
    idem::store_options so;
    so.max_backoff = 5ms;
    idem::durable_guard g(
        std::move(st),
        [] {
            idem::options o;
            o.capacity = 16;
            o.maintenance_interval = {};
            return o;
        }(),
        so);
    auto r = g->begin(idem::key("TX1_PAY_v1"));
    ASSERT_EQ(r.status, begin_status::acquired);
    ASSERT_FALSE(r.ticket.succeed(1));
    ASSERT_TRUE(g.flush(10s));
    const idem::verify_report rep = idem::verify(disk);
    for (const auto& v : rep.violations) ADD_FAILURE() << "audit: " << v;
    EXPECT_EQ(disk.audit("TX1_PAY_v1").size(), 2u) << "the claim and its success, once each";
}

// Finding F3 (fixed): a RELEASED record evicted by a rotation and claimed again is offered as
// ABSENT -> PROCESSING; idem::verify used to report it. It is a legal reopening, like one after a
// terminal record, as long as the fence rises.
TEST(sim, released_record_evicted_by_rotation_and_claimed_again_is_a_legal_reopening) {
    idem::memory_store disk;
    idem::manual_clock clock;
    idem::options o;
    o.capacity = 2;
    o.retention = 0s;
    o.maintenance_interval = {};
    idem::basic_durable_guard<std::atomic, idem::manual_clock> g(std::make_unique<scripted_store>(disk), o, {}, clock);
    const idem::key k1("TX1_PAY_v1"), k2("TX2_PAY_v1");
    {
        auto r = g->begin(k1);
        ASSERT_EQ(r.status, begin_status::acquired);
        ASSERT_FALSE(r.ticket.fail(0, idem::failure_policy::retryable));  // RELEASED, in generation 0
    }
    ASSERT_TRUE(g.flush(10s));
    ASSERT_TRUE(g->collect());  // generation 1 becomes current; k1 stays RELEASED in generation 0
    {
        auto r = g->begin(k2);
        ASSERT_FALSE(r.ticket.succeed(2));
    }
    clock.advance(1s);
    ASSERT_TRUE(g.flush(10s));
    ASSERT_TRUE(g->collect());  // generation 0 is recycled: k1's RELEASED record is evicted
    {
        auto r = g->begin(k1);
        ASSERT_EQ(r.status, begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(1));
    }
    ASSERT_TRUE(g.flush(10s));
    const idem::verify_report rep = idem::verify(disk);
    for (const auto& v : rep.violations) ADD_FAILURE() << "audit: " << v;
    EXPECT_EQ(rep.reopened, 1u) << "k1's second claim starts from ABSENT after its evicted RELEASED record";
    const auto trail = disk.audit("TX1_PAY_v1");
    ASSERT_EQ(trail.size(), 4u) << "claim, release, claim, success";
    EXPECT_EQ(trail[2].from, record_state::absent);
    EXPECT_GT(trail[2].fence, trail[0].fence) << "the reopening claim's fence rises";
}

// Finding F8 (docs/testing.md, section 4): rotate_if_due takes its durability mark as
// max(1, issued()), so a pipeline that has offered no row yet (a restarted process whose traffic is
// all duplicates of keys in the cold window, each recalled into memory) never has row 1 decided:
// the table fills with recalled records, never rotates, and a new key answers capacity_exhausted
// for as long as nothing else offers a row (nothing can: new claims are the refused ones). Nothing
// offered means nothing to wait for.
TEST(sim, a_guard_that_offered_no_row_still_rotates) {
    idem::memory_store disk;
    idem::manual_clock clock;
    const auto opts = [](std::size_t capacity) {
        idem::options o;
        o.capacity = capacity;
        o.retention = 0s;
        o.maintenance_interval = {};
        return o;
    };
    std::vector<idem::key> old;
    for (int i = 0; i < 6; ++i) old.emplace_back("TX" + std::to_string(i) + "_PAY_v1");
    {
        idem::basic_durable_guard<std::atomic, idem::manual_clock> g(std::make_unique<scripted_store>(disk), opts(16), {},
                                                                     clock);
        for (const auto& k : old) {
            auto r = g->begin(k);
            ASSERT_EQ(r.status, begin_status::acquired);
            ASSERT_FALSE(r.ticket.succeed(1));
        }
        ASSERT_TRUE(g.flush(10s));
    }
    clock.advance(1s);
    // Restart: with retention 0 every decided record goes to the cold window.
    idem::basic_durable_guard<std::atomic, idem::manual_clock> g(std::make_unique<scripted_store>(disk), opts(2), {}, clock);
    for (const auto& k : old) EXPECT_EQ(g->begin(k).status, begin_status::succeeded) << k.view();  // recalled
    bool rotated = false;
    for (int i = 0; i < 4; ++i) rotated |= g->collect();
    auto r = g->begin(idem::key("NEW_PAY_v1"));
    EXPECT_TRUE(rotated) << "a table of recalled (decided) records did not rotate: no row was ever offered";
    EXPECT_EQ(r.status, begin_status::acquired)
        << "a new key after a restart whose traffic was all duplicates: " << idem::to_string(r.status);
}

// ---- layer B: the real pipeline ----------------------------------------------------------------
// The real durable_guard (flush_pipeline thread, recovery, compensation at start) over fault_store.
// Several threads claim, execute (ledger), and complete; then the store "dies" (the flusher gives up
// at stop: the queue is lost, a crash), and a new durable_guard recovers from the disk. Checked: no
// double execution in sync mode, no acknowledged transition lost (sync), a legal audit trail.
TEST(sim, real_pipeline) {
    // Key k's response: a few bytes with a NUL, so the store keeps bytes, not text.
    const auto response_of = [](std::size_t k) { return "ok" + std::string(1, '\0') + std::to_string(k); };
    for (std::uint64_t seed = 1; seed <= g_flags.real_seeds; ++seed) {
        SCOPED_TRACE("real pipeline seed " + std::to_string(seed));
        rng r(seed);
        const bool sync = seed % 2 == 1;
        fault_rates rates;
        rates.fail_before = 0.1;
        rates.unknown_done = 0.05;
        rates.unknown_lost = 0.05;
        rates.committed_fail = 0.3;
        trace log;
        idem::memory_store disk;
        idem::manual_clock clock;
        std::mutex ledger_mutex;
        std::map<std::size_t, int> executed;
        std::vector<std::pair<std::string, std::uint64_t>> acked_success;
        idem::store_options so;
        so.mode = sync ? idem::durability::sync : idem::durability::async;
        so.sync_timeout = 300ms;
        so.idle_poll = 100us;
        so.max_backoff = 5ms;
        so.queue_capacity = 256;
        auto opts = [&] {
            idem::options o;
            o.capacity = 256;
            o.lease = 1h;  // no expiry during the run: the threads are never paused that long
            o.maintenance_interval = {};
            o.resolve = [&](const idem::expired_claim& c) {
                std::lock_guard lock(ledger_mutex);
                const std::size_t k = std::strtoull(std::string(c.key.substr(2)).c_str(), nullptr, 10);
                return executed[k] ? idem::resolver_answer{resolution::succeeded, outcome_of(k), response_of(k)}
                                   : idem::resolver_answer{resolution::not_executed, 0};
            };
            return o;
        };
        for (int life = 0; life < 2; ++life) {
            auto st = std::make_unique<fault_store>(disk, rates, mix(seed, life), nullptr);
            fault_store* fs = st.get();
            fs->set_healthy(life == 1 ? true : false);
            idem::basic_durable_guard<std::atomic, idem::manual_clock> g(std::move(st), opts(), so, clock);
            std::vector<std::thread> threads;
            for (int t = 0; t < 3; ++t)
                threads.emplace_back([&, t] {
                    rng tr(mix(seed, life, t));
                    for (int n = 0; n < 40; ++n) {
                        const std::size_t k = tr.below(12);
                        const idem::key key("TX" + std::to_string(k) + "_PAY_v1");
                        auto res = g->begin(key);
                        if (res.status != begin_status::acquired) continue;
                        {
                            std::lock_guard lock(ledger_mutex);
                            ++executed[k];
                        }
                        std::error_code ec;
                        while ((ec = res.ticket.succeed(outcome_of(k), response_of(k))) == errc::backpressure ||
                               ec == errc::busy)
                            std::this_thread::yield();
                        if (!ec) {
                            std::lock_guard lock(ledger_mutex);
                            acked_success.emplace_back(key.str(), res.fence);
                        }
                    }
                });
            for (auto& th : threads) th.join();
            if (life == 0) {
                // Crash: the store stops answering; the flusher gives up at stop (the queue is lost).
                if (sync) (void)g.flush(2s);
                fs->set_dead(true);
            } else {
                ASSERT_TRUE(g.flush(10s));
            }
            // Every expired claim from the first life was compensated at the second start.
        }
        if (sync) {
            for (auto& [k, n] : executed) EXPECT_LE(n, 1) << "key " << k << " executed " << n << " times in sync mode";
            for (auto& [k, fence] : acked_success) {
                bool found = false;
                for (const auto& a : disk.audit(k)) found |= a.to == record_state::succeeded && a.fence == fence;
                EXPECT_TRUE(found) << "acknowledged success of " << k << " fence " << fence << " is not in the store";
            }
        }
        // Every success recorded its response (the resolver finds the same bytes), and the audit
        // rows name them (verify checks their size and hash).
        disk.load([&](const idem::stored_record& rec) {
            if (rec.state != record_state::succeeded) return;
            const std::size_t k = std::strtoull(rec.key.substr(2).c_str(), nullptr, 10);
            EXPECT_EQ(rec.payload, response_of(k)) << rec.key;
        });
        const idem::verify_report rep = idem::verify(disk);
        for (const auto& v : rep.violations) ADD_FAILURE() << "audit: " << v;
    }
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0)
            std::printf(
                "sim_test: deterministic simulation of idem (docs/testing.md, section 4)\n"
                "  --seeds=N              seeds of sim.seeds (IDEM_SIM_SEEDS, default 1000)\n"
                "  --first=S              first seed (IDEM_SIM_FIRST, default 1)\n"
                "  --seed=S               replay one seed with its full trace (IDEM_SIM_SEED)\n"
                "  --real-seeds=N         seeds of sim.real_pipeline (IDEM_SIM_REAL_SEEDS, default 8)\n"
                "  --no-committed-faults  keep store::committed() healthy (IDEM_SIM_COMMITTED_FAULTS=0)\n"
                "  --teeth-all            every mutation of sim.checker_has_teeth over 200 seeds (IDEM_SIM_TEETH_ALL=1)\n"
                "  --windows=0            no window features (and none of the rotation's: versions, confirm\n"
                "                         races, steady load) (IDEM_SIM_WINDOWS=0)\n"
                "  IDEM_SIM_DISK=sqlite|rocksdb, IDEM_SIM_FILE_SEEDS=N: the seeds over a real file store\n"
                "  long runs: --gtest_filter=sim.seeds --first=S --seeds=N (about 1,000 seeds a second)\n\n");
    ::testing::InitGoogleTest(&argc, argv);
    g_flags.seeds = env_or("IDEM_SIM_SEEDS", g_flags.seeds);
    g_flags.first = env_or("IDEM_SIM_FIRST", g_flags.first);
    g_flags.real_seeds = env_or("IDEM_SIM_REAL_SEEDS", g_flags.real_seeds);
    if (const char* s = std::getenv("IDEM_SIM_SEED")) g_flags.one = std::strtoull(s, nullptr, 10);
    // IDEM_SIM_DISK=sqlite|rocksdb: test sim.seeds (and --seed=S replays) run over that file store.
    if (const char* d = std::getenv("IDEM_SIM_DISK")) {
        const std::string disk = d;
        if (disk == "sqlite") g_disk = disk_kind::sqlite;
        else if (disk == "rocksdb") g_disk = disk_kind::rocksdb;
    }
    g_flags.committed_faults = env_or("IDEM_SIM_COMMITTED_FAULTS", 1) != 0;
    g_flags.teeth_all = env_or("IDEM_SIM_TEETH_ALL", 0) != 0;
    g_flags.windows = env_or("IDEM_SIM_WINDOWS", 1) != 0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&](const char* p) { return std::strtoull(a.c_str() + std::strlen(p), nullptr, 10); };
        if (a.rfind("--seeds=", 0) == 0) g_flags.seeds = val("--seeds=");
        else if (a.rfind("--first=", 0) == 0) g_flags.first = val("--first=");
        else if (a.rfind("--seed=", 0) == 0) g_flags.one = val("--seed=");
        else if (a.rfind("--real-seeds=", 0) == 0) g_flags.real_seeds = val("--real-seeds=");
        else if (a == "--no-committed-faults") g_flags.committed_faults = false;
        else if (a == "--teeth-all") g_flags.teeth_all = true;
        else if (a.rfind("--windows=", 0) == 0) g_flags.windows = val("--windows=") != 0;
    }
    return RUN_ALL_TESTS();
}
