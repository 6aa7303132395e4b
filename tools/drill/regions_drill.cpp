// tools/drill/regions_drill.cpp: `idem drill --region a=URI --region b=URI --region c=URI`, the
// regions drill: exactly once across regions (idem/regional_guard.hpp) under the faults regions
// meet, checked against an independent ledger as the crash drill checks one store.
//
// What it does
// ------------
// The clusters (3 or 4, on loopback, wal_level = logical, reached as a superuser) must hold no idem
// regions yet: the drill sets them up itself (setup_regions, setup_home_leases) with a
// fault-injecting TCP proxy (fault_proxy.hpp) on every path between two regions: one per ordered
// pair, carrying both the subscription of one region to the other's publication and the forwarded
// claims of one region's processes to the other's cluster, with --rtt-ms of latency. The drill
// itself, the operator, reaches every cluster through one more proxy per region, so a region can
// be lost to it too. Every key is "DR<run id>-<home region>-<serial>_PAY_v1" (drill::home_of).
//
// Each of --cycles cycles starts one `idem drill-worker --scope regional` per region on the same
// request list (new keys of every home, every key not acknowledged yet, late duplicates), so the
// regions race on every key; once they are ready it applies the cycle's fault, SIGKILLs each worker
// at its own random moment, and heals the fault. The faults, in turn:
//   - a partition between two regions (both proxies cut);
//   - a home region isolated (every proxy to and from it blackholed: packets vanish);
//   - replication stopped (one subscription disabled) and resumed;
//   - latency raised to 4x --rtt-ms.
// --synchronous adds the lost region, after the cycles: one region L is isolated from everyone,
// the drill among them, while every worker runs; once L's home lease has run out, another region T
// takes L's key space over (take_over); the workers are killed; L's cluster is wiped (everything
// idem made in it dropped, as a new cluster would be); a cycle runs with L gone and every process
// told decided_at[L] = T; the network heals and L is rebuilt from the others (rebuild_region).
// Asynchronous mode reports the loss window instead: the largest replication lag seen, what a
// region lost with its disks would take with it.
// A final run, every region's worker without kill or fault, asks every key again until each is
// answered. The checks, from the files and the clusters:
//   - no key has two effects in the ledger                                 (double executions)
//   - every acknowledged key is SUCCESS, with its outcome, where its key space is decided
//   - every key issued is SUCCESS, with the outcome of its one effect; no SUCCESS lacks an effect
//   - idem::verify_regions: one trail per key, decided by its space's decider, replicas prefixes
//   - no worker gave an answer a regional guard must never give
// Afterwards the drill drops what it set up in the clusters (not with --keep), so it can run again.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <pqxx/pqxx>

#include "command.hpp"
#include "drill/fault_proxy.hpp"
#include "drill/files.hpp"
#include "drill/process.hpp"
#include "drill/regions_drill.hpp"
#include "drill/report_line.hpp"
#include "idem/home_lease.hpp"
#include "idem/rebuild_region.hpp"
#include "idem/regions.hpp"
#include "idem/takeover.hpp"
#include "prometheus_file.hpp"
#include "report.hpp"

