// idem/detail/table/lease_histogram.hpp: per-operation latency histograms and the adaptive lease they set
// (options.adaptive).
//
// What is measured
// ----------------
// The claim-to-completion time of every claim that ends in a terminal succeed() or fail(): the time
// from the claim (the slot's `updated` field, written by grant() with the claim's lease start) to
// the completion. A release (a retryable failure, a dropped ticket) is not counted: it says how soon
// the owner gave up, not how long the work takes. Compensation, reclaims and withdrawn claims are
// not counted either: nobody observed their work finish.
//
// The histogram (latency_histogram)
// ---------------------------------
// Log-linear, as HdrHistogram: each power of two from 2^10 ns (1.02 us) to 2^42 ns (73.3 min) is
// cut into 8 linear sub-buckets, plus one bucket below 2^10 ns and one at or above 2^42 ns: 258
// counters, 2 KiB. A quantile is answered with the upper edge of the bucket that holds the sample of
// that rank, so for samples from 1.02 us to 73.3 min it is never below the true sample quantile and
// at most 1/8 (12.5 %) above it: a bucket [lo, lo + 2^e/8) has lo >= 2^e. Below 1.02 us the answer is
// 1.02 us; at or above 73.3 min it is nanoseconds::max() (the lease is then options.adaptive.max).
//
// The operation table (operation_leases)
// --------------------------------------
// One histogram per operation (the OPERATION of a key::compose'd "TXID_OPERATION_vN"; key::split),
// for up to `capacity` (64) operations, open addressed (linear probing over the whole table) by a
// keyed 64-bit hash of the operation name. A slot is claimed by the first completion of its
// operation, with a CAS on its id word; the table never forgets an operation. The 65th distinct
// operation and every later one go to one shared "other" histogram, reported with the operation
// name "" (not a name key::split can give); their claims keep the static options.lease, since the
// p99 of a mix of operations bounds none of them. Keys that do not split are not measured and keep
// options.lease too.
//
// The lease in force: refresh() (guard::maintain(), so the background thread every
// options.maintenance_interval) recomputes each operation's lease = clamp(k x p99, min, max) once
// it has min_samples samples, and stores it in the operation's lease word, which a claim reads with
// one relaxed load. Until then the word holds 0 and the claim uses options.lease. refresh() also
// ages the histograms: when an operation holds more than `window` samples, every bucket is halved,
// so the p99 follows the recent completions (about the last `window`) instead of all since start.
//
// Thread-safety and progress
// --------------------------
// record() (the completing thread), lease() (the claiming thread) and snapshot() may run from any
// threads at once; refresh() too (a second concurrent refresh returns at once). No lock, no
// allocation, no system call on record() or lease(): both are wait-free (a probe of at most
// `capacity` id words; record()'s CAS is tried at most once per empty slot met).
// * Counters: relaxed fetch_add. A count is a statistic: nothing else is published with it, and a
//   quantile read while counts change is the quantile of some mix of before and after (each bucket
//   is read once into a copy, so the answer is consistent with that copy).
// * halve(): relaxed fetch_sub of half of the value read. Adds that land between the read and the
//   fetch_sub are kept (never lost, never negative): the bucket ends a little above half.
// * Id words, bit 0 "name written": (1) CAS 0 -> id with bit 0 clear (the slot is the operation's;
//   its histogram is usable at once, identity is the 63-bit hash, never the name), relaxed: the
//   identity is the word itself, nothing is published with it; (2) after writing the name bytes,
//   release store of id | 1, pairs with (3) snapshot()'s acquire load, which reads the name only
//   when bit 0 is set. The name is written once, before (2), and never changed.
// * Lease words: relaxed load and store. A lease is a number complete in itself; a claim that reads
//   the previous refresh's value just gets that (valid) lease.
// * Two operations whose keyed 63-bit hashes collide would share a histogram (probability about
//   n^2 / 2^64; the key of the hash is random per guard, so a client cannot aim at it).
#pragma once

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.hpp"
#include "idem/options.hpp"
#include "idem/stats.hpp"

