// A consumer of idem: guards one operation and checks the duplicate is replayed, not executed; then,
// for each component it was built with, uses that store (PostgreSQL only when IDEM_TEST_PG_URI names
// a server, MySQL when IDEM_TEST_MY_URI does: otherwise the store is linked, not opened). The add_subdirectory consumer runs the first
// part alone.
#include <idem/idem.hpp>
#if defined(IDEM_CONSUMER_SQLITE) || defined(IDEM_CONSUMER_POSTGRES) || defined(IDEM_CONSUMER_ROCKSDB) || \
    defined(IDEM_CONSUMER_MYSQL)
#include <idem/durable.hpp>
#endif
#ifdef IDEM_CONSUMER_SQLITE
#include <idem/stores/sqlite_store.hpp>
#endif
#ifdef IDEM_CONSUMER_POSTGRES
#include <idem/stores/postgres_store.hpp>
#endif
#ifdef IDEM_CONSUMER_ROCKSDB
#include <idem/stores/rocksdb_store.hpp>
#endif
#ifdef IDEM_CONSUMER_MYSQL
#include <idem/stores/mysql_store.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

namespace {

// Runs the same key twice through g; the operation must run once and the duplicate get its outcome.
template <class Guard>
bool exactly_once(const char* what, Guard& g, const idem::key& k = idem::key::compose("TX1", "PAY", 1)) {
    int executed = 0;
    const auto first = g.run(k, [&] {
        ++executed;
        return 42;
    });
    const auto again = g.run(k, [&] {
        ++executed;
        return 43;
    });
    if (first != 42 || again != 42 || executed != 1) {
        std::fprintf(stderr, "consumer (%s): first=%llu again=%llu executed=%d\n", what,
                     static_cast<unsigned long long>(first), static_cast<unsigned long long>(again), executed);
        return false;
    }
    std::printf("consumer (%s): ok\n", what);
    return true;
}

#if defined(IDEM_CONSUMER_SQLITE) || defined(IDEM_CONSUMER_POSTGRES) || defined(IDEM_CONSUMER_ROCKSDB) || \
    defined(IDEM_CONSUMER_MYSQL)
bool durable(const char* what, std::unique_ptr<idem::store> st, const idem::key& k) {
    idem::options opts;
    opts.capacity = 64;
    opts.maintenance_interval = {};
    idem::store_options so;
    so.mode = idem::durability::sync;
    idem::durable_guard g(std::move(st), opts, so);
    return exactly_once(what, g.guard(), k);
}
#endif

}  // namespace

int main() {
    idem::options opts;
    opts.capacity = 64;
    opts.maintenance_interval = {};
    idem::guard g(opts);
    bool ok = exactly_once("core", g);
    [[maybe_unused]] const auto scratch = std::filesystem::current_path() / "consumer-stores";
#ifdef IDEM_CONSUMER_SQLITE
    std::filesystem::remove_all(scratch);
    std::filesystem::create_directories(scratch);
    ok = durable("sqlite", std::make_unique<idem::sqlite_store>((scratch / "idem.db").string()),
                 idem::key::compose("TX1", "PAY", 1)) &&
         ok;
#endif
#ifdef IDEM_CONSUMER_ROCKSDB
    std::filesystem::remove_all(scratch / "rocksdb");
    std::filesystem::create_directories(scratch);
    ok = durable("rocksdb", std::make_unique<idem::rocksdb_store>((scratch / "rocksdb").string(), true),
                 idem::key::compose("TX1", "PAY", 1)) &&
         ok;
#endif
#ifdef IDEM_CONSUMER_POSTGRES
    if (const char* uri = std::getenv("IDEM_TEST_PG_URI"); uri != nullptr && *uri != '\0') {
        // A key of this run's own: the shared test database keeps its records between runs.
        const auto k = idem::key::compose("CONSUMER" + std::to_string(std::random_device{}()), "PAY", 1);
        ok = durable("postgres", std::make_unique<idem::postgres_store>(uri), k) && ok;
    } else {
        std::puts("consumer (postgres): linked; IDEM_TEST_PG_URI unset, not opened");
    }
#endif
#ifdef IDEM_CONSUMER_MYSQL
    if (const char* uri = std::getenv("IDEM_TEST_MY_URI"); uri != nullptr && *uri != '\0') {
        const auto k = idem::key::compose("CONSUMER" + std::to_string(std::random_device{}()), "PAY", 1);
        ok = durable("mysql", std::make_unique<idem::mysql_store>(uri), k) && ok;
    } else {
        std::puts("consumer (mysql): linked; IDEM_TEST_MY_URI unset, not opened");
    }
#endif
    return ok ? 0 : 1;
}
