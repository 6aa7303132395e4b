// idem/detail/rocks/expiry_filter.hpp: which records rocksdb_store may drop once they are past the
// idempotency window, and the compaction filter that drops them (rocksdb_options::window).
//
// Invariant: only a record that is terminal (SUCCESS, FAILED) or RELEASED and was last updated
// before the bound is ever dropped; a PROCESSING record, an audit row, or a value that does not
// decode (kept for load() to report as corrupt_record) never is. The filter runs on RocksDB's
// compaction threads and holds only the window, so it shares nothing with the store's thread.
#pragma once

#include <rocksdb/compaction_filter.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/detail/rocks/codec.hpp"
#include "idem/detail/rows/batch_fold.hpp"
#include "idem/error.hpp"
#include "idem/store.hpp"

namespace idem::detail::rocks {

/// Whether a record in `state` last updated at `updated_ms` is past a window that ends at
/// `before_ms`: terminal or RELEASED, and older. PROCESSING records are never pruned.
[[nodiscard]] constexpr bool expired(record_state state, std::int64_t updated_ms, std::int64_t before_ms) noexcept {
    return (rows::is_terminal(state) || state == record_state::released) && updated_ms < before_ms;
}

/// Unix time in milliseconds, the clock of updated_time.
[[nodiscard]] inline std::int64_t now_ms() noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/// Drops expired records during compaction. Thread-safe: it holds only the window. A value that
/// does not decode is kept, for load() to report.
class expiry_filter final : public rocksdb::CompactionFilter {
public:
    explicit expiry_filter(std::chrono::milliseconds window) : window_(window) {}
    bool Filter(int, const rocksdb::Slice& k, const rocksdb::Slice& v, std::string*, bool*) const override {
        if (k.size() < 2 || k[0] != record_prefix) return false;
        const std::int64_t now = now_ms();
        try {
            const stored_record r = decode_record("", std::string_view(k.data() + 1, k.size() - 1),
                                                  std::string_view(v.data(), v.size()));
            return expired(r.state, r.updated_ms, now - window_.count());
        } catch (const error&) {
            return false;
        }
    }
    const char* Name() const override { return "idem.expiry_filter"; }

private:
    std::chrono::milliseconds window_;
};

}  // namespace idem::detail::rocks