namespace idem::detail::table {

/// A log-linear histogram of durations (the layout is at the top of this file).
class latency_histogram {
public:
    static constexpr unsigned sub_bits = 3;  ///< 2^3 = 8 linear sub-buckets per octave
    static constexpr unsigned sub_buckets = 1u << sub_bits;
    static constexpr unsigned min_exp = 10;  ///< 2^10 ns = 1.02 us: the first octave
    static constexpr unsigned max_exp = 42;  ///< 2^42 ns = 73.3 min: the overflow bucket
    static constexpr std::size_t buckets = 2 + (max_exp - min_exp) * sub_buckets;
    /// A quantile's answer is at most this fraction above the true sample quantile (1.02 us to 73.3 min).
    static constexpr double relative_error = 1.0 / sub_buckets;

    [[nodiscard]] static constexpr std::size_t bucket_of(std::chrono::nanoseconds d) noexcept {
        if (d.count() < (std::int64_t{1} << min_exp)) return 0;
        const auto v = static_cast<std::uint64_t>(d.count());
        const unsigned e = static_cast<unsigned>(std::bit_width(v)) - 1;
        if (e >= max_exp) return buckets - 1;
        const auto sub = static_cast<std::size_t>((v >> (e - sub_bits)) & (sub_buckets - 1));
        return 1 + (e - min_exp) * sub_buckets + sub;
    }
    /// The smallest duration bucket b holds.
    [[nodiscard]] static constexpr std::chrono::nanoseconds lower_edge(std::size_t b) noexcept {
        if (b == 0) return std::chrono::nanoseconds(0);
        if (b >= buckets - 1) return std::chrono::nanoseconds(std::int64_t{1} << max_exp);
        const unsigned e = min_exp + static_cast<unsigned>((b - 1) / sub_buckets);
        const auto sub = static_cast<std::int64_t>((b - 1) % sub_buckets);
        return std::chrono::nanoseconds((std::int64_t{1} << e) + (sub << (e - sub_bits)));
    }
    /// The first duration above bucket b (nanoseconds::max() for the overflow bucket).
    [[nodiscard]] static constexpr std::chrono::nanoseconds upper_edge(std::size_t b) noexcept {
        if (b >= buckets - 1) return std::chrono::nanoseconds::max();
        return lower_edge(b + 1);
    }

    /// Progress: wait-free.
    void record(std::chrono::nanoseconds d) noexcept {
        counts_[bucket_of(d)].fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic (top of file)
    }

    /// The counts, each read once: quantiles are computed from this copy.
    struct copy {
        std::array<std::uint64_t, buckets> counts{};
        std::uint64_t total = 0;
        /// The upper edge of the bucket holding the sample of rank ceil(q x total); nullopt when empty.
        [[nodiscard]] std::optional<std::chrono::nanoseconds> quantile(double q) const noexcept {
            if (total == 0) return std::nullopt;
            const auto rank = std::max<std::uint64_t>(1,
                                                      static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total))));
            std::uint64_t seen = 0;
            for (std::size_t b = 0; b < buckets; ++b) {
                seen += counts[b];
                if (seen >= rank) return upper_edge(b);
            }
            return upper_edge(buckets - 1);
        }
    };
    [[nodiscard]] copy read() const noexcept {
        copy c;
        for (std::size_t b = 0; b < buckets; ++b) {
            c.counts[b] = counts_[b].load(std::memory_order_relaxed);  // relaxed: a statistic
            c.total += c.counts[b];
        }
        return c;
    }
    [[nodiscard]] std::uint64_t count() const noexcept { return read().total; }
    [[nodiscard]] std::optional<std::chrono::nanoseconds> quantile(double q) const noexcept { return read().quantile(q); }

    /// Halves every bucket (ageing). Concurrent record()s are kept (top of file).
    void halve() noexcept {
        for (auto& c : counts_) {
            const std::uint64_t v = c.load(std::memory_order_relaxed);  // relaxed: see halve() at the top
            if (v > 1) c.fetch_sub(v / 2, std::memory_order_relaxed);
        }
    }

private:
    std::array<std::atomic<std::uint64_t>, buckets> counts_{};
};

static_assert(latency_histogram::bucket_of(std::chrono::nanoseconds(1023)) == 0, "below 2^10 ns: the first bucket");
static_assert(latency_histogram::bucket_of(std::chrono::nanoseconds(1024)) == 1, "2^10 ns opens the first octave");
static_assert(latency_histogram::lower_edge(latency_histogram::bucket_of(std::chrono::nanoseconds(3'000'000))) <=
                      std::chrono::nanoseconds(3'000'000) &&
                  latency_histogram::upper_edge(latency_histogram::bucket_of(std::chrono::nanoseconds(3'000'000))) >
                      std::chrono::nanoseconds(3'000'000),
              "a duration lies in its bucket's [lower_edge, upper_edge)");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "counters must be lock-free atomics");

