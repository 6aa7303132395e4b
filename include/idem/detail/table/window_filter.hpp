// idem/detail/table/window_filter.hpp: the cold window, a compact summary of the keys the store still
// remembers but memory no longer holds (evicted by rotation, or left out of memory at recovery).
//
// A split block Bloom filter: each key sets one bit in each of the 8 words of one 64-byte block
// (one cache line per slice and lookup), at bits_per_key = 12 bits (1.5 bytes) of filter per key:
// design false-positive rate design_fpr() = 0.42 % per slice. No false negatives: a key added is
// found until its slice expires.
//
// Ageing. The window is cut into 2 buckets of window/2 by the keys' last-update time; each bucket
// has one or more slices (a slice is sized when it is made, for the keys being added then, or twice
// its bucket's previous slice when that is larger). A slice is dropped once its newest key is older
// than the window, so memory follows the window, not the deployment's lifetime; a key stays in the
// filter between one and one and a half windows (past the window the store's record decides: the
// key is new). A lookup reads one block per live slice, so the rate that matters is
// effective_fpr() = 1 - (1 - design_fpr())^slices. Recovery adds the whole recovered window as
// one slice (add(..., together)): 0.42 % and one block read until rotations add slices. Fewer buckets would mean fewer reads but longer-lived keys; more, the reverse (8 buckets
// measured 8 % false positives and 0.3-0.5x the fresh-key rate with a 10M-key window). A window of
// nanoseconds::max() (forever) keeps one bucket that never expires.
//
// Concurrency. One writer at a time (the caller serialises add() and expire(): recovery, then the
// record table's rotation mutex); any number of lock-free readers. Slice memory is never unmapped while
// the filter lives: a dropped slice is zeroed with MADV_DONTNEED (a stale reader then reads zeros,
// or the bits of a later slice made in the same mapping, never unmapped memory) and its mapping is
// reused. A slice's block count lives in its first word, so a reader always pairs a mapping with a
// count that fits in it. A key added before the table evicts it is seen by every reader that missed
// it in memory afterwards: the eviction's seq_cst writes come after the bits are set, and the
// reader's seq_cst reads of the table come before its filter reads. A partial filter (its keys still
// being streamed in at start, recovery_start::claims_first) answers every lookup "may be": it can
// only send a claim to the store, never let a key of the window through; complete() publishes the
// bits added before it (release, paired with the lookup's acquire).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include <sys/mman.h>

namespace idem::detail::table {

class window_filter {
public:
    static constexpr std::size_t max_slices = 64;
    static constexpr double bits_per_key = 12.0;
    static constexpr std::int64_t buckets_per_window = 2;

    /// One key to remember: its 128-bit table hash and its last update on the guard's clock (ns).
    struct entry {
        std::uint64_t lo = 0, hi = 0;
        std::int64_t updated = 0;
    };

    struct usage {
        std::uint64_t keys = 0;      ///< keys added to live slices
        std::uint64_t bytes = 0;     ///< bytes of live slices (their blocks)
        std::uint64_t slices = 0;    ///< live slices
        std::uint64_t overfull = 0;  ///< keys added beyond a slice's design capacity (no slice free)
    };

    /// The design false-positive rate at `bits` bits per key: a block holds Poisson(512 / bits)
    /// keys, and a lookup is a false positive when each of its 8 bits is set.
    /// The false-positive rate of a lookup now: one chance per live slice.
    [[nodiscard]] double effective_fpr() const {
        return 1.0 - std::pow(1.0 - design_fpr(),
                              static_cast<double>(slice_count_.load(std::memory_order_relaxed)));  // relaxed: a statistic
    }

    [[nodiscard]] static double design_fpr(double bits = bits_per_key) {
        const double lambda = 512.0 / bits;
        double p = std::exp(-lambda), sum = 0;
        for (int j = 0; j < 2000; ++j) {
            if (j > 0) p *= lambda / j;
            sum += p * std::pow(1.0 - std::pow(63.0 / 64.0, j), 8);
        }
        return sum;
    }

