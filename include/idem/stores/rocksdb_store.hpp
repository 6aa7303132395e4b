// idem/rocksdb_store.hpp: an LSM store (target idem::rocksdb; links librocksdb).
//
// Why. With random-order keys (client UUIDs) a B-tree store dirties about one page per row per index
// per commit; an LSM tree appends each batch to its write-ahead log and memtable and sorts later, in
// the background, so its cost per row hardly depends on the key order.
//
// Layout (detail/rocks/codec.hpp): one key space, told apart by a one-byte prefix: 'r' records,
// 'a' audit rows keyed KEY 0x00 SEQUENCE (so they sort by key, then sequence), 'b' batch markers,
// 'm' metadata (schema version, next audit sequence, largest fence written). Values are versioned
// binary; one that does not decode is corrupt_record naming the key and the field.
//
// A batch is one rocksdb::WriteBatch: its audit rows, the records it changes, its batch marker and
// the two counters, written atomically, in ascending key order (so each memtable insert starts
// from the previous one). The records it may change are read first with one MultiGet
// (the flusher is the only writer, so nothing changes between that read and the write), and folded
// as every store folds (detail/rows/batch_fold.hpp): rows in seq order, a row below the record's fence
// skipped, lease and fingerprint from PROCESSING rows only, created_time from the first insert, and
// at the same fence a record that was terminal before the batch is never taken back to PROCESSING
// or RELEASED.
//
// Durability. rocksdb_options::sync: WriteOptions::sync, one fsync of the log per batch (a commit
// survives power loss); off: the log is written to the OS at each batch but not synced (a commit
// survives a process crash; the last commits may be lost on power loss, which async mode allows).
// With rocksdb_options::wal off, nothing survives a crash until the memtable is flushed: refused by
// check_sync_durability().
//
// One writer. RocksDB locks PATH/LOCK (fcntl) for as long as a DB is open: a second store on the
// directory, in this or another process, is refused at open with store_unavailable ("another
// process holds PATH/LOCK ..."). Readers (idem verify, stats) open it the same way, so they cannot
// run beside a live writer (unlike SQLite).
//
// Reopening. Only the first open may create the database; reconnect() opens only the directory it
// opened first (same device and inode) and refuses (store_error) when it is gone or replaced, and
// apply() checks the directory before and after each batch, as sqlite_store checks its file. A new
// store (a restart) on a directory that was removed creates a new, empty history: RocksDB keeps
// nothing outside the directory to tell.
//
// Pruning. rocksdb_options::window > 0 installs a compaction filter that drops records (never audit
// rows) that are terminal or RELEASED and whose updated_time is older than now - window; prune()
// deletes such records at once, and prune(limits) (store::prune) records and audit rows, a bounded
// number per call, scanning in key order (there is no time index). Until compaction reaches it, an
// expired record is still returned. The horizon is kept in the metadata ('m' records_horizon,
// audit_horizon; missing: never pruned); with a window, each batch moves records_horizon to
// now - window, since the filter may drop anything older. max_fence() is the largest fence ever
// written (kept in the metadata), so fences keep increasing over pruned keys.
//
// Thread-safety: one thread at a time (the flusher, or recovery before it starts), like every
// store; the compaction filter runs on RocksDB's threads and reads nothing of the store's.
//
// Where the parts live: the byte layout in detail/rocks/codec.hpp, the window's compaction filter
// in detail/rocks/expiry_filter.hpp, the path and directory checks in detail/files/ (shared with
// sqlite_store). This header holds the contract and the flow.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/files/identity.hpp"
#include "idem/detail/files/path_rules.hpp"
#include "idem/detail/rocks/codec.hpp"
#include "idem/detail/rocks/expiry_filter.hpp"
#include "idem/detail/rows/batch_fold.hpp"
#include "idem/store.hpp"

