// bench/net_guards.hpp: the out-of-process peers users reach for instead of idem, behind the same
// interface as bench/guards.hpp, each set up the way its own documentation recommends for a
// per-request idempotency check.
//
//   redis_guard     Redis over loopback through hiredis, one synchronous connection per thread, no
//                   pipelining (a request checks its own key): SET key "P|fp" NX PX lease claims; a
//                   refused SET is followed by GET to read the winner's state; completion is
//                   SET key "S|fp|outcome" PX retention. Two round trips per fresh key, two per
//                   duplicate.
//   postgres_guard  PostgreSQL through libpqxx, one connection per thread, prepared statements, each
//                   statement its own (autocommit) transaction with the server's default durability
//                   (fsync=on, synchronous_commit=on):
//                   INSERT ... ON CONFLICT (k) DO NOTHING claims (row count 1 = acquired), a
//                   conflict reads the row, completion is an UPDATE. Two round trips per fresh key
//                   (two commits), two per duplicate.
//
// Both are configured from the environment: IDEM_BENCH_REDIS=host:port and IDEM_BENCH_PG_URI;
// without the variable the benchmark run is skipped with an error naming it (scripts/bench always
// sets both). Each guard object has a key space of its own (a key prefix in Redis, a table in
// PostgreSQL), so runs of different scenarios cannot see each other's keys. Nothing is cleaned up:
// scripts/bench runs both servers in throwaway directories.
// connect(threads) opens one connection per benchmark thread before the timed loop (thread 0 calls
// it); use(thread_index) picks this thread's, so connection set-up is never timed.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>
#include <pqxx/pqxx>

#include "guards.hpp"

namespace idem_bench {

inline constexpr long long lease_ms = 30'000;
inline constexpr long long retention_ms = 86'400'000;

/// Thrown by a peer's constructor when its server is not configured or not reachable.
struct peer_unavailable : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------------------

class redis_guard {
public:
    using key_type = std::string;
    static constexpr std::string_view name = "redis";
    static constexpr bool networked = true;

    struct claim : peer_claim_base {
        const std::string* key = nullptr;
        std::uint64_t fingerprint = 0;
    };

    explicit redis_guard(std::size_t) {
        const char* env = std::getenv("IDEM_BENCH_REDIS");
        if (env == nullptr || *env == 0) throw peer_unavailable("IDEM_BENCH_REDIS (host:port) is not set");
        const std::string_view hp(env);
        const auto colon = hp.rfind(':');
        host_ = std::string(hp.substr(0, colon));
        port_ = colon == std::string_view::npos ? 6379 : std::atoi(env + colon + 1);
        prefix_ = "g" + std::to_string(++instances()) + ":";
        connect(1);
        use(0);
    }
    void connect(std::size_t threads) {
        while (pool_.size() < threads) {
            pool_.emplace_back(redisConnect(host_.c_str(), port_));
            if (!pool_.back() || pool_.back()->err)
                throw peer_unavailable("redis " + host_ + ":" + std::to_string(port_) + ": cannot connect");
        }
    }
    void use(std::size_t thread_index) { current() = pool_[thread_index].get(); }

    claim begin(const std::string& k, std::uint64_t fingerprint) {
        char v[32];
        const int vn = std::snprintf(v, sizeof v, "P|%llu", static_cast<unsigned long long>(fingerprint));
        claim c;
        c.key = &k;
        c.fingerprint = fingerprint;
        reply r(command("SET %b%b %b NX PX %lld", prefix_.data(), prefix_.size(), k.data(), k.size(), v,
                        static_cast<std::size_t>(vn), lease_ms));
        if (!r) return c;  // rejected: the connection failed
        if (r->type == REDIS_REPLY_STATUS) {
            c.v = verdict::acquired;
            return c;
        }
        reply g(command("GET %b%b", prefix_.data(), prefix_.size(), k.data(), k.size()));
        if (!g || g->type != REDIS_REPLY_STRING) return c;
        const std::string_view s(g->str, g->len);
        record rec;
        rec.state = s[0] == 'S' ? record_state::succeeded : record_state::processing;
        const auto bar1 = s.find('|'), bar2 = s.find('|', bar1 + 1);
        std::from_chars(s.data() + bar1 + 1, s.data() + (bar2 == std::string_view::npos ? s.size() : bar2), rec.fingerprint);
        if (bar2 != std::string_view::npos) std::from_chars(s.data() + bar2 + 1, s.data() + s.size(), rec.outcome);
        static_cast<peer_claim_base&>(c) = judge(rec, fingerprint);
        return c;
    }