    /// `window`: how long a key stays after its last update, on the guard's clock; max(): forever.
    explicit window_filter(std::chrono::nanoseconds window) : window_(window) {
        for (auto& s : slices_) s.store(nullptr, std::memory_order_relaxed);  // relaxed: before sharing
    }
    ~window_filter() {
        for (auto& m : meta_)
            if (m.map != nullptr) ::munmap(m.map, m.map_bytes);
        for (auto& f : free_) ::munmap(f.map, f.map_bytes);
    }
    window_filter(const window_filter&) = delete;
    window_filter& operator=(const window_filter&) = delete;

    [[nodiscard]] bool forever() const noexcept { return window_ == std::chrono::nanoseconds::max(); }
    [[nodiscard]] std::chrono::nanoseconds window() const noexcept { return window_; }
    [[nodiscard]] bool empty() const noexcept { return occupied_.load(std::memory_order_acquire) == 0; }

    /// Starts loading the key's block in every live slice (a hint: a stale address is harmless).
    /// The loads are acquire, as may_contain's: the block count it reads lives in the slice's
    /// mapping, which a slice made meanwhile (rotation, or the stream of recovery_start::claims_first
    /// beside the claims) publishes with the release stores of make(); plain loads on x86.
    void prefetch(std::uint64_t lo, std::uint64_t hi) const noexcept {
        (void)lo;
        for (std::uint64_t m = occupied_.load(std::memory_order_acquire); m != 0; m &= m - 1) {
            const word* s = slices_[std::countr_zero(m)].load(std::memory_order_acquire);
            if (s != nullptr) __builtin_prefetch(s + 8 + 8 * block_of(hi, s[0].load(std::memory_order_relaxed)));
        }
    }

    /// Marks the filter partial: until complete() every lookup answers "may be in the window", so
    /// a claim of any key memory does not hold reads the store. Before the filter is shared
    /// (recovery_start::claims_first: the window's keys are still being streamed in).
    void begin_partial() noexcept { partial_.store(true, std::memory_order_relaxed); }  // relaxed: before sharing
    /// The filter holds every key it was meant to: lookups read its bits from now on. The release
    /// pairs with may_contain's acquire, so a reader that sees the filter complete sees every bit
    /// set before this call.
    void complete() noexcept { partial_.store(false, std::memory_order_release); }
    [[nodiscard]] bool partial() const noexcept { return partial_.load(std::memory_order_acquire); }

    /// Whether the key may be in the window. Lock-free, wait-free, no allocation.
    [[nodiscard]] bool may_contain(std::uint64_t lo, std::uint64_t hi) const noexcept {
        if (partial_.load(std::memory_order_acquire)) [[unlikely]]
            return true;
        for (std::uint64_t m = occupied_.load(std::memory_order_acquire); m != 0; m &= m - 1) {
            const word* s = slices_[std::countr_zero(m)].load(std::memory_order_acquire);
            if (s == nullptr) continue;
            const std::uint64_t n = s[0].load(std::memory_order_relaxed);  // relaxed: see the header comment
            if (n == 0) continue;
            const word* b = s + 8 + 8 * block_of(hi, n);
            bool all = true;
            for (unsigned i = 0; i < 8 && all; ++i)
                all = (b[i].load(std::memory_order_relaxed) & bit(lo, i)) != 0;  // relaxed: see the header comment
            if (all) return true;
        }
        return false;
    }

