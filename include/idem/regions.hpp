// idem/regions.hpp: several PostgreSQL clusters as regions of one key space (target idem::postgres).
//
//   std::vector<idem::region> rs{{"eu", "postgresql://idem@db.eu/pay"}, {"us", "postgresql://idem@db.us/pay"},
//                                {"ap", "postgresql://idem@db.ap/pay"}};
//   idem::setup_regions(rs, idem::replication_mode::synchronous);  // once, by an operator (or `idem regions setup`)
//   // then, in each region's processes: idem::regional_guard (regional_guard.hpp)
//
// Each key has a home region, given by the user's rule (a function of the key). Its claims are
// decided by its home's cluster only, by that cluster's primary key, exactly as global scope
// decides them in one PostgreSQL; a process in another region sends a foreign key's first claim to
// the home (one cross-region round trip, batched like local claims). Decisions travel by logical
// replication (change data capture): each cluster publishes the schema of its home keys and
// subscribes to every other's (detail/regions/names.hpp: one schema per home, and why), so a
// duplicate in any region whose decision has arrived is answered there, from memory or the local
// replica, with no cross-region round trip.
//
// Durability between regions (replication_mode):
//   * asynchronous: a home's commit is acknowledged once its own cluster flushed it; a region lost
//     with its disks takes with it the decisions its subscribers had not received, the replication
//     lag (replication_link::lag_bytes / lag_ms, regional_guard::replication(), and their
//     Prometheus series say how large it is right now);
//   * synchronous: each home's synchronous_standby_names names its subscriptions
//     ('ANY 1 (idem_eu_to_us, idem_eu_to_ap)'), so a commit is acknowledged only once another
//     region's subscriber flushed it: no acknowledged decision is lost with one region. A commit
//     then costs a cross-region round trip, and a home that can reach no other region acknowledges
//     nothing (its callers get store_unavailable) until one is back.
//
// Moving a key space to another region's cluster while both run is move_home() (move_home.hpp:
// a fence on the old one first). After a region is lost, its key spaces are taken over with home
// leases (home_lease.hpp, takeover.hpp) and the region rebuilt (rebuild_region.hpp); without
// leases, the keys of a lost home are refused (store_unavailable) in the other regions, never
// granted there, and their decisions already replicated are still answered.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "idem/detail/global/pg_sql.hpp"
#include "idem/detail/pg/connection.hpp"
#include "idem/detail/pg/schema.hpp"
#include "idem/detail/regions/lease_sql.hpp"
#include "idem/detail/regions/names.hpp"
#include "idem/error.hpp"
#include "idem/stores/postgres_store.hpp"
#include "idem/verify.hpp"

