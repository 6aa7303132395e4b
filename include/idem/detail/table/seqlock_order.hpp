// idem/detail/table/seqlock_order.hpp: the seqlock's fences (8) and (9), and what stands for them under
// ThreadSanitizer.
//
// The slot seqlock pairs two fences (record_table.hpp, "Memory ordering"):
//   (9) writer: release fence after the word enters a transient state (claiming, completing,
//       recycling), before the field stores;
//   (8) reader: acquire fence after the field loads, before the load that validates the word.
// When a field load before (8) reads a store made after (9), (9) synchronizes with (8): the
// transient word happens-before the validation load, which sees it (or a later word), so the
// snapshot is refused.
//
// ThreadSanitizer does not model std::atomic_thread_fence: GCC says so with -Wtsan (an error
// under -Werror), and TSan would not see that synchronization. So under TSan the fences are left
// out and the field accesses they bracket carry the order themselves: field_store is release,
// field_load acquire. That is at least as strong for this pairing, access by access: a release
// field store that an acquire field load reads synchronizes with it, so everything sequenced before
// the store (the transient word, which (9) would have ordered) happens-before the load and so
// before the validation load after it, as with (9) and (8). Normal builds keep relaxed field
// accesses and the two fences: free on x86, and on ARM one barrier per side instead of one per field.
#pragma once

#include <atomic>

#if defined(__SANITIZE_THREAD__)  // GCC, and clang since 14
#define IDEM_DETAIL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)  // older clang
#define IDEM_DETAIL_TSAN 1
#endif
#endif
#ifndef IDEM_DETAIL_TSAN
#define IDEM_DETAIL_TSAN 0
#endif

namespace idem::detail::table::seqlock {

/// True when this build carries the fences (8) and (9); false under ThreadSanitizer.
inline constexpr bool uses_fences = IDEM_DETAIL_TSAN == 0;

/// Order of a field store made while holding a transient word: relaxed after (9); release without it.
inline constexpr std::memory_order field_store = uses_fences ? std::memory_order_relaxed : std::memory_order_release;
/// Order of a field load that a validation load checks: relaxed before (8); acquire without it.
inline constexpr std::memory_order field_load = uses_fences ? std::memory_order_relaxed : std::memory_order_acquire;

/// (9) right after the word entered a transient state.
inline void writer_fence() noexcept {
#if !IDEM_DETAIL_TSAN
    std::atomic_thread_fence(std::memory_order_release);  // (9)
#endif
}

/// (8) after the field loads, before the relaxed load that validates the word.
inline void reader_fence() noexcept {
#if !IDEM_DETAIL_TSAN
    std::atomic_thread_fence(std::memory_order_acquire);  // (8)
#endif
}

}  // namespace idem::detail::table::seqlock
