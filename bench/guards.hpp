// bench/guards.hpp: idem::guard and its peers behind one small compile-time interface.
//
// Every guard keeps the same record per key (state, fence, lease deadline, last update, outcome,
// request fingerprint), reads steady_clock once to set the lease on a claim and once to stamp the
// completion, and answers begin() with one of four verdicts. The interface is a concept, not a
// virtual base, so each benchmark loop is compiled for one guard and pays no indirect call.
//
//   G::key_type                      idem::key for idem, std::string for the peers
//   G::name                          the name in the benchmark's name ("idem", "mutex_map", ...)
//   G g(capacity)                    sized for `capacity` live keys up front
//   auto c = g.begin(key, fp)        c.status() is a verdict, c.outcome() the replayed outcome
//   g.succeed(c, outcome)            completes an acquired claim; true on success
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <concepts>
#include <random>
#include <stdexcept>
#include <vector>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <atomic>
#include <unordered_map>

#include <tbb/concurrent_hash_map.h>

#include "uuid_keys.hpp"

#include "idem/durable.hpp"
#include "idem/guard.hpp"
#ifdef IDEM_BENCH_HAVE_ROCKSDB
#include "idem/stores/rocksdb_store.hpp"
#endif
#include "idem/stores/sqlite_store.hpp"

#if IDEM_BENCH_HAVE_LIBCUCKOO
#include <libcuckoo/cuckoohash_map.hh>
#endif

namespace idem_bench {

enum class verdict : std::uint8_t { acquired, duplicate, busy, rejected };

template <class G>
concept bench_guard = requires(G& g, const typename G::key_type& k, typename G::claim& c, std::uint64_t v) {
    { G::name } -> std::convertible_to<std::string_view>;
    { g.begin(k, v) } -> std::same_as<typename G::claim>;
    { c.status() } -> std::same_as<verdict>;
    { c.outcome() } -> std::same_as<std::uint64_t>;
    { g.succeed(c, v) } -> std::same_as<bool>;
};

inline constexpr std::chrono::nanoseconds lease = std::chrono::seconds(30);

inline std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
// idem::guard, no background thread. Two configurations: the default options (the table's pages
// are faulted in on first touch, so early claims pay page faults) and options.prefault = true
// (every page faulted in at construction, MAP_POPULATE).

// A third, idem_payload200: default options, and every success records a 200-byte response payload
// (ticket.succeed(outcome, payload)) that duplicates get back (copied into the answer's string);
// its payload budget is raised to hold one per key of the largest run.
template <bool Prefault, std::size_t Payload = 0>
class basic_idem_guard {
public:
    using key_type = idem::key;
    static constexpr std::string_view name = Payload != 0 ? "idem_payload200" : Prefault ? "idem_prefault" : "idem";
    static_assert(Payload == 0 || Payload == 200, "name the payload size in `name`");

    struct claim {
        idem::begin_result r;
        [[nodiscard]] verdict status() const noexcept {
            switch (r.status) {
                case idem::begin_status::acquired: return verdict::acquired;
                case idem::begin_status::succeeded:
                case idem::begin_status::failed: return verdict::duplicate;
                case idem::begin_status::in_progress:
                case idem::begin_status::in_doubt: return verdict::busy;
                default: return verdict::rejected;
            }
        }
        [[nodiscard]] std::uint64_t outcome() const noexcept { return r.outcome + r.payload.size(); }
    };

    explicit basic_idem_guard(std::size_t capacity) : g_(make_options(capacity)) {}

    claim begin(const idem::key& k, std::uint64_t fingerprint) noexcept { return claim{g_.begin(k, fingerprint)}; }
    bool succeed(claim& c, std::uint64_t outcome) noexcept {
        if constexpr (Payload != 0) {
            static const std::string body(Payload, 'p');
            return !c.r.ticket.succeed(outcome, body);
        } else {
            return !c.r.ticket.succeed(outcome);
        }
    }

    [[nodiscard]] idem::stats snapshot() const noexcept { return g_.snapshot(); }
    [[nodiscard]] std::vector<idem::operation_latency> latencies() const { return g_.operation_latencies(); }

private:
    static idem::options make_options(std::size_t capacity) {
        idem::options o;
        o.capacity = capacity;
        o.prefault = Prefault;
        o.lease = lease;
        o.maintenance_interval = {};  // no background thread: nothing runs beside the benchmark
        if constexpr (Payload != 0) o.payload_budget = std::max<std::size_t>(o.payload_budget, 2 * capacity * Payload);
        return o;
    }
    idem::guard g_;
};

using idem_guard = basic_idem_guard<false>;
using idem_prefault_guard = basic_idem_guard<true>;
using idem_payload_guard = basic_idem_guard<false, 200>;

// idem_scraped: idem_guard with a thread that writes the whole Prometheus exposition
// (to_prometheus(snapshot(), operation_latencies())) every millisecond while the benchmark runs:
// what serving /metrics costs the hot path, at 15,000 times the rate of a 15 s scrape interval.
// Its rows beside idem's in one run are the ratio (docs/api.md, "Metrics").
class idem_scraped_guard {
public:
    using key_type = idem::key;
    using claim = idem_guard::claim;
    static constexpr std::string_view name = "idem_scraped";

