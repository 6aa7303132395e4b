// tests/support/store_fixtures.hpp: what the store and durability tests share.
//
// * temp_dir: a fresh directory under /tmp (mkdtemp), removed with its contents at scope exit.
// * tmpfs_mount: a size-limited tmpfs mounted on a temp_dir (disk-full tests), unmounted at exit.
// * set_immutable(): the ext4 immutable flag (chattr +i), the one way to make a file unwritable for
//   root, whose writes then fail with EPERM (SQLite: SQLITE_IOERR_WRITE, or SQLITE_READONLY on open).
// * faulty_store: forwards to a store the test owns and injects failures on demand (outage,
//   commit_unknown after or before the commit, committed() failing); thread-safe switches, and a
//   mutex-protected copy of what the inner store acknowledged, so a test thread can ask what is
//   durable while the flusher runs.
// * open_wrapped(): a durable guard over a store wrapper it owns, the wrapper steered by the test.
// * forwarding_store: forwards every call to a store the test owns; the base of wrappers that
//   change one thing. gated_store holds every apply() at a commit_gate the test closes and opens
//   (a commit that takes as long as the test wants; gate_opener opens it at scope exit);
//   poisoned_store refuses with idem::rejected_row every batch holding one key.
// * row(): a store_row from readable fields; hostile_keys(): keys that break naive SQL or encodings.
// * batch_model: seeded batches that follow the state machine as the engine produces it (fences
//   increase per key in seq order, completions carry the claim's fence), sorted like the flusher's.
// * abandon(): leaves a ticket uncompleted forever, as a crashed owner would.
// * wait_for(): polls a condition until a deadline (conditions, never fixed sleeps).
#pragma once

#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <ostream>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <unistd.h>


namespace idem {

inline void PrintTo(durability m, std::ostream* os) { *os << (m == durability::sync ? "sync" : "async"); }
inline void PrintTo(const stored_record& r, std::ostream* os) {
    *os << "{key '" << key::printable(r.key) << "' biz " << r.biz_type << ' ' << to_string(r.state) << " fence " << r.fence
        << " lease_until " << r.lease_until_ms << " outcome " << r.outcome << " fp " << r.fingerprint << " created "
        << r.created_ms << " updated " << r.updated_ms << '}';
}
inline void PrintTo(const audit_entry& a, std::ostream* os) {
    *os << "{#" << a.sequence << " '" << key::printable(a.key) << "' " << to_string(a.from) << "->" << to_string(a.to)
        << " fence " << a.fence << " node " << a.node << " at " << a.at_ms << " '" << a.detail << "'}";
}

}  // namespace idem

namespace idem_test {

using namespace std::chrono_literals;

// ---- files and mounts --------------------------------------------------------------------------

/// Clears the immutable flag of every file under `dir` (so it can be removed).
inline void clear_immutable_under(const std::filesystem::path& dir);

/// A fresh directory under /tmp, removed with its contents at scope exit.
class temp_dir {
public:
    explicit temp_dir(const char* tag = "idem") {
        std::string pattern = std::string("/tmp/") + tag + ".XXXXXX";
        if (::mkdtemp(pattern.data()) == nullptr)
            throw std::runtime_error("mkdtemp(" + pattern + "): " + std::strerror(errno));
        path_ = pattern;
    }
    ~temp_dir() {
        std::error_code ec;
        clear_immutable_under(path_);
        std::filesystem::remove_all(path_, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
    [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    std::filesystem::path path_;
};

/// Sets or clears the immutable attribute (chattr +i / -i). Returns "" or the reason it failed.
inline std::string set_immutable(const std::string& file, bool on) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "open(" + file + "): " + std::strerror(errno);
    int flags = 0;
    std::string why;
    if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) {
        why = "FS_IOC_GETFLAGS(" + file + "): " + std::strerror(errno);
    } else {
        flags = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
        if (::ioctl(fd, FS_IOC_SETFLAGS, &flags) != 0) why = "FS_IOC_SETFLAGS(" + file + "): " + std::strerror(errno);
    }
    ::close(fd);
    return why;
}

inline void clear_immutable_under(const std::filesystem::path& dir) {
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec)) (void)set_immutable(it->path().string(), false);
}

