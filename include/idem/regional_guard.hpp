// idem/regional_guard.hpp: scope::global across regions (regions.hpp): each key decided in its
// home region only, decisions replicated to the others by logical replication (target idem::postgres).
//
//   idem::regional_options ro;
//   ro.self = "eu";
//   ro.regions = {{"eu", "postgresql://idem@db.eu/pay"}, {"us", "postgresql://idem@db.us.example/pay"}};
//   ro.home = [](std::string_view k) { return k.starts_with("US") ? std::string("us") : std::string("eu"); };
//   idem::regional_guard g(idem::options{}, ro);
//   auto r = g.begin(idem::key("US42_PAY_v1"), fingerprint);  // home us: decided there
//
// How begin(k) is answered, in this order:
//   1. k's home is this region: global_guard::begin on this region's cluster (schema idem_<self>),
//      exactly the global scope of one PostgreSQL.
//   2. a foreign home H: this process's table of H's keys (memory: a decision it already saw);
//   3. then this region's replica of H's schema (one round trip inside the region): a SUCCESS or
//      FAILED row that arrived by replication answers the duplicate, and is cached;
//   4. else the claim goes to H's cluster, batched with this process's other claims of H's keys
//      (global_guard's claim batcher: one cross-region round trip per batch). Its completion goes
//      there too (the ticket is H's).
// A region this process cannot reach answers its keys' first claims store_unavailable (never
// granted here); their duplicates whose decision has arrived are still answered by 2 or 3. The
// home region keeps deciding its own keys whatever happens to the others (in asynchronous mode; in
// synchronous mode a home commits only while one other region's subscriber confirms: regions.hpp).
//
// Costs: a guard opens, per region, global_guard's connections (claim_connections +
// completion_connections + 2) to that region's cluster, plus `replica_connections` to this
// region's cluster per foreign region. Compensation of a home's expired claims is run by the
// home's own processes (forward guards have no resolver), so options.resolve must be able to
// decide an operation started in any region.
//
// Not guaranteed: a foreign key's decision pruned at its home (past the window) may still be
// answered here from the replica until the prune arrives: keep the retention of every region's
// window the same. A duplicate whose decision has not arrived yet costs the cross-region round
// trip. After a planned move (move_home.hpp) or a takeover (takeover.hpp) every process needs the
// new decided_at map.
//
// Thread-safety: every member may be called from any thread concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/detail/regions/names.hpp"
#include "idem/detail/regions/replica_reader.hpp"
#include "idem/global_guard.hpp"
#include "idem/home_lease.hpp"
#include "idem/regions.hpp"

namespace idem {

struct regional_options {
    /// This process's region (one of `regions`).
    std::string self;
    /// Every region, with its cluster's connection string as this process reaches it.
    std::vector<region> regions;
    /// The home rule: the key space of a key, named by the region that is its home. It must give
    /// the same answer for a key in every process of every region, and name a region of `regions`
    /// (a key it maps elsewhere, or for which it throws, is answered invalid_key).
    std::function<std::string(std::string_view key)> home;
    /// Key spaces decided by another region's cluster than their own, after a move (move_home() in
    /// regions.hpp): {"eu", "us"} once eu's keys are decided by us's cluster. A key space not
    /// named here is decided by its own region's cluster. Every process must be given the same
    /// map after a move; one still on the old map is refused by the fenced old home (never granted).
    std::map<std::string, std::string> decided_at;
    /// The global guard of this region's home keys.
    global_options local;
    /// The global guards of foreign homes (one per foreign region). Their prune_interval is forced
    /// to zero: a home's own processes prune it.
    global_options forward = [] {
        global_options g;
        g.claim_connections = 1;
        g.completion_connections = 1;
        return g;
    }();
    /// Connections to this region's cluster reading each foreign home's replica.
    std::size_t replica_connections = 2;
    /// Home leases (home_lease.hpp), when setup_home_leases ran: the guard runs a
    /// home_lease_keeper renewing the leases of the key spaces this region decides, and answers a
    /// claim of one of them store_unavailable, never "acquired", when the keeper's lease is no
    /// longer valid as the claim returns (its cluster's fence refuses it before that).
    std::optional<lease_options> leases;
};

/// Counters of a regional guard: each region's global guard, plus the routing.
struct regional_stats {
    std::vector<std::pair<std::string, global_stats>> regions;  ///< by region: the guard of its keys
    std::uint64_t foreign_begins = 0;                           ///< begin() of keys whose home is another region
    std::uint64_t replica_reads = 0;                            ///< replica rows read (a foreign key unknown to memory)
    std::uint64_t answered_by_replica = 0;                      ///< of those, duplicates answered from the replica
    std::uint64_t replica_errors = 0;                           ///< replica reads that failed (the home was asked instead)
    std::uint64_t unroutable = 0;                               ///< keys the home rule mapped to no configured region
    std::uint64_t lease_refused = 0;  ///< claims won here but answered store_unavailable: the home lease had run out
};

class regional_guard : public detail::guard_contract<regional_guard> {
public:
    using ticket_type = global_ticket;
    using result_type = global_begin_result;