namespace idem::tool {
namespace {

using clock_type = std::chrono::steady_clock;
using drill::fault_proxy;
using drill::worker_process;
using namespace std::chrono_literals;

/// A loopback URI split around its host and port: "postgresql://u@" + 127.0.0.1:PORT + "/db?...".
struct endpoint {
    std::string head;  ///< scheme and user
    std::uint16_t port = 0;
    std::string tail;  ///< path and parameters
    [[nodiscard]] std::string at(std::uint16_t p) const { return head + "127.0.0.1:" + std::to_string(p) + tail; }
};

/// The endpoint of a postgresql:// URI naming 127.0.0.1 or localhost with a port; nullopt otherwise
/// (the proxies forward to loopback only).
std::optional<endpoint> loopback(const std::string& uri) {
    const std::size_t scheme = uri.find("://");
    if (scheme == std::string::npos) return std::nullopt;
    const std::string s = uri.substr(0, scheme);
    if (s != "postgresql" && s != "postgres") return std::nullopt;
    std::size_t host = scheme + 3;
    const std::size_t end = uri.find_first_of("/?", host);
    const std::size_t at = uri.find('@', host);
    if (at != std::string::npos && (end == std::string::npos || at < end)) host = at + 1;
    const std::string hostport = uri.substr(host, end == std::string::npos ? std::string::npos : end - host);
    const std::size_t colon = hostport.rfind(':');
    if (colon == std::string::npos) return std::nullopt;
    const std::string h = hostport.substr(0, colon);
    if (h != "127.0.0.1" && h != "localhost") return std::nullopt;
    int port = 0;
    try {
        std::size_t used = 0;
        port = std::stoi(hostport.substr(colon + 1), &used);
        if (used != hostport.size() - colon - 1) return std::nullopt;
    } catch (const std::exception&) {
        return std::nullopt;
    }
    if (port <= 0 || port > 65535) return std::nullopt;
    return endpoint{uri.substr(0, host), static_cast<std::uint16_t>(port), end == std::string::npos ? "" : uri.substr(end)};
}

/// Runs `sql` on `uri` (a short session of the drill's own).
void exec(const std::string& uri, const std::string& sql) {
    pqxx::connection c(uri);
    pqxx::nontransaction n(c);
    n.exec(sql);
}

/// What idem set up in a cluster, dropped (the wipe of a lost region; the drill's clean-up). The
/// subscriptions first, without their slots (their publishers may be unreachable), then the slots
/// no one streams from, the publications, the schemas, and synchronous_standby_names. Sessions in
/// the way are ended: a killed worker's backend still waiting for a synchronous standby holds its
/// locks until it is ended (it notices its client is gone only when it writes to it), and so does
/// a walsender or a session whose client is behind a blackholed path.
void drop_regions(const std::string& uri, const std::vector<std::string>& names) {
    pqxx::connection c(uri);
    pqxx::nontransaction n(c);
    n.exec("SET synchronous_commit = local");
    n.exec("SET lock_timeout = '2s'");
    static const std::string end_holders =
        "SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_class k ON k.oid = l.relation JOIN pg_namespace s "
        "ON s.oid = k.relnamespace WHERE left(s.nspname, 5) = 'idem_' AND l.pid <> pg_backend_pid()";
    // A statement, again after ending the sessions holding locks on idem's tables (bounded); the
    // error names the statement and the sessions still in the way.
    auto run = [&](const std::string& sql) {
        for (int attempt = 1;; ++attempt) {
            try {
                n.exec(sql);
                return;
            } catch (const pqxx::sql_error& e) {
                if (e.sqlstate() != "55P03" || attempt == 5) {
                    std::string holders;
                    try {
                        for (const auto& r : n.exec(
                                 "SELECT DISTINCT a.pid, a.backend_type, a.application_name, a.state, a.wait_event FROM "
                                 "pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.pid <> pg_backend_pid() AND "
                                 "l.granted AND l.relation IS NOT NULL"))
                            holders += std::string(holders.empty() ? "" : "; ") + r[0].c_str() + " " + r[1].c_str() + " '" +
                                       r[2].c_str() + "' " + r[3].c_str() + " " + r[4].c_str();
                    } catch (const std::exception&) {
                    }
                    throw idem::error(idem::errc::store_error,
                                      "'" + sql + "': " + e.what() +
                                          (holders.empty() ? "" : " (locks held by: " + holders + ")"));
                }
                n.exec(end_holders);
            }
        }
    };
    n.exec(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND "
        "left(application_name, 5) = 'idem-'");
    n.exec(end_holders);
    for (const auto& row : n.exec("SELECT subname FROM pg_subscription WHERE left(subname, 5) = 'idem_'")) {
        const std::string sub = row[0].c_str();
        run("ALTER SUBSCRIPTION " + sub + " DISABLE");
        run("ALTER SUBSCRIPTION " + sub + " SET (slot_name = NONE)");
        run("DROP SUBSCRIPTION " + sub);
    }
    n.exec(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE left(slot_name, 5) = 'idem_' AND "
        "active_pid IS NOT NULL");
    for (int i = 0; i < 100; ++i) {  // a terminated walsender releases its slot shortly after: bounded polling
        const auto r = n.exec("SELECT count(*) FROM pg_replication_slots WHERE left(slot_name, 5) = 'idem_' AND active");
        if (r[0][0].as<int>() == 0) break;
        std::this_thread::sleep_for(50ms);  // polling the server, an external process
        n.exec(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE left(slot_name, 5) = 'idem_' "
            "AND active_pid IS NOT NULL");
    }
    run("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE left(slot_name, 5) = 'idem_' AND NOT "
        "active");
    for (const std::string& r : names) {
        run("DROP PUBLICATION IF EXISTS " + detail::regions::publication_of(r));
        run("DROP SCHEMA IF EXISTS " + detail::regions::schema_of(r) + " CASCADE");
    }
    run("DROP SCHEMA IF EXISTS idem__leases CASCADE");
    run("ALTER SYSTEM RESET synchronous_standby_names");
    n.exec("SELECT pg_reload_conf()");
}

/// What idem regions this cluster holds already (a schema or subscription of theirs), or "".
std::string regions_present(const std::string& uri, const std::vector<std::string>& names) {
    pqxx::connection c(uri);
    pqxx::nontransaction n(c);
    for (const std::string& r : names)
        if (!n.exec_params("SELECT 1 FROM pg_namespace WHERE nspname = $1", detail::regions::schema_of(r)).empty())
            return "schema " + detail::regions::schema_of(r);
    const auto s = n.exec("SELECT subname FROM pg_subscription WHERE left(subname, 5) = 'idem_' LIMIT 1");
    if (!s.empty()) return std::string("subscription ") + s[0][0].c_str();
    if (!n.exec("SELECT 1 FROM pg_namespace WHERE nspname = 'idem__leases'").empty()) return "schema idem__leases";
    return {};
}

/// Ends a blackhole: the connections that lost bytes are cut (both ends see them die and connect
/// again, rather than wait on a stream with a hole), and new ones are forwarded.
void reconnect(fault_proxy& p) {
    p.partition();
    p.heal();
}

/// "12.3 s": how long a phase of the drill took, for its line in the report.
std::string took_since(clock_type::time_point t0) {
    return fixed(std::chrono::duration<double>(clock_type::now() - t0).count(), 1) + " s";
}
std::string seconds_since(clock_type::time_point t0) { return " (" + took_since(t0) + ")"; }

struct fault {
    std::string what;  ///< for the report
    std::function<void()> apply, heal;
};

struct worker_run {
    std::string region;
    std::unique_ptr<worker_process> w;
    bool ready = false, killed = false, over = false;
    std::optional<clock_type::time_point> kill_at;
    std::optional<drill::report_line> done;
};

}  // namespace

int run_regions_drill(const regions_drill_config& c) {
    namespace dr = detail::regions;
    const auto started = clock_type::now();
    // The regions, checked before anything is touched.
    std::vector<region> direct;
    std::vector<endpoint> ends;
    std::vector<std::string> names;
    for (const std::string& a : c.regions) {
        const auto eq = a.find('=');
        const std::string name = eq == std::string::npos ? a : a.substr(0, eq);
        if (eq == std::string::npos || !dr::valid_name(name) || name.size() > 10) {
            std::cerr
                << "--region: '" << a
                << "' is not NAME=URI with a region name of 1 to 10 characters of a-z and 0-9 starting with a letter\n";
            return exit_usage;
        }
        const auto e = loopback(a.substr(eq + 1));
        if (!e) {
            std::cerr << "--region: " << name
                      << ": the drill's proxies forward to loopback only: give a postgresql:// URI naming 127.0.0.1 or "
                         "localhost with a port\n";
            return exit_usage;
        }
        if (std::find(names.begin(), names.end(), name) != names.end()) {
            std::cerr << "--region: region '" << name << "' is named twice\n";
            return exit_usage;
        }
        for (std::size_t i = 0; i < ends.size(); ++i)
            if (ends[i].port == e->port) {
                std::cerr << "--region: regions " << names[i] << " and " << name << " name the same cluster (port "
                          << e->port << "); each region needs a cluster of its own\n";
                return exit_usage;
            }
        direct.push_back({name, a.substr(eq + 1)});
        ends.push_back(*e);
        names.push_back(name);
    }
    if (direct.size() < 3 || direct.size() > 4) {
        std::cerr << "--region: " << direct.size()
                  << " regions given; the drill needs 3 or 4 (the home leases' majority must survive a lost region)\n";
        return exit_usage;
    }
    if (c.kill_min_ms > c.kill_max_ms) {
        std::cerr << "--kill-min-ms: " << c.kill_min_ms << " is above --kill-max-ms " << c.kill_max_ms << '\n';
        return exit_usage;
    }
    for (const region& r : direct) {
        std::string present;
        try {
            present = regions_present(r.uri, names);
        } catch (const std::exception& e) {
            std::cerr << "idem drill: region " << r.name << ": cannot reach its cluster: " << e.what() << '\n';
            return exit_runtime;
        }
        if (!present.empty()) {
            std::cerr << "idem drill: region " << r.name << "'s cluster holds idem regions already (" << present
                      << "); the drill sets regions up itself and drops them afterwards: give it clusters for drills\n";
            return exit_runtime;
        }
    }

    const std::string dir = drill::make_directory();
    const std::string ledger_path = dir + "/ledger", acks_path = dir + "/acks";
    std::mt19937_64 rng(c.seed);
    std::random_device rd;
    char run_id[16];
    std::snprintf(run_id, sizeof run_id, "%08x", static_cast<unsigned>(rd()));
    const std::string prefix = std::string("DR") + run_id + "-";
    const std::string exe = drill::self_exe();
    const std::size_t n = direct.size();
    if (!c.json)
        std::cerr << "idem drill: " << c.cycles << " cycles across " << n << " regions ("
                  << (c.synchronous ? "synchronous" : "asynchronous") << "), seed " << c.seed << ", drill directory " << dir
                  << '\n';

    // The proxies: path[i][j] carries region i's traffic to region j's cluster; op[j] the drill's.
    std::vector<std::vector<std::unique_ptr<fault_proxy>>> path(n);
    std::vector<std::unique_ptr<fault_proxy>> op;
    const auto one_way = std::chrono::milliseconds(static_cast<std::int64_t>(c.rtt_ms / 2));
    for (std::size_t i = 0; i < n; ++i) {
        path[i].resize(n);
        for (std::size_t j = 0; j < n; ++j) {
            if (i == j) continue;
            path[i][j] = std::make_unique<fault_proxy>(ends[j].port);
            path[i][j]->set_latency(one_way);
        }
        op.push_back(std::make_unique<fault_proxy>(ends[i].port));
    }
    std::vector<region> rs_op;  // the drill's view, through op[]
    for (std::size_t i = 0; i < n; ++i) rs_op.push_back({names[i], ends[i].at(op[i]->port())});
    auto index_of = [&](const std::string& name) {
        return static_cast<std::size_t>(std::find(names.begin(), names.end(), name) - names.begin());
    };
    auto publisher = [&](const region& home, const region& subscriber) {
        const std::size_t h = index_of(home.name), s = index_of(subscriber.name);
        return ends[h].at(path[s][h]->port());
    };
    lease_options lo;
    lo.lease = std::chrono::milliseconds(static_cast<std::int64_t>(c.home_lease_ms));
    lo.margin = lo.lease / 3;
    lo.call_deadline = lo.lease / 4;

    std::vector<std::string> failures;
    std::vector<std::string> fault_log;
    std::map<std::string, std::string> decided_at;  // after a takeover
    std::int64_t max_lag_bytes = 0, max_lag_ms = 0;
    std::uint64_t kills = 0, clean_exits = 0, requests_sent = 0, workers_started = 0;
    struct worker_totals {
        std::uint64_t executed = 0, acked = 0, replayed = 0, unavailable = 0, by_replica = 0, lease_refused = 0,
                      compensated = 0;
    } totals;
    std::string lost_region, taker;
    std::optional<takeover_report> took;
    std::optional<rebuild_report> rebuilt;
    bool set_up = false;

    // Setup: regions (through the paths, so replication meets the faults too) and home leases.
    try {
        set_up = true;  // a setup that fails half-way is cleaned up too
        setup_regions(rs_op, c.synchronous ? replication_mode::synchronous : replication_mode::asynchronous, publisher);
        setup_home_leases(rs_op, lo);
    } catch (const std::exception& e) {
        failures.push_back(std::string("setting the regions up failed: ") + e.what());
    }

    std::vector<std::string> issued;
    std::unordered_map<std::string, std::uint64_t> amount;
    std::unordered_set<std::string> acked;
    std::uint64_t next_serial = 1;
    std::uniform_int_distribution<std::uint64_t> amount_dist(0, 99'999);
    std::uniform_real_distribution<double> delay_dist(c.kill_min_ms, c.kill_max_ms);
    auto refresh_acks = [&] {
        for (const drill::entry& e : drill::read_lines(acks_path).entries)
            if (e.tag == 'A') acked.insert(e.key);
    };
    // New keys of the homes in `homes`, every key not acknowledged yet, and some late duplicates.
    auto make_requests = [&](unsigned fresh, const std::vector<std::string>& homes) {
        std::vector<drill::request> reqs;
        for (unsigned i = 0; i < fresh; ++i) {
            const std::string k = prefix + homes[i % homes.size()] + "-" + std::to_string(next_serial++) + "_PAY_v1";
            amount[k] = amount_dist(rng);
            issued.push_back(k);
            reqs.push_back({k, amount[k]});
        }
        std::vector<std::string> done;
        for (const std::string& k : issued)
            if (!acked.contains(k)) reqs.push_back({k, amount[k]});
            else done.push_back(k);
        for (std::size_t i = 0; i < std::min<std::size_t>(done.size(), fresh / 4 + 1); ++i) {
            const std::string& k = done[rng() % done.size()];
            reqs.push_back({k, amount[k]});
        }
        std::shuffle(reqs.begin(), reqs.end(), rng);
        return reqs;
    };
    auto worker_args = [&](std::size_t i, const std::string& req_path) {
        std::vector<std::string> a{"drill-worker",
                                   "--scope",
                                   "regional",
                                   "--store",
                                   direct[i].uri,
                                   "--self",
                                   names[i],
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
                                   "--worker-index",
                                   std::to_string(i),
                                   "--home-lease-ms",
                                   std::to_string(lo.lease.count()),
                                   "--home-margin-ms",
                                   std::to_string(lo.margin.count())};
        for (std::size_t j = 0; j < n; ++j)
            a.insert(a.end(), {"--region", names[j] + "=" + (i == j ? direct[j].uri : ends[j].at(path[i][j]->port()))});
        for (const auto& [space, at] : decided_at) a.insert(a.end(), {"--decided-at", space + "=" + at});
        if (c.no_guard) a.push_back("--no-guard");
        return a;
    };
    auto sample_lag = [&] {
        for (std::size_t i = 0; i < n; ++i) {
            try {
                pqxx::connection conn(direct[i].uri);
                for (const replication_link& l : dr::read_links(conn, names[i])) {
                    max_lag_bytes = std::max(max_lag_bytes, l.lag_bytes);
                    max_lag_ms = std::max(max_lag_ms, l.lag_ms);
                }
            } catch (const std::exception&) {  // a region that does not answer has no lag to report
            }
        }
    };
    auto absorb = [&](worker_run& x, std::chrono::milliseconds timeout) {
        for (const std::string& line : x.w->read_lines(timeout)) {
            if (line.starts_with("problem ")) {  // an answer a regional guard must never give
                failures.push_back("region " + x.region + "'s worker: " + line.substr(8));
                continue;
            }
            drill::report_line rl = drill::parse_report(line);
            if (rl.word == "ready") x.ready = true;
            else if (rl.word == "done") x.done = rl;
        }
    };
    // One cycle: a worker per region in `in`, the fault applied once they are ready, each killed at
    // its own moment (kill = false: the final run, every worker runs its list to the end).
    auto cycle = [&](const std::string& label, const std::vector<std::size_t>& in, const std::vector<drill::request>& reqs,
                     fault* f, bool kill, std::chrono::seconds limit, const std::function<void()>& while_running = {}) {
        const std::string req_path = dir + "/requests-" + label;
        drill::write_requests(req_path, reqs);
        requests_sent += reqs.size() * in.size();
        std::vector<worker_run> ws;
        for (const std::size_t i : in) {
            worker_run x;
            x.region = names[i];
            x.w = std::make_unique<worker_process>(exe, worker_args(i, req_path));
            ++workers_started;
            ws.push_back(std::move(x));
        }
        bool applied = false;
        const auto hang = clock_type::now() + limit;
        for (;;) {
            bool all_over = true, all_ready = true;
            for (worker_run& x : ws) {
                if (x.over) continue;
                absorb(x, 0ms);
                all_ready = all_ready && (x.ready || x.w->exited());
                if (clock_type::now() > hang) {
                    x.w->kill_now();
                    failures.push_back(label + ": region " + x.region + "'s worker had not finished after " +
                                       std::to_string(limit.count()) + " s");
                    x.over = true;
                    continue;
                }
                if (x.kill_at && clock_type::now() >= *x.kill_at && !x.w->exited()) {
                    x.w->kill_now();
                    x.killed = true;
                    x.over = true;
                    continue;
                }
                if (x.w->exited()) {
                    x.over = true;
                    continue;
                }
                all_over = false;
            }
            if (all_ready && !applied) {
                applied = true;
                if (f != nullptr) f->apply();
                if (while_running) while_running();
                // Each worker's kill moment counts from here, so every one of them meets the fault.
                if (kill)
                    for (worker_run& x : ws)
                        x.kill_at = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                            std::chrono::duration<double, std::milli>(delay_dist(rng)));
            }
            if (all_over) break;
            std::this_thread::sleep_for(10ms);  // the workers' pipes and kill moments, polled
        }
        if (applied && f != nullptr) {
            sample_lag();
            f->heal();
        }
        for (worker_run& x : ws) {
            x.w->wait();
            for (int i = 0; i < 50 && !x.w->eof(); ++i) absorb(x, 10ms);
            const int st = x.w->status();
            if (x.killed && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
                ++kills;
            } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                ++clean_exits;
            } else {  // a crash, an exit 1 (an answer it must never give), or a kill not the drill's
                failures.push_back(label + ": region " + x.region + "'s worker " + drill::describe_status(st));
            }
            if (x.done) {
                totals.executed += static_cast<std::uint64_t>(x.done->get("executed"));
                totals.acked += static_cast<std::uint64_t>(x.done->get("acked"));
                totals.replayed += static_cast<std::uint64_t>(x.done->get("replayed"));
                totals.unavailable += static_cast<std::uint64_t>(x.done->get("unavailable"));
                totals.by_replica += static_cast<std::uint64_t>(x.done->get("by_replica"));
                totals.lease_refused += static_cast<std::uint64_t>(x.done->get("lease_refused"));
                totals.compensated += static_cast<std::uint64_t>(x.done->get("compensated"));
            }
        }
        refresh_acks();
    };