    /// Adds keys (one writer at a time). False when a slice could not be mapped: the caller must
    /// not forget the keys then (the table keeps them in memory and tries again later).
    /// `together`: all of them into one slice of the bucket of the newest, sized for them (recovery:
    /// a lookup then reads one block for the whole recovered window, at the price of keeping its
    /// oldest keys up to one window longer).
    [[nodiscard]] bool add(std::span<const entry> keys, bool together = false) {
        if (keys.empty()) return true;
        std::int64_t newest_bucket = INT64_MIN;
        if (together)
            for (const entry& e : keys) newest_bucket = std::max(newest_bucket, bucket_of(e.updated));
        auto bucket = [&](const entry& e) { return together ? newest_bucket : bucket_of(e.updated); };
        std::map<std::int64_t, std::uint64_t> per_bucket;
        for (const entry& e : keys) ++per_bucket[bucket(e)];
        std::map<std::int64_t, std::size_t> target;  // bucket -> slice index with room for its keys
        for (auto [b, n] : per_bucket) {
            const auto t = slice_for(b, n);
            if (!t) return false;
            target[b] = *t;
        }
        for (const entry& e : keys) {
            const std::size_t i = target[bucket(e)];
            meta& m = meta_[i];
            word* s = m.words();
            word* blk = s + 8 + 8 * block_of(e.hi, m.blocks);
            for (unsigned j = 0; j < 8; ++j)
                blk[j].fetch_or(bit(e.lo, j), std::memory_order_relaxed);  // relaxed: see header
            m.newest = std::max(m.newest, e.updated);
            if (++m.keys > m.capacity) overfull_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
        }
        publish_usage();
        return true;
    }

    /// Drops the slices whose newest key is older than the window at `now`. Returns keys forgotten.
    std::uint64_t expire(std::chrono::nanoseconds now) {
        if (forever()) return 0;
        std::uint64_t forgotten = 0;
        for (std::size_t i = 0; i < max_slices; ++i) {
            meta& m = meta_[i];
            if (m.map == nullptr || !m.live) continue;
            if (now.count() - m.newest <= window_.count()) continue;
            forgotten += m.keys;
            drop(i);
        }
        publish_usage();
        return forgotten;
    }

    [[nodiscard]] usage use() const noexcept {
        return {keys_.load(std::memory_order_relaxed), bytes_.load(std::memory_order_relaxed),  // relaxed: statistics
                slice_count_.load(std::memory_order_relaxed), overfull_.load(std::memory_order_relaxed)};
    }

private:
    using word = std::atomic<std::uint64_t>;

    struct meta {
        void* map = nullptr;
        std::size_t map_bytes = 0;
        bool live = false;
        std::int64_t bucket = 0;
        std::int64_t newest = INT64_MIN;
        std::uint64_t blocks = 0, keys = 0, capacity = 0;
        [[nodiscard]] word* words() const noexcept { return static_cast<word*>(map); }
    };
    struct spare {
        void* map;
        std::size_t map_bytes;
    };

    [[nodiscard]] static std::uint64_t block_of(std::uint64_t hi, std::uint64_t n) noexcept {
        return static_cast<std::uint64_t>((static_cast<unsigned __int128>(hi) * n) >> 64);
    }
    [[nodiscard]] static std::uint64_t bit(std::uint64_t lo, unsigned i) noexcept {
        const std::uint64_t mixed = lo * 0x9E3779B97F4A7C15ull;
        return std::uint64_t{1} << ((mixed >> (64 - 6 * (i + 1) - 4)) & 63);
    }
    [[nodiscard]] std::int64_t bucket_of(std::int64_t updated) const noexcept {
        if (forever()) return 0;
        const std::int64_t span = std::max<std::int64_t>(1, window_.count() / buckets_per_window);
        return updated >= 0 ? updated / span : -((-updated + span - 1) / span);
    }

