// idem/detail/assert.hpp: assertions in the code, two kinds.
//
//   IDEM_ASSERT(cond, what)        cold paths (open, recovery, rotation, the flusher, stores): always
//                                  on, in every build. A violation prints the file, the line, the
//                                  condition and `what` (a string literal naming the rule) to stderr
//                                  and aborts: a broken invariant of a library that decides whether
//                                  money moves must stop the process, not degrade silently.
//   IDEM_DEBUG_ASSERT(cond, what)  hot paths (claim, completion, reads: the table and the queue):
//                                  checked when IDEM_DEBUG_ASSERTS is 1, which is the default in a
//                                  build without NDEBUG and in the sanitizer builds (the build sets
//                                  it); otherwise it compiles to nothing: the condition is only
//                                  named inside an unevaluated sizeof, so it is type-checked and
//                                  never run. scripts/count-instructions shows a Release build of the
//                                  hot path carries no instruction for it (docs/internals/HACKING.md).
//
// Paired assertions: where a value crosses a boundary (a row handed to a store, a record image
// installed in the table), the producer asserts what it promises and the consumer what it needs.
#pragma once

#include <cstdio>
#include <cstdlib>

#ifndef IDEM_DEBUG_ASSERTS
#ifdef NDEBUG
#define IDEM_DEBUG_ASSERTS 0
#else
#define IDEM_DEBUG_ASSERTS 1
#endif
#endif

namespace idem::detail {

/// Reports a violated assertion and aborts. Out of line and cold, so the check at the call site is
/// one compare and a branch that is predicted not taken.
[[noreturn, gnu::cold, gnu::noinline]] inline void assertion_failed(const char* file, int line, const char* cond,
                                                                    const char* what) noexcept {
    std::fprintf(stderr, "idem: assertion failed at %s:%d: %s (%s)\n", file, line, what, cond);
    std::fflush(stderr);
    std::abort();
}

}  // namespace idem::detail

#define IDEM_ASSERT(cond, what)                                                \
    do {                                                                       \
        if (!(cond)) [[unlikely]]                                              \
            ::idem::detail::assertion_failed(__FILE__, __LINE__, #cond, what); \
    } while (false)

#if IDEM_DEBUG_ASSERTS
#define IDEM_DEBUG_ASSERT(cond, what) IDEM_ASSERT(cond, what)
#else
#define IDEM_DEBUG_ASSERT(cond, what) static_cast<void>(sizeof(static_cast<bool>(cond)))
#endif
