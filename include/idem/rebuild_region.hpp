// idem/rebuild_region.hpp: bringing a region back after its key spaces were taken over
// (takeover.hpp), or putting a new cluster in place of a wiped one (target idem::postgres).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "idem/home_lease.hpp"
#include "idem/takeover.hpp"

namespace idem {

/// What rebuild_region() did.
struct rebuild_report {
    std::vector<std::string> copied;  ///< key spaces whose copies were rebuilt from their deciders
    std::uint64_t records = 0;        ///< records the rebuilt copies hold
};

/// Brings region `name` back after its key spaces were taken over (its cluster returned, stale),
/// or gives a new, empty cluster the place of a wiped one (`rs` names the new URI): every key
/// space must be decided by another region's cluster now (take_over first). Then, on `name`'s
/// cluster: idem's schemas, nothing published, the replica guard (and, with leases, the lease
/// fence) on every copy, the copies emptied and copied again from the clusters deciding them
/// (new subscriptions, the old ones and their slots dropped), and its lease store rows set to the
/// newest owner and epoch the others hold, valid for lease + margin from now (a rebuilt store
/// must not vote "expired" for a lease it may have accepted before it was lost). Every other
/// region's subscription to `name` is made again, empty (nothing to copy: it decides nothing), so
/// a later move back works. Waits for every copy (at most `ready_timeout`). `publisher` as for
/// setup_regions. Throws idem::error: invalid_argument (names; a key space decided by no other
/// region), store_unavailable (a cluster cannot be reached; a copy did not finish), store_error.
inline rebuild_report rebuild_region(
    const std::vector<region>& rs, const std::string& name, const std::optional<lease_options>& lo = std::nullopt,
    const std::function<std::string(const region& home, const region& subscriber)>& publisher = {},
    std::chrono::milliseconds ready_timeout = std::chrono::seconds(120)) {
    namespace dr = detail::regions;
    if (lo) dr::check_leases(rs, *lo);
    else dr::check_regions(rs);
    std::size_t ri = rs.size();
    for (std::size_t i = 0; i < rs.size(); ++i)
        if (rs[i].name == name) ri = i;
    if (ri == rs.size()) throw error(errc::invalid_argument, "rebuild_region: no region '" + name + "'");
    const auto deadline = std::chrono::milliseconds(30000);
    std::vector<std::unique_ptr<pqxx::connection>> cs;
    std::vector<pqxx::connection*> others;
    for (const region& r : rs) {
        try {
            cs.push_back(dr::connect(r.uri, deadline, "idem-regions-rebuild"));
        } catch (const std::exception& e) {
            throw error(errc::store_unavailable, "rebuild_region: region '" + r.name + "': cannot connect: " + e.what());
        }
        others.push_back(r.name == name ? nullptr : cs.back().get());
    }
    const std::vector<std::string> decider = dr::deciders(rs, others);  // the rebuilt cluster's catalog is not asked
    for (std::size_t x = 0; x < rs.size(); ++x)
        if (decider[x].empty())
            throw error(errc::invalid_argument, "rebuild_region: key space '" + rs[x].name +
                                                    "' is decided by no region but '" + name +
                                                    "'; take it over first (take_over), or it is lost with it");
    auto step = [&](std::size_t i, const std::string& what, const auto& body) {
        dr::on_region("rebuild_region", rs[i], *cs[i], what, body);
    };
    // A subscription dropped without its publisher's help (the slot may be gone with a wiped
    // cluster), then its slot dropped at the publisher when it is still there.
    auto drop_subscription = [&](std::size_t at, std::size_t publisher_at, const std::string& sub) {
        step(at, "dropping subscription " + sub, [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            if (n.exec_params("SELECT 1 FROM pg_subscription WHERE subname = $1", sub).empty()) return;
            n.exec("ALTER SUBSCRIPTION " + sub + " DISABLE");
            n.exec("ALTER SUBSCRIPTION " + sub + " SET (slot_name = NONE)");
            n.exec("DROP SUBSCRIPTION " + sub);
        });
        step(publisher_at, "dropping slot " + sub, [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            for (const auto until = std::chrono::steady_clock::now() + deadline;;) {
                const auto r = n.exec_params("SELECT active FROM pg_replication_slots WHERE slot_name = $1", sub);
                if (r.empty()) return;
                if (!r[0][0].as<bool>()) break;
                if (std::chrono::steady_clock::now() >= until)
                    throw error(errc::store_unavailable, "rebuild_region: slot " + sub + " stays in use");
                std::this_thread::sleep_for(std::chrono::milliseconds(20));  // its walsender exits
            }
            n.exec_params("SELECT pg_drop_replication_slot($1)", sub);
        });
    };
    auto create_subscription = [&](std::size_t at, std::size_t home, bool copy) {
        const std::string sub = dr::subscription_of(rs[home].name, rs[at].name);
        step(at, "subscription " + sub, [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            n.exec("CREATE SUBSCRIPTION " + sub + " CONNECTION " +
                   dr::sql_literal(publisher ? publisher(rs[home], rs[at]) : rs[home].uri) + " PUBLICATION " +
                   dr::publication_of(rs[home].name) +
                   " WITH (synchronous_commit = 'local', copy_data = " + (copy ? "true" : "false") + ")");
        });
    };
    // 1. It publishes nothing, and every copy it holds refuses local writes (the replica guard,
    // and with leases the lease fence). Its commits left waiting for a subscriber the takeover
    // stopped were never acknowledged: they are ended. They hold locks the guard needs, and a
    // waiting transaction would hold up the creation of the new slots at it (a slot waits for every
    // running transaction), so it waits for no standby until its subscribers are back (step 2).
    rebuild_report rep;
    const std::string pub = dr::publication_of(name);
    std::string standbys;  // its synchronous_standby_names, set again after step 2
    step(ri, "guarding its copies", [&](pqxx::connection& c) {
        {
            pqxx::nontransaction k(c);
            standbys = k.exec("SHOW synchronous_standby_names")[0][0].c_str();
            k.exec(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND "
                "pid <> pg_backend_pid()");
            if (!standbys.empty()) {
                k.exec("ALTER SYSTEM SET synchronous_standby_names = ''");
                k.exec("SELECT pg_reload_conf()");
            }
            for (const auto until = std::chrono::steady_clock::now() + ready_timeout;;) {
                // what committed between the ending and the reload is released by the reload
                if (k.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND "
                           "pid <> pg_backend_pid()")
                        .empty())
                    break;
                if (std::chrono::steady_clock::now() >= until)
                    throw error(errc::store_unavailable,
                                "rebuild_region: region '" + name + "': commits still wait for a synchronous standby");
                std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the reload reaching the backends
            }
        }
        {
            pqxx::nontransaction n(c);
            if (n.exec_params("SELECT 1 FROM pg_publication WHERE pubname = $1", pub).empty())
                n.exec("CREATE PUBLICATION " + pub);
            for (std::size_t x = 0; x < rs.size(); ++x)
                if (!n.exec_params(std::string(dr::publishes_sql), pub, dr::schema_of(rs[x].name)).empty())
                    n.exec("ALTER PUBLICATION " + pub + " DROP TABLES IN SCHEMA " + dr::schema_of(rs[x].name));
        }
        for (std::size_t x = 0; x < rs.size(); ++x) {
            const std::string schema = dr::schema_of(rs[x].name);
            dr::retry_deadlocks([&] {
                pqxx::work w(c);
                w.exec("SET LOCAL lock_timeout = " + std::to_string(ready_timeout.count()));
                w.exec(std::string(detail::pg::schema_lock));
                w.exec("CREATE SCHEMA IF NOT EXISTS " + schema);
                w.exec("SET LOCAL search_path = " + schema);
                w.exec(std::string(detail::pg::schema_ddl));
                for (const std::string& q : dr::guard_sql(schema, rs[x].name, "region " + decider[x])) w.exec(q);
                if (lo) {
                    w.exec(std::string(dr::lease::ddl));
                    for (const std::string& q : dr::lease::fence_sql(schema)) w.exec(q);
                }
                w.commit();
            });
        }
    });
    // 2. The others' subscriptions to it made again, empty (it publishes nothing): its walsenders
    // stream again, so a commit of its own processes (a batch row) waits no longer.
    for (std::size_t h = 0; h < rs.size(); ++h) {
        if (h == ri) continue;
        drop_subscription(h, ri, dr::subscription_of(name, rs[h].name));
        create_subscription(h, ri, false);
    }
    if (!standbys.empty())
        step(ri, "synchronous_standby_names", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            n.exec("ALTER SYSTEM SET synchronous_standby_names = " + dr::sql_literal(standbys));
            n.exec("SELECT pg_reload_conf()");
        });
    // 3. Its own subscriptions dropped (a change applied after the emptying would collide with the
    // new copy), the copies emptied, and subscribed again with a copy.
    for (std::size_t h = 0; h < rs.size(); ++h)
        if (h != ri) drop_subscription(ri, h, dr::subscription_of(rs[h].name, name));
    step(ri, "emptying its copies", [&](pqxx::connection& c) {
        for (std::size_t x = 0; x < rs.size(); ++x) {
            pqxx::work w(c);
            w.exec("SET LOCAL lock_timeout = " + std::to_string(ready_timeout.count()));
            const std::string schema = dr::schema_of(rs[x].name);
            w.exec("TRUNCATE " + schema + ".idempotent_record, " + schema + ".idempotent_audit, " + schema +
                   ".idempotent_batch, " + schema + ".idem_schema");
            w.commit();
            rep.copied.push_back(rs[x].name);
        }
    });
    for (std::size_t h = 0; h < rs.size(); ++h)
        if (h != ri) create_subscription(ri, h, true);
    // 4. Every copy done.
    for (const auto until = std::chrono::steady_clock::now() + ready_timeout;;) {
        std::int64_t pending = 0;
        step(ri, "initial copy", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            pending = n.exec(
                           "SELECT count(*) FROM pg_subscription_rel sr JOIN pg_subscription s ON s.oid = sr.srsubid "
                           "WHERE left(s.subname, 5) = 'idem_' AND sr.srsubstate <> 'r'")[0][0]
                          .as<std::int64_t>();
        });
        if (pending == 0) break;
        if (std::chrono::steady_clock::now() >= until)
            throw error(errc::store_unavailable, "rebuild_region: region '" + name + "': " + std::to_string(pending) +
                                                     " table copies not done after " +
                                                     std::to_string(ready_timeout.count()) + " ms");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling the server's copy state
    }
    step(ri, "records", [&](pqxx::connection& c) {
        pqxx::nontransaction n(c);
        for (const region& x : rs)
            rep.records +=
                n.exec("SELECT count(*) FROM " + dr::schema_of(x.name) + ".idempotent_record")[0][0].as<std::uint64_t>();
    });
    // 5. Its lease store: the newest owner and epoch, pessimistically valid.
    if (lo) {
        for (const region& x : rs) {
            std::string owner;
            std::int64_t epoch = -1;
            for (std::size_t i = 0; i < rs.size(); ++i) {
                if (i == ri) continue;
                pqxx::nontransaction n(*cs[i]);
                const auto r = n.exec_params("SELECT owner, epoch FROM idem__leases.home_lease WHERE space = $1", x.name);
                if (!r.empty() && r[0][1].as<std::int64_t>() > epoch) {
                    owner = r[0][0].c_str();
                    epoch = r[0][1].as<std::int64_t>();
                }
            }
            if (epoch < 0) continue;
            step(ri, "lease store", [&](pqxx::connection& c) {
                pqxx::work w(c);
                w.exec_params(std::string(dr::lease::adopt), x.name, owner, epoch, dr::ms(lo->lease + lo->margin));
                w.exec_params(std::string(dr::lease::drop), x.name, epoch);
                w.commit();
            });
        }
    }
    return rep;
}

}  // namespace idem
