// rocksdb_store_test: what rocksdb_store adds beyond the conformance suite (store_conformance_test
// runs that over it too): crash safety of sync-mode batches under SIGKILL, one writer per directory,
// damaged values, configuration faults, reconnects that never create a new database, pruning, and a
// durable_guard that keeps its keys across a restart; a record value written before payloads
// (version 1) read from a database, completed again with a payload, kept through a compaction.
//
// The crash and second-writer cases re-execute this binary with IDEM_ROCKSDB_CHILD=MODE:PATH set
// (it then never reaches GoogleTest, so it starts with no thread inherited from the test process).
// MODE "write": apply batch after batch in sync mode, each batch i holding keys "b<i>_<j>", and
// write "A <i>" to fd 100 after apply() returns; MODE "hold": open the store, write "R", wait.
#include <idem/durable.hpp>
#include <idem/stores/rocksdb_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <rocksdb/db.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/store_fixtures.hpp"
#include "support/threads.hpp"

extern char** environ;

namespace {

using namespace std::chrono_literals;
using idem::errc;
using idem::record_state;
using idem_test::row_fields;

constexpr std::uint64_t F1 = (std::uint64_t{1} << 32) | 1;
constexpr std::int64_t T0 = 1'700'000'000'000;
constexpr int keys_per_batch = 16;

std::string batch_key(std::uint64_t batch, int j) { return "b" + std::to_string(batch) + "_" + std::to_string(j); }

std::vector<idem::store_row> batch_rows(std::uint64_t batch) {
    std::vector<idem::store_row> rows;
    for (int j = 0; j < keys_per_batch; ++j)
        rows.push_back(idem_test::row({.key = batch_key(batch, j), .fence = F1 + batch, .at_ms = T0}, rows.size() + 1));
    idem_test::sort_like_flusher(rows);
    return rows;
}

void say(const std::string& line) {
    const std::string l = line + "\n";
    if (::write(100, l.data(), l.size()) != static_cast<ssize_t>(l.size())) std::_Exit(4);
}

int child_main(std::string spec) {
    const auto colon = spec.find(':');
    const std::string mode = spec.substr(0, colon), path = spec.substr(colon + 1);
    try {
        idem::rocksdb_store st(path, true);
        if (mode == "hold") {
            say("R");
            ::pause();
            return 0;
        }
        for (std::uint64_t b = 1;; ++b) {
            st.apply(batch_rows(b), b);
            say("A " + std::to_string(b));
        }
    } catch (const std::exception& e) {
        say(std::string("E ") + e.what());
        return 3;
    }
}

// Before main(): a re-executed child does its part and never reaches GoogleTest.
[[maybe_unused]] const bool child_hook = [] {
    if (const char* spec = std::getenv("IDEM_ROCKSDB_CHILD")) std::_Exit(child_main(spec));
    return false;
}();

/// This binary re-executed as a child (MODE:PATH); SIGKILLed and reaped at scope exit.
class child {
public:
    explicit child(const std::string& spec) {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
        read_fd_ = p[0];
        std::vector<std::string> env{"IDEM_ROCKSDB_CHILD=" + spec};
        for (char** e = environ; *e; ++e)
            if (std::strncmp(*e, "IDEM_ROCKSDB_CHILD=", 19) != 0) env.emplace_back(*e);
        std::vector<char*> envp;
        for (auto& e : env) envp.push_back(e.data());
        envp.push_back(nullptr);
        char exe[] = "/proc/self/exe";
        char none[] = "--gtest_filter=-*";
        char* argv[] = {exe, none, nullptr};
        pid_ = ::fork();
        if (pid_ == 0) {
            ::dup2(p[1], 100);
            ::execve(exe, argv, envp.data());
            std::_Exit(127);
        }
        ::close(p[1]);
    }
    ~child() {
        kill();
        ::close(read_fd_);
    }
    /// The next line from the child, or "" at EOF or after 60 s.
    std::string line() {
        std::size_t nl;
        while ((nl = buf_.find('\n')) == std::string::npos) {
            pollfd pfd{read_fd_, POLLIN, 0};
            if (::poll(&pfd, 1, 60'000) <= 0) return "";
            char b[4096];
            const ssize_t n = ::read(read_fd_, b, sizeof b);
            if (n <= 0) return "";
            buf_.append(b, static_cast<std::size_t>(n));
        }
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
    }
    void kill() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGKILL);
        int status;
        ::waitpid(pid_, &status, 0);
        pid_ = 0;
    }

private:
    pid_t pid_ = -1;
    int read_fd_ = -1;
    std::string buf_;
};

template <class Fn>
idem::error thrown_by(Fn&& fn) {
    try {
        fn();
    } catch (const idem::error& e) {
        return e;
    }
    return idem::error(errc::busy, "nothing was thrown");
}

std::string raw_put(const std::string& path, const std::string& k, const std::string& v) {
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(rocksdb::Options(), path, &db);
    if (s.ok()) s = db->Put(rocksdb::WriteOptions(), k, v);
    delete db;
    return s.ok() ? "" : s.ToString();
}

class RocksdbStore : public ::testing::Test {
protected:
    idem_test::temp_dir dir_{"idem-rocksdb"};
    std::string path_ = dir_.file("db");
};

// Every batch the child saw acknowledged (apply() returned in sync mode) before SIGKILL is there
// after a reopen, whole; committed(id) answers exactly: true iff the batch's rows are there.
TEST_F(RocksdbStore, SyncBatchesAcknowledgedBeforeSigkillSurviveAndCommittedIsExact) {
    const std::uint64_t seed = idem_test::test_seed();
    std::mt19937_64 rng(seed);
    for (int cycle = 0; cycle < 3; ++cycle) {
        SCOPED_TRACE("cycle " + std::to_string(cycle) + ", seed " + std::to_string(seed));
        std::filesystem::remove_all(path_);
        std::uint64_t acked = 0;
        {
            child c("write:" + path_);
            const std::uint64_t kill_after = 20 + rng() % 200;
            while (acked < kill_after) {
                const std::string l = c.line();
                ASSERT_TRUE(l.starts_with("A ")) << "child: '" << l << "'";
                acked = std::stoull(l.substr(2));
            }
            c.kill();
        }
        idem::rocksdb_store st(path_);
        for (std::uint64_t b = 1; b <= acked + 2; ++b) {
            std::size_t present = 0;
            for (int j = 0; j < keys_per_batch; ++j) present += st.get(batch_key(b, j)).has_value();
            const bool committed = st.committed(b);
            EXPECT_TRUE(present == 0 || present == keys_per_batch) << "batch " << b << " is torn: " << present;
            EXPECT_EQ(committed, present == keys_per_batch) << "batch " << b;
            if (b <= acked) {
                EXPECT_TRUE(committed) << "acknowledged batch " << b << " was lost";
            }
        }
        EXPECT_TRUE(idem_test::verify_clean(st));
    }
}

TEST_F(RocksdbStore, ASecondWriterIsRefusedNamingTheLockFile) {
    {
        child holder("hold:" + path_);
        ASSERT_EQ(holder.line(), "R");
        const auto e = thrown_by([&] { idem::rocksdb_store st(path_); });
        EXPECT_EQ(e.kind(), errc::store_unavailable) << e.what();
        EXPECT_NE(std::string(e.what()).find("another process holds " + path_ + "/LOCK"), std::string::npos) << e.what();
        EXPECT_TRUE(std::string(e.what()).starts_with("rocksdb:" + path_ + ": ")) << e.what();
    }
    idem::rocksdb_store first(path_);  // the holder is gone: the lock went with it
    const auto e = thrown_by([&] { idem::rocksdb_store second(path_); });
    EXPECT_EQ(e.kind(), errc::store_unavailable) << "a second store in the same process: " << e.what();
}

TEST_F(RocksdbStore, DamagedValuesAreCorruptRecordNamingTheKey) {
    namespace codec = idem::detail::rocks;
    {
        idem::rocksdb_store st(path_);
        std::vector<idem::store_row> rows{idem_test::row({.key = "good_key", .fence = F1, .at_ms = T0}, 1)};
        st.apply(rows, 1);
    }
    idem::stored_record done;
    done.state = record_state::succeeded;
    done.fence = F1;
    std::string truncated = codec::encode_record(done);
    truncated.pop_back();
    ASSERT_EQ(raw_put(path_, codec::record_key("cut_key"), truncated), "");
    ASSERT_EQ(raw_put(path_, codec::audit_key("good_key", 99), std::string("\x01\x01", 2)), "");
    idem::rocksdb_store st(path_);
    auto e = thrown_by([&] { (void)st.get("cut_key"); });
    EXPECT_EQ(e.kind(), errc::corrupt_record) << e.what();
    EXPECT_NE(std::string(e.what()).find("record 'cut_key'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("updated_time"), std::string::npos) << "names the field: " << e.what();
    e = thrown_by([&] { st.load([](const idem::stored_record&) {}); });
    EXPECT_EQ(e.kind(), errc::corrupt_record) << e.what();
    e = thrown_by([&] { (void)st.audit("good_key"); });
    EXPECT_EQ(e.kind(), errc::corrupt_record) << e.what();
    EXPECT_NE(std::string(e.what()).find("audit row 99 (key 'good_key')"), std::string::npos) << e.what();
    ASSERT_TRUE(st.get("good_key").has_value());
}

// A database written before payloads holds version 1 record values: they read with an empty
// payload, a later batch stores a payload over one (version 2), and both survive a reopen and a
// compaction (whose filter decodes every record).
TEST_F(RocksdbStore, ARecordValueFromBeforePayloadsReadsAndTakesAPayloadLater) {
    namespace codec = idem::detail::rocks;
    {
        idem::rocksdb_store st(path_);  // the schema and counters of a current database
    }
    std::string old_value(1, '\x01');  // version 1, as that release encoded a claim in flight
    old_value.push_back(static_cast<char>(record_state::processing));
    codec::put_varint(old_value, F1);
    codec::put_signed(old_value, T0 + 1000);  // lease_until
    codec::put_varint(old_value, 0);          // outcome
    codec::put_varint(old_value, 77);         // fingerprint
    codec::put_signed(old_value, T0);         // created
    codec::put_signed(old_value, T0);         // updated
    ASSERT_EQ(raw_put(path_, codec::record_key("OLD_PAY_v1"), old_value), "");
    const std::string bytes("\0\xff\xc3\x28", 4);
    {
        idem::rocksdb_options o;
        o.window = std::chrono::hours(24 * 365 * 50);  // installs the compaction filter; expires nothing
        idem::rocksdb_store st(path_, o);
        const auto before = st.get("OLD_PAY_v1");
        ASSERT_TRUE(before);
        EXPECT_EQ(before->fingerprint, 77u);
        EXPECT_EQ(before->payload, "");
        idem::store_row done = idem_test::row({.key = "OLD_PAY_v1",
                                               .from = record_state::processing,
                                               .to = record_state::succeeded,
                                               .cause = idem::transition_cause::succeed,
                                               .fence = F1,
                                               .outcome = 9,
                                               .at_ms = T0 + 1},
                                              1);
        done.t.payload = bytes;
        st.apply(std::vector{done}, 1);
        st.compact();
    }
    idem::rocksdb_store st(path_);
    const auto after = st.get("OLD_PAY_v1");
    ASSERT_TRUE(after);
    EXPECT_EQ(after->state, record_state::succeeded);
    EXPECT_EQ(after->fingerprint, 77u);
    EXPECT_TRUE(after->payload == bytes);
}

TEST_F(RocksdbStore, ConfigurationFaultsAreInvalidArgumentNamingPathAndRule) {
    const std::string file = dir_.file("plain");
    std::ofstream(file) << "x";
    struct fault {
        std::string path, rule;
    };
    std::vector<fault> faults{{file, "the path is a regular file"},
                              {dir_.file("no/such/db"), "does not exist"},
                              {file + "/db", "is not a directory"}};
    const std::string locked = dir_.file("ro");
    std::filesystem::create_directory(locked);
    ::chmod(locked.c_str(), 0500);
    if (::geteuid() != 0) faults.push_back({locked + "/db", "no permission"});  // root may write anyway
    for (const auto& f : faults) {
        const auto e = thrown_by([&] { idem::rocksdb_store st(f.path); });
        EXPECT_EQ(e.kind(), errc::invalid_argument) << e.what();
        EXPECT_TRUE(std::string(e.what()).starts_with("rocksdb:" + f.path + ": ")) << e.what();
        EXPECT_NE(std::string(e.what()).find(f.rule), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir_.file("no"))) << "a missing parent was created";
    const auto e = thrown_by([&] { idem::rocksdb_store st(path_, idem::rocksdb_options{.window = -1ms}); });
    EXPECT_EQ(e.kind(), errc::invalid_argument) << e.what();
}

// Once the directory is removed (or replaced), nothing is acknowledged and a reconnect refuses
// instead of creating a new, empty database in which every recorded key would run again.
TEST_F(RocksdbStore, ReconnectNeverCreatesANewDatabaseWhereOneWas) {
    idem::rocksdb_store st(path_);
    st.apply(batch_rows(1), 1);
    std::filesystem::remove_all(path_);
    auto e = thrown_by([&] { st.apply(batch_rows(2), 2); });
    EXPECT_EQ(e.kind(), errc::store_error) << e.what();
    e = thrown_by([&] { st.reconnect(); });
    EXPECT_EQ(e.kind(), errc::store_error) << e.what();
    EXPECT_NE(std::string(e.what()).find("refusing to create a new, empty database"), std::string::npos) << e.what();
    EXPECT_FALSE(std::filesystem::exists(path_)) << "reconnect() created the directory again";
    std::filesystem::create_directory(path_);  // an empty directory in its place
    e = thrown_by([&] { st.reconnect(); });
    EXPECT_EQ(e.kind(), errc::store_error) << e.what();
    EXPECT_FALSE(std::filesystem::exists(path_ + "/CURRENT")) << "reconnect() created a database";
}

// prune() deletes exactly the terminal and RELEASED records older than the cut-off; PROCESSING
// records, newer records and every audit row stay. The window's compaction filter does the same.
TEST_F(RocksdbStore, PruneRemovesExactlyTheExpiredFinishedRecords) {
    const std::int64_t old = T0, cut = T0 + 1000, fresh = T0 + 2000;
    auto rows_at = [](std::int64_t at, const std::string& tag) {
        std::vector<row_fields> f{{.key = tag + "_ok",
                                   .to = record_state::succeeded,
                                   .cause = idem::transition_cause::succeed,
                                   .fence = F1,
                                   .at_ms = at},
                                  {.key = tag + "_failed",
                                   .to = record_state::failed,
                                   .cause = idem::transition_cause::fail,
                                   .fence = F1,
                                   .at_ms = at},
                                  {.key = tag + "_released",
                                   .to = record_state::released,
                                   .cause = idem::transition_cause::release,
                                   .fence = F1,
                                   .at_ms = at},
                                  {.key = tag + "_processing", .fence = F1, .at_ms = at, .lease_until_ms = at + 30'000}};
        std::vector<idem::store_row> rows;
        for (auto& x : f) rows.push_back(idem_test::row(x, rows.size() + 1));
        idem_test::sort_like_flusher(rows);
        return rows;
    };
    auto check = [&](idem::rocksdb_store& st, const char* how) {
        SCOPED_TRACE(how);
        for (const char* s : {"_ok", "_failed", "_released"}) {
            EXPECT_FALSE(st.get(std::string("old") + s).has_value()) << "old" << s << " was kept";
            EXPECT_TRUE(st.get(std::string("new") + s).has_value()) << "new" << s << " was pruned";
        }
        EXPECT_TRUE(st.get("old_processing").has_value()) << "a PROCESSING record was pruned";
        EXPECT_TRUE(st.get("new_processing").has_value());
        EXPECT_EQ(idem_test::scan_all(st).size(), 8u) << "audit rows were pruned";
        EXPECT_EQ(st.max_fence(), F1);
    };
    {
        idem::rocksdb_store st(path_);
        st.apply(rows_at(old, "old"), 1);
        st.apply(rows_at(fresh, "new"), 2);
        EXPECT_EQ(st.prune(cut), 3u);
        check(st, "prune()");
        EXPECT_EQ(st.prune(cut), 0u);
    }
    std::filesystem::remove_all(path_);
    // The window ends at now - window: a window reaching back to `cut` from now.
    const auto now =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    idem::rocksdb_store st(path_, idem::rocksdb_options{.window = std::chrono::milliseconds(now - cut)});
    st.apply(rows_at(old, "old"), 1);
    st.apply(rows_at(fresh, "new"), 2);
    EXPECT_TRUE(st.get("old_ok").has_value()) << "expired records stay until compaction";
    st.compact();
    check(st, "compaction filter");
}

// A durable_guard over rocksdb_store keeps its keys across a restart: each is refused as a
// duplicate with its outcome, and nothing runs twice.
TEST_F(RocksdbStore, DurableGuardRefusesItsKeysAsDuplicatesAfterARestart) {
    constexpr int n = 200;
    for (auto mode : {idem::durability::sync, idem::durability::async}) {
        std::filesystem::remove_all(path_);
        idem::store_options so;
        so.mode = mode;
        {
            auto st = std::make_unique<idem::rocksdb_store>(path_, mode == idem::durability::sync);
            idem::durable_guard g(std::move(st), idem_test::durable_options(), so);
            for (int i = 0; i < n; ++i) {
                auto r = g.guard().begin(idem::key("TX" + std::to_string(i) + "_PAY_v1"));
                ASSERT_EQ(r.status, idem::begin_status::acquired);
                ASSERT_FALSE(r.ticket.succeed(static_cast<std::uint64_t>(i) + 1000));
            }
            ASSERT_TRUE(g.flush(30s)) << g.last_store_error();
        }
        idem::durable_guard g(std::make_unique<idem::rocksdb_store>(path_), idem_test::durable_options(), so);
        for (int i = 0; i < n; ++i) {
            const auto r = g.guard().begin(idem::key("TX" + std::to_string(i) + "_PAY_v1"));
            EXPECT_EQ(r.status, idem::begin_status::succeeded) << i;
            EXPECT_EQ(r.outcome, static_cast<std::uint64_t>(i) + 1000) << i;
        }
    }
}

}  // namespace
