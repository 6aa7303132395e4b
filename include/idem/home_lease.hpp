// idem/home_lease.hpp: home leases, so a key space can be taken over after its region is lost
// (target idem::postgres; regions.hpp has the regions themselves).
//
//   idem::lease_options lo;                       // lease 10 s, margin 2 s
//   idem::setup_home_leases(rs, lo);              // once, after setup_regions (or `idem regions leases`)
//   ro.leases = lo;                               // every regional_guard: its home_lease_keeper renews
//   ...                                           // region "eu" lost:
//   idem::take_over(rs, "eu", "us", lo);          // or `idem regions takeover --space eu --to us`
//   ro.decided_at["eu"] = "us";                   // then every process, as after move_home
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
#include <pqxx/tablewriter>

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

/// Sets up home leases on the regions' clusters (after setup_regions), idempotently:
///   * in every cluster and every witness, the lease tables (lease_sql.hpp) and a row per key space,
///     owned by the region deciding it (the catalog says which), epoch 0, not yet renewed;
///   * on every copy of every key space's records, the lease fence. From here on a cluster decides
///     a key space only while a keeper holds its lease: give every regional_guard
///     regional_options::leases = lo (their keepers renew before the guard's constructor returns).
/// Throws idem::error: invalid_argument (names, options, more than four lease stores),
/// store_unavailable (a cluster cannot be reached), store_error (the server refused).
inline void setup_home_leases(const std::vector<region>& rs, const lease_options& lo) {
    namespace dr = detail::regions;
    dr::check_leases(rs, lo);
    const auto deadline = std::chrono::milliseconds(30000);
    std::vector<std::unique_ptr<pqxx::connection>> cs;
    std::vector<pqxx::connection*> raw;
    for (const region& r : rs) {
        try {
            cs.push_back(dr::connect(r.uri, deadline, "idem-regions-leases"));
        } catch (const std::exception& e) {
            throw error(errc::store_unavailable, "home leases setup, region '" + r.name + "': cannot connect: " + e.what());
        }
        raw.push_back(cs.back().get());
    }
    const std::vector<std::string> decider = dr::deciders(rs, raw);
    auto seed = [&](pqxx::connection& c, const std::string& name, bool data) {
        try {
            pqxx::work w(c);
            w.exec(std::string(detail::pg::schema_lock));
            w.exec(std::string(dr::lease::ddl));
            for (std::size_t x = 0; x < rs.size(); ++x) {
                if (decider[x].empty())
                    throw error(errc::invalid_argument, "home leases setup: no cluster decides key space '" + rs[x].name +
                                                            "' (run setup_regions first)");
                w.exec_params(std::string(dr::lease::seed), rs[x].name, decider[x]);
                if (data)
                    for (const std::string& q : dr::lease::fence_sql(dr::schema_of(rs[x].name))) w.exec(q);
            }
            w.commit();
        } catch (const error&) {
            throw;
        } catch (const std::exception& e) {
            throw error(errc::store_error, "home leases setup, '" + name + "': " + e.what());
        }
    };
    for (std::size_t c = 0; c < rs.size(); ++c) seed(*cs[c], rs[c].name, true);
    for (const region& w : lo.witnesses) {
        std::unique_ptr<pqxx::connection> c;
        try {
            c = dr::connect(w.uri, deadline, "idem-regions-leases");
        } catch (const std::exception& e) {
            throw error(errc::store_unavailable, "home leases setup, witness '" + w.name + "': cannot connect: " + e.what());
        }
        seed(*c, w.name, false);
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
        for (auto& h : held_) {
            if (!h.fenced) {
                for (std::size_t i = 0; i < stores_.size() && !h.fenced; ++i) {
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
                        n.exec_params(std::string(dr::lease::drop), h.space);
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

/// What take_over() did.
struct takeover_report {
    std::string from;                   ///< the region that owned the lease
    std::int64_t epoch = 0;             ///< the new epoch
    std::vector<std::string> accepted;  ///< lease stores that accepted the takeover
    std::vector<std::string> merged;    ///< regions whose copies were merged into the taker's
    std::vector<std::string> fenced;    ///< regions whose copies no longer follow the old home
    std::vector<std::string> skipped;   ///< regions that could not be reached (rebuild them)
    std::uint64_t records = 0;          ///< records of the key space at the taker afterwards
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
    for (const auto until = std::chrono::steady_clock::now() + timeout;;) {
        struct seen {
            std::string owner;
            std::int64_t epoch;
            bool expired;
            std::int64_t ms_left;
        };
        std::vector<std::optional<seen>> rows(stores.size());
        std::int64_t newest = -1;
        for (std::size_t i = 0; i < stores.size(); ++i) {
            try {
                rows[i] = stores[i]->call([&](pqxx::connection& c) -> std::optional<seen> {
                    pqxx::nontransaction n(c);
                    const auto r = n.exec_params(std::string(dr::lease::read), space, dr::ms(lo.margin));
                    if (r.empty()) return std::nullopt;
                    return seen{r[0][0].c_str(), r[0][1].as<std::int64_t>(), r[0][2].as<bool>(), r[0][3].as<std::int64_t>()};
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

    // 2. The conditional writes: the lease is `to`'s at a majority.
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

    // 3. Fence the copies: nothing more of the old home arrives anywhere we read.
    const auto deadline = std::chrono::milliseconds(30000);
    std::vector<std::unique_ptr<pqxx::connection>> cs(rs.size());
    for (std::size_t i = 0; i < rs.size(); ++i) {
        try {
            cs[i] = dr::connect(rs[i].uri, deadline, "idem-regions-takeover");
        } catch (const std::exception&) {
            rep.skipped.push_back(rs[i].name);
        }
    }
    auto in_majority = [&](std::size_t i) { return took[i].has_value(); };
    if (!cs[ti]) throw error(errc::store_unavailable, "take_over: region '" + to + "' cannot be reached");
    auto step = [&](std::size_t i, const std::string& what, const auto& body) {
        try {
            body(*cs[i]);
        } catch (const error&) {
            throw;
        } catch (const std::exception& e) {
            throw error(errc::store_error, "take_over: region '" + rs[i].name + "': " + what + ": " + e.what());
        }
    };
    for (std::size_t i = 0; i < rs.size(); ++i) {
        if (!cs[i]) {
            if (in_majority(i))
                throw error(errc::store_unavailable,
                            "take_over: region '" + rs[i].name +
                                "' accepted the lease but cannot be reached to fence its copy; run the takeover again");
            continue;
        }
        if (i == fi) {
            step(i, "fencing the old home's copy", [&](pqxx::connection& c) {
                pqxx::work w(c);
                w.exec("SET LOCAL lock_timeout = " + std::to_string(timeout.count()));
                for (const std::string& q : dr::guard_sql(schema, space, "region " + to)) w.exec(q);
                w.exec_params(std::string(dr::lease::drop), space);
                w.commit();
                pqxx::nontransaction n(c);
                if (!n.exec_params(std::string(dr::publishes_sql), dr::publication_of(rs[i].name), schema).empty())
                    n.exec("ALTER PUBLICATION " + dr::publication_of(rs[i].name) + " DROP TABLES IN SCHEMA " + schema);
            });
            rep.fenced.push_back(rs[i].name);
            continue;
        }
        const std::string sub = dr::subscription_of(rs[fi].name, rs[i].name);
        step(i, "stopping its subscription to '" + rs[fi].name + "'", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            n.exec("ALTER SUBSCRIPTION " + sub + " DISABLE");
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

    // 4. Merge: the majority's copies into `to`'s, then `to`'s into every other reachable region.
    for (std::size_t i = 0; i < rs.size(); ++i) {
        if (i == ti || !cs[i] || !in_majority(i)) continue;
        step(ti, "merging region '" + rs[i].name + "''s copy",
             [&](pqxx::connection& c) { rep.records = dr::merge_copy(*cs[i], c, schema); });
        rep.merged.push_back(rs[i].name);
    }
    for (std::size_t i = 0; i < rs.size(); ++i) {
        if (i == ti || i == fi || !cs[i]) continue;
        step(i, "receiving the merged copy", [&](pqxx::connection& c) { (void)dr::merge_copy(*cs[ti], c, schema); });
    }

    // 5. `to` decides it: numbering past every merged row, leases of held claims pushed out (they
    // were measured on the old home's clock), published, the others subscribed without a copy,
    // the view of the new lease for its fence, and last its replica guard removed.
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
        if (n.exec_params(std::string(dr::publishes_sql), dr::publication_of(to), schema).empty())
            n.exec("ALTER PUBLICATION " + dr::publication_of(to) + " ADD TABLES IN SCHEMA " + schema);
    });
    for (std::size_t i = 0; i < rs.size(); ++i) {
        if (i == ti || i == fi || !cs[i]) continue;
        step(i, "subscribing to key space '" + space + "' at '" + to + "'", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            n.exec("ALTER SUBSCRIPTION " + dr::subscription_of(to, rs[i].name) +
                   " REFRESH PUBLICATION WITH (copy_data = false)");
        });
    }
    step(ti, "holding the new lease", [&](pqxx::connection& c) {
        std::vector<std::chrono::steady_clock::time_point> at;
        for (const auto& t : took)
            if (t) at.push_back(*t);
        std::sort(at.begin(), at.end(), std::greater<>());
        const std::int64_t us = dr::server_time_us(c, at[majority - 1] + lo.lease);
        pqxx::work w(c);
        w.exec_params(std::string(dr::lease::hold), space, epoch, us);
        for (const std::string& q : dr::unguard_sql(schema)) w.exec(q);
        w.commit();
    });
    return rep;
}

}  // namespace idem
