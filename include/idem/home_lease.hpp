// idem/home_lease.hpp: home leases, so a key space can be taken over after its region is lost
// (target idem::postgres; regions.hpp has the regions themselves).
//
//   std::vector<idem::region> rs{{"eu", "postgresql://idem@db.eu/pay"}, {"us", "postgresql://idem@db.us/pay"},
//                                {"ap", "postgresql://idem@db.ap/pay"}};
//   idem::lease_options lo;                        // a lease of 10 s, a margin of 2 s for clock skew
//   idem::setup_home_leases(rs, lo);               // once, after setup_regions (or `idem regions leases`)
//   idem::home_lease_keeper keeper(rs, "eu", lo);  // what a regional_guard given ro.leases = lo runs
//   if (keeper.valid("eu")) {
//       // eu's processes may decide eu's keys now; take_over (takeover.hpp) moves them once eu is lost
//   }
//
// The protocol (model-checked in verify/regions.pml; docs/scaling.md has the argument):
//   * Lease stores: every region's cluster, and any witness (a PostgreSQL holding only leases),
//     holds a row per key space: (owner, epoch, lease_until on that server's clock).
//   * Renewal: the processes of the region deciding a key space (home_lease_keeper, one per
//     regional_guard) write lease_until = now + lease to every store, accepted only at their epoch.
//     Once a majority of the stores accepted, the keeper's view of the lease is valid until the
//     earliest of those writes' start + lease (this process's steady clock), and it writes that
//     time, on its own cluster's clock, into the cluster's `held` row (lease_sql.hpp).
//   * Grants: a cluster's lease fence (a trigger on every copy of the records) refuses a write of
//     a key space whose `held` time has passed; and regional_guard acknowledges a claim of its
//     own region only while its keeper's view is still valid (the model's ACK_FENCE: a claim that
//     committed in time but returned late is answered store_unavailable, never "acquired").
//   * Takeover (take_over): only once a majority of the stores say the lease ran out by `margin`
//     (the bound on clock skew between servers), a conditional write at each (epoch + 1, accepted
//     only if still expired) makes the taker the owner at a majority; every majority meets the one
//     that accepted the old owner's last renewal, so the old owner can neither renew again nor
//     still hold a valid view. Then the copies are fenced (each reachable region's subscription
//     to the old home disabled, the old home's own copy guarded if it is reachable), the copies
//     of the majority's data regions merged into the taker's and pushed to the others, and the
//     taker publishes and decides the key space.
//   * In synchronous mode no acknowledged decision is lost by a takeover: it reached another
//     region's copy before it was acknowledged, and that copy is in every majority's merge (with
//     at most four lease stores; more are refused, since a majority of five could leave out the
//     copy that acknowledged). In asynchronous mode the decisions the old home had not yet
//     replicated are lost with it (the replication lag), and a key among them can run again.
//
// Costs: a keeper thread per regional_guard with leases, one statement per store and key space
// every renew_every; one index probe per record row in the decider's claim and completion
// batches (the fence).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "idem/detail/global/pg_sql.hpp"
#include "idem/detail/pg/connection.hpp"
#include "idem/detail/regions/lease_sql.hpp"
#include "idem/detail/regions/names.hpp"
#include "idem/error.hpp"
#include "idem/regions.hpp"

