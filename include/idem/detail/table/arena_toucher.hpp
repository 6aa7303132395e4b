// idem/detail/table/arena_toucher.hpp: a thread that keeps the arenas' pages populated ahead of their
// allocation frontier, so claims do not take a first-touch fault on the hot path.
//
// Invariants
// ----------
// * It never writes a byte (MADV_POPULATE_WRITE, or fetch_or(0) per page), so it needs no ordering
//   with the claims that write there.
// * What it has populated never shrinks: the arenas stay mapped while it runs (the record table declares
//   it last, so it stops before the generations are unmapped).
// * Its thread sleeps on the bell, which an allocation rings once when it passes the armed chunk.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include "idem/detail/table/arenas.hpp"
#include "idem/detail/table/mapping.hpp"
#include "idem/detail/table/stripes.hpp"

namespace idem::detail::table {

/// Keeps the arenas' pages populated ahead of their allocation frontier, from a thread of its own,
/// so claims do not take the first-touch fault of a huge page (zeroing 2 MiB: about 0.2 ms; on a VM
/// whose host took the memory back, up to several ms) on the hot path. An arena in use is kept
/// populated `ahead` bytes beyond its frontier (the chunks handed out); the first chunk allocated
/// beyond the half of that margin rings the toucher's bell (chunk_allocator::call_at), so a claim
/// pays at most one futex wake per `ahead / 2` bytes of arena and the toucher sleeps otherwise.
/// Memory stays committed lazily: a guard holding n records has populated at most its n records'
/// arena pages plus `ahead` per arena in use. Populating never writes a byte (MADV_POPULATE_WRITE;
/// before Linux 5.14, an atomic `fetch_or(0)` per 4 KiB page, which changes no value either), so it
/// needs no ordering with the claims that write there.
class arena_toucher {
public:
    using span = arena_span<std::atomic>;
    static constexpr std::size_t ahead = std::size_t{4} << 20;

    /// Populates the first `ahead` bytes of the arenas in `now` (and the index `index`, if any) before
    /// returning, then starts the thread that keeps every arena ahead.
    arena_toucher(std::vector<span> arenas, std::size_t now, char* index, std::size_t index_bytes)
        : regions_(arenas.size()) {
        for (std::size_t i = 0; i < arenas.size(); ++i) regions_[i].a = arenas[i];
        if (index != nullptr) populate(index, index_bytes);
        for (std::size_t i = 0; i < now && i < regions_.size(); ++i) advance_to(regions_[i], ahead);
        for (auto& r : regions_) {
            r.a.alloc->attach(&bell_);
            rearm(r);
        }
        thread_ = std::thread([this] { run(); });
    }
    ~arena_toucher() {
        stop_.store(true, std::memory_order_relaxed);   // relaxed: published by the release RMW below
        bell_.fetch_add(1, std::memory_order_release);  // pairs with the acquire load in run()
        bell_.notify_one();
        thread_.join();
    }
    arena_toucher(const arena_toucher&) = delete;
    arena_toucher& operator=(const arena_toucher&) = delete;

    /// Populates [p, p + bytes): fault the pages in as a write would, without writing.
    static void populate(char* p, std::size_t bytes) noexcept {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
        if (bytes == 0 || ::madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
        for (std::size_t i = 0; i < bytes; i += 4096)
            __atomic_fetch_or(reinterpret_cast<std::uint64_t*>(p + i), 0, __ATOMIC_RELAXED);  // relaxed: changes nothing
    }

private:
    struct region {
        span a{};
        std::size_t populated = 0;  ///< bytes from the start known populated (never falls: memory stays)
    };

    /// How far `r` should be populated: `ahead` beyond its frontier, once it is in use.
    [[nodiscard]] static std::size_t wanted(const region& r) noexcept {
        const std::size_t frontier = r.a.alloc->taken() * r.a.chunk_bytes;
        return frontier == 0 ? 0 : std::min(r.a.bytes, frontier + ahead);
    }
    static void advance_to(region& r, std::size_t target) noexcept {
        target = std::min(r.a.bytes, target);
        if (r.populated >= target) return;
        populate(r.a.base + r.populated, target - r.populated);
        r.populated = target;
    }
    /// Rings when the frontier comes within ahead / 2 of what is populated (at once, while unused).
    void rearm(region& r) noexcept {
        const std::size_t at = r.populated > ahead / 2 ? (r.populated - ahead / 2) / r.a.chunk_bytes : 0;
        r.a.alloc->call_at(r.populated >= r.a.bytes ? chunk_allocator<std::atomic, stripe_count>::npos : at);
    }
    void run() noexcept {
        for (;;) {
            // acquire: a bell rung by ~arena_toucher (release) shows its stop_; claimers' rings
            // need no order (the frontier is re-read below)
            const std::uint32_t seen = bell_.load(std::memory_order_acquire);
            if (stop_.load(std::memory_order_relaxed)) return;  // relaxed: ordered by the acquire above
            bool behind = false;
            for (auto& r : regions_) {
                const std::size_t want = wanted(r);
                if (r.populated >= want) continue;
                // One huge page per step, so the other arenas get their turn; skip what the claims
                // already faulted in themselves.
                const std::size_t frontier = r.a.alloc->taken() * r.a.chunk_bytes;
                r.populated = std::max(r.populated, frontier / huge_page * huge_page);
                advance_to(r, std::min(want, (r.populated / huge_page + 1) * huge_page));
                behind = behind || r.populated < wanted(r);
            }
            if (behind) continue;
            for (auto& r : regions_) rearm(r);
            bool again = false;  // a frontier may have passed the new mark before it was armed
            for (auto& r : regions_) again = again || r.populated < wanted(r);
            if (!again) bell_.wait(seen, std::memory_order_relaxed);
        }
    }

    std::vector<region> regions_;
    std::atomic<std::uint32_t> bell_{0};
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace idem::detail::table
