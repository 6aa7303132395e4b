// regions_bench: what regions cost (docs/benchmarks.md, "Regions"). Each run starts three
// PostgreSQL clusters of its own (scripts/lib/postgres.sh, wal_level = logical) as regions a, b and
// c on loopback, and puts a fault-injecting TCP proxy (tests/support/fault_proxy.hpp) with a set
// latency between regions.
//
//   idem-regions-bench --mode foreign [--rtt-ms 20,80] [--threads T] [--keys N]
//   idem-regions-bench --mode sync-cost [--rtt-ms 20] [--threads T] [--keys N] [--reps R]
//
// foreign: region b's process reaches home a through the proxy (one-way latency rtt / 2). Per RTT:
//   * first claims: T threads (default 16) of b each run begin + succeed on fresh keys of home a
//     (N in all, default 800): begin()'s p50 / p99, claims per claim batch (batching across the
//     region boundary), and acknowledged operations/s;
//   * the same keys' duplicates in b, once their decisions reached b's replica, from a new process
//     (empty memory): answered from the local replica (no cross-region round trip): p50 / p99, and
//     how many the replica answered; then again from memory;
//   * for contrast, the same duplicates asked at the home (a global guard of a's keys through the
//     proxy, empty memory): p50 / p99, one cross-region round trip each (batched).
// sync-cost: the servers replicate to each other through proxies with the given latency; T threads
//   (default 32) of a process in a run begin + succeed on N fresh keys of a's own (default 2000),
//   with a's commits waiting for one other region's subscriber (synchronous) and not
//   (asynchronous), alternately, R times each (default 3): acknowledged operations/s and the p50 /
//   p99 of succeed() per mode (medians), and sync / async.
//
// Prints one JSON object per measurement on stdout. Not a test: no assertion on time.
#include <idem/regional_guard.hpp>
#include <idem/regions.hpp>

#include "support/fault_proxy.hpp"
#include "support/private_pg.hpp"
#include "support/threads.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}
double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

std::uint16_t port_of(const std::string& uri) {
    const auto colon = uri.rfind(':');
    return static_cast<std::uint16_t>(std::stoi(uri.substr(colon + 1, uri.find('/', colon) - colon - 1)));
}
std::string via(const idem_test::fault_proxy& p) {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(p.port()) + "/postgres";
}
std::string home_rule(std::string_view k) { return std::string(k.substr(0, 1)); }

struct clusters {
    std::vector<std::unique_ptr<idem_test::private_server>> servers;
    std::vector<idem::region> rs;
    clusters() {
        for (const char* name : {"a", "b", "c"}) {
            servers.push_back(std::make_unique<idem_test::private_server>(
                "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20"));
            if (servers.back()->uri().empty()) {
                std::fprintf(stderr, "regions_bench: a cluster did not start (scripts/lib/postgres.sh)\n");
                std::exit(3);
            }
            rs.push_back({name, servers.back()->uri()});
        }
    }
};

idem::options fast() {
    idem::options o;
    o.capacity = 1 << 16;
    return o;
}

idem::regional_options region_opts(const std::string& self, std::vector<idem::region> rs) {
    idem::regional_options ro;
    ro.self = self;
    ro.regions = std::move(rs);
    ro.home = home_rule;
    ro.forward.claim_connections = 2;
    ro.forward.completion_connections = 2;
    ro.replica_connections = 4;
    return ro;
}

double us_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

/// Runs fn(key index) for `keys` keys over `threads` threads on a latch; returns what each call
/// returned (a latency in us: the whole call's when fn returns a negative value).
template <class Fn>
std::vector<double> timed(int threads, int keys, Fn fn) {
    std::vector<double> all;
    std::mutex m;
    std::atomic<int> next{0};
    idem_test::run_on_latch(static_cast<std::size_t>(threads), [&](std::size_t) {
        std::vector<double> mine;
        for (int i = next.fetch_add(1); i < keys; i = next.fetch_add(1)) {
            const auto t0 = clock_type::now();
            const double own = fn(i);
            mine.push_back(own >= 0 ? own : us_since(t0));
        }
        std::lock_guard lk(m);
        all.insert(all.end(), mine.begin(), mine.end());
    });
    return all;
}

bool replicated(const std::string& on_uri, const std::string& schema, const std::string& k) {
    const auto until = clock_type::now() + 60s;
    while (clock_type::now() < until) {
        pqxx::connection c(on_uri);
        pqxx::nontransaction n(c);
        if (!n.exec_params("SELECT 1 FROM " + schema + ".idempotent_record WHERE idempotent_key = $1 AND status = 'SUCCESS'",
                           k)
                 .empty())
            return true;
        std::this_thread::sleep_for(20ms);
    }
    return false;
}