/// clamp(k x p99, min, max), saturating (p99 may be nanoseconds::max()).
[[nodiscard]] inline std::chrono::nanoseconds adaptive_lease_of(std::chrono::nanoseconds p99,
                                                                const adaptive_lease& p) noexcept {
    const double want = p.k * static_cast<double>(p99.count());
    if (!(want < static_cast<double>(p.max.count()))) return p.max;  // also NaN: never expected
    return std::clamp(std::chrono::nanoseconds(static_cast<std::int64_t>(want)), p.min, p.max);
}

/// Throws idem::error(errc::invalid_argument) naming the option and its rule.
inline void check_adaptive_lease(const adaptive_lease& p) {
    if (!p.enabled) return;
    if (!(p.k >= 1.0) || !std::isfinite(p.k))
        throw error(errc::invalid_argument, "options.adaptive.k is " + std::to_string(p.k) +
                                                "; it must be a finite number of at least 1 (below 1, more than 1% of "
                                                "claims would outlive their lease)");
    if (p.min <= std::chrono::nanoseconds::zero())
        throw error(errc::invalid_argument, "options.adaptive.min must be positive");
    if (p.max < p.min)
        throw error(errc::invalid_argument, "options.adaptive.max (" + std::to_string(p.max.count()) +
                                                " ns) is below options.adaptive.min (" + std::to_string(p.min.count()) +
                                                " ns)");
    if (p.min_samples == 0) throw error(errc::invalid_argument, "options.adaptive.min_samples is 0; it must be at least 1");
    if (p.window != 0 && p.window < 2 * p.min_samples)
        throw error(errc::invalid_argument, "options.adaptive.window (" + std::to_string(p.window) +
                                                ") must be 0 (never age) or at least 2 x options.adaptive.min_samples (" +
                                                std::to_string(2 * p.min_samples) +
                                                "), so that ageing never drops an operation below min_samples");
}

/// The operation table and the leases it sets (top of file).
class operation_leases {
public:
    static constexpr std::size_t capacity = 64;
    static constexpr std::size_t max_name = 32;  ///< names are shown cut here (as the store's biz_type column)
    static_assert(std::has_single_bit(capacity), "linear probing masks with capacity - 1");

    explicit operation_leases(const adaptive_lease& policy) : policy_(policy) {
        check_adaptive_lease(policy_);
        std::random_device rd;
        seed_ = (std::uint64_t{rd()} << 32) ^ rd();
    }

    /// The lease a claim of `operation` gets now: the adaptive one once refresh() set it, else 0
    /// (the caller uses options.lease). Progress: wait-free, no allocation.
    [[nodiscard]] std::chrono::nanoseconds lease(std::string_view operation) const noexcept {
        const std::size_t i = lookup(id_of(operation));
        if (i == npos) return std::chrono::nanoseconds::zero();
        return std::chrono::nanoseconds(leases_[i].load(std::memory_order_relaxed));  // relaxed: top of file
    }

    /// Records one claim-to-completion time of `operation`. Progress: wait-free, no allocation.
    void record(std::string_view operation, std::chrono::nanoseconds d) noexcept {
        const std::size_t i = find_or_claim(id_of(operation), operation);
        (i == npos ? other_ : hist_[i]).record(d);
    }

    /// Recomputes every operation's lease (and ages the histograms). Not on the hot path.
    void refresh() noexcept {
        if (refreshing_.test_and_set(std::memory_order_acquire)) return;  // another refresh runs: its result stands
        for (std::size_t i = 0; i < capacity; ++i) {
            if (ids_[i].load(std::memory_order_relaxed) == 0) continue;  // relaxed: identity only
            if (policy_.window != 0 && hist_[i].count() > policy_.window) hist_[i].halve();
            const auto c = hist_[i].read();
            const std::int64_t l = c.total >= policy_.min_samples ? adaptive_lease_of(*c.quantile(0.99), policy_).count()
                                                                  : 0;
            leases_[i].store(l, std::memory_order_relaxed);  // relaxed: top of file
        }
        if (policy_.window != 0 && other_.count() > policy_.window) other_.halve();
        refreshing_.clear(std::memory_order_release);
    }

