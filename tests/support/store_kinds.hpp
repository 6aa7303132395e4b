// tests/support/store_kinds.hpp: one store of each kind, for tests parameterised by store.
//
// * store_kind: set up ("memory", "sqlite", "rocksdb", "postgres") once per test; open() then
//   ("mysql" too) gives a new connection to the same data each time (a restart, a second reader). A kind this
//   build lacks fails the test (never a silent skip).
// * evict(): fills and rotates a durable guard on a manual clock until a key left memory.
// * held_reads: forwards to a store and holds every get() at a gate the test opens (a read that
//   hangs, as on a dead connection), failing it while `down`; its reader (the second connection of
//   SQLite and PostgreSQL) is held the same way, so a recall is tested on the path the store
//   really takes: the reader thread, or the flusher between batches.
//
// The test target defines IDEM_TEST_WITH_ROCKSDB / IDEM_TEST_WITH_POSTGRES / IDEM_TEST_WITH_MYSQL where it links those
// stores (tests/CMakeLists.txt, idem_store_kinds_test).
#pragma once

#include <idem/stores/sqlite_store.hpp>
#include <idem/store.hpp>
#ifdef IDEM_TEST_WITH_ROCKSDB
#include <idem/stores/rocksdb_store.hpp>
#endif
#ifdef IDEM_TEST_WITH_POSTGRES
#include <idem/stores/postgres_store.hpp>

#include "pg_database.hpp"
#endif
#ifdef IDEM_TEST_WITH_MYSQL
#include <idem/stores/mysql_store.hpp>

#include "my_database.hpp"
#endif

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "store_fixtures.hpp"

namespace idem_test {

class store_kind {
public:
    /// Prepares a store of `kind` in a fresh directory or database named after `tag`. Fails the
    /// calling test (a fatal failure: check HasFatalFailure) when this build lacks the kind.
    void prepare(const std::string& kind, const char* tag) {
        if (kind == "memory") {
            mem_ = std::make_shared<idem::memory_store>();
            open_ = [m = mem_] { return std::make_unique<forwarding_store>(*m); };
        } else if (kind == "sqlite") {
            dir_ = std::make_unique<temp_dir>(tag);
            open_ = [path = dir_->file("w.db")] { return std::make_unique<idem::sqlite_store>(path); };
        } else if (kind == "rocksdb") {
#ifdef IDEM_TEST_WITH_ROCKSDB
            dir_ = std::make_unique<temp_dir>(tag);
            open_ = [path = dir_->file("rocks")] { return std::make_unique<idem::rocksdb_store>(path); };
#else
            FAIL() << "built without RocksDB";
#endif
        } else if (kind == "postgres") {
#ifdef IDEM_TEST_WITH_POSTGRES
            std::string why;
            ASSERT_TRUE(db_.create(&why)) << why;
            open_ = [uri = db_.uri()] { return std::make_unique<idem::postgres_store>(uri); };
#else
            FAIL() << "built without PostgreSQL";
#endif
        } else if (kind == "mysql") {
#ifdef IDEM_TEST_WITH_MYSQL
            std::string why;
            ASSERT_TRUE(my_.create(&why)) << why;
            open_ = [uri = my_.uri()] { return std::make_unique<idem::mysql_store>(uri); };
#else
            FAIL() << "built without MySQL";
#endif
        } else {
            FAIL() << "no store kind '" << kind << "' (memory, sqlite, rocksdb, postgres, mysql)";
        }
    }

    /// A new connection to the prepared store.
    [[nodiscard]] std::unique_ptr<idem::store> open() const { return open_(); }

private:
    std::shared_ptr<idem::memory_store> mem_;
    std::unique_ptr<temp_dir> dir_;
#ifdef IDEM_TEST_WITH_POSTGRES
    pg_database db_;
#endif
#ifdef IDEM_TEST_WITH_MYSQL
    my_database my_;
#endif
    std::function<std::unique_ptr<idem::store>()> open_;
};

/// Every kind this build has, for INSTANTIATE_TEST_SUITE_P.
inline std::vector<std::string> store_kinds() {
    std::vector<std::string> k{"memory", "sqlite"};
#ifdef IDEM_TEST_WITH_ROCKSDB
    k.push_back("rocksdb");
#endif
#ifdef IDEM_TEST_WITH_POSTGRES
    k.push_back("postgres");
#endif
#ifdef IDEM_TEST_WITH_MYSQL
    k.push_back("mysql");
#endif
    return k;
}

/// Fills and rotates `g` (a durable guard on `clock`) until `k` is no longer in memory (two
/// rotations after it was written), so the next begin() of it goes through the cold window to the
/// store: each round succeeds four filler keys "F<n>X<i>_PAY_v1" (n counts in `filler`), flushes,
/// moves the clock 10 ms and collects.
template <class Guard>
void evict(Guard& g, const std::string& k, idem::manual_clock& clock, int& filler) {
    using namespace std::chrono_literals;
    for (int round = 0; g->query(idem::key(k)).state != idem::record_state::absent; ++round) {
        ASSERT_LT(round, 50) << "key " << k << " never left memory";
        for (int i = 0; i < 4; ++i) {
            auto r = g->begin(idem::key("F" + std::to_string(filler) + "X" + std::to_string(i) + "_PAY_v1"));
            ASSERT_EQ(r.status, idem::begin_status::acquired) << "filler " << filler << "/" << i;
            ASSERT_FALSE(r.ticket.succeed(static_cast<std::uint64_t>(i) + 1000));
        }
        ++filler;
        ASSERT_TRUE(g.flush(10s)) << g.last_store_error();
        clock.advance(10ms);
        (void)g->collect();
    }
}

/// What a test steers in held_reads: reads wait at the gate, and fail while `down`; `reads`
/// counts the store reads made (each counted before it waits).
struct read_control {
    commit_gate gate;
    std::atomic<int> reads{0};
    std::atomic<bool> down{false};
};

class held_reads final : public forwarding_store {
public:
    held_reads(idem::store& inner, read_control& c, std::unique_ptr<idem::store> owned = nullptr)
        : forwarding_store(inner), c_(c), owned_(std::move(owned)) {}
    std::optional<idem::stored_record> get(std::string_view k) override {
        ++c_.reads;
        c_.gate.pass();
        if (c_.down.load()) throw idem::error(idem::errc::store_unavailable, "held store: injected outage");
        return inner_.get(k);
    }
    std::unique_ptr<idem::store> open_reader() override {
        auto r = inner_.open_reader();
        if (!r) return nullptr;
        idem::store& inner = *r;
        return std::make_unique<held_reads>(inner, c_, std::move(r));
    }

private:
    read_control& c_;
    std::unique_ptr<idem::store> owned_;  // a reader's own connection
};

}  // namespace idem_test
