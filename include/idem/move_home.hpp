// idem/move_home.hpp: moving the deciding of a key space to another region's cluster while both
// run: a planned move (target idem::postgres). The regions themselves are regions.hpp's; a move
// after a region is lost is take_over (takeover.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "idem/detail/global/pg_sql.hpp"
#include "idem/detail/regions/lease_sql.hpp"
#include "idem/detail/regions/names.hpp"
#include "idem/error.hpp"
#include "idem/regions.hpp"

namespace idem {

/// Moves the deciding of key space `space` (the keys whose home rule names it) from region
/// `from`'s cluster, which decides it now, to region `to`'s, while both run: a planned move.
///   1. Fence: on `from`, the replica guard (names.hpp) on idem_<space>: a trigger refusing every
///      write of its records, audit rows and idem_schema (SQLSTATE 55000, naming `to`). Creating it
///      waits for the transactions writing them; after its commit no claim, completion or
///      compensation of the key space commits there: a process still sending them to `from` gets
///      store_unavailable, never a grant. (Batch rows stay writable: the in-doubt probe of a batch
///      in flight at the fence still answers.)
///   2. Catch up: a marker batch row written on `from` after the fence, awaited in EVERY other
///      region's replica (`to` first; at most `timeout` in all): replication applies a publisher's
///      commits in order, so each then holds every row `from` ever committed for the key space.
///      A region that does not catch up fails the move (store_unavailable, naming it): nothing is
///      handed over, the fence stays, and the move can be run again.
///   3. Hand over: `from`'s publication drops the schema and every other region refreshes its
///      subscription to `from`; `to` sets its audit sequence past every row `from` numbered,
///      creates scope::global's index, pushes the leases of claims still PROCESSING out by
///      `lease_margin` (they were measured on `from`'s clock, and their owners can no longer renew
///      them), and publishes the schema; every other region (`from` included) refreshes its
///      subscription to `to` without a copy (each already holds every row).
///   4. With home leases (home_lease.hpp): the lease goes to `to` at the next epoch on every
///      region's cluster and every witness in `witnesses` (a majority must take it; `from`'s
///      keepers then see the newer epoch and stop), and `to`'s keepers renew it from their next
///      round: until then `to`'s lease fence refuses its claims, a pause of at most renew_every.
///   5. Last, `to`'s replica guard is removed: `to` decides the key space from here on. Until then
///      a process given the new map too early is refused there too.
/// Each step reads the catalog (which publication publishes the schema), so a move that stopped
/// half-way (a cluster unreachable) is finished by running it again with the same arguments, and
/// moving a key space back removes the guard the earlier move left. Afterwards give every process
/// regional_options::decided_at[space] = to. Claims still PROCESSING at the fence are decided at
/// `to`, by compensation of `to`'s processes once their (pushed-out) leases expired. Throws
/// idem::error: invalid_argument (names; `from` does not decide the key space), store_unavailable
/// (a cluster cannot be reached, a region did not catch up), store_error (the server refused).
inline void move_home(const std::vector<region>& rs, const std::string& space, const std::string& from,
                      const std::string& to, std::chrono::milliseconds timeout = std::chrono::seconds(60),
                      std::chrono::milliseconds lease_margin = std::chrono::seconds(5),
                      const std::vector<region>& witnesses = {}) {
    namespace dr = detail::regions;
    dr::check_regions(rs);
    auto find = [&](const std::string& name) -> const region& {
        for (const region& r : rs)
            if (r.name == name) return r;
        throw error(errc::invalid_argument, "move_home: no region '" + name + "'");
    };
    (void)find(space);
    (void)find(from);
    (void)find(to);
    if (from == to)
        throw error(errc::invalid_argument, "move_home: key space '" + space + "' is already decided at '" + to + "'");
    const std::string schema = dr::schema_of(space);
    const auto deadline = std::chrono::milliseconds(30000);
    std::map<std::string, std::unique_ptr<pqxx::connection>> cs;
    for (const region& r : rs) {
        try {
            cs[r.name] = dr::connect(r.uri, deadline, "idem-regions-move");
        } catch (const std::exception& e) {
            throw error(errc::store_unavailable, "move_home: region '" + r.name + "': cannot connect: " + e.what());
        }
    }
    auto step = [&](const std::string& region_name, const std::string& what, const auto& body) {
        try {
            body(*cs[region_name]);
        } catch (const error&) {
            throw;
        } catch (const std::exception& e) {
            throw error(errc::store_error, "move_home: region '" + region_name + "': " + what + ": " + e.what());
        }
    };
    auto publishes = [&](const std::string& r) {
        pqxx::nontransaction n(*cs[r]);
        return !n.exec_params(std::string(dr::publishes_sql), dr::publication_of(r), schema).empty();
    };
    const bool at_from = publishes(from);
    if (!at_from && !publishes(to))
        throw error(errc::invalid_argument, "move_home: region '" + from + "' does not decide key space '" + space +
                                                "' (its publication does not publish " + schema + "), nor does '" + to +
                                                "'");
    if (at_from) {
        // 1. the fence, then a marker after it
        const std::int64_t marker = -std::chrono::duration_cast<std::chrono::microseconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count();
        step(from, "fence", [&](pqxx::connection& c) {
            dr::retry_deadlocks([&] {
                pqxx::work w(c);
                for (const std::string& q : dr::guard_sql(schema, space, "region " + to)) w.exec(q);
                w.commit();
            });
            pqxx::work m(c);
            m.exec_params("INSERT INTO " + schema + ".idempotent_batch (batch_id, committed_time) VALUES ($1, 0)", marker);
            m.commit();
        });
        // 2. every other replica up to the marker, `to` first
        std::vector<std::string> order{to};
        for (const region& r : rs)
            if (r.name != from && r.name != to) order.push_back(r.name);
        const auto until = std::chrono::steady_clock::now() + timeout;
        for (const std::string& r : order) {
            bool there = false;
            step(r, "catching up", [&](pqxx::connection& c) {
                for (;;) {
                    pqxx::nontransaction n(c);
                    there =
                        !n.exec_params("SELECT 1 FROM " + schema + ".idempotent_batch WHERE batch_id = $1", marker).empty();
                    if (there || std::chrono::steady_clock::now() >= until) return;
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling the replica
                }
            });
            if (!there)
                throw error(errc::store_unavailable,
                            "move_home: region '" + r + "' did not receive every decision of key space '" + space +
                                "' within " + std::to_string(timeout.count()) + " ms; nothing handed over (the fence on '" +
                                from + "' stays; run the move again)");
        }
        // 3a. `from` stops publishing it; its subscribers drop it (they hold every row: step 2)
        step(from, "publication", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            n.exec("ALTER PUBLICATION " + dr::publication_of(from) + " DROP TABLES IN SCHEMA " + schema);
        });
    }
    for (const region& r : rs) {
        if (r.name == from) continue;
        step(r.name, "refreshing its subscription to '" + from + "'", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            n.exec("ALTER SUBSCRIPTION " + dr::subscription_of(from, r.name) +
                   " REFRESH PUBLICATION WITH (copy_data = false)");
        });
    }
    // 3b. `to` takes it: the audit numbering continues past `from`'s, leases pushed out, published
    std::int64_t numbered = 0;
    step(from, "audit sequence", [&](pqxx::connection& c) {
        pqxx::nontransaction n(c);
        numbered = n.exec("SELECT last_value FROM " + schema + ".idempotent_audit_sequence_seq")[0][0].as<std::int64_t>();
    });
    step(to, "taking the key space", [&](pqxx::connection& c) {
        pqxx::work w(c);
        w.exec("SET LOCAL session_replication_role = replica");  // past its own replica guard, this transaction only
        w.exec("SELECT setval(pg_get_serial_sequence('" + schema + ".idempotent_audit', 'sequence'), GREATEST(" +
               std::to_string(numbered) + ", (SELECT COALESCE(max(sequence), 0) FROM " + schema +
               ".idempotent_audit)) + 1, false)");
        w.exec("SET LOCAL search_path = " + schema);
        w.exec(std::string(detail::global::sql::processing_index));
        w.exec("UPDATE idempotent_record SET lease_until = lease_until + " + std::to_string(lease_margin.count()) +
               " WHERE status = 'PROCESSING'");
        w.commit();
        if (!publishes(to)) {
            pqxx::nontransaction n(c);
            n.exec("ALTER PUBLICATION " + dr::publication_of(to) + " ADD TABLES IN SCHEMA " + schema);
        }
    });
    for (const region& r : rs) {
        if (r.name == to) continue;
        step(r.name, "subscribing to key space '" + space + "' at '" + to + "'", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            n.exec("ALTER SUBSCRIPTION " + dr::subscription_of(to, r.name) +
                   " REFRESH PUBLICATION WITH (copy_data = false)");
        });
    }
    // 4. the home lease, if there are leases
    bool leased = false;
    step(to, "home lease", [&](pqxx::connection& c) {
        pqxx::nontransaction n(c);
        leased = !n.exec(std::string(dr::lease::installed)).empty();
    });
    if (leased) {
        std::vector<std::string> names;
        for (const region& r : rs) names.push_back(r.name);
        for (const region& w : witnesses) {
            names.push_back(w.name);
            try {
                cs[w.name] = dr::connect(w.uri, deadline, "idem-regions-move");
            } catch (const std::exception&) {  // counted below: a majority must take it
            }
        }
        std::int64_t newest = -1;
        for (const std::string& r : names) {
            if (!cs[r]) continue;
            try {
                pqxx::nontransaction n(*cs[r]);
                const auto row = n.exec_params(std::string(dr::lease::epoch_of), space);
                if (!row.empty() && !row[0][0].is_null()) newest = std::max(newest, row[0][0].as<std::int64_t>());
            } catch (const std::exception&) {
            }
        }
        std::size_t took = 0;
        bool at_to = false;
        for (const std::string& r : names) {
            if (!cs[r]) continue;
            try {
                pqxx::nontransaction n(*cs[r]);
                const auto row = n.exec_params(std::string(dr::lease::hand_over), space, to, newest + 1);
                const bool ok = !row.empty() || !n.exec_params(
                                                      "SELECT 1 FROM idem__leases.home_lease WHERE space = $1 "
                                                      "AND owner = $2 AND epoch = $3",
                                                      space, to, newest + 1)
                                                     .empty();
                took += ok ? 1 : 0;
                at_to = at_to || (ok && r == to);
            } catch (const std::exception&) {
            }
        }
        if (took < names.size() / 2 + 1 || !at_to)
            throw error(errc::store_unavailable, "move_home: the home lease of key space '" + space + "' reached " +
                                                     std::to_string(took) + " of " + std::to_string(names.size()) +
                                                     " lease stores (a majority, '" + to +
                                                     "''s own among them, is needed); run the move again");
    }
    // 5. last: `to` decides it
    step(to, "removing its replica guard", [&](pqxx::connection& c) {
        dr::retry_deadlocks([&] {
            pqxx::work w(c);
            for (const std::string& q : dr::unguard_sql(schema)) w.exec(q);
            w.commit();
        });
    });
}

}  // namespace idem