/// A tmpfs of `size` (mount(8) syntax: "1m") mounted on a fresh temp_dir. ok() says whether the
/// mount worked; error() why not. Unmounted (lazily, in case a file is still open) at scope exit.
class tmpfs_mount {
public:
    explicit tmpfs_mount(const std::string& size) : dir_("idem-tmpfs") {
        const std::string opts = "size=" + size + ",mode=0700";
        if (::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, opts.c_str()) != 0)
            error_ = "mount -t tmpfs -o " + opts + " tmpfs " + dir_.path().string() + ": " + std::strerror(errno);
        else mounted_ = true;
    }
    ~tmpfs_mount() {
        if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
    }
    tmpfs_mount(const tmpfs_mount&) = delete;
    tmpfs_mount& operator=(const tmpfs_mount&) = delete;

    [[nodiscard]] bool ok() const noexcept { return mounted_; }
    [[nodiscard]] const std::string& error() const noexcept { return error_; }
    [[nodiscard]] std::string file(const std::string& name) const { return dir_.file(name); }
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return dir_.path(); }

    /// mount -o remount,size=<size>. Returns "" or the reason it failed.
    std::string resize(const std::string& size) {
        const std::string opts = "size=" + size + ",mode=0700";
        if (::mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_REMOUNT, opts.c_str()) != 0)
            return "mount -o remount," + opts + " " + dir_.path().string() + ": " + std::strerror(errno);
        return {};
    }

private:
    temp_dir dir_;
    bool mounted_ = false;
    std::string error_;
};

/// Runs `sql` on the SQLite file `db` through a connection of its own (damage, an old layout, or a
/// change a store must then find), failing the test with SQLite's message when it is refused.
inline void sqlite_exec(const std::string& db, const std::string& sql) {
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(h, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << sql << ": " << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close(h);
}

// ---- rows --------------------------------------------------------------------------------------

struct row_fields {
    std::string key;
    idem::record_state from = idem::record_state::absent;
    idem::record_state to = idem::record_state::processing;
    idem::transition_cause cause = idem::transition_cause::claim;
    std::uint64_t fence = 1;
    std::uint64_t outcome = 0;
    std::uint64_t fingerprint = 0;
    std::int64_t at_ms = 1'700'000'000'000;
    std::int64_t lease_until_ms = 0;
};

inline idem::store_row row(const row_fields& f, std::uint64_t seq) {
    idem::store_row r;
    r.t.k = idem::key(f.key);
    r.t.from = f.from;
    r.t.to = f.to;
    r.t.cause = f.cause;
    r.t.fence = f.fence;
    r.t.outcome = f.outcome;
    r.t.fingerprint = f.fingerprint;
    r.seq = seq;
    r.at_ms = f.at_ms;
    r.lease_until_ms = f.lease_until_ms;
    return r;
}

/// Sorts rows as the flusher does: by key bytes, then seq.
inline void sort_like_flusher(std::vector<idem::store_row>& rows) {
    std::sort(rows.begin(), rows.end(), [](const idem::store_row& a, const idem::store_row& b) {
        const auto ka = a.t.k.view(), kb = b.t.k.view();
        return ka != kb ? ka < kb : a.seq < b.seq;
    });
}

/// Keys that break string-built SQL, naive encodings or signed-char comparisons. All valid keys.
inline std::vector<std::string> hostile_keys() {
    std::vector<std::string> keys = {
        "'",
        "''",
        "\"",
        ";",
        "--",
        "'); DROP TABLE idempotent_record; --",
        "x'; DELETE FROM idempotent_audit WHERE '1'='1",
        "%_\\*?[]{}$1:name@param",
        "TX1_TRANSFER_v2",
        "\xe6\x94\xaf\xe4\xbb\x98_\xe8\xbd\xac\xe8\xb4\xa6_v1",  // 支付_转账_v1
        "\xf0\x9f\x92\xb8 emoji",
    };
    // Long UTF-8: 42 three-byte characters (126 bytes), then a 2-byte one: 128 bytes exactly.
    std::string long_utf8;
    for (int i = 0; i < 42; ++i) long_utf8 += "\xe2\x82\xac";  // €
    long_utf8 += "\xc3\xa9";                                   // é
    keys.push_back(long_utf8);
    keys.push_back(std::string(128, 'k'));
    // Every byte 0x80..0xff (not valid UTF-8), in two keys of 64 bytes.
    std::string high1, high2;
    for (int b = 0x80; b < 0xc0; ++b) high1 += static_cast<char>(b);
    for (int b = 0xc0; b <= 0xff; ++b) high2 += static_cast<char>(b);
    keys.push_back(high1);
    keys.push_back(high2);
    keys.push_back("\xff");
    keys.push_back("a\x80z");
    return keys;
}

/// True when `s` is valid UTF-8 (what a PostgreSQL text column can hold).
inline bool valid_utf8(std::string_view s) {
    std::size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (std::size_t j = 1; j < n; ++j)
            if ((static_cast<unsigned char>(s[i + j]) & 0xc0) != 0x80) return false;
        i += n;
    }
    return true;
}

