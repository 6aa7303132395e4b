// idem/takeover.hpp: taking a key space over after the region deciding it is lost (target
// idem::postgres); bringing the lost region back is rebuild_region.hpp's. The leases that make a
// takeover safe are home_lease.hpp's; the protocol and its argument are there and in
// docs/scaling.md.
//
//   #include <idem/rebuild_region.hpp>
//   std::vector<idem::region> rs{{"eu", "postgresql://idem@db.eu/pay"}, {"us", "postgresql://idem@db.us/pay"},
//                                {"ap", "postgresql://idem@db.ap/pay"}};
//   idem::lease_options lo;                       // as given to setup_home_leases
//   auto taken = idem::take_over(rs, "eu", "us", lo);  // eu lost: us decides eu's keys once eu's lease ran out
//   // every process: decided_at["eu"] = "us". Then, each copy that follows no one, once it answers
//   // again (eu's cluster back, or a new one given eu's URI):
//   for (const std::string& r : taken.rebuild) idem::rebuild_region(rs, r, lo);
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>
#include <pqxx/tablewriter>

#include "idem/home_lease.hpp"

namespace idem {

namespace detail::regions {

/// Runs `body` on region `r`'s connection; a failure that is not already an idem::error becomes
/// store_error naming the function, the region and the step.
template <class Body>
void on_region(const char* fn, const region& r, pqxx::connection& c, const std::string& what, const Body& body) {
    try {
        body(c);
    } catch (const error&) {
        throw;
    } catch (const std::exception& e) {
        throw error(errc::store_error, std::string(fn) + ": region '" + r.name + "': " + what + ": " + e.what());
    }
}

/// Merges `from`'s copy of `schema` (records, audit rows, batch rows) into `into`'s, past every
/// trigger (replication's role): a record is replaced by a more advanced one (higher fence; at the
/// same fence a final state over PROCESSING; then the later update), audit and batch rows missing
/// are added. Every copy of a key space is a prefix of its home's commits, so the merge of two is
/// the longer one, row by row. Returns the records `into` holds afterwards.
inline std::uint64_t merge_copy(pqxx::connection& from, pqxx::connection& into, const std::string& schema) {
    static constexpr const char* rec_cols =
        "idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, created_time, "
        "updated_time, payload";
    static constexpr const char* audit_cols =
        "sequence, idempotent_key, from_status, to_status, fencing_token, node, at_time, detail";
    static constexpr const char* batch_cols = "batch_id, committed_time";
    struct table {
        const char* name;
        const char* cols;
        std::string merge;
    };
    const std::vector<table> tables{
        {"idempotent_record", rec_cols,
         std::string("INSERT INTO ") + schema + ".idempotent_record AS r (" + rec_cols + ") SELECT " + rec_cols +
             " FROM idem_merge ON CONFLICT (idempotent_key) DO UPDATE SET biz_type = EXCLUDED.biz_type, status = "
             "EXCLUDED.status, fencing_token = EXCLUDED.fencing_token, lease_until = EXCLUDED.lease_until, outcome = "
             "EXCLUDED.outcome, request_fingerprint = EXCLUDED.request_fingerprint, created_time = EXCLUDED.created_time, "
             "updated_time = EXCLUDED.updated_time, payload = EXCLUDED.payload WHERE (EXCLUDED.fencing_token, "
             "EXCLUDED.status <> 'PROCESSING', EXCLUDED.updated_time) > (r.fencing_token, r.status <> 'PROCESSING', "
             "r.updated_time)"},
        {"idempotent_audit", audit_cols,
         std::string("INSERT INTO ") + schema + ".idempotent_audit (" + audit_cols + ") SELECT " + audit_cols +
             " FROM idem_merge ON CONFLICT (sequence) DO NOTHING"},
        {"idempotent_batch", batch_cols,
         std::string("INSERT INTO ") + schema + ".idempotent_batch (" + batch_cols + ") SELECT " + batch_cols +
             " FROM idem_merge ON CONFLICT (batch_id) DO NOTHING"},
    };
    pqxx::work w(into);
    w.exec("SET LOCAL session_replication_role = replica");
    pqxx::work r(from);
    for (const table& t : tables) {
        w.exec(std::string("CREATE TEMP TABLE idem_merge ON COMMIT DROP AS SELECT ") + t.cols + " FROM " + schema + "." +
               t.name + " WITH NO DATA");
        {
            // COPY out of one server, line by line into the other (libpqxx 6.4's stream_to << stream_from
            // doubles each line's newline; tablewriter's raw line is the one public way to pass a line on).
            pqxx::stream_from in(r, std::string("(SELECT ") + t.cols + " FROM " + schema + "." + t.name + ")");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
            pqxx::tablewriter out(w, "idem_merge");
            std::string line;
            while (in.get_raw_line(line)) out.write_raw_line(line);
            out.complete();
#pragma GCC diagnostic pop
            in.complete();
        }
        w.exec(t.merge);
        w.exec("DROP TABLE idem_merge");
    }
    const auto n = w.exec("SELECT count(*) FROM " + schema + ".idempotent_record")[0][0].as<std::uint64_t>();
    r.commit();
    w.commit();
    return n;
}

}  // namespace detail::regions

/// What take_over() did.
struct takeover_report {
    std::string from;                   ///< the region that owned the lease
    std::int64_t epoch = 0;             ///< the new epoch
    std::vector<std::string> accepted;  ///< lease stores that accepted the takeover
    std::vector<std::string> merged;    ///< regions whose copies were merged into the taker's
    std::vector<std::string> fenced;    ///< regions whose copies no longer follow the old home
    std::vector<std::string> skipped;   ///< regions that could not be reached
    /// Regions whose copies of the key space follow no one now (the old home's, the unreachable
    /// ones, any that had stopped following before): rebuild_region() each before it serves.
    /// Empty when the takeover had been completed before (a re-run).
    std::vector<std::string> rebuild;
    std::uint64_t records = 0;  ///< records of the key space at the taker afterwards
};

/// Takes key space `space` over to region `to` after the region deciding it is lost: waits (at
/// most `timeout`) until a majority of the lease stores say its lease ran out by lo.margin, takes
/// the lease there (epoch + 1), fences the copies (every reachable region's subscription to the
/// old home disabled, the old home's copy guarded if it is reachable), merges the copies of the
/// majority's regions into `to`'s and pushes the result to every other reachable region, then
/// `to` publishes and decides the key space, with a view of the new lease written for its fence.
/// Afterwards give every process regional_options::decided_at[space] = to (and leases); `to`'s
/// keepers renew the lease from their next round. A region skipped (unreachable) still follows
/// the old home: rebuild it (docs/scaling.md) before it serves again. Re-runnable: a takeover that
/// stopped half-way is finished by running it again. Throws idem::error: invalid_argument (names;
/// `to` already decides it with a valid lease), store_unavailable (the lease is still valid at a
/// majority after `timeout`: the old home may still decide, nothing is taken over; a store or
/// region needed cannot be reached), store_error (the server refused).
inline takeover_report take_over(const std::vector<region>& rs, const std::string& space, const std::string& to,
                                 const lease_options& lo, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    namespace dr = detail::regions;
    dr::check_leases(rs, lo);
    auto index = [&](const std::string& name) {
        for (std::size_t i = 0; i < rs.size(); ++i)
            if (rs[i].name == name) return i;
        throw error(errc::invalid_argument, "take_over: no region '" + name + "'");
    };
    (void)index(space);
    const std::size_t ti = index(to);
    const std::string schema = dr::schema_of(space);
    std::vector<std::unique_ptr<dr::lease_store>> stores;
    for (const region& r : rs) stores.push_back(std::make_unique<dr::lease_store>(r, lo.call_deadline));
    for (const region& w : lo.witnesses) stores.push_back(std::make_unique<dr::lease_store>(w, lo.call_deadline));
    const std::size_t majority = stores.size() / 2 + 1;
    takeover_report rep;

    // 1. A majority expired by the margin (or already ours at the newest epoch).
    std::int64_t epoch = 0;
    bool all_taken = false;  // every store answering holds `to` at the newest epoch
    for (const auto until = std::chrono::steady_clock::now() + timeout;;) {
        struct seen {
            std::string owner;
            std::int64_t epoch;
            bool expired;
            std::int64_t ms_left;
            std::string previous;  ///< the owner before the last takeover or move ("" unknown)
        };
        std::vector<std::optional<seen>> rows(stores.size());
        std::int64_t newest = -1;
        for (std::size_t i = 0; i < stores.size(); ++i) {
            try {
                rows[i] = stores[i]->call([&](pqxx::connection& c) -> std::optional<seen> {
                    pqxx::nontransaction n(c);
                    const auto r = n.exec_params(std::string(dr::lease::read), space, dr::ms(lo.margin));
                    if (r.empty()) return std::nullopt;
                    return seen{r[0][0].c_str(), r[0][1].as<std::int64_t>(), r[0][2].as<bool>(), r[0][3].as<std::int64_t>(),
                                r[0][4].c_str()};
                });
            } catch (const std::exception&) {
            }
            if (rows[i]) newest = std::max(newest, rows[i]->epoch);
        }
        if (newest < 0)
            throw error(errc::store_unavailable, "take_over: key space '" + space +
                                                     "': no lease store answered with its lease (setup_home_leases first)");
        // The owner at the newest epoch is the one to take from; when that is `to` already, this is
        // a re-run of a takeover that stopped half-way, and the old owner is the one a store still
        // shows at an older epoch.
        std::string owner;
        for (const auto& r : rows)
            if (r && r->epoch == newest) owner = r->owner;
        epoch = owner == to ? newest : newest + 1;
        rep.from = owner == to ? std::string() : owner;
        for (const auto& r : rows)
            if (r && owner == to && r->epoch < newest && r->owner != to) rep.from = r->owner;
        // Every store answering took the new epoch already: the owner taken from is the one they
        // keep as previous. Whether this takeover finished is the catalog's to say (step 2).
        all_taken = owner == to && rep.from.empty();
        for (const auto& r : rows)
            if (r && all_taken && r->epoch == newest && !r->previous.empty() && r->previous != to) rep.from = r->previous;
        if (rep.from.empty())
            throw error(errc::invalid_argument, "take_over: key space '" + space + "' is already held by '" + to +
                                                    "' (epoch " + std::to_string(newest) + ")");
        std::size_t takeable = 0;
        std::int64_t wait_ms = 0;
        for (const auto& r : rows) {
            if (!r) continue;
            if ((r->epoch < epoch && r->expired) || (r->epoch == epoch && r->owner == to)) ++takeable;
            else wait_ms = std::max(wait_ms, r->ms_left);
        }
        if (takeable >= majority) break;
        if (std::chrono::steady_clock::now() >= until)
            throw error(errc::store_unavailable,
                        "take_over: key space '" + space + "': its lease (owner '" + rep.from +
                            "') has not run out by the margin at " + std::to_string(stores.size() - takeable) + " of " +
                            std::to_string(stores.size()) + " lease stores after " + std::to_string(timeout.count()) +
                            " ms; the owner may still decide it, nothing taken over");
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::clamp<std::int64_t>(wait_ms, 20, 500)));  // the lease's own time
    }
    rep.epoch = epoch;
    const std::size_t fi = index(rep.from);

    // 2. Every region reached, and whether `to` can take the key space: its copy must follow the old
    // home (or `to` publishes it already: a re-run), checked before any lease is taken, so that a
    // refusal changes nothing (a lease taken by a region that cannot decide would leave the key
    // space to no one). A region is given the lease stores' call deadline to answer the connection
    // (a lost one is skipped, not waited for 30 s); the statements that follow are bounded by their
    // own lock timeouts.
    std::vector<std::unique_ptr<pqxx::connection>> cs(rs.size());
    for (std::size_t i = 0; i < rs.size(); ++i) {
        try {
            cs[i] = dr::connect(rs[i].uri, lo.call_deadline, "idem-regions-takeover");
        } catch (const std::exception&) {
            rep.skipped.push_back(rs[i].name);
        }
    }
    if (!cs[ti]) throw error(errc::store_unavailable, "take_over: region '" + to + "' cannot be reached");
    auto step = [&](std::size_t i, const std::string& what, const auto& body) {
        dr::on_region("take_over", rs[i], *cs[i], what, body);
    };
    // Whether region i's copy follows the old home (its subscription to it carries the key space):
    // only such a copy is a prefix of what the old home decided. A copy that stopped following at an
    // earlier takeover (an old home not rebuilt since) holds what it wrote alone, and is never merged.
    auto follows = [&](std::size_t i) {
        bool yes = false;
        step(i, "its copy", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            yes = !n.exec_params(
                        "SELECT 1 FROM pg_subscription s JOIN pg_subscription_rel sr ON sr.srsubid = s.oid "
                        "JOIN pg_class c ON c.oid = sr.srrelid JOIN pg_namespace ns ON ns.oid = c.relnamespace "
                        "WHERE s.subname = $1 AND ns.nspname = $2 AND c.relname = 'idempotent_record'",
                        dr::subscription_of(rs[fi].name, rs[i].name), schema)
                       .empty();
        });
        return yes;
    };
    bool completed = false;  // a re-run after `to` published the key space: it decides it already
    step(ti, "catalog", [&](pqxx::connection& c) {
        pqxx::nontransaction n(c);
        completed = !n.exec_params(std::string(dr::publishes_sql), dr::publication_of(to), schema).empty();
    });
    std::vector<bool> following(rs.size(), false);
    for (std::size_t i = 0; i < rs.size(); ++i) following[i] = i != fi && cs[i] && !completed && follows(i);
    if (all_taken && completed)
        throw error(errc::invalid_argument, "take_over: key space '" + space + "' is already held by '" + to + "' (epoch " +
                                                std::to_string(epoch) + "), which decides it");
    if (!completed && !following[ti])
        throw error(errc::store_unavailable,
                    "take_over: region '" + to + "''s copy of key space '" + space + "' does not follow '" + rs[fi].name +
                        "': take the key space to a region whose copy follows it; nothing taken, fenced or merged");
    // 3. The conditional writes: the lease is `to`'s at a majority.
    std::vector<std::optional<std::chrono::steady_clock::time_point>> took(stores.size());
    for (std::size_t i = 0; i < stores.size(); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        try {
            const bool ok = stores[i]->call([&](pqxx::connection& c) {
                pqxx::nontransaction n(c);
                return !n.exec_params(std::string(dr::lease::take), space, to, epoch, dr::ms(lo.lease), dr::ms(lo.margin))
                            .empty();
            });
            if (ok) {
                took[i] = t0;
                rep.accepted.push_back(stores[i]->where().name);
            }
        } catch (const std::exception&) {
        }
    }
    if (rep.accepted.size() < majority || !took[ti])
        throw error(errc::store_unavailable, "take_over: key space '" + space + "': " + std::to_string(rep.accepted.size()) +
                                                 " of " + std::to_string(stores.size()) + " lease stores accepted epoch " +
                                                 std::to_string(epoch) +
                                                 (took[ti] ? "" : " (not region '" + to + "' itself)") +
                                                 "; a majority including '" + to + "' is needed; run the takeover again");

    // 4. Fence the copies: nothing more of the old home arrives anywhere we read.
    auto in_majority = [&](std::size_t i) { return took[i].has_value(); };
    if (!completed) {
        // The old home first, when it answers: its commits waiting for a subscriber are ended
        // (they were never acknowledged: the subscribers are about to stop), then its copy guarded
        // (creating the trigger waits for every transaction writing the tables) and unpublished.
        if (cs[fi]) {
            step(fi, "fencing the old home's copy", [&](pqxx::connection& c) {
                {
                    pqxx::nontransaction k(c);
                    k.exec(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND "
                        "pid <> pg_backend_pid()");
                }
                dr::retry_deadlocks([&] {
                    pqxx::work w(c);
                    w.exec("SET LOCAL lock_timeout = " + std::to_string(timeout.count()));
                    for (const std::string& q : dr::guard_sql(schema, space, "region " + to)) w.exec(q);
                    w.exec_params(std::string(dr::lease::drop), space, epoch - 1);
                    w.commit();
                });
                pqxx::nontransaction n(c);
                if (!n.exec_params(std::string(dr::publishes_sql), dr::publication_of(rs[fi].name), schema).empty())
                    n.exec("ALTER PUBLICATION " + dr::publication_of(rs[fi].name) + " DROP TABLES IN SCHEMA " + schema);
            });
            rep.fenced.push_back(rs[fi].name);
        } else if (in_majority(fi)) {
            throw error(errc::store_unavailable, "take_over: region '" + rs[fi].name +
                                                     "' accepted the lease but cannot be reached to fence its copy; run "
                                                     "the takeover again");
        }
        for (std::size_t i = 0; i < rs.size(); ++i) {
            if (i == fi || !cs[i]) continue;
            const std::string sub = dr::subscription_of(rs[fi].name, rs[i].name);
            step(i, "stopping its subscription to '" + rs[fi].name + "'", [&](pqxx::connection& c) {
                pqxx::nontransaction n(c);
                if (n.exec_params("SELECT 1 FROM pg_subscription WHERE subname = $1", sub).empty()) return;
                n.exec("ALTER SUBSCRIPTION " + sub + " DISABLE");
                // A disabled subscription's apply worker stops only once it reads its catalog again,
                // which one blocked on a silent publisher (a lost home behind a dead network) does
                // after wal_receiver_timeout (a minute by default). It is ended instead: it applies
                // whole transactions, so ending it loses nothing; disabled, it is not started again.
                n.exec_params(
                    "SELECT pg_terminate_backend(st.pid) FROM pg_stat_subscription st JOIN pg_subscription s ON "
                    "s.oid = st.subid WHERE s.subname = $1 AND st.pid IS NOT NULL",
                    sub);
                for (const auto until = std::chrono::steady_clock::now() + timeout;;) {  // its apply worker gone
                    if (n.exec_params("SELECT 1 FROM pg_stat_subscription st JOIN pg_subscription s ON s.oid = st.subid "
                                      "WHERE s.subname = $1 AND st.pid IS NOT NULL",
                                      sub)
                            .empty())
                        break;
                    if (std::chrono::steady_clock::now() >= until)
                        throw error(errc::store_unavailable, "take_over: region '" + rs[i].name + "': subscription " + sub +
                                                                 " still applies after " + std::to_string(timeout.count()) +
                                                                 " ms");
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling the server's worker list
                }
            });
            rep.fenced.push_back(rs[i].name);
        }
        for (std::size_t i = 0; i < rs.size(); ++i)
            if (i != ti && in_majority(i) && i != fi && !following[i])
                throw error(errc::store_unavailable,
                            "take_over: region '" + rs[i].name + "' accepted the lease but its copy of key space '" + space +
                                "' does not follow '" + rs[fi].name + "' (rebuild it first, rebuild_region)");

        // 5. Merge: the majority's copies (the old home's own, and those following it) into `to`'s,
        // then `to`'s into every other reachable copy that follows the old home.
        for (std::size_t i = 0; i < rs.size(); ++i) {
            if (i == ti || !cs[i] || !in_majority(i)) continue;
            step(ti, "merging region '" + rs[i].name + "''s copy",
                 [&](pqxx::connection& c) { rep.records = dr::merge_copy(*cs[i], c, schema); });
            rep.merged.push_back(rs[i].name);
        }
        for (std::size_t i = 0; i < rs.size(); ++i) {
            if (i == ti || !following[i]) continue;
            step(i, "receiving the merged copy", [&](pqxx::connection& c) { (void)dr::merge_copy(*cs[ti], c, schema); });
        }

        // 6. `to` decides it: numbering past every merged row, leases of held claims pushed out
        // (they were measured on the old home's clock), published, the copies that follow
        // subscribed without a copy, the view of the new lease for its fence, and last its
        // replica guard removed.
        step(ti, "taking the key space", [&](pqxx::connection& c) {
            pqxx::work w(c);
            w.exec("SET LOCAL session_replication_role = replica");
            w.exec("SELECT setval(pg_get_serial_sequence('" + schema +
                   ".idempotent_audit', 'sequence'), (SELECT COALESCE(max(sequence), 0) FROM " + schema +
                   ".idempotent_audit) + 1, false)");
            w.exec("SET LOCAL search_path = " + schema);
            w.exec(std::string(detail::global::sql::processing_index));
            w.exec("UPDATE idempotent_record SET lease_until = lease_until + " + std::to_string(lo.margin.count()) +
                   " WHERE status = 'PROCESSING'");
            w.commit();
            pqxx::nontransaction n(c);
            n.exec("ALTER PUBLICATION " + dr::publication_of(to) + " ADD TABLES IN SCHEMA " + schema);
        });
        for (std::size_t i = 0; i < rs.size(); ++i) {
            if (i == ti || !following[i]) continue;
            step(i, "subscribing to key space '" + space + "' at '" + to + "'", [&](pqxx::connection& c) {
                pqxx::nontransaction n(c);
                n.exec("ALTER SUBSCRIPTION " + dr::subscription_of(to, rs[i].name) +
                       " REFRESH PUBLICATION WITH (copy_data = false)");
            });
        }
        for (std::size_t i = 0; i < rs.size(); ++i)
            if (i != ti && !following[i]) rep.rebuild.push_back(rs[i].name);
    }
    if (!rep.merged.empty() || completed) {
        step(ti, "records", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            rep.records = n.exec("SELECT count(*) FROM " + schema + ".idempotent_record")[0][0].as<std::uint64_t>();
        });
    }
    step(ti, "holding the new lease", [&](pqxx::connection& c) {
        std::vector<std::chrono::steady_clock::time_point> at;
        for (const auto& t : took)
            if (t) at.push_back(*t);
        std::sort(at.begin(), at.end(), std::greater<>());
        const std::int64_t us = dr::server_time_us(c, at[majority - 1] + lo.lease);
        dr::retry_deadlocks([&] {
            pqxx::work w(c);
            w.exec_params(std::string(dr::lease::hold), space, epoch, us);
            for (const std::string& q : dr::unguard_sql(schema)) w.exec(q);
            w.commit();
        });
    });
    return rep;
}

}  // namespace idem