    /// Checks the options (invalid_argument, before any connection), then opens a global guard per
    /// region (this region's own keys, and every foreign home) and the replica readers. Throws what
    /// global_guard's constructor throws.
    regional_guard(options opts, regional_options ro) : ro_(std::move(ro)) {
        namespace dr = detail::regions;
        dr::check_regions(ro_.regions);
        if (!ro_.home)
            throw error(errc::invalid_argument, "regional guard: regional_options::home (the home rule) is empty");
        // Ordered versions keep their table (idempotent_version) in the key space's schema, which
        // setup_regions neither creates on the replicas nor moves: its first row would stop every
        // subscriber of the home. Refused until regions carry it.
        if (opts.ordered_versions)
            throw error(errc::invalid_argument,
                        "regional guard: options.ordered_versions is not supported across regions (its version table is not "
                        "replicated); order versions within one region's global_guard");
        if (ro_.replica_connections == 0)
            throw error(errc::invalid_argument, "regional guard: replica_connections must be at least 1");
        self_ = index_of(ro_.self);
        if (self_ == npos)
            throw error(errc::invalid_argument, "regional guard: self region '" + ro_.self + "' is not one of the regions");
        for (const auto& [space, at] : ro_.decided_at)
            if (index_of(space) == npos || index_of(at) == npos)
                throw error(errc::invalid_argument, "regional guard: decided_at maps key space '" + space + "' to region '" +
                                                        at + "'; both must be regions");
        if (ro_.leases) keeper_ = std::make_unique<home_lease_keeper>(ro_.regions, ro_.self, *ro_.leases);
        readers_.resize(ro_.regions.size());
        for (std::size_t i = 0; i < ro_.regions.size(); ++i) {
            // Key space i (the keys whose home rule names region i), decided by region d's cluster.
            const std::string schema = dr::schema_of(ro_.regions[i].name);
            const auto moved = ro_.decided_at.find(ro_.regions[i].name);
            const std::size_t d = moved == ro_.decided_at.end() ? i : index_of(moved->second);
            const std::string at = dr::with_schema(ro_.regions[d].uri, schema);
            if (d == self_) {
                guards_.push_back(std::make_unique<global_guard>(at, opts, ro_.local));
                continue;
            }
            options fo = opts;
            fo.resolve = nullptr;  // the deciding region's own processes compensate
            global_options fg = ro_.forward;
            fg.prune_interval = std::chrono::milliseconds::zero();
            guards_.push_back(std::make_unique<global_guard>(at, fo, fg));
            readers_[i] = std::make_unique<dr::replica_reader>(dr::with_schema(ro_.regions[self_].uri, schema),
                                                               ro_.replica_connections, ro_.local.call_deadline);
        }
    }
    regional_guard(const regional_guard&) = delete;
    regional_guard& operator=(const regional_guard&) = delete;

    /// Claims `k` in its home region, or says what its record is (the header says in which order
    /// it asks). invalid_key for a key global scope refuses, and for one the home rule maps to no
    /// configured region.
    global_begin_result begin(const key& k, std::uint64_t fingerprint = 0) noexcept {
        const std::size_t h = home_index(k);
        if (h == npos) [[unlikely]] {
            unroutable_.fetch_add(1, std::memory_order_relaxed);  // statistics
            return {begin_status::invalid_key, global_ticket(), 0, 0};
        }
        if (!readers_[h]) {  // decided here
            auto r = guards_[h]->begin(k, fingerprint);
            // The acknowledgement is fenced by the lease: a claim that committed while the lease was
            // valid but returns after it ran out may already be decided again by a region that took
            // the key space over. Dropping the ticket rolls the claim back (if the fence still lets it).
            if (keeper_ && r.status == begin_status::acquired && !keeper_->valid(h)) [[unlikely]] {
                lease_refused_.fetch_add(1, std::memory_order_relaxed);  // statistics
                return {begin_status::store_unavailable, global_ticket(), 0, 0};
            }
            return r;
        }
        foreign_.fetch_add(1, std::memory_order_relaxed);  // statistics
        return guards_[h]->begin_via(k, fingerprint,
                                     [r = readers_[h].get()](const key& kk) noexcept { return r->read(kk); });
    }