void foreign(const std::vector<int>& rtts, int threads, int keys) {
    clusters cl;
    idem::setup_regions(cl.rs, idem::replication_mode::asynchronous);
    for (const int rtt : rtts) {
        idem_test::fault_proxy to_a(port_of(cl.rs[0].uri));
        to_a.set_latency(std::chrono::milliseconds(rtt / 2));
        auto rs = cl.rs;
        rs[0].uri = via(to_a);
        const std::string prefix = "a-rtt" + std::to_string(rtt) + "-";
        const std::string warm = "a-warm" + std::to_string(rtt) + "-";  // opens every connection first
        const int warm_keys = 4 * threads;
        std::vector<double> first;
        double secs = 0, per_batch = 0;
        int failed = 0;
        {
            idem::regional_guard gb(fast(), region_opts("b", rs));
            (void)timed(threads, warm_keys, [&](int i) {
                auto r = gb.begin(idem::key(warm + std::to_string(i)), 1);
                if (r.status == idem::begin_status::acquired) (void)r.ticket.succeed(1);
                return -1.0;
            });
            const auto s0 = gb.snapshot();
            const auto t0 = clock_type::now();
            std::atomic<int> bad{0};
            first = timed(threads, keys, [&](int i) {
                const auto t0 = clock_type::now();
                auto r = gb.begin(idem::key(prefix + std::to_string(i)), 1);
                const double begin_us = us_since(t0);
                if (r.status != idem::begin_status::acquired || r.ticket.succeed(static_cast<std::uint64_t>(i)))
                    bad.fetch_add(1);
                return begin_us;
            });
            secs = std::chrono::duration<double>(clock_type::now() - t0).count();
            failed = bad.load();
            const auto s = gb.snapshot();
            for (std::size_t r = 0; r < s.regions.size(); ++r)
                if (s.regions[r].first == "a") {
                    const auto& now = s.regions[r].second;
                    const auto& before = s0.regions[r].second;
                    per_batch = static_cast<double>(now.claims_sent - before.claims_sent) /
                                static_cast<double>(std::max<std::uint64_t>(1, now.claim_batches - before.claim_batches));
                }
        }
        std::printf(
            "{\"bench\":\"regions_first_claim\",\"rtt_ms\":%d,\"threads\":%d,\"keys\":%d,\"begin_p50_us\":%.0f,"
            "\"begin_p99_us\":%.0f,\"claims_per_batch\":%.1f,\"ops_per_s\":%.0f,\"failed\":%d}\n",
            rtt, threads, keys, percentile(first, 0.5), percentile(first, 0.99), per_batch, keys / secs, failed);
        if (!replicated(cl.rs[1].uri, "idem_a", prefix + std::to_string(keys - 1))) {
            std::fprintf(stderr, "regions_bench: the decisions never reached b's replica\n");
            std::exit(4);
        }
        // Every key's decision in b's replica before the duplicates are timed (the last one is
        // there; replication applies a home's commits in order).
        idem::regional_guard gb(fast(), region_opts("b", rs));
        auto dup = [&](auto& g) {
            return [&](int i) {
                (void)g.begin(idem::key(prefix + std::to_string(i)), 1);
                return -1.0;
            };
        };
        auto warmed = [&](auto& g) {
            (void)timed(threads, warm_keys, [&](int i) {
                (void)g.begin(idem::key(warm + std::to_string(i)), 1);
                return -1.0;
            });
        };
        warmed(gb);
        const auto before = gb.snapshot().answered_by_replica;
        const auto replica = timed(threads, keys, dup(gb));
        const auto s = gb.snapshot();
        const auto memory = timed(threads, keys, dup(gb));
        idem::global_options go;
        go.claim_connections = 2;
        idem::global_guard at_home(idem::detail::regions::with_schema(via(to_a), "idem_a"), fast(), go);
        warmed(at_home);
        const auto home = timed(threads, keys, dup(at_home));
        std::printf(
            "{\"bench\":\"regions_duplicate\",\"rtt_ms\":%d,\"threads\":%d,\"keys\":%d,\"replica_p50_us\":%.0f,"
            "\"replica_p99_us\":%.0f,\"answered_by_replica\":%llu,\"memory_p50_us\":%.2f,\"memory_p99_us\":%.2f,"
            "\"home_p50_us\":%.0f,\"home_p99_us\":%.0f}\n",
            rtt, threads, keys, percentile(replica, 0.5), percentile(replica, 0.99),
            static_cast<unsigned long long>(s.answered_by_replica - before), percentile(memory, 0.5),
            percentile(memory, 0.99), percentile(home, 0.5), percentile(home, 0.99));
        std::fflush(stdout);
    }
}

