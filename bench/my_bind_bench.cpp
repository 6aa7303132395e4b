// bench/my_bind_bench.cpp: how mysql_store should send a batch to MySQL / MariaDB, measured: the
// multi-statement text query it sends (one round trip, values as hex literals), against array
// binding of prepared statements (MariaDB Connector/C's STMT_ATTR_ARRAY_SIZE: one execution sends
// every row of a batch, values in the binary protocol, but each statement is its own round trip).
//
// Both write what a batch of idem writes for fresh claims: one audit row per key and one upserted
// record per key (the store's ON DUPLICATE KEY UPDATE guard), in one transaction with
// innodb_flush_log_at_trx_commit as the server has it (1 in scripts/lib/mariadb.sh), on the store's
// own tables (a fresh database with mysql_store's schema), with the same random UUID keys.
//
//   text      START TRANSACTION;INSERT audit VALUES ...;INSERT record VALUES ... ON DUPLICATE KEY
//             UPDATE ...;COMMIT                                        1 round trip per batch
//   bound     START TRANSACTION; execute(audit, array); execute(record, array); COMMIT
//                                                                      4 round trips per batch
//
// Usage: idem-my-bind-bench [--rows N] [--batch B]   (IDEM_BENCH_MY_URI names the server)
// Prints one JSON line per method: rows/s, batches, round trips per batch, the client's CPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <mysql.h>

#include "idem/detail/my/connection.hpp"
#include "idem/detail/my/sql.hpp"
#include "idem/stores/mysql_store.hpp"
#include "uuid_keys.hpp"