    bool succeed(claim& c, std::uint64_t outcome) {
        char v[64];
        const int vn = std::snprintf(v, sizeof v, "S|%llu|%llu", static_cast<unsigned long long>(c.fingerprint),
                                     static_cast<unsigned long long>(outcome));
        reply r(command("SET %b%b %b PX %lld", prefix_.data(), prefix_.size(), c.key->data(), c.key->size(), v,
                        static_cast<std::size_t>(vn), retention_ms));
        return r && r->type == REDIS_REPLY_STATUS;
    }

private:
    struct reply_free {
        void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
    };
    using reply = std::unique_ptr<redisReply, reply_free>;
    struct context_free {
        void operator()(redisContext* c) const noexcept { redisFree(c); }
    };

    static unsigned& instances() {
        static unsigned n = 0;
        return n;
    }
    /// This thread's connection (one per thread, as hiredis's synchronous API requires).
    static redisContext*& current() {
        thread_local redisContext* c = nullptr;
        return c;
    }

    template <class... A>
    redisReply* command(const char* fmt, A... a) {
        return static_cast<redisReply*>(redisCommand(current(), fmt, a...));
    }

    std::string host_;
    int port_ = 6379;
    std::string prefix_;
    std::vector<std::unique_ptr<redisContext, context_free>> pool_;
};

// ---------------------------------------------------------------------------------------------

class postgres_guard {
public:
    using key_type = std::string;
    static constexpr std::string_view name = "postgres";
    static constexpr bool networked = true;

    struct claim : peer_claim_base {
        const std::string* key = nullptr;
    };

    explicit postgres_guard(std::size_t) {
        const char* env = std::getenv("IDEM_BENCH_PG_URI");
        if (env == nullptr || *env == 0) throw peer_unavailable("IDEM_BENCH_PG_URI is not set");
        uri_ = env;
        table_ = "idem_bench_peer_" + std::to_string(++instances());
        try {
            pqxx::connection c(uri_);
            pqxx::nontransaction n(c);
            n.exec("DROP TABLE IF EXISTS " + table_);
            n.exec("CREATE TABLE " + table_ +
                   " (k TEXT PRIMARY KEY, status CHAR(1) NOT NULL, fingerprint BIGINT NOT NULL, "
                   "outcome BIGINT NOT NULL DEFAULT 0, lease_until TIMESTAMPTZ NOT NULL)");
            connect(1);
            use(0);
        } catch (const std::exception& e) {
            throw peer_unavailable(std::string("postgres: ") + e.what());
        }
    }
    void connect(std::size_t threads) {
        while (pool_.size() < threads) {
            auto conn = std::make_unique<pqxx::connection>(uri_);
            conn->prepare("claim", "INSERT INTO " + table_ +
                                       " (k, status, fingerprint, lease_until) VALUES ($1, 'P', $2, "
                                       "now() + interval '30 seconds') ON CONFLICT (k) DO NOTHING");
            conn->prepare("read", "SELECT status, fingerprint, outcome FROM " + table_ + " WHERE k = $1");
            conn->prepare("done", "UPDATE " + table_ + " SET status = 'S', outcome = $2 WHERE k = $1 AND status = 'P'");
            {
                // A new backend loads its catalog caches and plans on first use: do it untimed.
                pqxx::nontransaction n(*conn);
                (void)n.exec_prepared("read", std::string("warm-up"));
            }
            pool_.push_back(std::move(conn));
        }
    }
    void use(std::size_t thread_index) { current() = pool_[thread_index].get(); }

    claim begin(const std::string& k, std::uint64_t fingerprint) {
        claim c;
        c.key = &k;
        pqxx::nontransaction n(*current());
        const auto fp = static_cast<std::int64_t>(fingerprint);
        if (n.exec_prepared("claim", k, fp).affected_rows() == 1) {
            c.v = verdict::acquired;
            return c;
        }
        const pqxx::result r = n.exec_prepared("read", k);
        if (r.empty()) return c;
        record rec;
        rec.state = r[0][0].c_str()[0] == 'S' ? record_state::succeeded : record_state::processing;
        rec.fingerprint = static_cast<std::uint64_t>(r[0][1].as<std::int64_t>());
        rec.outcome = static_cast<std::uint64_t>(r[0][2].as<std::int64_t>());
        static_cast<peer_claim_base&>(c) = judge(rec, fingerprint);
        return c;
    }

    bool succeed(claim& c, std::uint64_t outcome) {
        pqxx::nontransaction n(*current());
        return n.exec_prepared("done", *c.key, static_cast<std::int64_t>(outcome)).affected_rows() == 1;
    }

private:
    static unsigned& instances() {
        static unsigned n = 0;
        return n;
    }
    static pqxx::connection*& current() {
        thread_local pqxx::connection* c = nullptr;
        return c;
    }

    std::string uri_, table_;
    std::vector<std::unique_ptr<pqxx::connection>> pool_;
};

}  // namespace idem_bench