namespace idem {

/// How a rocksdb_store opens its database.
struct rocksdb_options {
    /// fsync the write-ahead log at each batch (a commit survives power loss) instead of only
    /// writing it to the OS (a commit survives a process crash). Sync durability mode wants it.
    bool sync = false;
    /// The idempotency window: records terminal or RELEASED whose updated_time is older than
    /// now - window are dropped by compaction (audit rows are kept). 0: kept forever.
    std::chrono::milliseconds window{0};
    /// The write-ahead log. Off, a commit lives only in the memtable until it is flushed: a crash
    /// loses it, and check_sync_durability() refuses the store.
    bool wal = true;
    /// Memtable size before a flush to an SST file (RocksDB's write_buffer_size).
    std::size_t write_buffer_bytes = std::size_t{64} << 20;
};

class rocksdb_store final : public store {
public:
    /// Opens (creating when missing) the database directory at `path`. Throws idem::error:
    /// invalid_argument for a configuration fault (the path is not a directory, a missing parent
    /// directory, no permission), naming the path and the rule; store_unavailable when another
    /// store holds PATH/LOCK; store_error / corrupt_record otherwise, naming the path and the cause.
    explicit rocksdb_store(std::string path, bool sync = false)
        : rocksdb_store(std::move(path), rocksdb_options{.sync = sync}) {}

    rocksdb_store(std::string path, const rocksdb_options& opts) : path_(std::move(path)), opts_(opts) {
        if (path_.empty() || detail::files::has_nul(path_))
            throw error(errc::invalid_argument,
                        "rocksdb:" + key::printable(path_) + ": the path must name a directory (non-empty, no NUL byte)");
        if (opts_.window.count() < 0)
            throw error(errc::invalid_argument, where() + "rocksdb_options::window is negative; 0 keeps records forever");
        if (opts_.window.count() > 0) filter_ = std::make_unique<detail::rocks::expiry_filter>(opts_.window);
        open(true);
    }
    ~rocksdb_store() override { close(); }
    rocksdb_store(const rocksdb_store&) = delete;
    rocksdb_store& operator=(const rocksdb_store&) = delete;

    static constexpr std::uint64_t schema_version = 1;
    /// Records deleted per WriteBatch by prune().
    static constexpr std::size_t prune_batch = 4096;

    void apply(std::span<const store_row> rows, std::uint64_t batch_id) override {
        namespace codec = detail::rocks;
        ensure_open();
        check_dir("before the batch");
        // The records this batch may change, read in one MultiGet (rows are sorted by key, so the
        // record keys are too; any other order is told to MultiGet).
        const detail::rows::batch_fold fold = detail::rows::fold_batch(rows);
        std::vector<std::string> keys;
        keys.reserve(fold.keys.size());
        for (const detail::rows::key_fold& f : fold.keys) keys.push_back(codec::record_key(f.key()));
        const bool sorted = std::is_sorted(keys.begin(), keys.end());
        std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
        std::vector<rocksdb::PinnableSlice> values(keys.size());
        std::vector<rocksdb::Status> found(keys.size());
        if (!keys.empty())
            db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(), keys.size(), slices.data(), values.data(),
                          found.data(), sorted);

        // The batch is built in ascending key order ('a' audit rows, 'b' marker, 'm' counters, 'r'
        // records; each kind sorted by key): the memtable skip list then starts each insert from
        // where the previous one ended instead of searching from its top.
        rocksdb::WriteBatch batch;
        std::vector<std::pair<std::size_t, std::string>> records;  // (index into keys, value)
        std::uint64_t sequence = next_sequence_;
        std::uint64_t max_fence = max_fence_;
        for (const store_row& r : rows) {
            // KEY 0x00 SEQ sorts by key, then sequence, only for keys without a NUL byte (codec.hpp),
            // which is every key the guard admits (key::check refuses control bytes).
            IDEM_ASSERT(!detail::files::has_nul(r.t.k.view()), "a row's key holds no NUL byte (key::check)");
            put(batch, codec::audit_key(r.t.k.view(), sequence++), codec::encode_audit(r, node_));
        }
        for (std::size_t group = 0; group < fold.keys.size(); ++group) {
            const detail::rows::key_fold& f = fold.keys[group];
            std::optional<stored_record> before;
            if (found[group].ok())
                before = codec::decode_record(where(), f.key(), {values[group].data(), values[group].size()});
            else if (!found[group].IsNotFound()) fail(found[group], "read the batch's records");
            // The fold every store writes (detail/rows/batch_fold.hpp); nullopt: the record stays.
            const std::optional<stored_record> rec = detail::rows::folded(f, before ? &*before : nullptr);
            if (!rec || rec == before) continue;
            max_fence = std::max(max_fence, rec->fence);
            records.emplace_back(group, codec::encode_record(*rec));
        }
        put(batch, codec::batch_key(batch_id),
            codec::encode_counter(
                static_cast<std::uint64_t>(rows.empty() ? 0 : std::max<std::int64_t>(rows.back().at_ms, 0))));
        put(batch, codec::meta_key("next_sequence"), codec::encode_counter(sequence));
        put(batch, codec::meta_key("max_fence"), codec::encode_counter(max_fence));
        prune_horizon h = horizon_;
        if (filter_) {  // the compaction filter may drop what is older than now - window from now on
            h.records_ms = std::max(h.records_ms, detail::rocks::now_ms() - opts_.window.count());
            put_horizon(batch, h);
        }
        for (const auto& [group_of, value] : records) put(batch, keys[group_of], value);
        const rocksdb::Status s = db_->Write(write_options(), &batch);
        if (!s.ok()) fail(s, "write batch");
        next_sequence_ = sequence;
        max_fence_ = max_fence;
        horizon_ = h;
        // Checked again after the commit: a batch written into a directory the path no longer
        // names is reported as failed, so its rows stay pending and are never acknowledged.
        check_dir("after the batch committed");
    }