    // The faults, one per cycle in turn, on regions drawn from the seed.
    auto pick = [&] { return static_cast<std::size_t>(rng() % n); };
    auto make_fault = [&](unsigned k) {
        fault f;
        const std::size_t a = pick();
        const std::size_t b = (a + 1 + rng() % (n - 1)) % n;
        switch (k % 4) {
            case 0:
                f.what = "partition " + names[a] + " | " + names[b];
                f.apply = [&, a, b] {
                    path[a][b]->partition();
                    path[b][a]->partition();
                };
                f.heal = [&, a, b] {
                    path[a][b]->heal();
                    path[b][a]->heal();
                };
                break;
            case 1:
                f.what = "region " + names[a] + " isolated";
                f.apply = [&, a] {
                    for (std::size_t j = 0; j < n; ++j)
                        if (j != a) {
                            path[a][j]->blackhole();
                            path[j][a]->blackhole();
                        }
                };
                f.heal = [&, a] {
                    for (std::size_t j = 0; j < n; ++j)
                        if (j != a) {
                            reconnect(*path[a][j]);
                            reconnect(*path[j][a]);
                        }
                };
                break;
            case 2: {
                const std::string sub = dr::subscription_of(names[a], names[b]);
                f.what = "replication " + names[a] + " -> " + names[b] + " stopped and resumed";
                f.apply = [&, b, sub] { exec(direct[b].uri, "ALTER SUBSCRIPTION " + sub + " DISABLE"); };
                f.heal = [&, b, sub] { exec(direct[b].uri, "ALTER SUBSCRIPTION " + sub + " ENABLE"); };
                break;
            }
            default:
                f.what = "latency " + fixed(c.rtt_ms * 4, 0) + " ms round trip";
                f.apply = [&, one_way] {
                    for (auto& row : path)
                        for (auto& p : row)
                            if (p) p->set_latency(one_way * 4);
                };
                f.heal = [&, one_way] {
                    for (auto& row : path)
                        for (auto& p : row)
                            if (p) p->set_latency(one_way);
                };
        }
        return f;
    };