    explicit idem_scraped_guard(std::size_t capacity)
        : g_(capacity), scraper_([this](std::stop_token stop) {
              while (!stop.stop_requested()) {
                  const std::string text = idem::to_prometheus(g_.snapshot(), g_.latencies());
                  bytes_.fetch_add(text.size(), std::memory_order_relaxed);   // relaxed: keeps the text alive
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the scrape interval, not a wait for anything
              }
          }) {}

    claim begin(const idem::key& k, std::uint64_t fingerprint) noexcept { return g_.begin(k, fingerprint); }
    bool succeed(claim& c, std::uint64_t outcome) noexcept { return g_.succeed(c, outcome); }
    [[nodiscard]] idem::stats snapshot() const noexcept { return g_.snapshot(); }

private:
    idem_guard g_;
    std::atomic<std::uint64_t> bytes_{0};
    std::jthread scraper_;  // last: stopped and joined before g_ goes
};

/// The durable stores the overhead scenario runs: SQLite (the default set-up) and RocksDB.
enum class durable_kind { sqlite, rocksdb };

/// idem with its durable store: a durable_guard on SQLite (a file in the temporary directory) or
/// RocksDB (a directory there) in async mode, its flusher thread writing every transition in
/// batches while the benchmark runs. Used by the overhead scenario: what a user of the durable
/// set-up pays.
template <durable_kind Kind>
class basic_idem_durable_guard {
public:
    using key_type = idem::key;
    using claim = basic_idem_guard<false>::claim;
    static constexpr std::string_view name = Kind == durable_kind::sqlite ? "idem_durable_sqlite" : "idem_durable_rocksdb";

    explicit basic_idem_durable_guard(std::size_t capacity)
        : path_((std::filesystem::temp_directory_path() /
                 (Kind == durable_kind::sqlite ? "idem-bench-durable.db" : "idem-bench-durable.rocksdb"))
                    .string()),
          g_(open(path_), options(capacity), store_options()) {}
    ~basic_idem_durable_guard() { g_.flush(std::chrono::seconds(60)); }

    claim begin(const idem::key& k, std::uint64_t fingerprint) noexcept { return claim{g_->begin(k, fingerprint)}; }
    bool succeed(claim& c, std::uint64_t outcome) noexcept { return !c.r.ticket.succeed(outcome); }

    /// The guard's and the flusher's counters (flusher_cpu_ns, flushed_transitions, backpressure).
    [[nodiscard]] idem::stats snapshot() { return g_.snapshot(); }

private:
    static std::unique_ptr<idem::store> open(const std::string& path) {
        if constexpr (Kind == durable_kind::rocksdb) {
#ifdef IDEM_BENCH_HAVE_ROCKSDB
            std::error_code ec;
            std::filesystem::remove_all(path, ec);
            return std::make_unique<idem::rocksdb_store>(path);
#endif
        } else {
            // A fresh start: PATH.lock too (the store refuses a missing file whose lock names a writer).
            for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::remove((path + suffix).c_str());
            return std::make_unique<idem::sqlite_store>(path);
        }
    }
    static idem::options options(std::size_t capacity) {
        idem::options o;
        o.capacity = capacity;
        o.lease = lease;
        return o;
    }
    static idem::store_options store_options() {
        idem::store_options so;
        so.mode = idem::durability::async;
        so.offer_wait = std::chrono::seconds(5);  // a full queue waits (bounded) instead of refusing
        return so;
    }
    std::string path_;
    idem::durable_guard g_;
};
using idem_durable_guard = basic_idem_durable_guard<durable_kind::sqlite>;
using idem_durable_rocksdb_guard = basic_idem_durable_guard<durable_kind::rocksdb>;

// ---------------------------------------------------------------------------------------------
// The cold window's cost to fresh keys (issue: "the store is the idempotency window"). A guard
// whose sink takes every transition at once (no store, no thread: what is measured is the hot path
// alone), with or without a cold window of cold_window_keys keys. The cold window is filled as
// recovery fills it (durable.hpp, recover()): one remember_cold() call with every key's table hash
// and last update, the updates spread evenly from the window's start to the hot window's
// (options.retention) edge, so the filter has the slices a restarted service has (one per eighth
// of the window the keys span). The filter's keys are UUIDs of another stream, never a run's keys:
// each begin() of a fresh key probes the filter and misses, except for its false positives, which
// read the "store" (recall: absent here, at once) and are granted; stats::recalls counts them.

/// Keys in the cold window of the idem_cold_window guard: IDEM_BENCH_COLD_KEYS, default 10M.
inline std::size_t cold_window_keys = 10'000'000;

/// Takes every transition at once; knows no record (recall answers absent).
class accept_all_sink final : public idem::transition_sink {
public:
    bool reserve() noexcept override { return true; }
    void unreserve() noexcept override {}
    std::uint64_t offer(const idem::transition&) noexcept override {
        thread_local std::uint64_t seq = 0;  // per thread: no shared counter on the measured path
        return ++seq;
    }
    idem::durability_wait await(std::uint64_t) noexcept override { return idem::durability_wait::committed; }
    bool durable(std::uint64_t) const noexcept override { return true; }
    bool synchronous() const noexcept override { return false; }
    idem::recalled recall(const idem::key&) noexcept override { return {}; }
};

template <bool Cold>
class basic_idem_window_guard {
public:
    using key_type = idem::key;
    using claim = basic_idem_guard<false>::claim;
    static constexpr std::string_view name = Cold ? "idem_cold_window" : "idem_no_cold_window";
    static constexpr auto window = std::chrono::hours(24 * 7);  // store_options::window's default