namespace idem {

/// A region: its name (1 to 24 of a-z and 0-9, starting with a letter) and the connection string of
/// its PostgreSQL cluster as this process reaches it (a failover pair's multi-host URI works).
struct region {
    std::string name;
    std::string uri;
};

enum class replication_mode : std::uint8_t {
    asynchronous,  ///< a region lost with its disks can take its last decisions (its replication lag) with it
    synchronous,   ///< a home's commit waits for one other region's subscriber: no acknowledged decision is lost
};

/// One replication link between two regions, as seen from one cluster.
struct replication_link {
    std::string from;  ///< the home region publishing
    std::string to;    ///< the region subscribing
    /// Incoming (to == this region): the subscription's apply worker runs. Outgoing (from == this
    /// region): a walsender streams to the subscriber.
    bool up = false;
    /// Outgoing: WAL bytes of the home not yet confirmed flushed by the subscriber (what a loss of
    /// the home's disks would take with it in asynchronous mode). -1 for incoming links.
    std::int64_t lag_bytes = -1;
    /// Outgoing: PostgreSQL's flush lag of the subscriber (0 when idle). -1 for incoming links.
    std::int64_t lag_ms = -1;
    /// Incoming: milliseconds since the subscription last heard from its publisher (-1: never,
    /// or not running). -1 for outgoing links.
    std::int64_t heard_ms = -1;
    /// Outgoing: the home waits for this subscriber at commit (synchronous_standby_names names it,
    /// and it is streaming).
    bool synchronous = false;
};

namespace detail::regions {

inline void check_regions(const std::vector<region>& rs) {
    if (rs.size() < 2)
        throw error(errc::invalid_argument, "regions: at least two regions are needed, got " + std::to_string(rs.size()));
    for (std::size_t i = 0; i < rs.size(); ++i) {
        check_name(rs[i].name);
        if (rs[i].uri.empty()) throw error(errc::invalid_argument, "region '" + rs[i].name + "': empty connection string");
        for (std::size_t j = 0; j < i; ++j)
            if (rs[j].name == rs[i].name) throw error(errc::invalid_argument, "region '" + rs[i].name + "' is named twice");
    }
}

/// A session of the regions' own administration (setup, moves, takeovers, leases, status). Its
/// commits wait for no other region (synchronous_commit = local): they write catalogs, markers,
/// lease rows and merged copies, and a commit that waited for a lost region's subscriber would
/// wait for ever. What must be elsewhere before a step goes on is awaited by polling the other
/// cluster.
[[nodiscard]] inline std::unique_ptr<pqxx::connection> connect(const std::string& uri, std::chrono::milliseconds deadline,
                                                               std::string_view app) {
    auto c = std::make_unique<pqxx::connection>(pg::session_conninfo(uri, deadline, app));
    pqxx::nontransaction n(*c);
    n.exec("SET synchronous_commit = local");
    return c;
}

/// A row's fields from `first` on, each followed by '|' (to compare rows as text).
[[nodiscard]] inline std::string joined(const pqxx::row& row, pqxx::row::size_type first) {
    std::string line;
    for (pqxx::row::size_type i = first; i < row.size(); ++i) line.append(row[i].c_str()).append("|");
    return line;
}

/// The links this cluster (region `self`) sees: its incoming subscriptions and its outgoing slots.
[[nodiscard]] inline std::vector<replication_link> read_links(pqxx::connection& c, const std::string& self) {
    std::vector<replication_link> out;
    pqxx::nontransaction n(c);
    for (const auto& row : n.exec_params(std::string(incoming_sql), self)) {
        const std::string sub = row[0].c_str();  // idem_<home>_to_<self>
        replication_link l;
        l.from = sub.substr(5, sub.size() - 5 - 4 - self.size());
        l.to = self;
        l.up = row[1].as<bool>() && row[2].as<bool>();
        l.heard_ms = row[3].as<std::int64_t>();
        out.push_back(std::move(l));
    }
    for (const auto& row : n.exec_params(std::string(outgoing_sql), self)) {
        const std::string slot = row[0].c_str();  // idem_<self>_to_<subscriber>
        replication_link l;
        l.from = self;
        l.to = slot.substr(5 + self.size() + 4);
        l.up = row[1].as<bool>();
        l.lag_bytes = row[2].as<std::int64_t>();
        l.lag_ms = row[3].as<std::int64_t>();
        l.synchronous = std::string_view(row[4].c_str()) == "sync" || std::string_view(row[4].c_str()) == "quorum";
        out.push_back(std::move(l));
    }
    return out;
}

}  // namespace detail::regions

/// Sets up the regions' clusters, idempotently (run it again after adding a region):
///   * in every cluster, a schema per region (names.hpp), with idem's tables; the schema of the
///     cluster's own region gets the schema version row and scope::global's index;
///   * in every cluster, the publication of its own region's schema;
///   * on every copy of a key space the cluster does not decide, the replica guard (names.hpp): a
///     trigger refusing local writes, so a process with a wrong map is refused, never granted;
///   * in every cluster, a subscription to every other region's publication, connecting with
///     `publisher(home, subscriber)` (default: home.uri; give it when the servers reach each other
///     by other addresses than this process does), whose initial copy is waited for (at most
///     `ready_timeout`);
///   * synchronous mode, once every copy is done: each cluster's synchronous_standby_names =
///     'ANY 1 (<its subscriptions>)' (ALTER SYSTEM and a reload). Asynchronous mode leaves it as
///     it is.
/// Needs a role that may create publications and subscriptions (superuser, or PostgreSQL 15's
/// pg_create_subscription is 16+: superuser on 15), and wal_level = logical on every cluster.
/// Throws idem::error: invalid_argument (names, wal_level), store_unavailable (a cluster cannot be
/// reached, or an initial copy did not finish in time), store_error (anything the server refused).
inline void setup_regions(const std::vector<region>& rs, replication_mode mode,
                          const std::function<std::string(const region& home, const region& subscriber)>& publisher = {},
                          std::chrono::milliseconds ready_timeout = std::chrono::seconds(60)) {
    namespace dr = detail::regions;
    dr::check_regions(rs);
    const auto deadline = std::chrono::milliseconds(30000);
    auto fail = [](const region& r, const std::string& what, const std::exception& e) -> error {
        return error(errc::store_error, "regions setup, region '" + r.name + "': " + what + ": " + e.what());
    };
    std::vector<std::unique_ptr<pqxx::connection>> cs;
    for (const region& r : rs) {
        try {
            cs.push_back(dr::connect(r.uri, deadline, "idem-regions-setup"));
        } catch (const std::exception& e) {
            throw error(errc::store_unavailable, "regions setup, region '" + r.name + "' (" + detail::pg::redact(r.uri) +
                                                     "): cannot connect: " + e.what());
        }
        pqxx::nontransaction n(*cs.back());
        const std::string level = n.exec("SHOW wal_level")[0][0].c_str();
        if (level != "logical")
            throw error(errc::invalid_argument, "regions setup, region '" + r.name + "': wal_level is '" + level +
                                                    "'; logical replication needs wal_level = logical (a restart)");
    }
    for (std::size_t c = 0; c < rs.size(); ++c) {
        for (const region& x : rs) {
            const std::string schema = dr::schema_of(x.name);
            try {
                pqxx::work w(*cs[c]);
                w.exec(std::string(detail::pg::schema_lock));
                w.exec("CREATE SCHEMA IF NOT EXISTS " + schema);
                w.exec("SET LOCAL search_path = " + schema);
                w.exec(std::string(detail::pg::schema_ddl));
                if (x.name == rs[c].name) {  // its own home: written here (a replica gets its rows by the copy)
                    w.exec(std::string(detail::pg::schema_version_insert));
                    w.exec(std::string(detail::global::sql::processing_index));
                }
                w.commit();
            } catch (const std::exception& e) {
                throw fail(rs[c], "schema " + schema, e);
            }
        }
        const std::string pub = dr::publication_of(rs[c].name);
        try {
            pqxx::nontransaction n(*cs[c]);
            if (n.exec_params("SELECT 1 FROM pg_publication WHERE pubname = $1", pub).empty())
                n.exec("CREATE PUBLICATION " + pub + " FOR TABLES IN SCHEMA " + dr::schema_of(rs[c].name));
        } catch (const std::exception& e) {
            throw fail(rs[c], "publication " + pub, e);
        }
    }
    // Which cluster decides each key space: the one whose publication publishes its schema (its own
    // region's, unless move_home handed it over). Every other cluster's copy gets the replica guard.
    std::vector<std::string> decider(rs.size());
    for (std::size_t x = 0; x < rs.size(); ++x)
        for (std::size_t c = 0; c < rs.size(); ++c) {
            pqxx::nontransaction n(*cs[c]);
            if (!n.exec_params(std::string(dr::publishes_sql), dr::publication_of(rs[c].name), dr::schema_of(rs[x].name))
                     .empty())
                decider[x] = rs[c].name;
        }
    for (std::size_t c = 0; c < rs.size(); ++c)
        for (std::size_t x = 0; x < rs.size(); ++x) {
            const std::string schema = dr::schema_of(rs[x].name);
            try {
                dr::retry_deadlocks([&] {
                    pqxx::work w(*cs[c]);
                    const bool here = decider[x] == rs[c].name;
                    for (const std::string& q :
                         here ? dr::unguard_sql(schema)
                              : dr::guard_sql(schema, rs[x].name,
                                              decider[x].empty() ? "another region's cluster" : "region " + decider[x]))
                        w.exec(q);
                    w.commit();
                });
            } catch (const std::exception& e) {
                throw fail(rs[c], "replica guard of " + schema, e);
            }
        }
    for (std::size_t s = 0; s < rs.size(); ++s) {
        for (const region& h : rs) {
            if (h.name == rs[s].name) continue;
            const std::string sub = dr::subscription_of(h.name, rs[s].name);
            try {
                pqxx::nontransaction n(*cs[s]);  // CREATE SUBSCRIPTION cannot run in a transaction block
                // The apply worker commits what it applied with synchronous_commit = local: flushed
                // before it reports the position, so a synchronous home waits for its subscriber's
                // flush and not for the WAL writer's next round (PostgreSQL's default for a
                // subscription is off: a synchronous commit took ~0.5 s). Not on: the subscriber's own
                // synchronous_standby_names names the other regions, and an apply that waited for
                // them would chain every region's commits into each other's.
                if (n.exec_params("SELECT 1 FROM pg_subscription WHERE subname = $1", sub).empty())
                    n.exec("CREATE SUBSCRIPTION " + sub + " CONNECTION " +
                           dr::sql_literal(publisher ? publisher(h, rs[s]) : h.uri) + " PUBLICATION " +
                           dr::publication_of(h.name) + " WITH (synchronous_commit = 'local')");
                else n.exec("ALTER SUBSCRIPTION " + sub + " SET (synchronous_commit = 'local')");
            } catch (const std::exception& e) {
                throw fail(rs[s], "subscription " + sub, e);
            }
        }
    }
    // Every initial copy done (pg_subscription_rel 'r' for every table of every idem subscription):
    // until then a replica lacks the rows its copy has not reached, and its schema version row.
    const auto until = std::chrono::steady_clock::now() + ready_timeout;
    for (std::size_t s = 0; s < rs.size(); ++s) {
        for (;;) {
            std::int64_t pending = 0;
            try {
                pqxx::nontransaction n(*cs[s]);
                pending = n.exec(
                               "SELECT count(*) FROM pg_subscription_rel sr JOIN pg_subscription s ON s.oid = sr.srsubid "
                               "WHERE left(s.subname, 5) = 'idem_' AND sr.srsubstate <> 'r'")[0][0]
                              .as<std::int64_t>();
            } catch (const std::exception& e) {
                throw fail(rs[s], "initial copy", e);
            }
            if (pending == 0) break;
            if (std::chrono::steady_clock::now() >= until)
                throw error(errc::store_unavailable, "regions setup, region '" + rs[s].name +
                                                         "': " + std::to_string(pending) + " table copies not done after " +
                                                         std::to_string(ready_timeout.count()) + " ms");
            std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling the server's copy state
        }
    }
    // Synchronous mode only now: a subscriber whose table is still in its initial copy skips that
    // table's changes in its apply worker and confirms their flush all the same, so a commit that
    // waited for it would not be held by it.
    if (mode == replication_mode::synchronous) {
        for (std::size_t s = 0; s < rs.size(); ++s) {
            std::string names;
            for (const region& x : rs)
                if (x.name != rs[s].name) names += (names.empty() ? "" : ", ") + dr::subscription_of(rs[s].name, x.name);
            try {
                pqxx::nontransaction n(*cs[s]);
                n.exec("ALTER SYSTEM SET synchronous_standby_names = " + dr::sql_literal("ANY 1 (" + names + ")"));
                n.exec("SELECT pg_reload_conf()");
            } catch (const std::exception& e) {
                throw fail(rs[s], "synchronous_standby_names", e);
            }
        }
    }
}

/// What verify_regions found: each home's own verify() report, and the checks across regions.
struct regions_verify_report {
    std::map<std::string, verify_report> homes;  ///< by region: verify() of its home schema on its cluster
    std::uint64_t records = 0;                   ///< records read in the homes
    std::uint64_t replica_rows = 0;              ///< replica audit rows compared with their home's
    std::vector<std::string> violations;         ///< across regions; each names the key or row and the rule
    /// True when no home and no cross-region check found a violation.
    [[nodiscard]] bool clean() const noexcept {
        if (!violations.empty()) return false;
        for (const auto& [name, r] : homes)
            if (!r.violations.empty()) return false;
        return true;
    }
};

/// Checks every key has one trail, decided in its home region: for every region H, verify() of
/// schema idem_H on H's cluster (the state machine, fences, outcomes); every record there has home
/// H by `home` (a key decided anywhere else is a violation; an empty `home` skips this check); and every other cluster's replica of
/// idem_H holds only audit rows identical to H's rows of the same sequence (a replica is a prefix
/// of its home, behind by its lag: a row past the home's last one was written at the replica;
/// rows its home pruned are not compared). Reads only.
inline regions_verify_report verify_regions(const std::vector<region>& rs,
                                            const std::function<std::string(std::string_view key)>& home,
                                            const std::map<std::string, std::string>& decided_at = {},
                                            std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    namespace dr = detail::regions;
    dr::check_regions(rs);
    regions_verify_report out;
    static const std::string audit_rows =
        "SELECT sequence, idempotent_key, from_status, to_status, fencing_token, detail FROM idempotent_audit ORDER BY "
        "sequence";
    for (const region& space : rs) {
        const std::string schema = dr::schema_of(space.name);
        const auto moved = decided_at.find(space.name);
        const region* at = &space;
        for (const region& r : rs)
            if (moved != decided_at.end() && r.name == moved->second) at = &r;
        const region& h = *at;  // the cluster deciding the key space
        {
            postgres_store st(dr::with_schema(h.uri, schema), deadline);
            out.homes[space.name] = verify(st);
        }
        const auto hc = dr::connect(dr::with_schema(h.uri, schema), deadline, "idem-regions-verify");
        pqxx::nontransaction hn(*hc);
        for (const auto& row : hn.exec("SELECT idempotent_key FROM idempotent_record")) {
            ++out.records;
            if (!home) continue;
            const std::string k = row[0].c_str();
            const std::string want = home(k);
            if (want != space.name)
                out.violations.push_back("key '" + key::printable(k) + "' was decided as key space '" + space.name +
                                         "', but its home is '" + want + "'");
        }
        std::map<std::int64_t, std::string> trail;
        for (const auto& row : hn.exec(audit_rows)) {
            trail.emplace(row[0].as<std::int64_t>(), dr::joined(row, 1));
        }
        for (const region& s : rs) {
            if (s.name == h.name) continue;
            const auto sc = dr::connect(dr::with_schema(s.uri, schema), deadline, "idem-regions-verify");
            pqxx::nontransaction sn(*sc);
            for (const auto& row : sn.exec(audit_rows)) {
                ++out.replica_rows;
                const auto seq = row[0].as<std::int64_t>();
                const std::string line = dr::joined(row, 1);
                const auto it = trail.find(seq);
                if (it == trail.end() && !trail.empty() && seq > trail.rbegin()->first)
                    out.violations.push_back("region '" + s.name + "' replica of '" + space.name + "': audit row " +
                                             std::to_string(seq) + " ('" + line +
                                             "') is past every row of the deciding cluster: written there, not replicated");
                if (it != trail.end() && it->second != line)
                    out.violations.push_back("region '" + s.name + "' replica of '" + space.name + "': audit row " +
                                             std::to_string(seq) + " is '" + line + "' there but '" + it->second +
                                             "' at home");
            }
        }
    }
    return out;
}

/// The links in the Prometheus text exposition format (gauges, one series per link):
///   idem_region_replication_up{from="eu",to="us",side="outgoing"} 1
///   idem_region_replication_lag_bytes{from="eu",to="us"} 0
///   idem_region_replication_lag_seconds{from="eu",to="us"} 0.004
///   idem_region_replication_synchronous{from="eu",to="us"} 1
///   idem_region_replication_heard_seconds{from="us",to="eu"} 0.2
inline std::string to_prometheus(const std::vector<replication_link>& links) {
    std::string out;
    auto family = [&](const char* name, const char* help) {
        out.append("# HELP idem_region_replication_").append(name).append(" ").append(help);
        out.append("\n# TYPE idem_region_replication_").append(name).append(" gauge\n");
    };
    auto series = [&](const char* name, const replication_link& l, const std::string& v, const char* side = nullptr) {
        out.append("idem_region_replication_").append(name).append("{from=\"").append(l.from);
        out.append("\",to=\"").append(l.to).append("\"");
        if (side != nullptr) out.append(",side=\"").append(side).append("\"");
        out.append("} ").append(v).append("\n");
    };
    auto seconds = [](std::int64_t ms) {
        return std::to_string(ms / 1000) + "." + std::to_string(1000 + ms % 1000).substr(1);
    };
    family("up", "1 when the link replicates (incoming: apply worker running; outgoing: walsender streaming).");
    for (const auto& l : links) series("up", l, l.up ? "1" : "0", l.lag_bytes >= 0 ? "outgoing" : "incoming");
    family("lag_bytes", "WAL bytes of the home not yet flushed by the subscriber (outgoing links).");
    for (const auto& l : links)
        if (l.lag_bytes >= 0) series("lag_bytes", l, std::to_string(l.lag_bytes));
    family("lag_seconds", "Flush lag of the subscriber as PostgreSQL measured it (outgoing links; 0 when idle).");
    for (const auto& l : links)
        if (l.lag_ms >= 0) series("lag_seconds", l, seconds(l.lag_ms));
    family("synchronous", "1 when the home's commits wait for this subscriber (outgoing links).");
    for (const auto& l : links)
        if (l.lag_bytes >= 0) series("synchronous", l, l.synchronous ? "1" : "0");
    family("heard_seconds", "Seconds since the subscription last heard from its home (incoming links).");
    for (const auto& l : links)
        if (l.lag_bytes < 0 && l.heard_ms >= 0) series("heard_seconds", l, seconds(l.heard_ms));
    return out;
}

}  // namespace idem