    std::vector<std::size_t> everyone(n);
    for (std::size_t i = 0; i < n; ++i) everyone[i] = i;
    for (unsigned k = 0; k < c.cycles && failures.empty(); ++k) {
        fault f = make_fault(k);
        const auto t0 = clock_type::now();
        try {
            cycle("cycle-" + std::to_string(k + 1), everyone, make_requests(c.keys, names), &f, true, 180s);
        } catch (const std::exception& e) {
            failures.push_back("cycle " + std::to_string(k + 1) + " (" + f.what + "): " + e.what());
        }
        fault_log.push_back("cycle " + std::to_string(k + 1) + ": " + f.what + seconds_since(t0));
    }

    // Synchronous mode: a region lost with its disks, taken over, wiped, and rebuilt.
    if (c.synchronous && failures.empty()) {
        const std::size_t l = pick();
        const std::size_t t = (l + 1 + rng() % (n - 1)) % n;
        lost_region = names[l];
        taker = names[t];
        fault cut;
        cut.what = "region " + lost_region + " lost (isolated from every region and the drill), taken over by " + taker;
        cut.apply = [&] {
            op[l]->blackhole();
            for (std::size_t j = 0; j < n; ++j)
                if (j != l) {
                    path[l][j]->blackhole();
                    path[j][l]->blackhole();
                }
        };
        cut.heal = [] {};  // L stays lost until it is rebuilt
        std::string step = "the takeover";
        std::string times;
        try {
            // While every worker runs, L disappears; the takeover waits for L's lease, L's own
            // worker keeps asking (its grants are refused once its lease ran out), the others' ask
            // for L's keys in vain (refused store_unavailable, never granted) until they die.
            cycle("lost", everyone, make_requests(c.keys, names), nullptr, true, 240s, [&] {
                const auto cut_at = clock_type::now();
                cut.apply();
                took = take_over(rs_op, lost_region, taker, lo, 60s);
                times += "; taken over " + took_since(cut_at) + " after the cut";
            });
            decided_at[lost_region] = taker;
            step = "the wipe";
            drop_regions(direct[l].uri, names);  // L's cluster as a new one
            step = "the cycle after the takeover";
            std::vector<std::size_t> others;
            for (std::size_t i = 0; i < n; ++i)
                if (i != l) others.push_back(i);
            fault none{"none", [] {}, [] {}};
            cycle("after-takeover", others, make_requests(c.keys, names), &none, true, 180s);
            reconnect(*op[l]);
            for (std::size_t j = 0; j < n; ++j)
                if (j != l) {
                    reconnect(*path[l][j]);
                    reconnect(*path[j][l]);
                }
            step = "the rebuild";
            const auto r0 = clock_type::now();
            rebuilt = rebuild_region(rs_op, lost_region, lo, publisher);
            times += "; rebuilt in " + took_since(r0);
        } catch (const std::exception& e) {
            failures.push_back("lost region " + lost_region + ", " + step + ": " + e.what());
            reconnect(*op[l]);  // the checks below read every region
            for (std::size_t j = 0; j < n; ++j)
                if (j != l) {
                    reconnect(*path[l][j]);
                    reconnect(*path[j][l]);
                }
        }
        fault_log.push_back("lost region: " + cut.what + times);
    }
    if (!c.synchronous) sample_lag();