    bool committed(std::uint64_t batch_id) override {
        ensure_open();
        check_dir("asked whether a batch committed");
        std::string value;
        const rocksdb::Status s = db_->Get(read_options(), detail::rocks::batch_key(batch_id), &value);
        if (s.IsNotFound()) return false;
        if (!s.ok()) fail(s, "check batch id");
        return true;
    }

    void load(const std::function<void(const stored_record&)>& fn) override {
        ensure_open();
        scan(detail::rocks::record_prefix, {},
             [&](std::string_view k, std::string_view v) { fn(detail::rocks::decode_record(where(), k.substr(1), v)); });
    }

    std::optional<stored_record> get(std::string_view key) override {
        ensure_open();
        std::string value;
        const rocksdb::Status s = db_->Get(read_options(), detail::rocks::record_key(key), &value);
        if (s.IsNotFound()) return std::nullopt;
        if (!s.ok()) fail(s, "read record");
        return detail::rocks::decode_record(where(), key, value);
    }

    std::vector<audit_entry> audit(std::string_view key) override {
        ensure_open();
        std::vector<audit_entry> out;
        scan(detail::rocks::audit_key(key, 0), detail::rocks::audit_end(key),
             [&](std::string_view k, std::string_view v) { out.push_back(detail::rocks::decode_audit(where(), k, v)); });
        return out;
    }

    void scan_audit(const std::function<void(const audit_entry&)>& fn) override {
        ensure_open();
        scan(detail::rocks::audit_prefix, {},
             [&](std::string_view k, std::string_view v) { fn(detail::rocks::decode_audit(where(), k, v)); });
    }

    /// Runs fn with every read on one rocksdb::Snapshot. (Compaction may still drop expired
    /// records seen by it: a compaction filter does not honour snapshots.)
    void snapshot_read(const std::function<void()>& fn) override {
        ensure_open();
        if (snapshot_ != nullptr) return fn();
        struct release {
            rocksdb_store& s;
            ~release() {
                if (s.db_) s.db_->ReleaseSnapshot(s.snapshot_);
                s.snapshot_ = nullptr;
            }
        } guard{*this};
        snapshot_ = db_->GetSnapshot();
        fn();
    }

    /// Refuses a store opened without its write-ahead log: no commit of it survives a crash.
    void check_sync_durability() override {
        if (!opts_.wal)
            throw error(errc::invalid_argument,
                        where() +
                            "rocksdb_options::wal is off, so a commit lives only in memory until a flush; sync "
                            "durability needs the write-ahead log");
    }

    /// Closes and reopens the database: only the directory opened first, never a new one.
    void reconnect() override {
        close();
        open(false);
    }

    [[nodiscard]] std::string name() const override { return "rocksdb:" + path_; }

    /// The largest fence ever written (kept in the metadata, so pruned records count too).
    std::uint64_t max_fence() override {
        ensure_open();
        return max_fence_;
    }

    /// Deletes now the records that are terminal or RELEASED and were last updated before
    /// `before_ms` (Unix ms), in WriteBatches of prune_batch deletions, and moves the records
    /// horizon. Audit rows are kept. Returns how many records it deleted. A record that does not
    /// decode is corrupt_record.
    std::size_t prune(std::int64_t before_ms) {
        std::size_t deleted = 0;
        for (prune_result r{.more = true}; r.more;) {
            r = prune(prune_limits{.records_before_ms = before_ms, .max_rows = prune_batch});
            deleted += r.records;
        }
        return deleted;
    }