/// Seeded batches that follow the state machine as the engine produces it.
class batch_model {
public:
    explicit batch_model(std::uint64_t seed, std::vector<std::string> extra_keys = {}) : rng_(seed) {
        for (auto& k : extra_keys) pool_.push_back(std::move(k));
    }

    /// A batch touching about `keys` keys with 1..3 transitions each, sorted like the flusher's.
    std::vector<idem::store_row> next(std::size_t keys) {
        std::vector<idem::store_row> rows;
        std::set<std::string> used;
        for (std::size_t i = 0; i < keys; ++i) {
            const std::string k = pick();
            if (!used.insert(k).second) continue;
            const int steps = 1 + static_cast<int>(rng_() % 3);
            for (int s = 0; s < steps; ++s)
                if (!step(k, rows)) break;
        }
        sort_like_flusher(rows);
        return rows;
    }

    [[nodiscard]] std::uint64_t next_batch_id() { return ++batch_id_ * 7919; }

private:
    struct state {
        idem::record_state st = idem::record_state::absent;
        std::uint64_t fence = 0;
        std::uint64_t fp = 0;
    };

    std::string pick() {
        if (!pool_.empty() && rng_() % 4 == 0) return pool_[rng_() % pool_.size()];
        if (!made_.empty() && rng_() % 2 == 0) return made_[rng_() % made_.size()];
        std::string k = "TX" + std::to_string(rng_() % 1'000'000) + "_" + ops_[rng_() % 3] + "_v" +
                        std::to_string(1 + rng_() % 3);
        made_.push_back(k);
        return k;
    }

    /// Appends the key's next legal transition; false when the key is terminal.
    bool step(const std::string& k, std::vector<idem::store_row>& rows) {
        state& s = states_[k];
        using idem::record_state;
        using idem::transition_cause;
        row_fields f;
        f.key = k;
        f.from = s.st;
        now_ms_ += 1 + static_cast<std::int64_t>(rng_() % 5);
        f.at_ms = now_ms_;
        switch (s.st) {
            case record_state::absent:
            case record_state::released:
                f.to = record_state::processing;
                f.cause = transition_cause::claim;
                f.fence = s.st == record_state::absent ? ((1 + rng_() % 3) << 32) + 1 : s.fence + 1;
                f.fingerprint = rng_() % 3 == 0 ? 0 : rng_() | 1;
                f.lease_until_ms = now_ms_ + 30'000;
                s.fp = f.fingerprint;
                break;
            case record_state::processing: {
                const auto r = rng_() % 10;
                f.fingerprint = s.fp;
                f.fence = s.fence;
                if (r < 4) {
                    f.to = record_state::succeeded;
                    f.cause = transition_cause::succeed;
                    f.outcome = rng_() % 4 == 0 ? 0 : rng_() >> 1;  // falsy outcomes too (a classic replay bug)
                } else if (r < 6) {
                    f.to = record_state::failed;
                    f.cause = transition_cause::fail;
                    f.outcome = rng_() % 100;
                } else if (r < 8) {
                    f.to = record_state::released;
                    f.cause = transition_cause::release;
                    f.outcome = rng_() % 100;
                } else if (r < 9) {
                    f.to = record_state::processing;  // doubt mark: same fence, lease cleared
                    f.cause = transition_cause::doubt;
                    f.lease_until_ms = -5000;
                } else {
                    f.to = record_state::processing;  // reclaim: higher fence, new lease and payload
                    f.cause = transition_cause::reclaim;
                    f.fence = s.fence + 1;
                    f.fingerprint = rng_() | 1;
                    f.lease_until_ms = now_ms_ + 30'000;
                    s.fp = f.fingerprint;
                }
                break;
            }
            default: return false;
        }
        s.st = f.to;
        s.fence = f.fence;
        rows.push_back(row(f, ++seq_));
        return true;
    }

    std::mt19937_64 rng_;
    std::vector<std::string> pool_;
    std::vector<std::string> made_;
    std::map<std::string, state> states_;
    std::uint64_t seq_ = 0;
    std::uint64_t batch_id_ = 0;
    std::int64_t now_ms_ = 1'700'000'000'000;
    const char* ops_[3] = {"TRANSFER", "REFUND", "PAYOUT"};
};