    // The final run: every region, no fault, no kill, until every request is answered.
    if (failures.empty()) {
        try {
            std::vector<drill::request> all;
            for (const std::string& k : issued) all.push_back({k, amount[k]});
            std::shuffle(all.begin(), all.end(), rng);
            const auto t0 = clock_type::now();
            cycle("final", everyone, all, nullptr, false, 300s);
            fault_log.push_back("final run: every key asked again in every region, no fault, no kill" + seconds_since(t0));
        } catch (const std::exception& e) {
            failures.push_back(std::string("final run: ") + e.what());
        }
    }

    // The checks.
    const std::size_t run_failures_before_checks = failures.size();
    const drill::line_file ledger = drill::read_lines(ledger_path);
    const drill::line_file acks = drill::read_lines(acks_path);
    std::unordered_map<std::string, std::uint64_t> effects;
    std::uint64_t double_executions = 0;
    for (const drill::entry& e : ledger.entries)
        if (e.tag == 'E' && !effects.emplace(e.key, e.outcome).second) {
            ++double_executions;
            failures.push_back("key " + e.key + " has two effects in the ledger");
        }
    struct row {
        std::string status;
        std::uint64_t outcome = 0;
    };
    std::unordered_map<std::string, row> rows;  // every drill key where its space is decided
    bool read_ok = true;
    for (std::size_t s = 0; s < n; ++s) {
        const auto moved = decided_at.find(names[s]);
        const std::size_t d = moved == decided_at.end() ? s : index_of(moved->second);
        try {
            pqxx::connection conn(direct[d].uri);
            pqxx::nontransaction q(conn);
            for (const auto& r :
                 q.exec_params("SELECT idempotent_key, status, COALESCE(outcome, 0) FROM " + dr::schema_of(names[s]) +
                                   ".idempotent_record WHERE left(idempotent_key, length($1)) = $1",
                               prefix))
                rows[r[0].c_str()] = {r[1].c_str(), r[2].as<std::uint64_t>()};
        } catch (const std::exception& e) {
            read_ok = false;
            failures.push_back("reading key space " + names[s] + " at region " + names[d] + ": " + e.what());
        }
    }
    std::uint64_t lost_acknowledged = 0, unresolved = 0, phantom = 0, mismatches = 0;
    if (read_ok) {
        for (const drill::entry& a : acks.entries) {
            const auto it = rows.find(a.key);
            if (it == rows.end() || it->second.status != "SUCCESS" || it->second.outcome != a.outcome) {
                ++lost_acknowledged;
                if (lost_acknowledged <= 5)
                    failures.push_back("acknowledged key " + a.key + " is not SUCCESS with its outcome");
            }
        }
        for (const std::string& k : issued) {
            const auto it = rows.find(k);
            if (it == rows.end() || it->second.status != "SUCCESS") {
                ++unresolved;
                continue;
            }
            const auto eff = effects.find(k);
            if (eff == effects.end()) ++phantom;
            else if (eff->second != it->second.outcome) ++mismatches;
        }
        if (unresolved) failures.push_back(grouped(unresolved) + " key(s) not SUCCESS after the final run");
        if (phantom) failures.push_back(grouped(phantom) + " SUCCESS record(s) without an effect in the ledger");
        if (mismatches) failures.push_back(grouped(mismatches) + " SUCCESS record(s) whose outcome is not their effect's");
    }
    regions_verify_report vr;
    try {
        vr = verify_regions(
            rs_op, [&](std::string_view k) { return drill::home_of(k, prefix); }, decided_at);
        for (std::size_t i = 0; i < vr.violations.size() && i < 5; ++i) failures.push_back("verify: " + vr.violations[i]);
        for (const auto& [name, r] : vr.homes)
            for (std::size_t i = 0; i < r.violations.size() && i < 5; ++i)
                failures.push_back("verify " + name + ": " + r.violations[i]);
    } catch (const std::exception& e) {
        failures.push_back(std::string("verify_regions: ") + e.what());
    }
    std::uint64_t violations = vr.violations.size();
    for (const auto& [name, r] : vr.homes) violations += r.violations.size();
    const bool ok = failures.empty();
    const double elapsed_s = std::chrono::duration<double>(clock_type::now() - started).count();