namespace idem {

struct lease_options {
    /// How long one renewal holds. A lost home's keys wait about lease + margin before they can be
    /// taken over.
    std::chrono::milliseconds lease{std::chrono::seconds(10)};
    /// The bound on clock skew between the lease stores' servers (and on the drift of a keeper's
    /// clock over one lease): a taker waits lease_until + margin on each store's clock.
    std::chrono::milliseconds margin{std::chrono::seconds(2)};
    /// How often a keeper renews; zero means lease / 4.
    std::chrono::milliseconds renew_every{0};
    /// Every statement to a lease store is cut after this long (a store that does not answer is
    /// skipped for that round).
    std::chrono::milliseconds call_deadline{std::chrono::seconds(2)};
    /// Lease stores that hold no data: a third vote where two regions cannot decide alone.
    std::vector<region> witnesses;
};

namespace detail::regions {

inline void check_leases(const std::vector<region>& rs, const lease_options& lo) {
    check_regions(rs);
    if (lo.lease <= std::chrono::milliseconds::zero() || lo.margin < std::chrono::milliseconds::zero() ||
        lo.call_deadline <= std::chrono::milliseconds::zero() || lo.renew_every < std::chrono::milliseconds::zero())
        throw error(errc::invalid_argument,
                    "home leases: lease and call_deadline must be positive, margin and renew_every not negative");
    if (lo.call_deadline * 2 >= lo.lease)
        throw error(errc::invalid_argument, "home leases: call_deadline (" + std::to_string(lo.call_deadline.count()) +
                                                " ms) must be under half the lease (" + std::to_string(lo.lease.count()) +
                                                " ms), or a renewal round could outlast it");
    for (const region& w : lo.witnesses) {
        check_name(w.name);
        for (const region& r : rs)
            if (r.name == w.name) throw error(errc::invalid_argument, "witness '" + w.name + "' is also a region");
    }
    const std::size_t stores = rs.size() + lo.witnesses.size();
    // A majority of five could leave out the one copy that acknowledged a synchronous decision
    // (synchronous_standby_names waits for ANY 1): at most four stores (home_lease.hpp).
    if (stores > 4)
        throw error(errc::invalid_argument, "home leases: " + std::to_string(stores) +
                                                " lease stores (regions plus witnesses); at most 4 are supported");
}

/// One lease store's connection: connected on first use, every call cut at the deadline (the
/// watchdog), dropped after any failure (the next call reconnects).
class lease_store {
public:
    lease_store(region r, std::chrono::milliseconds deadline) : r_(std::move(r)), deadline_(deadline) {}