    // begin_wait(key, fingerprint, timeout) and run(key, fn, run_options) come from
    // detail::guard_contract, as in every scope.

    /// The region whose cluster decides `k` (empty when the home rule names no configured region).
    [[nodiscard]] std::string home_of(const key& k) const {
        const std::size_t h = home_index(k);
        return h == npos ? std::string() : ro_.regions[h].name;
    }
    /// What this process's table of k's home knows about `k`. Lock-free.
    [[nodiscard]] record_view query(const key& k) const noexcept {
        const std::size_t h = home_index(k);
        return h == npos ? record_view{} : guards_[h]->query(k);
    }
    /// The key's row at its home (a round trip to the home's cluster).
    [[nodiscard]] std::optional<stored_record> lookup(const key& k) {
        const std::size_t h = checked_home(k);
        return guards_[h]->lookup(k.view());
    }
    /// The key's audit trail at its home.
    [[nodiscard]] std::vector<audit_entry> audit(const key& k) { return guards_[checked_home(k)]->audit(k.view()); }
    /// The guard of region `name`'s keys (this region's own, or a foreign home's forward guard).
    [[nodiscard]] global_guard& region_guard(std::string_view name) {
        const std::size_t i = index_of(name);
        if (i == npos) throw error(errc::invalid_argument, "regional guard: no region '" + std::string(name) + "'");
        return *guards_[i];
    }

    /// The replication links this region's cluster sees: its subscriptions to every other home
    /// (incoming) and every other region's subscription to its home keys (outgoing, with the lag
    /// that asynchronous mode can lose with this region). A round trip to this region's cluster.
    /// Throws idem::error(store_unavailable) when the cluster does not answer.
    [[nodiscard]] std::vector<replication_link> replication() {
        std::lock_guard lk(status_m_);
        try {
            if (!status_db_)
                status_db_ = std::make_unique<pqxx::connection>(
                    detail::pg::session_conninfo(ro_.regions[self_].uri, ro_.local.call_deadline, "idem-regions-status"));
            return detail::regions::read_links(*status_db_, ro_.self);
        } catch (const std::exception& e) {
            status_db_.reset();
            throw error(errc::store_unavailable,
                        "regional guard: replication state of region '" + ro_.self + "': " + e.what());
        }
    }

    [[nodiscard]] regional_stats snapshot() const noexcept {
        regional_stats s;
        try {
            for (std::size_t i = 0; i < guards_.size(); ++i)
                s.regions.emplace_back(ro_.regions[i].name, guards_[i]->snapshot());
        } catch (...) {  // no memory for the names: the counters below stand alone
        }
        s.foreign_begins = foreign_.load(std::memory_order_relaxed);
        s.unroutable = unroutable_.load(std::memory_order_relaxed);
        s.lease_refused = lease_refused_.load(std::memory_order_relaxed);
        for (const auto& r : readers_) {
            if (!r) continue;
            s.replica_reads += r->reads();
            s.answered_by_replica += r->hits();
            s.replica_errors += r->errors();
        }
        return s;
    }

    [[nodiscard]] const regional_options& regional_opts() const noexcept { return ro_; }
    /// The keeper of this region's home leases (null without regional_options::leases).
    [[nodiscard]] const home_lease_keeper* lease_keeper() const noexcept { return keeper_.get(); }

private:
    friend class detail::guard_contract<regional_guard>;
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);

    [[nodiscard]] std::size_t index_of(std::string_view name) const noexcept {
        for (std::size_t i = 0; i < ro_.regions.size(); ++i)
            if (ro_.regions[i].name == name) return i;
        return npos;
    }
    [[nodiscard]] std::size_t home_index(const key& k) const noexcept {
        try {
            return index_of(ro_.home(k.view()));
        } catch (...) {
            return npos;
        }
    }
    std::size_t checked_home(const key& k) const {
        const std::size_t h = home_index(k);
        if (h == npos) throw error(errc::invalid_key, refusal_message(begin_status::invalid_key, k));
        return h;
    }