    if (c.json) {
        json j = json::object();
        j["command"] = "drill";
        j["mode"] = "regions";
        j["ok"] = ok;
        j["regions"] = names;
        j["synchronous"] = c.synchronous;
        j["rtt_ms"] = c.rtt_ms;
        j["seed"] = c.seed;
        j["run_id"] = std::string(run_id);
        j["cycles"] = std::uint64_t{c.cycles};
        j["faults"] = fault_log;
        j["workers_started"] = workers_started;
        j["kills"] = kills;
        j["clean_exits"] = clean_exits;
        j["keys_issued"] = std::uint64_t{issued.size()};
        j["requests_sent"] = requests_sent;
        j["effects"] = std::uint64_t{ledger.entries.size()};
        j["acknowledged"] = std::uint64_t{acks.entries.size()};
        j["double_executions"] = double_executions;
        j["lost_acknowledged"] = lost_acknowledged;
        j["unresolved"] = unresolved;
        j["phantom_successes"] = phantom;
        j["outcome_mismatches"] = mismatches;
        j["answered_by_replica"] = totals.by_replica;
        j["unavailable"] = totals.unavailable;
        j["lease_refused"] = totals.lease_refused;
        j["compensated"] = totals.compensated;
        j["max_lag_bytes"] = max_lag_bytes;
        j["max_lag_ms"] = max_lag_ms;
        if (took) {
            json t = json::object();
            t["lost"] = lost_region;
            t["to"] = taker;
            t["epoch"] = took->epoch;
            t["merged"] = took->merged;
            t["records"] = took->records;
            t["rebuilt_records"] = rebuilt ? rebuilt->records : 0;
            j["takeover"] = t;
        }
        j["violations"] = violations;
        j["verify_records"] = vr.records;
        j["verify_replica_rows"] = vr.replica_rows;
        j["elapsed_s"] = elapsed_s;
        j["failures"] = failures;
        if (!ok || c.keep) j["drill_dir"] = dir;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem drill: " << c.cycles << " cycles across regions ";
        for (std::size_t i = 0; i < n; ++i) std::cout << (i ? ", " : "") << names[i];
        std::cout << " (" << (c.synchronous ? "synchronous" : "asynchronous") << ", " << fixed(c.rtt_ms, 0)
                  << " ms round trip), seed " << c.seed << ", run id " << run_id << "\n\n";
        for (const std::string& f : fault_log) std::cout << "  " << f << '\n';
        std::cout << '\n';
        table t;
        t.row("worker kills", grouped(kills),
              "(SIGKILL; " + grouped(workers_started) + " workers started, " + grouped(clean_exits) + " finished)");
        t.row("keys issued", grouped(issued.size()), "(" + grouped(requests_sent) + " requests, every region racing)");
        t.row("effects in the ledger", grouped(ledger.entries.size()));
        t.row("acknowledged", grouped(acks.entries.size()));
        t.row("double executions", grouped(double_executions), "(keys with two effects in the ledger)");
        t.row("lost acknowledged", grouped(lost_acknowledged), "(acknowledged but not SUCCESS where decided)");
        t.row("unresolved", grouped(unresolved), "(keys not SUCCESS after the final run)");
        t.row("answered by a replica", grouped(totals.by_replica),
              "(duplicates of foreign keys, no round trip; as counted by the workers that finished)");
        t.row("refused, unavailable", grouped(totals.unavailable),
              "(" + grouped(totals.lease_refused) + " of them: the home lease had run out; same)");
        if (took)
            t.row("takeover", lost_region + " -> " + taker,
                  "(epoch " + std::to_string(took->epoch) + ", " + grouped(took->records) + " records; rebuilt with " +
                      grouped(rebuilt ? rebuilt->records : 0) + ")");
        if (!c.synchronous)
            t.row("async loss window", grouped(static_cast<std::uint64_t>(std::max<std::int64_t>(max_lag_bytes, 0))) + " B",
                  "(largest replication lag seen, " +
                      grouped(static_cast<std::uint64_t>(std::max<std::int64_t>(max_lag_ms, 0))) +
                      " ms: what a region lost with its disks would take with it)");
        t.row("verify", grouped(violations) + " violations",
              "(" + grouped(vr.records) + " records, " + grouped(vr.replica_rows) + " replica rows)");
        t.row("elapsed", fixed(elapsed_s, 1) + " s");
        t.print(std::cout);
        std::cout << '\n'
                  << (ok ? std::string("PASS: no double execution, no lost acknowledgement, verify clean across regions.")
                         : "FAIL: see below; the drill directory is kept: " + dir)
                  << '\n';
    }
    for (const std::string& f : failures) std::cerr << "idem drill: FAIL: " << f << '\n';
    if (!ok)
        std::cerr << "idem drill: replay with --seed " << c.seed
                  << " (--keep keeps the regions set up for inspection); files in " << dir << '\n';

    // Clean up what the drill set up, so it can run again (kept with --keep, for inspection).
    op.clear();
    path.clear();
    if (!c.keep && set_up) {
        for (const region& r : direct) {
            try {
                drop_regions(r.uri, names);
            } catch (const std::exception& e) {
                std::cerr << "idem drill: region " << r.name << ": clean-up failed: " << e.what() << '\n';
            }
        }
    }
    bool metrics_written = true;
    if (!c.prometheus.empty()) {
        // The checks: the ledger (double executions), the acknowledgements, every key's record,
        // verify_regions, and the run itself (setup, workers, takeover); each failed or held.
        const std::uint64_t failed_checks = (double_executions != 0) + (lost_acknowledged != 0) +
                                            (unresolved + phantom + mismatches != 0) + (violations != 0) +
                                            (run_failures_before_checks != 0);
        if (auto why = write_drill_metrics(c.prometheus, failed_checks, 5, elapsed_s, "regions")) {
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

}  // namespace idem::tool