// ---- stores ------------------------------------------------------------------------------------

/// Forwards to a store the test owns (so the test can read it after the durable guard is gone) and
/// injects failures. Every switch is atomic: tests flip them while the flusher runs. acked()
/// answers what the inner store acknowledged (the last committed row of a key) under a mutex.
class faulty_store final : public idem::store {
public:
    explicit faulty_store(idem::store& inner) : inner_(inner) { node_ = inner.node(); }

    std::atomic<bool> down{false};              ///< every apply/committed throws store_unavailable
    std::atomic<int> fail_applies{0};           ///< the next n applies throw store_unavailable
    std::atomic<int> unknown_after_commit{0};   ///< the next n applies commit, then throw commit_unknown
    std::atomic<int> unknown_before_commit{0};  ///< the next n applies throw commit_unknown, not committed
    std::atomic<int> fail_committed{0};         ///< the next n committed() calls throw store_unavailable
    std::atomic<int> applies{0};                ///< apply calls that reached the inner store and committed
    std::atomic<int> committed_calls{0};

    void apply(std::span<const idem::store_row> rows, std::uint64_t batch_id) override {
        if (down.load() || take(fail_applies))
            throw idem::error(idem::errc::store_unavailable, "faulty store: injected outage");
        if (take(unknown_before_commit)) throw idem::commit_unknown("faulty store: connection lost during COMMIT");
        inner_.apply(rows, batch_id);
        ++applies;
        {
            std::lock_guard lock(mutex_);
            for (const auto& r : rows) {
                auto& a = acked_[std::string(r.t.k.view())];
                if (a.fence <= r.t.fence) a = {r.t.to, r.t.fence, r.t.outcome};
            }
        }
        if (take(unknown_after_commit)) throw idem::commit_unknown("faulty store: connection lost after COMMIT");
    }
    bool committed(std::uint64_t batch_id) override {
        ++committed_calls;
        if (down.load() || take(fail_committed))
            throw idem::error(idem::errc::store_unavailable, "faulty store: injected outage (committed)");
        return inner_.committed(batch_id);
    }
    void load(const std::function<void(const idem::stored_record&)>& fn) override { inner_.load(fn); }
    std::optional<idem::stored_record> get(std::string_view key) override { return inner_.get(key); }
    void load_claims(const std::function<void(const idem::stored_record&)>& fn) override { inner_.load_claims(fn); }
    void load_window_keys(std::int64_t since_ms, const std::function<void(std::string_view, std::int64_t)>& fn) override {
        inner_.load_window_keys(since_ms, fn);
    }
    std::vector<idem::audit_entry> audit(std::string_view key) override { return inner_.audit(key); }
    void scan_audit(const std::function<void(const idem::audit_entry&)>& fn) override { inner_.scan_audit(fn); }
    void snapshot_read(const std::function<void()>& fn) override { inner_.snapshot_read(fn); }
    void check_sync_durability() override { inner_.check_sync_durability(); }
    void reconnect() override { inner_.reconnect(); }
    std::string name() const override { return "faulty(" + inner_.name() + ")"; }
    std::uint64_t max_fence() override { return inner_.max_fence(); }

    struct acked_row {
        idem::record_state state = idem::record_state::absent;
        std::uint64_t fence = 0;
        std::uint64_t outcome = 0;
    };
    /// The last row of `key` the inner store committed (absent when none). Thread-safe.
    [[nodiscard]] acked_row acked(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = acked_.find(std::string(key));
        return it == acked_.end() ? acked_row{} : it->second;
    }

private:
    static bool take(std::atomic<int>& n) {
        int v = n.load();
        while (v > 0)
            if (n.compare_exchange_weak(v, v - 1)) return true;
        return false;
    }

    idem::store& inner_;
    mutable std::mutex mutex_;
    std::map<std::string, acked_row> acked_;
};

/// Forwards every call to a store the test owns (so the test can read it after the durable guard
/// is gone). The base of wrappers that change one thing, such as gated_store and poisoned_store.
class forwarding_store : public idem::store {
public:
    explicit forwarding_store(idem::store& inner) : inner_(inner) { node_ = inner.node(); }