    template <class Fn>
    auto call(Fn&& fn) {
        watchdog_.arm(deadline_);
        try {
            if (!c_) {
                watchdog_.watch(-1);
                c_ = connect(r_.uri, deadline_, "idem-home-lease");
                watchdog_.watch(c_->sock());
            }
            auto out = fn(*c_);
            (void)watchdog_.disarm();
            return out;
        } catch (...) {
            (void)watchdog_.disarm();
            c_.reset();
            throw;
        }
    }
    [[nodiscard]] const region& where() const noexcept { return r_; }

private:
    region r_;
    std::chrono::milliseconds deadline_;
    pg::pg_watchdog watchdog_;
    std::unique_ptr<pqxx::connection> c_;
};

[[nodiscard]] inline std::int64_t ms(std::chrono::milliseconds d) { return d.count(); }

/// This server's clock for a steady time point `t`, in µs since the epoch, never later than the
/// true one: read the server's clock, and map `t` with the time the answer arrived.
[[nodiscard]] inline std::int64_t server_time_us(pqxx::connection& c, std::chrono::steady_clock::time_point t) {
    pqxx::nontransaction n(c);
    const auto server_us = n.exec(std::string(lease::clock_us))[0][0].as<std::int64_t>();
    const auto arrived = std::chrono::steady_clock::now();
    return server_us + std::chrono::duration_cast<std::chrono::microseconds>(t - arrived).count();
}

/// The region whose cluster decides each key space (its publication publishes the schema), by
/// the catalog of every cluster in `cs` (by region index); empty when none does.
[[nodiscard]] inline std::vector<std::string> deciders(const std::vector<region>& rs,
                                                       const std::vector<pqxx::connection*>& cs) {
    std::vector<std::string> out(rs.size());
    for (std::size_t x = 0; x < rs.size(); ++x)
        for (std::size_t c = 0; c < rs.size(); ++c) {
            if (cs[c] == nullptr) continue;
            pqxx::nontransaction n(*cs[c]);
            if (!n.exec_params(std::string(publishes_sql), publication_of(rs[c].name), schema_of(rs[x].name)).empty())
                out[x] = rs[c].name;
        }
    return out;
}

}  // namespace detail::regions

/// Sets up home leases on the regions' clusters (after setup_regions), idempotently:
///   * in every cluster and every witness, the lease tables (lease_sql.hpp) and a row per key space,
///     owned by the region deciding it (the catalog says which), epoch 0, not yet renewed; a store
///     set up later (a witness added, a cluster rebuilt) adopts the newest owner and epoch the
///     others hold, valid for lease + margin from now (it must not vote "expired" for a renewal it
///     may have accepted before);
///   * on every copy of every key space's records, the lease fence. From here on a cluster decides
///     a key space only while a keeper holds its lease: give every regional_guard
///     regional_options::leases = lo (their keepers renew before the guard's constructor returns).
/// Throws idem::error: invalid_argument (names, options, more than four lease stores),
/// store_unavailable (a cluster cannot be reached), store_error (the server refused).
inline void setup_home_leases(const std::vector<region>& rs, const lease_options& lo) {
    namespace dr = detail::regions;
    dr::check_leases(rs, lo);
    const auto deadline = std::chrono::milliseconds(30000);
    std::vector<region> stores = rs;
    stores.insert(stores.end(), lo.witnesses.begin(), lo.witnesses.end());
    std::vector<std::unique_ptr<pqxx::connection>> cs;
    for (const region& r : stores) {
        try {
            cs.push_back(dr::connect(r.uri, deadline, "idem-regions-leases"));
            pqxx::work w(*cs.back());
            w.exec(std::string(detail::pg::schema_lock));
            w.exec(std::string(dr::lease::ddl));
            w.commit();
        } catch (const std::exception& e) {
            throw error(errc::store_unavailable, "home leases setup, '" + r.name + "': " + e.what());
        }
    }
    std::vector<pqxx::connection*> raw;
    for (std::size_t i = 0; i < rs.size(); ++i) raw.push_back(cs[i].get());
    const std::vector<std::string> decider = dr::deciders(rs, raw);
    // The newest owner and epoch any store holds: a store that lacks it (added or rebuilt since)
    // adopts it rather than starting a key space over at epoch 0.
    std::vector<std::pair<std::string, std::int64_t>> newest(rs.size(), {std::string(), -1});
    for (auto& c : cs) {
        pqxx::nontransaction n(*c);
        for (const auto& row : n.exec("SELECT space, owner, epoch FROM idem__leases.home_lease"))
            for (std::size_t x = 0; x < rs.size(); ++x)
                if (rs[x].name == row[0].c_str() && row[2].as<std::int64_t>() > newest[x].second)
                    newest[x] = {row[1].c_str(), row[2].as<std::int64_t>()};
    }
    for (std::size_t i = 0; i < stores.size(); ++i) {
        try {
            pqxx::work w(*cs[i]);
            for (std::size_t x = 0; x < rs.size(); ++x) {
                if (newest[x].second >= 0) {
                    w.exec_params(std::string(dr::lease::adopt), rs[x].name, newest[x].first, newest[x].second,
                                  dr::ms(lo.lease + lo.margin));
                } else if (decider[x].empty()) {
                    throw error(errc::invalid_argument, "home leases setup: no cluster decides key space '" + rs[x].name +
                                                            "' (run setup_regions first)");
                } else {
                    w.exec_params(std::string(dr::lease::seed), rs[x].name, decider[x]);
                }
                if (i < rs.size())  // a data cluster: the fence on its copy
                    for (const std::string& q : dr::lease::fence_sql(dr::schema_of(rs[x].name))) w.exec(q);
            }
            w.commit();
        } catch (const error&) {
            throw;
        } catch (const std::exception& e) {
            throw error(errc::store_error, "home leases setup, '" + stores[i].name + "': " + e.what());
        }
    }
}

/// One key space's lease as one lease store holds it.
struct lease_row {
    std::string store;          ///< the region or witness holding the row
    std::string space;          ///< the key space (named by its home region)
    std::string owner;          ///< the region whose keepers renew it
    std::int64_t epoch = 0;     ///< raised by every takeover and planned move
    std::int64_t valid_ms = 0;  ///< how much longer it holds on that store's clock (<= 0: ran out)
    std::int64_t held_ms = 0;   ///< a data cluster: how much longer its fence lets it decide the key
                                ///< space (<= 0: it does not); 0 for a witness
};

/// Every lease row of one store (a region's cluster or a witness), for `idem regions status`.
/// Throws idem::error(store_unavailable) when it cannot be read.
inline std::vector<lease_row> read_leases(const region& store,
                                          std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    namespace dr = detail::regions;
    std::vector<lease_row> out;
    try {
        const auto c = dr::connect(store.uri, deadline, "idem-regions-status");
        pqxx::nontransaction n(*c);
        if (n.exec(std::string(dr::lease::installed)).empty()) return out;
        for (const auto& row :
             n.exec("SELECT l.space, l.owner, l.epoch, "
                    "CASE WHEN isfinite(l.lease_until) THEN (extract(epoch FROM l.lease_until - clock_timestamp()) * "
                    "1000)::bigint "
                    "ELSE -1 END, "
                    "CASE WHEN isfinite(h.valid_until) THEN (extract(epoch FROM h.valid_until - clock_timestamp()) * "
                    "1000)::bigint "
                    "ELSE 0 END "
                    "FROM idem__leases.home_lease l LEFT JOIN idem__leases.held h ON h.space = l.space ORDER BY l.space"))
            out.push_back({store.name, row[0].c_str(), row[1].c_str(), row[2].as<std::int64_t>(), row[3].as<std::int64_t>(),
                           std::max<std::int64_t>(0, row[4].as<std::int64_t>())});
    } catch (const std::exception& e) {
        throw error(errc::store_unavailable, "lease store '" + store.name + "': " + e.what());
    }
    return out;
}

/// Renews the leases of the key spaces region `self` decides, on every lease store (the regions'
/// clusters and the witnesses), from a thread of its own; says whether each is valid now.
/// regional_guard runs one when regional_options::leases is set. The key spaces are those `self`'s
/// own cluster says it owns (read every round, so a key space taken over or moved to it is picked
/// up); a renewal refused because a store has a higher epoch fences that lease for good.
///
/// Thread-safety: valid() is lock-free and may be called from any thread; the rest is internally
/// locked.
class home_lease_keeper {
public:
    /// Checks the options, renews once before it returns (a store that cannot be reached is
    /// skipped), then every lo.renew_every.
    home_lease_keeper(std::vector<region> regions, std::string self, lease_options lo)
        : regions_(std::move(regions)), self_(std::move(self)), lo_(std::move(lo)) {
        detail::regions::check_leases(regions_, lo_);
        self_index_ = regions_.size();
        for (std::size_t i = 0; i < regions_.size(); ++i)
            if (regions_[i].name == self_) self_index_ = i;
        if (self_index_ == regions_.size())
            throw error(errc::invalid_argument, "home lease keeper: self region '" + self_ + "' is not one of the regions");
        for (const region& r : regions_)
            stores_.push_back(std::make_unique<detail::regions::lease_store>(r, lo_.call_deadline));
        for (const region& w : lo_.witnesses)
            stores_.push_back(std::make_unique<detail::regions::lease_store>(w, lo_.call_deadline));
        until_ = std::make_unique<std::atomic<std::int64_t>[]>(regions_.size());
        for (std::size_t i = 0; i < regions_.size(); ++i) until_[i].store(0, std::memory_order_relaxed);
        renew();
        thread_ = std::thread([this] { loop(); });
    }
    ~home_lease_keeper() {
        {
            std::lock_guard lk(stop_m_);
            stop_ = true;
        }
        stop_cv_.notify_one();
        thread_.join();
    }
    home_lease_keeper(const home_lease_keeper&) = delete;
    home_lease_keeper& operator=(const home_lease_keeper&) = delete;