    /// One row per operation seen (in table order), then the shared "other" row (operation "") if
    /// it has samples. `fallback` is options.lease, the lease of an operation without its own.
    [[nodiscard]] std::vector<operation_latency> snapshot(std::chrono::nanoseconds fallback) const {
        std::vector<operation_latency> out;
        auto row = [&](std::string name, const latency_histogram& h, std::int64_t lease) {
            const auto c = h.read();
            operation_latency o;
            o.operation = std::move(name);
            o.samples = c.total;
            o.p50 = c.quantile(0.50).value_or(std::chrono::nanoseconds::zero());
            o.p99 = c.quantile(0.99).value_or(std::chrono::nanoseconds::zero());
            o.adaptive = lease != 0;
            o.lease = lease != 0 ? std::chrono::nanoseconds(lease) : fallback;
            out.push_back(std::move(o));
        };
        for (std::size_t i = 0; i < capacity; ++i) {
            const std::uint64_t w = ids_[i].load(std::memory_order_acquire);  // (3) pairs with (2): the name
            if (w == 0) continue;
            const std::string name = (w & 1) ? std::string(names_[i].data(), name_sizes_[i]) : std::string("?");
            row(name, hist_[i], leases_[i].load(std::memory_order_relaxed));  // relaxed: top of file
        }
        if (other_.count() != 0) row(std::string(), other_, 0);
        return out;
    }

    [[nodiscard]] const adaptive_lease& policy() const noexcept { return policy_; }

private:
    static constexpr std::size_t npos = capacity;

    /// The keyed hash with bit 1 set (never 0, also with bit 0 clear) and bit 0 clear.
    [[nodiscard]] std::uint64_t id_of(std::string_view operation) const noexcept {
        return (XXH3_64bits_withSeed(operation.data(), operation.size(), seed_) | 2) & ~std::uint64_t{1};
    }

    /// The operation's slot, or npos (not in the table). Progress: wait-free.
    [[nodiscard]] std::size_t lookup(std::uint64_t id) const noexcept {
        std::size_t i = static_cast<std::size_t>(id >> 1) & (capacity - 1);
        for (std::size_t n = 0; n < capacity; ++n, i = (i + 1) & (capacity - 1)) {
            const std::uint64_t w = ids_[i].load(std::memory_order_relaxed);  // relaxed: identity only (top of file)
            if (w == 0) return npos;
            if ((w | 1) == (id | 1)) return i;
        }
        return npos;
    }

    /// The operation's slot, claimed for it if it has none, or npos when the table is full.
    /// Progress: wait-free (at most one CAS per slot probed).
    std::size_t find_or_claim(std::uint64_t id, std::string_view name) noexcept {
        std::size_t i = static_cast<std::size_t>(id >> 1) & (capacity - 1);
        for (std::size_t n = 0; n < capacity; ++n, i = (i + 1) & (capacity - 1)) {
            std::uint64_t w = ids_[i].load(std::memory_order_relaxed);  // relaxed: identity only (top of file)
            // (1) relaxed CAS: the word is the identity; nothing else is published with it.
            if (w == 0 && ids_[i].compare_exchange_strong(w, id, std::memory_order_relaxed)) {
                const std::size_t len = std::min(name.size(), max_name);
                std::memcpy(names_[i].data(), name.data(), len);
                name_sizes_[i] = static_cast<std::uint8_t>(len);
                ids_[i].store(id | 1, std::memory_order_release);  // (2) pairs with (3): the name is written
                return i;
            }
            if ((w | 1) == (id | 1)) return i;  // w: the word seen, or the CAS winner's id
        }
        return npos;
    }

    adaptive_lease policy_;
    std::uint64_t seed_ = 0;
    std::array<std::atomic<std::uint64_t>, capacity> ids_{};
    std::array<std::atomic<std::int64_t>, capacity> leases_{};
    std::array<std::array<char, max_name>, capacity> names_{};  // written once, before (2)
    std::array<std::uint8_t, capacity> name_sizes_{};
    std::array<latency_histogram, capacity> hist_{};
    latency_histogram other_;
    std::atomic_flag refreshing_;
};

}  // namespace idem::detail::table