    /// The slice that takes `n` more keys of bucket b: the bucket's newest slice if it has room,
    /// else a new one (max(n, 2 x that slice's capacity)); with no slice free, the bucket's newest
    /// (or any) slice, over capacity.
    std::optional<std::size_t> slice_for(std::int64_t b, std::uint64_t n) {
        const std::size_t newest = last_of_bucket(b);
        if (newest != max_slices && meta_[newest].keys + n <= meta_[newest].capacity) return newest;
        const std::uint64_t cap = std::max<std::uint64_t>({n, newest != max_slices ? 2 * meta_[newest].capacity : 0, 1024});
        std::size_t freei = max_slices;
        for (std::size_t i = 0; i < max_slices && freei == max_slices; ++i)
            if (!meta_[i].live) freei = i;
        if (freei == max_slices) {  // every slice in use: degrade the false-positive rate, never forget
            if (newest != max_slices) return newest;
            for (std::size_t i = 0; i < max_slices; ++i)
                if (meta_[i].live) return i;
            return std::nullopt;
        }
        if (!make(freei, b, cap)) return std::nullopt;
        last_[b] = freei;
        return freei;
    }
    [[nodiscard]] std::size_t last_of_bucket(std::int64_t b) const {
        auto it = last_.find(b);
        return it == last_.end() ? max_slices : it->second;
    }

    bool make(std::size_t i, std::int64_t b, std::uint64_t cap) {
        const std::uint64_t blocks = std::max<std::uint64_t>(
            1, static_cast<std::uint64_t>(std::ceil(static_cast<double>(cap) * bits_per_key / 512.0)));
        const std::size_t need = static_cast<std::size_t>((blocks + 1) * 64);
        meta& m = meta_[i];
        if (m.map != nullptr && m.map_bytes < need) {  // too small for this slice: keep it for a smaller one
            free_.push_back({m.map, m.map_bytes});
            m.map = nullptr;
        }
        if (m.map == nullptr) {
            auto best = free_.end();
            for (auto it = free_.begin(); it != free_.end(); ++it)
                if (it->map_bytes >= need && (best == free_.end() || it->map_bytes < best->map_bytes)) best = it;
            if (best != free_.end()) {
                m.map = best->map;
                m.map_bytes = best->map_bytes;
                free_.erase(best);
            } else {
                void* p = ::mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (p == MAP_FAILED) return false;
                m.map = p;
                m.map_bytes = need;
            }
        }
        m.live = true;
        m.bucket = b;
        m.newest = INT64_MIN;
        m.blocks = blocks;
        m.keys = 0;
        m.capacity = cap;
        m.words()[0].store(blocks, std::memory_order_relaxed);  // relaxed: published by the release below
        slices_[i].store(m.words(), std::memory_order_release);
        occupied_.fetch_or(std::uint64_t{1} << i, std::memory_order_release);
        return true;
    }

    void drop(std::size_t i) {
        meta& m = meta_[i];
        occupied_.fetch_and(~(std::uint64_t{1} << i), std::memory_order_release);
        slices_[i].store(nullptr, std::memory_order_release);
        ::madvise(m.map, m.map_bytes, MADV_DONTNEED);  // zero pages: a stale reader reads zeros
        m.live = false;
        m.keys = 0;
        if (last_of_bucket(m.bucket) == i) last_.erase(m.bucket);
    }

    void publish_usage() noexcept {
        std::uint64_t k = 0, by = 0, n = 0;
        for (const meta& m : meta_)
            if (m.live) {
                k += m.keys;
                by += m.blocks * 64;
                ++n;
            }
        keys_.store(k, std::memory_order_relaxed);  // relaxed: statistics
        bytes_.store(by, std::memory_order_relaxed);
        slice_count_.store(n, std::memory_order_relaxed);
    }

    std::chrono::nanoseconds window_;
    std::atomic<std::uint64_t> occupied_{0};
    std::atomic<bool> partial_{false};  // read with occupied_ on every lookup: the same line
    std::atomic<const word*> slices_[max_slices];
    meta meta_[max_slices];                     // writer only
    std::map<std::int64_t, std::size_t> last_;  // writer only: each bucket's newest slice
    std::vector<spare> free_;                   // writer only: mappings of dropped slices, zeroed
    std::atomic<std::uint64_t> keys_{0}, bytes_{0}, slice_count_{0}, overfull_{0};
};

}  // namespace idem::detail::table