void sync_cost(int rtt, int threads, int keys, int reps) {
    clusters cl;
    // Replication between the servers goes through a proxy per (home, subscriber) with the latency.
    std::vector<std::unique_ptr<idem_test::fault_proxy>> proxies;
    auto publisher = [&](const idem::region& home, const idem::region&) {
        proxies.push_back(std::make_unique<idem_test::fault_proxy>(port_of(home.uri)));
        proxies.back()->set_latency(std::chrono::milliseconds(rtt / 2));
        return via(*proxies.back());
    };
    idem::setup_regions(cl.rs, idem::replication_mode::synchronous, publisher);
    auto set_sync = [&](bool on) {
        pqxx::connection c(cl.rs[0].uri);
        pqxx::nontransaction n(c);
        n.exec(std::string("ALTER SYSTEM SET synchronous_standby_names = '") +
               (on ? "ANY 1 (idem_a_to_b, idem_a_to_c)" : "") + "'");
        n.exec("SELECT pg_reload_conf()");
    };
    std::vector<double> rate[2], p50[2], p99[2];
    idem::regional_guard ga(fast(), region_opts("a", cl.rs));
    for (int rep = 0; rep < reps; ++rep) {
        for (const int mode : {1, 0}) {
            set_sync(mode == 1);
            const std::string prefix = "a-cost-" + std::to_string(rep) + "-" + std::to_string(mode) + "-";
            std::vector<double> lat;
            std::mutex m;
            const auto t0 = clock_type::now();
            (void)timed(threads, keys, [&](int i) {
                auto r = ga.begin(idem::key(prefix + std::to_string(i)), 1);
                if (r.status != idem::begin_status::acquired) return -1.0;
                const auto s0 = clock_type::now();
                (void)r.ticket.succeed(1);
                const double us = us_since(s0);
                std::lock_guard lk(m);
                lat.push_back(us);
                return us;
            });
            const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
            rate[mode].push_back(keys / secs);
            p50[mode].push_back(percentile(lat, 0.5));
            p99[mode].push_back(percentile(lat, 0.99));
        }
    }
    std::printf(
        "{\"bench\":\"regions_sync_cost\",\"rtt_ms\":%d,\"threads\":%d,\"keys\":%d,\"reps\":%d,\"sync_ops_per_s\":%.0f,"
        "\"async_ops_per_s\":%.0f,\"sync_succeed_p50_us\":%.0f,\"sync_succeed_p99_us\":%.0f,"
        "\"async_succeed_p50_us\":%.0f,\"async_succeed_p99_us\":%.0f,\"sync_over_async\":%.2f}\n",
        rtt, threads, keys, reps, median(rate[1]), median(rate[0]), median(p50[1]), median(p99[1]), median(p50[0]),
        median(p99[0]), median(rate[1]) / median(rate[0]));
}

std::vector<int> ints(const std::string& s) {
    std::vector<int> out;
    std::size_t at = 0;
    while (at < s.size()) {
        const std::size_t comma = s.find(',', at);
        out.push_back(std::atoi(s.substr(at, comma - at).c_str()));
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::string mode = "foreign", rtt;
    int threads = 0, keys = 0, reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--mode") mode = v;
        else if (a == "--rtt-ms") rtt = v;
        else if (a == "--threads") threads = std::atoi(v.c_str());
        else if (a == "--keys") keys = std::atoi(v.c_str());
        else if (a == "--reps") reps = std::atoi(v.c_str());
        else {
            std::fprintf(stderr, "regions_bench: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    if (mode == "foreign") {
        foreign(ints(rtt.empty() ? "20,80" : rtt), threads > 0 ? threads : 16, keys > 0 ? keys : 800);
    } else if (mode == "sync-cost") {
        sync_cost(rtt.empty() ? 20 : std::atoi(rtt.c_str()), threads > 0 ? threads : 32, keys > 0 ? keys : 2000, reps);
    } else {
        std::fprintf(stderr, "regions_bench: --mode foreign|sync-cost\n");
        return 2;
    }
    return 0;
}