    explicit basic_idem_window_guard(std::size_t capacity) : g_(make_options(capacity), {}, &sink_) {
        if constexpr (Cold) {
            idem::detail::guard_access::enable_cold_window(g_, window);
            // Recovery's cold keys: last updated between the window's start and the hot window's edge.
            const auto now = g_.now();
            const auto oldest = now - window + std::chrono::minutes(10);
            const auto newest = now - make_options(capacity).retention;
            std::vector<idem::detail::table::window_filter::entry> cold;
            cold.reserve(cold_window_keys);
            std::mt19937_64 rng(0xC01D);
            for (std::size_t i = 0; i < cold_window_keys; ++i) {
                const auto at = oldest + std::chrono::nanoseconds(static_cast<std::int64_t>(
                                             static_cast<double>((newest - oldest).count()) * static_cast<double>(i) /
                                             static_cast<double>(cold_window_keys)));
                cold.push_back(idem::detail::guard_access::cold_entry(g_, idem::key(format_uuid(draw_uuid(rng))), at));
            }
            if (!idem::detail::guard_access::remember_cold(g_, cold))
                throw std::runtime_error("no memory for the cold window");
        }
    }

    claim begin(const idem::key& k, std::uint64_t fingerprint) noexcept { return claim{g_.begin(k, fingerprint)}; }
    bool succeed(claim& c, std::uint64_t outcome) noexcept { return !c.r.ticket.succeed(outcome); }

    [[nodiscard]] idem::stats snapshot() const noexcept { return g_.snapshot(); }
    [[nodiscard]] std::uint64_t cold_slices() const noexcept {
        return g_.cold_window() != nullptr ? g_.cold_window()->use().slices : 0;
    }

private:
    static idem::options make_options(std::size_t capacity) {
        idem::options o;
        o.capacity = capacity;
        o.lease = lease;
        o.maintenance_interval = {};  // no background thread: nothing runs beside the benchmark
        return o;
    }
    accept_all_sink sink_;  // declared before the guard: outlives it
    idem::guard g_;
};

using idem_no_cold_window_guard = basic_idem_window_guard<false>;
using idem_cold_window_guard = basic_idem_window_guard<true>;

// ---------------------------------------------------------------------------------------------
// The record the peers keep, and the decision they share.

enum class record_state : std::uint8_t { processing, succeeded, failed };

struct record {
    record_state state = record_state::processing;
    std::uint64_t fence = 1;
    std::int64_t lease_until = 0;
    std::int64_t updated = 0;
    std::uint64_t outcome = 0;
    std::uint64_t fingerprint = 0;
};

struct peer_claim_base {
    verdict v = verdict::rejected;
    std::uint64_t out = 0;
    [[nodiscard]] verdict status() const noexcept { return v; }
    [[nodiscard]] std::uint64_t outcome() const noexcept { return out; }
};

/// What begin() answers for a key that already has a record.
inline peer_claim_base judge(const record& r, std::uint64_t fingerprint) noexcept {
    if (fingerprint != 0 && r.fingerprint != 0 && fingerprint != r.fingerprint) return {verdict::rejected, 0};
    if (r.state == record_state::processing) return {verdict::busy, 0};
    return {verdict::duplicate, r.outcome};
}

// ---------------------------------------------------------------------------------------------
// std::mutex + std::unordered_map<std::string, record>, reserve()d up front. The claim keeps a
// pointer to its record (node-based map: stable), so succeed() locks but does not hash again.

class mutex_guard {
public:
    using key_type = std::string;
    static constexpr std::string_view name = "mutex_map";