namespace {

namespace my = idem::detail::my;

double cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void fail(MYSQL* m, const char* what) { throw std::runtime_error(std::string(what) + ": " + mysql_error(m)); }
[[noreturn]] void fail(MYSQL_STMT* s, const char* what) {
    throw std::runtime_error(std::string(what) + ": " + mysql_stmt_error(s));
}

MYSQL* connect(const my::endpoint& e) {
    MYSQL* m = mysql_init(nullptr);
    const std::string host = e.host == "localhost" ? "127.0.0.1" : e.host;
    if (mysql_real_connect(m, host.c_str(), e.user.c_str(), e.password.empty() ? nullptr : e.password.c_str(),
                           e.database.c_str(), e.port, nullptr, CLIENT_MULTI_STATEMENTS) == nullptr)
        fail(m, "connect");
    return m;
}

void query(MYSQL* m, const std::string& sql) {
    if (mysql_real_query(m, sql.data(), static_cast<unsigned long>(sql.size())) != 0) fail(m, "query");
    for (;;) {
        if (MYSQL_RES* r = mysql_store_result(m)) mysql_free_result(r);
        const int more = mysql_next_result(m);
        if (more == -1) return;
        if (more > 0) fail(m, "next result");
    }
}

constexpr std::string_view audit_columns =
    "INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, detail) "
    "VALUES ";

struct result {
    const char* method;
    std::size_t rows, batches;
    double secs, cpu;
    int round_trips;
};

result run_text(MYSQL* m, const std::vector<std::string>& keys, std::size_t batch, std::int64_t now) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t batches = 0;
    for (std::size_t at = 0; at < keys.size(); at += batch, ++batches) {
        const std::size_t end = std::min(keys.size(), at + batch);
        std::string q = "START TRANSACTION;";
        q += audit_columns;
        for (std::size_t i = at; i < end; ++i) {
            if (i > at) q += ',';
            q += '(';
            my::append_literal(q, keys[i]);
            q += ",'ABSENT','PROCESSING',1,X'6e',";
            q += std::to_string(now);
            q += ",X'636c61696d')";
        }
        q += ';';
        q += my::record_insert;
        for (std::size_t i = at; i < end; ++i) {
            if (i > at) q += ',';
            q += '(';
            my::append_literal(q, keys[i]);
            q += ",X'504159','PROCESSING',1," + std::to_string(now + 30'000) + ",0,7," + std::to_string(now) + ',' +
                 std::to_string(now) + ",X'')";
        }
        q += my::upsert_direct_claimed;
        q += ";COMMIT";
        query(m, q);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {"text", keys.size(), batches, secs, cpu_seconds() - c0, 1};
}

/// One prepared statement with array binding, column-wise.
class bound_statement {
public:
    bound_statement(MYSQL* m, const std::string& sql, std::size_t columns) : binds_(columns) {
        st_ = mysql_stmt_init(m);
        if (mysql_stmt_prepare(st_, sql.data(), static_cast<unsigned long>(sql.size())) != 0) fail(st_, "prepare");
    }
    ~bound_statement() { mysql_stmt_close(st_); }
    bound_statement(const bound_statement&) = delete;
    bound_statement& operator=(const bound_statement&) = delete;

    /// Column i: byte strings (array of pointers, lengths).
    void strings(std::size_t i, std::vector<const char*>& p, std::vector<unsigned long>& len) {
        MYSQL_BIND& b = binds_[i];
        b = MYSQL_BIND{};
        b.buffer_type = MYSQL_TYPE_BLOB;
        b.buffer = p.data();
        b.length = len.data();
    }
    /// Column i: 64-bit integers (a contiguous array).
    void ints(std::size_t i, std::vector<long long>& v, bool is_unsigned) {
        MYSQL_BIND& b = binds_[i];
        b = MYSQL_BIND{};
        b.buffer_type = MYSQL_TYPE_LONGLONG;
        b.buffer = v.data();
        b.is_unsigned = is_unsigned;
    }
    void execute(unsigned rows) {
        if (mysql_stmt_attr_set(st_, STMT_ATTR_ARRAY_SIZE, &rows) != 0) fail(st_, "array size");
        if (mysql_stmt_bind_param(st_, binds_.data()) != 0) fail(st_, "bind");
        if (mysql_stmt_execute(st_) != 0) fail(st_, "execute");
    }

private:
    MYSQL_STMT* st_ = nullptr;
    std::vector<MYSQL_BIND> binds_;
};

result run_bound(MYSQL* m, const std::vector<std::string>& keys, std::size_t batch, std::int64_t now) {
    std::string audit_sql(audit_columns);
    audit_sql += "(?, 'ABSENT', 'PROCESSING', 1, ?, ?, ?)";
    std::string record_sql(my::record_insert);
    record_sql += "(?, ?, 'PROCESSING', 1, ?, 0, ?, ?, ?, ?)";
    record_sql += my::upsert_direct_claimed;
    bound_statement audit(m, audit_sql, 4), record(m, record_sql, 7);
    std::vector<const char*> kp(batch), np(batch), dp(batch), bp(batch), pp(batch);
    std::vector<unsigned long> kl(batch), nl(batch, 1), dl(batch, 5), bl(batch, 3), pl(batch, 0);
    std::vector<long long> at(batch, now), lease(batch, now + 30'000), fp(batch, 7), created(batch, now),
        updated(batch, now);
    std::fill(np.begin(), np.end(), "n");
    std::fill(dp.begin(), dp.end(), "claim");
    std::fill(bp.begin(), bp.end(), "PAY");
    std::fill(pp.begin(), pp.end(), "");
    audit.strings(0, kp, kl);
    audit.strings(1, np, nl);
    audit.ints(2, at, false);
    audit.strings(3, dp, dl);
    record.strings(0, kp, kl);
    record.strings(1, bp, bl);
    record.ints(2, lease, false);
    record.ints(3, fp, true);
    record.ints(4, created, false);
    record.ints(5, updated, false);
    record.strings(6, pp, pl);
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t batches = 0;
    for (std::size_t a = 0; a < keys.size(); a += batch, ++batches) {
        const std::size_t end = std::min(keys.size(), a + batch);
        for (std::size_t i = a; i < end; ++i) {
            kp[i - a] = keys[i].data();
            kl[i - a] = static_cast<unsigned long>(keys[i].size());
        }
        if (mysql_query(m, "START TRANSACTION") != 0) fail(m, "start");
        audit.execute(static_cast<unsigned>(end - a));
        record.execute(static_cast<unsigned>(end - a));
        if (mysql_commit(m) != 0) fail(m, "commit");
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {"bound", keys.size(), batches, secs, cpu_seconds() - c0, 4};
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t rows = 100'000, batch = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--rows") rows = std::stoul(argv[i + 1]);
        else if (a == "--batch") batch = std::stoul(argv[i + 1]);
        else {
            std::fprintf(stderr, "usage: idem-my-bind-bench [--rows N] [--batch B]\n");
            return 2;
        }
    }
    const char* uri = std::getenv("IDEM_BENCH_MY_URI");
    if (uri == nullptr || *uri == '\0') {
        std::fprintf(stderr, "idem-my-bind-bench: IDEM_BENCH_MY_URI is unset (mysql://USER@HOST:PORT/DB)\n");
        return 2;
    }
    try {
        const my::endpoint server = my::parse_uri(uri);
        std::random_device rd;
        char name[40];
        std::snprintf(name, sizeof name, "idem_bind_%08x", rd());  // hex digits only
        MYSQL* admin = connect(server);
        query(admin, std::string("CREATE DATABASE ") + name);
        std::string db_uri(uri);
        db_uri = db_uri.substr(0, db_uri.rfind('/') + 1) + name;
        const std::int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count();
        for (const char* method : {"text", "bound", "text", "bound"}) {
            { idem::mysql_store schema(db_uri); }  // the store's tables, emptied between runs
            MYSQL* m = connect(my::parse_uri(db_uri));
            query(m, "DELETE FROM idempotent_audit;DELETE FROM idempotent_record");
            // Fresh random keys per run (the same generator, another seed): every row an insert.
            std::mt19937_64 rng(std::string(method) == "text" ? 11 : 12);
            std::vector<std::string> keys;
            keys.reserve(rows);
            for (std::size_t i = 0; i < rows; ++i) keys.push_back(idem_bench::format_uuid(idem_bench::draw_uuid(rng)));
            const result r = std::string(method) == "text" ? run_text(m, keys, batch, now) : run_bound(m, keys, batch, now);
            mysql_close(m);
            std::printf(
                "{\"method\":\"%s\",\"rows\":%zu,\"batch\":%zu,\"batches\":%zu,\"round_trips_per_batch\":%d,"
                "\"rows_per_sec\":%.0f,\"client_cpu_ns_per_row\":%.0f}\n",
                r.method, r.rows, batch, r.batches, r.round_trips, static_cast<double>(r.rows) / r.secs,
                r.cpu * 1e9 / static_cast<double>(r.rows));
            std::fflush(stdout);
        }
        query(admin, std::string("DROP DATABASE ") + name);
        mysql_close(admin);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "idem-my-bind-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