    /// Whether this keeper holds a valid lease of key space `space` (a region's name) now: a
    /// majority of the stores accepted a renewal that started less than `lease` ago, and no store
    /// showed a higher epoch since.
    [[nodiscard]] bool valid(std::size_t space_index) const noexcept {
        if (space_index >= regions_.size()) return false;
        const auto until = until_[space_index].load(std::memory_order_acquire);
        return until != 0 && std::chrono::steady_clock::now().time_since_epoch().count() < until;
    }
    [[nodiscard]] bool valid(std::string_view space) const noexcept {
        for (std::size_t i = 0; i < regions_.size(); ++i)
            if (regions_[i].name == space) return valid(i);
        return false;
    }
    /// Lease stores whose acceptance makes a majority.
    [[nodiscard]] std::size_t majority() const noexcept { return stores_.size() / 2 + 1; }

    /// One lease as this keeper holds it.
    struct lease_state {
        std::string space;
        std::int64_t epoch = 0;
        bool fenced = false;       ///< a store showed a higher epoch: never renewed again
        std::size_t accepted = 0;  ///< stores that accepted a renewal at this epoch
        bool valid = false;
    };
    [[nodiscard]] std::vector<lease_state> leases() const {
        std::lock_guard lk(m_);
        std::vector<lease_state> out;
        for (const auto& h : held_) {
            lease_state s{h.space, h.epoch, h.fenced, 0, valid(h.space)};
            for (const auto& a : h.accepted) s.accepted += a.has_value() ? 1 : 0;
            out.push_back(std::move(s));
        }
        return out;
    }

