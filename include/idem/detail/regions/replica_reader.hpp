// idem/detail/regions/replica_reader.hpp: reads, in this region's own cluster, the replica of a
// foreign home's schema (names.hpp), for regional_guard's duplicates.
//
// What it may answer. Only a SUCCESS or FAILED row: those are final (no one changes them again,
// only a prune removes them), so a copy that arrived by replication is as good as the home's row.
// A PROCESSING or RELEASED copy may be stale; the caller asks the home then. The one staleness a
// final copy can have is a prune the replica has not applied yet: the same as the local table's
// terminal records, bounded by the window (regional_guard documents it).
//
// Failure is never an answer: a connection that cannot be made, a call past its deadline, a
// schema not set up yet all give "nothing here" (the caller asks the home), counted in errors().
// After a failure the reader waits `retry_after` before it tries that connection again, so a local
// cluster that is down costs the callers nothing but the home's round trip.
//
// Thread-safety: read() may be called from any thread; connections are a small pool, each under
// its own mutex (a caller takes the first free one, and waits on one only when all are busy).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "idem/detail/global/claim_batcher.hpp"
#include "idem/stores/postgres_store.hpp"

namespace idem::detail::regions {

class replica_reader {
public:
    /// `conninfo`: this region's cluster with search_path on the foreign home's schema.
    replica_reader(std::string conninfo, std::size_t connections, std::chrono::milliseconds deadline,
                   std::chrono::milliseconds retry_after = std::chrono::seconds(1))
        : conninfo_(std::move(conninfo)), deadline_(deadline), retry_after_(retry_after), slots_(connections) {}

    /// k's row in the replica when it is SUCCESS or FAILED, else nothing. noexcept: any failure is
    /// nothing (counted).
    std::optional<global::found_row> read(const key& k) noexcept {
        slot* s = nullptr;
        std::unique_lock<std::mutex> lk;
        for (auto& c : slots_) {
            std::unique_lock<std::mutex> l(c.m, std::try_to_lock);
            if (l.owns_lock()) {
                s = &c;
                lk = std::move(l);
                break;
            }
        }
        if (s == nullptr) {  // all busy: wait for one, spread by thread
            s = &slots_[std::hash<std::thread::id>{}(std::this_thread::get_id()) % slots_.size()];
            lk = std::unique_lock<std::mutex>(s->m);
        }
        try {
            const auto now = std::chrono::steady_clock::now();
            if (!s->st) {
                if (now < s->retry_at) return std::nullopt;
                s->st = std::make_unique<postgres_store>(conninfo_, deadline_);
            }
            auto r = s->st->get(k.view());
            ++reads_;
            if (!r || (r->state != record_state::succeeded && r->state != record_state::failed)) return std::nullopt;
            ++hits_;
            return global::found_row{r->state, r->fence, r->outcome, r->fingerprint, false, std::move(r->payload)};
        } catch (...) {
            ++errors_;
            s->st.reset();
            s->retry_at = std::chrono::steady_clock::now() + retry_after_;
            return std::nullopt;
        }
    }

    [[nodiscard]] std::uint64_t reads() const noexcept { return reads_.load(std::memory_order_relaxed); }
    [[nodiscard]] std::uint64_t hits() const noexcept { return hits_.load(std::memory_order_relaxed); }
    [[nodiscard]] std::uint64_t errors() const noexcept { return errors_.load(std::memory_order_relaxed); }

private:
    struct slot {
        std::mutex m;
        std::unique_ptr<postgres_store> st;  // under m; opened on first use, dropped on failure
        std::chrono::steady_clock::time_point retry_at{};
    };
    std::string conninfo_;
    std::chrono::milliseconds deadline_;
    std::chrono::milliseconds retry_after_;
    std::vector<slot> slots_;
    std::atomic<std::uint64_t> reads_{0}, hits_{0}, errors_{0};  // statistics
};

}  // namespace idem::detail::regions
