// idem/detail/pipeline/flush_queue.hpp: the bounded queue between the hot path and the flusher.
//
// A ring of `capacity` cells, each carrying a sequence number that says whose turn it is (Dmitry
// Vyukov's bounded MPMC queue). For the position pos a thread took, cell pos % capacity holds:
//   seq == pos                free: the producer of pos may write it
//   seq == pos + 1            the row of pos: the consumer of pos may read it
//   seq == pos + capacity     read and given back: free for the producer of pos + capacity
// Producers take positions with a fetch_add on tail_, consumers with a CAS on head_; each then
// owns its cell alone until it publishes the next sequence number.
//
// Bounded by the caller, not by the ring. pipeline_core admits a row only under a reservation
// (room_ counts free room and is given back after a pop completed), so at most `capacity` rows are
// ever reserved and not yet popped, and the cell a producer's position lands on has always been
// given back by the pop `capacity` positions earlier, or is being given back by a consumer already
// past its CAS (abandon() on two lanes at once at shutdown, which gives no room back). A producer
// therefore never backs out: push() waits for its cell only in that instant, never for room.
//
// Every access to a row is ordered by its cell's sequence number (release store, acquire load), so
// ThreadSanitizer models the queue exactly and reports nothing: unlike a node-based queue with a
// tagged-pointer freelist, no thread ever reads memory another thread may be writing.
//
// Progress: push() is wait-free when the caller holds a reservation (the only use), except for the
// shutdown case above. try_pop() is lock-free; it answers "empty" at a position whose producer
// has taken it and not yet written it (later rows wait for it: the flusher looks again).
//
// Memory ordering
//   (Q1) cell seq load in push, acquire: pairs with (Q4), so the producer writes the cell only after
//        the consumer that gave it back has read it.
//   (Q2) cell seq store in push (pos + 1), release: publishes the row; pairs with (Q3).
//   (Q3) cell seq load in try_pop, acquire: pairs with (Q2), so the consumer reads the row written.
//   (Q4) cell seq store in try_pop (pos + capacity), release: gives the cell back; pairs with (Q1).
//   tail_ and head_ are relaxed: they only hand out positions; the cells' sequence numbers order
//   the data.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>

namespace idem::detail::pipeline {

template <class T>
class flush_queue {
    static_assert(std::is_trivially_copyable_v<T>, "rows are copied in and out of cells by value");

public:
    explicit flush_queue(std::size_t capacity) : capacity_(capacity), cells_(new cell[capacity]) {
        for (std::size_t i = 0; i < capacity_; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);  // before sharing
    }
    flush_queue(const flush_queue&) = delete;
    flush_queue& operator=(const flush_queue&) = delete;

    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

    /// Enqueues `v`. The caller must hold one of at most capacity() reservations (see above).
    void push(const T& v) noexcept {
        const std::uint64_t pos = tail_.fetch_add(1, std::memory_order_relaxed);  // relaxed: see header
        cell& c = cells_[pos % capacity_];
        while (c.seq.load(std::memory_order_acquire) != pos) std::this_thread::yield();  // (Q1) pairs with (Q4)
        c.value = v;
        c.seq.store(pos + 1, std::memory_order_release);  // (Q2) pairs with (Q3)
    }

    /// Dequeues the oldest row into `out`; false when there is none ready.
    [[nodiscard]] bool try_pop(T& out) noexcept {
        std::uint64_t pos = head_.load(std::memory_order_relaxed);  // relaxed: the CAS decides
        for (;;) {
            cell& c = cells_[pos % capacity_];
            const std::uint64_t seq = c.seq.load(std::memory_order_acquire);  // (Q3) pairs with (Q2)
            const auto diff = static_cast<std::int64_t>(seq - (pos + 1));
            if (diff == 0) {
                if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {  // relaxed: see header
                    out = c.value;
                    c.seq.store(pos + capacity_, std::memory_order_release);  // (Q4) pairs with (Q1)
                    return true;
                }
            } else if (diff < 0) {
                return false;  // nothing written at pos yet
            } else {
                pos = head_.load(std::memory_order_relaxed);  // another consumer took pos
            }
        }
    }

private:
    struct cell {
        std::atomic<std::uint64_t> seq{0};
        T value{};
    };
    static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the queue must not hide a lock");

    const std::size_t capacity_;
    const std::unique_ptr<cell[]> cells_;
    alignas(64) std::atomic<std::uint64_t> tail_{0};  // producers; a line apart from head_ (no false sharing)
    alignas(64) std::atomic<std::uint64_t> head_{0};  // consumers
};

}  // namespace idem::detail::pipeline