    /// One renewal round, now (the thread runs one every renew_every).
    void renew() {
        namespace dr = detail::regions;
        std::lock_guard lk(m_);
        auto& own = *stores_[self_index_];
        try {  // what this region's own cluster says it owns
            const pqxx::result rows = own.call([&](pqxx::connection& c) {
                pqxx::nontransaction n(c);
                return n.exec_params(std::string(dr::lease::owned), self_);
            });
            for (const auto& row : rows) {
                const std::string space = row[0].c_str();
                const auto epoch = row[1].as<std::int64_t>();
                auto it = std::find_if(held_.begin(), held_.end(), [&](const held& h) { return h.space == space; });
                if (it == held_.end()) {
                    held_.push_back(held{space, epoch, false, std::vector<std::optional<time_point>>(stores_.size())});
                } else if (epoch > it->epoch) {  // taken over (or moved) to this region at a newer epoch
                    *it = held{space, epoch, false, std::vector<std::optional<time_point>>(stores_.size())};
                }
            }
        } catch (const std::exception&) {  // unreachable: renew what we knew
        }
        // A store that failed once is skipped for the rest of the round: a round must stay well
        // within the lease however many key spaces this region decides.
        std::vector<bool> failed(stores_.size(), false);
        for (auto& h : held_) {
            if (!h.fenced) {
                for (std::size_t i = 0; i < stores_.size() && !h.fenced; ++i) {
                    if (failed[i]) continue;
                    const auto t0 = std::chrono::steady_clock::now();
                    try {
                        const bool ok = stores_[i]->call([&](pqxx::connection& c) {
                            pqxx::nontransaction n(c);
                            return !n.exec_params(std::string(dr::lease::renew), h.space, self_, h.epoch, dr::ms(lo_.lease))
                                        .empty();
                        });
                        if (ok) {
                            h.accepted[i] = t0;
                            continue;
                        }
                        const auto newest = stores_[i]->call([&](pqxx::connection& c) {
                            pqxx::nontransaction n(c);
                            const auto r = n.exec_params(std::string(dr::lease::epoch_of), h.space);
                            return r.empty() || r[0][0].is_null() ? std::int64_t{-1} : r[0][0].as<std::int64_t>();
                        });
                        if (newest > h.epoch) h.fenced = true;
                    } catch (const std::exception&) {  // this store is skipped this round
                        failed[i] = true;
                    }
                }
            }
            const std::size_t i = index_of(h.space);
            std::optional<time_point> view;
            if (!h.fenced) {
                std::vector<time_point> at;
                for (const auto& a : h.accepted)
                    if (a) at.push_back(*a);
                if (at.size() >= majority()) {
                    std::sort(at.begin(), at.end(), std::greater<>());
                    view = at[majority() - 1] + lo_.lease;
                }
            }
            if (i < regions_.size()) until_[i].store(view ? view->time_since_epoch().count() : 0, std::memory_order_release);
            try {  // the fence's view, on this region's cluster
                own.call([&](pqxx::connection& c) {
                    if (h.fenced) {
                        pqxx::nontransaction n(c);
                        n.exec_params(std::string(dr::lease::drop), h.space, h.epoch);
                    } else if (view) {
                        const std::int64_t us = dr::server_time_us(c, *view);
                        pqxx::nontransaction n(c);
                        n.exec_params(std::string(dr::lease::hold), h.space, h.epoch, us);
                    }
                    return 0;
                });
            } catch (const std::exception&) {  // the fence keeps the older view, which only expires sooner
            }
        }
    }

private:
    using time_point = std::chrono::steady_clock::time_point;
    struct held {
        std::string space;
        std::int64_t epoch = 0;
        bool fenced = false;
        std::vector<std::optional<time_point>> accepted;  // by store: the start of its last accepted renewal
    };

    [[nodiscard]] std::size_t index_of(std::string_view space) const noexcept {
        for (std::size_t i = 0; i < regions_.size(); ++i)
            if (regions_[i].name == space) return i;
        return regions_.size();
    }

    void loop() {
        const auto every = lo_.renew_every.count() > 0 ? lo_.renew_every : lo_.lease / 4;
        std::unique_lock lk(stop_m_);
        while (!stop_cv_.wait_for(lk, every, [&] { return stop_; })) {
            lk.unlock();
            renew();
            lk.lock();
        }
    }

    std::vector<region> regions_;
    std::string self_;
    lease_options lo_;
    std::size_t self_index_ = 0;
    std::vector<std::unique_ptr<detail::regions::lease_store>> stores_;  // regions, then witnesses
    std::unique_ptr<std::atomic<std::int64_t>[]> until_;  // by region: steady ns the view holds until; 0: none
    mutable std::mutex m_;                                // held_, the stores' connections
    std::vector<held> held_;
    std::mutex stop_m_;
    std::condition_variable stop_cv_;
    bool stop_ = false;
    std::thread thread_;  // last: starts after every member above is initialised
};

}  // namespace idem