    /// One WriteBatch: the first limits.max_rows expired records and audit rows in key order (a
    /// scan that stops at the next expired row, which sets `more`), the horizon with them.
    prune_result prune(const prune_limits& limits) override {
        namespace codec = detail::rocks;
        ensure_open();
        check_dir("before a prune");
        prune_result out;
        rocksdb::WriteBatch batch;
        prune_horizon h = horizon_;
        // The scans stop at the first expired row past the limit: it only says there is more.
        struct stop {};
        auto del = [&](std::string_view k, std::size_t& n) {
            if (n == limits.max_rows) {
                out.more = true;
                throw stop{};
            }
            const rocksdb::Status s = batch.Delete(rocksdb::Slice(k.data(), k.size()));
            if (!s.ok()) fail(s, "prune");
            ++n;
        };
        if (limits.records_before_ms != prune_limits::keep_all) {
            try {
                scan(codec::record_prefix, {}, [&](std::string_view k, std::string_view v) {
                    const stored_record r = codec::decode_record(where(), k.substr(1), v);
                    if (detail::rocks::expired(r.state, r.updated_ms, limits.records_before_ms)) del(k, out.records);
                });
            } catch (const stop&) {
            }
            h.records_ms = std::max(h.records_ms, limits.records_before_ms);
        }
        if (limits.audit_before_ms != prune_limits::keep_all) {
            try {
                scan(codec::audit_prefix, {}, [&](std::string_view k, std::string_view v) {
                    if (codec::decode_audit(where(), k, v).at_ms < limits.audit_before_ms) del(k, out.audit_rows);
                });
            } catch (const stop&) {
            }
            h.audit_ms = std::max(h.audit_ms, limits.audit_before_ms);
        }
        put_horizon(batch, h);
        const rocksdb::Status s = db_->Write(write_options(), &batch);
        if (!s.ok()) fail(s, "write prune");
        horizon_ = h;
        check_dir("after a prune committed");
        return out;
    }

    /// The stored horizon; with a window, records_ms is at least now - window (the compaction
    /// filter may have dropped anything older by now).
    prune_horizon horizon() override {
        ensure_open();
        prune_horizon h = horizon_;
        if (filter_) h.records_ms = std::max(h.records_ms, detail::rocks::now_ms() - opts_.window.count());
        return h;
    }

    /// Compacts the whole key range now, which runs the window's compaction filter over every
    /// record (RocksDB otherwise compacts in the background as files accumulate).
    void compact() {
        ensure_open();
        const rocksdb::Status s = db_->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr);
        if (!s.ok()) fail(s, "compact");
    }

    /// Whether a record in `state` last updated at `updated_ms` is past a window that ends at
    /// `before_ms`: terminal or RELEASED, and older. PROCESSING records are never pruned.
    [[nodiscard]] static bool expired(record_state state, std::int64_t updated_ms, std::int64_t before_ms) noexcept {
        return detail::rocks::expired(state, updated_ms, before_ms);
    }