    struct claim : peer_claim_base {
        record* rec = nullptr;
    };

    explicit mutex_guard(std::size_t capacity) { map_.reserve(capacity); }

    claim begin(const std::string& k, std::uint64_t fingerprint) {
        const std::int64_t now = now_ns();
        std::lock_guard lock(mutex_);
        auto [it, inserted] = map_.try_emplace(k);
        record& r = it->second;
        if (inserted) {
            r.lease_until = now + lease.count();
            r.updated = now;
            r.fingerprint = fingerprint;
            claim c;
            c.v = verdict::acquired;
            c.rec = &r;
            return c;
        }
        claim c;
        static_cast<peer_claim_base&>(c) = judge(r, fingerprint);
        return c;
    }

    bool succeed(claim& c, std::uint64_t outcome) {
        const std::int64_t now = now_ns();
        std::lock_guard lock(mutex_);
        c.rec->state = record_state::succeeded;
        c.rec->outcome = outcome;
        c.rec->updated = now;
        return true;
    }

private:
    std::mutex mutex_;
    std::unordered_map<std::string, record> map_;
};

// ---------------------------------------------------------------------------------------------
// tbb::concurrent_hash_map<std::string, record>. Each operation holds an accessor (the element's
// write lock) only inside its own scope, as TBB's documentation recommends; succeed() finds the
// key again under a fresh accessor, because a record may only be written under one.

class tbb_guard {
public:
    using key_type = std::string;
    static constexpr std::string_view name = "tbb_chm";
    using map_type = tbb::concurrent_hash_map<std::string, record>;

    struct claim : peer_claim_base {
        const std::string* key = nullptr;
    };

    explicit tbb_guard(std::size_t capacity) : map_(capacity) {}

    claim begin(const std::string& k, std::uint64_t fingerprint) {
        const std::int64_t now = now_ns();
        claim c;
        map_type::accessor a;
        if (map_.insert(a, k)) {
            a->second.lease_until = now + lease.count();
            a->second.updated = now;
            a->second.fingerprint = fingerprint;
            c.v = verdict::acquired;
            c.key = &k;
        } else {
            static_cast<peer_claim_base&>(c) = judge(a->second, fingerprint);
        }
        return c;  // the accessor is released here
    }

    bool succeed(claim& c, std::uint64_t outcome) {
        const std::int64_t now = now_ns();
        map_type::accessor a;
        if (!map_.find(a, *c.key)) return false;
        a->second.state = record_state::succeeded;
        a->second.outcome = outcome;
        a->second.updated = now;
        return true;
    }

private:
    map_type map_;
};

// ---------------------------------------------------------------------------------------------
// libcuckoo::cuckoohash_map<std::string, record>, reserved up front. The claim is one uprase_fn
// (insert, or inspect the existing record under the bucket lock); succeed() is one update_fn.

#if IDEM_BENCH_HAVE_LIBCUCKOO
class cuckoo_guard {
public:
    using key_type = std::string;
    static constexpr std::string_view name = "libcuckoo";
    using map_type = libcuckoo::cuckoohash_map<std::string, record>;

    struct claim : peer_claim_base {
        const std::string* key = nullptr;
    };

    explicit cuckoo_guard(std::size_t capacity) : map_(capacity) {}

    claim begin(const std::string& k, std::uint64_t fingerprint) {
        const std::int64_t now = now_ns();
        claim c;
        record fresh;
        fresh.lease_until = now + lease.count();
        fresh.updated = now;
        fresh.fingerprint = fingerprint;
        const bool inserted = map_.uprase_fn(
            k,
            [&](record& r) {
                static_cast<peer_claim_base&>(c) = judge(r, fingerprint);
                return false;  // never erase
            },
            fresh);
        if (inserted) {
            c.v = verdict::acquired;
            c.key = &k;
        }
        return c;
    }

    bool succeed(claim& c, std::uint64_t outcome) {
        const std::int64_t now = now_ns();
        return map_.update_fn(*c.key, [&](record& r) {
            r.state = record_state::succeeded;
            r.outcome = outcome;
            r.updated = now;
        });
    }

private:
    map_type map_;
};
#endif

static_assert(bench_guard<idem_guard>);
static_assert(bench_guard<idem_prefault_guard>);
static_assert(bench_guard<mutex_guard>);
static_assert(bench_guard<tbb_guard>);
#if IDEM_BENCH_HAVE_LIBCUCKOO
static_assert(bench_guard<cuckoo_guard>);
#endif

}  // namespace idem_bench