    void apply(std::span<const idem::store_row> rows, std::uint64_t batch_id) override { inner_.apply(rows, batch_id); }
    bool committed(std::uint64_t batch_id) override { return inner_.committed(batch_id); }
    void load(const std::function<void(const idem::stored_record&)>& fn) override { inner_.load(fn); }
    std::optional<idem::stored_record> get(std::string_view key) override { return inner_.get(key); }
    std::vector<idem::audit_entry> audit(std::string_view key) override { return inner_.audit(key); }
    void scan_audit(const std::function<void(const idem::audit_entry&)>& fn) override { inner_.scan_audit(fn); }
    void snapshot_read(const std::function<void()>& fn) override { inner_.snapshot_read(fn); }
    void check_sync_durability() override { inner_.check_sync_durability(); }
    bool accepts(const idem::key& k, std::string* why) const noexcept override { return inner_.accepts(k, why); }
    void reconnect() override { inner_.reconnect(); }
    idem::prune_result prune(const idem::prune_limits& l) override { return inner_.prune(l); }
    idem::prune_horizon horizon() override { return inner_.horizon(); }
    std::string name() const override { return "forwarding(" + inner_.name() + ")"; }
    std::uint64_t max_fence() override { return inner_.max_fence(); }

protected:
    idem::store& inner_;
};

/// A gate a test closes and opens to hold commits back (see gated_store). The test owns it and
/// declares it before the durable guard, so it outlives the guard's flusher.
class commit_gate {
public:
    void close() {
        std::lock_guard lock(mutex_);
        open_ = false;
    }
    void open() {
        {
            std::lock_guard lock(mutex_);
            open_ = true;
        }
        cv_.notify_all();
    }
    /// Callers waiting at the closed gate now. Thread-safe.
    [[nodiscard]] int waiting() const {
        std::lock_guard lock(mutex_);
        return waiting_;
    }
    /// Returns at once while the gate is open, else when it opens.
    void pass() {
        std::unique_lock lock(mutex_);
        ++waiting_;
        cv_.wait(lock, [this] { return open_; });
        --waiting_;
    }

private:
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    bool open_ = true;
    int waiting_ = 0;
};

/// Forwards to a store the test owns and holds every commit at a commit_gate: while the gate is
/// closed, apply() waits inside the store call (its rows neither committed nor failed, as behind a
/// slow disk or a long lock wait). The gate must be open when the durable guard is destroyed (its
/// flusher finishes the call it is in first): declare a gate_opener right after the guard.
class gated_store final : public forwarding_store {
public:
    gated_store(idem::store& inner, commit_gate& gate) : forwarding_store(inner), gate_(gate) {}

    void apply(std::span<const idem::store_row> rows, std::uint64_t batch_id) override {
        gate_.pass();
        inner_.apply(rows, batch_id);
    }
    std::string name() const override { return "gated(" + inner_.name() + ")"; }

private:
    commit_gate& gate_;
};

/// Opens a commit_gate when it goes out of scope (also when an assertion returns early), so the
/// durable guard destroyed after it can stop its flusher.
class gate_opener {
public:
    explicit gate_opener(commit_gate& gate) : gate_(gate) {}
    gate_opener(const gate_opener&) = delete;
    gate_opener& operator=(const gate_opener&) = delete;
    ~gate_opener() { gate_.open(); }

private:
    commit_gate& gate_;
};

/// Forwards to a store the test owns, but refuses with idem::rejected_row every batch that holds a
/// row of one key (as PostgreSQL refuses a value its types or constraints can never take); batches
/// without it commit. The message does not name the key: naming it is the flusher's job.
class poisoned_store final : public forwarding_store {
public:
    poisoned_store(idem::store& inner, std::string poison) : forwarding_store(inner), poison_(std::move(poison)) {}

    std::atomic<int> refused{0};  ///< apply calls refused because the batch held the poisoned key
    std::atomic<int> applies{0};  ///< apply calls that committed

    void apply(std::span<const idem::store_row> rows, std::uint64_t batch_id) override {
        for (const auto& r : rows) {
            if (r.t.k.view() == poison_) {
                ++refused;
                throw idem::rejected_row("poisoned store: the batch holds a value this store can never take");
            }
        }
        inner_.apply(rows, batch_id);
        ++applies;
    }
    std::string name() const override { return "poisoned(" + inner_.name() + ")"; }

private:
    std::string poison_;
};

/// Every record of a store, by key.
inline std::map<std::string, idem::stored_record> load_all(idem::store& st) {
    std::map<std::string, idem::stored_record> out;
    st.load([&](const idem::stored_record& r) { out.emplace(r.key, r); });
    return out;
}