private:
    [[nodiscard]] std::string where() const { return "rocksdb:" + path_ + ": "; }

    /// The horizon's metadata: each bound as a counter with its sign bit flipped (so keep_all,
    /// INT64_MIN, is 0); a bound that is keep_all is not written.
    void put_horizon(rocksdb::WriteBatch& b, const prune_horizon& h) {
        namespace codec = detail::rocks;
        for (auto [name, v] : {std::pair{"records_horizon", h.records_ms}, std::pair{"audit_horizon", h.audit_ms}})
            if (v != prune_limits::keep_all)
                put(b, codec::meta_key(name), codec::encode_counter(static_cast<std::uint64_t>(v) ^ sign_bit));
    }
    std::int64_t read_bound(const char* name) {
        std::string value;
        const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), detail::rocks::meta_key(name), &value);
        if (s.IsNotFound()) return prune_limits::keep_all;
        if (!s.ok()) fail(s, "read metadata");
        return static_cast<std::int64_t>(detail::rocks::decode_counter(where(), name, value) ^ sign_bit);
    }
    static constexpr std::uint64_t sign_bit = std::uint64_t{1} << 63;

    rocksdb::WriteOptions write_options() const {
        rocksdb::WriteOptions w;
        w.sync = opts_.sync && opts_.wal;
        w.disableWAL = !opts_.wal;
        return w;
    }
    rocksdb::ReadOptions read_options() const {
        rocksdb::ReadOptions r;
        r.snapshot = snapshot_;
        return r;
    }
    void put(rocksdb::WriteBatch& b, const std::string& k, const std::string& v) {
        const rocksdb::Status s = b.Put(k, v);
        if (!s.ok()) fail(s, "build batch");
    }

    /// Calls fn(key, value) for every key in [from, to), or with the prefix `from` when to is empty.
    template <class Fn>
    void scan(const std::string& from, const std::string& to, Fn&& fn) {
        std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options()));
        for (it->Seek(from); it->Valid(); it->Next()) {
            const rocksdb::Slice k = it->key();
            const std::string_view kv(k.data(), k.size());
            if (to.empty() ? !kv.starts_with(from) : kv >= std::string_view(to)) break;
            fn(kv, std::string_view(it->value().data(), it->value().size()));
        }
        if (!it->status().ok()) fail(it->status(), "read");
    }
    template <class Fn>
    void scan(char prefix, const std::string& to, Fn&& fn) {
        scan(std::string(1, prefix), to, std::forward<Fn>(fn));
    }

    /// After a failed reconnect the handle is gone: reopen, so the caller sees the real cause.
    void ensure_open() {
        if (!db_) open(false);
    }

    void close() noexcept {
        if (db_ && snapshot_) db_->ReleaseSnapshot(snapshot_);
        snapshot_ = nullptr;
        if (db_) (void)db_->Close();
        db_.reset();
    }

    void open(bool first) {
        if (!first) check_reopen();
        else if (const std::string fault = detail::files::database_directory_fault(path_); !fault.empty())
            throw error(errc::invalid_argument, where() + fault);
        rocksdb::Options o;
        o.create_if_missing = first;  // a reopen never creates: see check_reopen()
        o.write_buffer_size = opts_.write_buffer_bytes;
        o.compaction_filter = filter_.get();
        // Most keys of a batch are new (random client keys): bloom filters in the memtable and in
        // every SST file answer "not there" for them without walking the skip list or reading blocks.
        o.memtable_prefix_bloom_size_ratio = 0.1;
        o.memtable_whole_key_filtering = true;
        rocksdb::BlockBasedTableOptions table;
        table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
        o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
        rocksdb::DB* raw = nullptr;
        const rocksdb::Status s = rocksdb::DB::Open(o, path_, &raw);
        if (!s.ok()) {
            const std::string msg = s.ToString();
            if (msg.find("LOCK") != std::string::npos || msg.find("lock") != std::string::npos)
                throw error(errc::store_unavailable,
                            where() + "another process holds " + path_ +
                                "/LOCK (or another store in this process has the directory open): a RocksDB store "
                                "has one writer at a time; stop it first (RocksDB: " +
                                msg + ")");
            if (first && (s.IsIOError() || s.IsInvalidArgument()))
                if (const std::string fault = detail::files::database_directory_fault(path_); !fault.empty())
                    throw error(errc::invalid_argument, where() + fault + " (RocksDB: " + msg + ")");
            if (!first && s.IsInvalidArgument())
                throw error(errc::store_error, where() + "the database is gone from the directory (" + msg +
                                                   "); refusing to create a new, empty database in its place (that "
                                                   "would drop the history of every key)");
            fail(s, "open");
        }
        db_.reset(raw);
        try {
            read_meta();
            if (first) note_dir();
        } catch (...) {
            close();
            throw;
        }
    }

    /// Reads (or, in a new database, writes) the schema version and the two counters.
    void read_meta() {
        namespace codec = detail::rocks;
        std::string value;
        rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), codec::meta_key("schema"), &value);
        if (s.IsNotFound()) {
            std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
            it->SeekToFirst();
            if (it->Valid())
                throw error(errc::corrupt_record, where() +
                                                      "the database holds data but no schema version: it is not "
                                                      "an idem store, or its metadata was lost");
            if (!it->status().ok()) fail(it->status(), "read metadata");
            rocksdb::WriteBatch b;
            put(b, codec::meta_key("schema"), codec::encode_counter(schema_version));
            put(b, codec::meta_key("next_sequence"), codec::encode_counter(1));
            put(b, codec::meta_key("max_fence"), codec::encode_counter(0));
            rocksdb::WriteOptions w = write_options();
            w.sync = opts_.wal;
            s = db_->Write(w, &b);
            if (!s.ok()) fail(s, "write schema");
            next_sequence_ = 1;
            max_fence_ = 0;
            horizon_ = {};
            return;
        }
        if (!s.ok()) fail(s, "read schema version");
        if (const auto v = codec::decode_counter(where(), "schema", value); v != schema_version)
            throw error(errc::store_error,
                        where() + "schema version " + std::to_string(v) + " is not the supported version 1");
        next_sequence_ = counter("next_sequence");
        // Each batch numbers its audit rows from here with ++: a counter no real history reaches can
        // only come from damage, and would overflow.
        if (next_sequence_ < 1 || next_sequence_ > (std::uint64_t{1} << 62))
            throw error(errc::corrupt_record, where() + "metadata 'next_sequence' is " + std::to_string(next_sequence_) +
                                                  "; it must be between 1 and 2^62");
        max_fence_ = counter("max_fence");
        horizon_ = {read_bound("records_horizon"), read_bound("audit_horizon")};
        if (max_fence_ >= detail::rocks::fence_limit)
            throw error(errc::corrupt_record,
                        where() + "metadata 'max_fence' is " + std::to_string(max_fence_) + "; fences are below 2^52");
    }
    std::uint64_t counter(const char* name) {
        std::string value;
        const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), detail::rocks::meta_key(name), &value);
        if (s.IsNotFound())
            throw error(errc::corrupt_record, where() + "metadata '" + name + "' is missing (damaged database?)");
        if (!s.ok()) fail(s, "read metadata");
        return detail::rocks::decode_counter(where(), name, value);
    }

    // ---- the directory under a running store (detail/files/identity.hpp) ------------------------

    void note_dir() {
        const detail::files::entry dir = detail::files::look(path_);
        if (!dir.directory())
            throw error(errc::store_error, where() + "the database directory vanished while it was being opened");
        dir_ = dir.id();
    }
    /// What is wrong with the directory, or "" when the path still names the one first opened.
    [[nodiscard]] std::string dir_fault() const {
        const detail::files::entry dir = detail::files::look(path_);
        if (!dir.found()) return replaced_message(std::strerror(dir.err));
        if (!dir_.names(dir.st)) return replaced_message("another directory is at the path");
        return {};
    }
    [[nodiscard]] static std::string replaced_message(const std::string& when) {
        return detail::files::replaced_message("directory", when, "where no restart finds it");
    }
    void check_dir(const char* when) const {
        if (const std::string fault = dir_fault(); !fault.empty())
            throw error(errc::store_error, where() + fault + "; nothing is acknowledged until it is back [" + when + "]");
    }
    void check_reopen() const {
        if (const std::string fault = dir_fault(); !fault.empty())
            throw error(errc::store_error, where() + fault +
                                               " [found at reconnect]; refusing to create a new, empty "
                                               "database in its place (that would drop the history of "
                                               "every key)");
    }

    /// Throws the error for a failed RocksDB call, naming the path and the step.
    [[noreturn]] void fail(const rocksdb::Status& s, const char* step) const {
        const std::string cause = std::string(step) + " failed: " + s.ToString();
        if (s.IsCorruption()) throw error(errc::corrupt_record, where() + "the database is damaged (" + cause + ")");
        if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() || s.IsShutdownInProgress())
            throw error(errc::store_unavailable, where() + cause);
        throw error(errc::store_error, where() + cause);  // NoSpace, IOError, ...
    }

    std::string path_;
    rocksdb_options opts_;
    std::unique_ptr<detail::rocks::expiry_filter> filter_;  // declared before db_: it must outlive the database
    std::unique_ptr<rocksdb::DB> db_;
    const rocksdb::Snapshot* snapshot_ = nullptr;  // inside snapshot_read()
    std::uint64_t next_sequence_ = 1;              // audit sequence: this store is the only writer
    std::uint64_t max_fence_ = 0;
    prune_horizon horizon_;        // what prune (and the window) removed; kept in the metadata
    detail::files::identity dir_;  // the directory the first open found
};

}  // namespace idem