    /// run()'s words for the answers only this scope gives its reasons for.
    [[nodiscard]] std::string refusal_message(begin_status st, const key& k) const {
        const std::string name = "key '" + key::printable(k.view()) + "'";
        const std::size_t h = home_index(k);
        if (h == npos) {
            std::string got;
            try {
                got = "'" + ro_.home(k.view()) + "'";
            } catch (const std::exception& e) {
                got = "an exception (" + std::string(e.what()) + ")";
            }
            return name + ": the home rule gave " + got + ", which is not a configured region; not executed";
        }
        const std::string where = " (home region '" + ro_.regions[h].name + "')";
        switch (st) {
            case begin_status::store_unavailable:
                return name + where + ": the home region did not confirm the claim; not executed (" +
                       guards_[h]->last_error() + ")";
            case begin_status::invalid_key: return name + " " + detail::global::coordinator::refusal(k) + "; not executed";
            default: return name + where + ": " + to_string(st);
        }
    }

    regional_options ro_;
    std::size_t self_ = npos;
    std::unique_ptr<home_lease_keeper> keeper_;                              // before the guards: it renews before they open
    std::vector<std::unique_ptr<global_guard>> guards_;                      // by region index
    std::vector<std::unique_ptr<detail::regions::replica_reader>> readers_;  // by region index; null for self
    std::mutex status_m_;
    std::unique_ptr<pqxx::connection> status_db_;                               // under status_m_
    std::atomic<std::uint64_t> foreign_{0}, unroutable_{0}, lease_refused_{0};  // statistics
};

/// A regional guard's counters in the Prometheus text format: each region's global guard as
/// to_prometheus(global_stats) gives it, with a region label, and the routing counters.
inline std::string to_prometheus(const regional_stats& s) {
    // Every family once, its series from every region together (the text format wants a family's
    // lines in one group): the regions' texts are split into families, in their order.
    std::vector<std::pair<std::string, std::string>> families;  // family name -> HELP/TYPE, then samples
    for (const auto& [name, g] : s.regions) {
        const std::string part = to_prometheus(g);
        std::size_t fam = 0;
        for (std::size_t at = 0; at < part.size();) {
            std::size_t nl = part.find('\n', at);
            if (nl == std::string::npos) nl = part.size();
            std::string line = part.substr(at, nl - at);
            at = nl + 1;
            if (line.empty()) continue;
            if (line.starts_with("# ")) {  // "# HELP name text" or "# TYPE name kind"
                const std::size_t from = line.find(' ', 2) + 1;
                const std::string family = line.substr(from, line.find(' ', from) - from);
                fam = families.size();
                for (std::size_t i = 0; i < families.size(); ++i)
                    if (families[i].first == family) fam = i;
                if (fam == families.size()) families.emplace_back(family, std::string());
                if (&name == &s.regions.front().first) families[fam].second.append(line).append("\n");
                continue;
            }
            const std::size_t sp = line.find(' ');
            const std::size_t br = line.find('{');
            if (br != std::string::npos && br < sp) line.insert(br + 1, "region=\"" + name + "\",");
            else line.insert(sp, "{region=\"" + name + "\"}");
            if (fam < families.size()) families[fam].second.append(line).append("\n");
        }
    }
    std::string out;
    for (const auto& f : families) out += f.second;
    auto put = [&](const char* n, const char* help, std::uint64_t v) {
        out.append("# HELP idem_region_").append(n).append(" ").append(help).append("\n# TYPE idem_region_");
        out.append(n).append(" counter\nidem_region_").append(n).append(" ").append(std::to_string(v)).append("\n");
    };
    put("foreign_begins_total", "begin() of keys whose home is another region.", s.foreign_begins);
    put("replica_reads_total", "Rows read from this region's replica of a foreign home.", s.replica_reads);
    put("answered_by_replica_total", "Duplicates of foreign keys answered from the local replica.", s.answered_by_replica);
    put("replica_errors_total", "Replica reads that failed (the home was asked).", s.replica_errors);
    put("unroutable_total", "Keys the home rule mapped to no configured region.", s.unroutable);
    put("lease_refused_total", "Claims won here answered store_unavailable: the home lease had run out.", s.lease_refused);
    return out;
}

}  // namespace idem