/// Every audit row of a store, in scan order.
inline std::vector<idem::audit_entry> scan_all(idem::store& st) {
    std::vector<idem::audit_entry> out;
    st.scan_audit([&](const idem::audit_entry& a) { out.push_back(a); });
    return out;
}

/// idem::verify, with the violations (at most 10) in the failure message.
inline ::testing::AssertionResult verify_clean(idem::store& st) {
    const idem::verify_report r = idem::verify(st);
    if (r.violations.empty()) return ::testing::AssertionSuccess() << r.keys << " keys";
    auto out = ::testing::AssertionFailure();
    out << r.violations.size() << " violation(s) in " << r.keys << " keys:";
    for (std::size_t i = 0; i < r.violations.size() && i < 10; ++i) out << "\n  " << r.violations[i];
    return out;
}

// ---- guards ------------------------------------------------------------------------------------

/// Leaves a ticket uncompleted forever (its destructor never runs), as a crashed owner would.
template <class Ticket>
void abandon(Ticket&& t) {
    struct alignas(Ticket) cell {
        unsigned char bytes[sizeof(Ticket)];
    };
    static std::deque<cell> graveyard;  // cells are trivially destructible: no ticket is ever released
    static std::mutex m;
    std::lock_guard lock(m);
    new (graveyard.emplace_back().bytes) Ticket(std::move(t));
}

/// Polls `pred` until it holds or `timeout` passes; returns its last value.
template <class Pred>
bool wait_for(Pred pred, std::chrono::nanoseconds timeout = 20s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::chrono::microseconds pause{50};
    for (;;) {
        if (pred()) return true;
        if (std::chrono::steady_clock::now() >= deadline) return pred();
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, 5ms);
    }
}

/// A writer thread for "reads during a write load" tests: it claims and succeeds new keys
/// `<prefix><i>_PAY_v1`, but only as many as it has been allowed (`allow`), so a slow reader on a
/// loaded machine never lets it fill the table and stop producing batches. The destructor stops
/// and joins it, so a failed assertion never leaves a joinable thread.
template <class Guard>
class paced_writer {
public:
    paced_writer(Guard& g, std::string prefix)
        : thread_([this, &g, prefix = std::move(prefix)] {
              for (std::size_t i = 0;; ++i) {
                  for (std::size_t b = budget_.load(); i >= b; b = budget_.load()) {
                      if (stop_.load()) return;
                      budget_.wait(b);
                  }
                  if (stop_.load()) return;
                  auto r = g->begin(idem::key(prefix + std::to_string(i) + "_PAY_v1"));
                  if (r.status == idem::begin_status::acquired) (void)r.ticket.succeed(i);
                  written_.store(i + 1);
              }
          }) {}
    paced_writer(const paced_writer&) = delete;
    paced_writer& operator=(const paced_writer&) = delete;
    ~paced_writer() { stop(); }

    /// Lets the writer begin `n` more keys.
    void allow(std::size_t n) {
        budget_.fetch_add(n);
        budget_.notify_all();
    }
    /// Keys begun so far.
    std::size_t written() const { return written_.load(); }
    void stop() {
        stop_.store(true);
        budget_.fetch_add(1);
        budget_.notify_all();
        if (thread_.joinable()) thread_.join();
    }

private:
    std::atomic<std::size_t> budget_{0};
    std::atomic<std::size_t> written_{0};
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

/// Waits until the wall clock passes `ms` (Unix milliseconds): stored leases are wall-clock times.
inline bool wait_wall_past(std::int64_t ms, std::chrono::nanoseconds timeout = 20s) {
    return wait_for(
        [ms] {
            return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                       .count() > ms;
        },
        timeout);
}

/// Guard options for durability tests: no maintenance thread (the tests call compensate()).
inline idem::options durable_options(std::size_t capacity = 4096) {
    idem::options o;
    o.capacity = capacity;
    o.maintenance_interval = {};
    return o;
}

/// A durable guard over a store wrapper W (faulty_store, gated_store, ...) that the guard owns,
/// built from args; *wrapper receives its address so the test can steer it.
template <class W, class... Args>
std::unique_ptr<idem::durable_guard> open_wrapped(W** wrapper, idem::durability mode, idem::options o,
                                                  idem::store_options so, Args&&... args) {
    so.mode = mode;
    auto w = std::make_unique<W>(std::forward<Args>(args)...);
    *wrapper = w.get();
    return std::make_unique<idem::durable_guard>(std::move(w), std::move(o), so);
}

}  // namespace idem_test
