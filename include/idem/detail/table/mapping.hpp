// idem/detail/table/mapping.hpp: the record table's memory: anonymous mappings in huge or 4 KiB pages.
//
// Invariants
// ----------
// * What map_words returns reads as atomics holding 0: with std::atomic it is fresh anonymous
//   memory (zero pages are atomics holding 0: see zero_pages_ok_v and the static_asserts in
//   slot.hpp); other atomic types (test hooks, model checkers) are constructed and stored 0.
// * A huge-backed mapping starts on a 2 MiB boundary, so every 2 MiB of it can be one huge page.
// * Memory is committed lazily: a page is faulted in by its first touch (all at once with
//   prefault). Nothing is unmapped before unmap_words, which takes exactly the count mapped.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <type_traits>

#include <sys/mman.h>
#include <unistd.h>

#include "idem/detail/table/slot.hpp"
#include "idem/error.hpp"

namespace idem::detail::table {

template <class T>
inline constexpr bool zero_pages_ok_v = std::is_same_v<T, std::atomic<std::uint64_t>> ||
                                        std::is_same_v<T, slot<std::atomic>>;

/// Transparent huge pages are 2 MiB on x86-64 and on arm64 with 4 KiB base pages.
inline constexpr std::size_t huge_page = std::size_t{2} << 20;

/// How a mapping is backed. `huge`: MADV_HUGEPAGE, for arenas filled from their start (a huge page
/// is committed only when a claim reaches it, and then it is used in full) and for an index small
/// enough that a few thousand claims touch all of it anyway. `small`: 4 KiB pages, for a large index,
/// which is touched at random: in huge pages, 1,000 claims on a 256 MiB index would commit nearly all
/// of it (a huge page each), in 4 KiB pages 4 MiB.
enum class backing : std::uint8_t { huge, small };

/// Largest index (bytes per generation) mapped in huge pages; beyond it, 4 KiB pages (see backing).
inline constexpr std::size_t huge_index_limit = std::size_t{32} << 20;

/// Arrays of atomics for the record table. With std::atomic they come from anonymous mmap: zero
/// pages, faulted in on first touch (or all at once with prefault). std::atomic<integer> is
/// lock-free and its object representation is the integer's, so zero pages are atomics holding 0
/// (static_asserts in slot.hpp). Other atomic types (test hooks, model checkers) are constructed.
template <class T>
T* map_words(std::size_t count, bool prefault, backing how = backing::huge) {
    if constexpr (zero_pages_ok_v<T>) {
        // Whole pages: the tail trimmed below must start on a page boundary, or its munmap fails
        // and leaves up to 2 MiB mapped per small table (unmap_words' length rounds up the same way).
        const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        const std::size_t bytes = (count * sizeof(T) + page - 1) / page * page;
        // Over-map by a huge page and trim both ends, so the mapping starts on a 2 MiB boundary and
        // every 2 MiB of it can be one huge page (an unaligned start splits the first and last).
        const std::size_t span = how == backing::huge ? bytes + huge_page : bytes;
        void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED)
            throw error(errc::invalid_argument,
                        "cannot map " + std::to_string(bytes) + " bytes for the record table; lower options.capacity");
        auto* p = static_cast<char*>(raw);
        if (how == backing::huge) {
            const auto addr = reinterpret_cast<std::uintptr_t>(raw);
            const std::size_t head = (huge_page - addr % huge_page) % huge_page;
            if (head != 0) ::munmap(p, head);
            ::munmap(p + head + bytes, huge_page - head);
            p += head;
            // Lookups land on random lines of a large table: with 4 KiB pages nearly every one is a
            // TLB miss (a two-level page walk under virtualization), and filling an arena costs a
            // fault per 4 KiB instead of per 2 MiB. Best effort: ignored where THP is off.
            (void)::madvise(p, bytes, MADV_HUGEPAGE);
        }
        if (prefault) {
            (void)::madvise(p, bytes, MADV_WILLNEED);
            auto* c = static_cast<volatile char*>(p);
            for (std::size_t i = 0; i < bytes; i += 4096) c[i] = 0;  // fault every page in, now
        }
        return reinterpret_cast<T*>(p);
    } else {
        T* p = static_cast<T*>(::operator new[](count * sizeof(T), std::align_val_t{alignof(T)}));
        for (std::size_t i = 0; i < count; ++i) new (&p[i]) T();
        if constexpr (requires(T & t) { t.store(std::uint64_t{0}, std::memory_order_relaxed); })
            for (std::size_t i = 0; i < count; ++i) p[i].store(0, std::memory_order_relaxed);  // relaxed: before publication
        return p;
    }
}

template <class T>
void unmap_words(T* p, std::size_t count) noexcept {
    if constexpr (zero_pages_ok_v<T>) {
        ::munmap(p, count * sizeof(T));
    } else {
        for (std::size_t i = 0; i < count; ++i) p[i].~T();
        ::operator delete[](p, std::align_val_t{alignof(T)});
    }
}

}  // namespace idem::detail::table
