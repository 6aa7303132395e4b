// tools/ledger.hpp: the demo's application: an in-memory ledger of accounts and balances.
//
// The ledger is what the guard protects, not part of it: its own thread-safety comes from one
// atomic balance per account (each on its own cache line, so transfers between different accounts
// never share a line). A transfer debits the payer with a compare-and-swap that refuses to go
// below zero (declined: insufficient funds), then credits the payee. Money is in integer cents.
//
// Thread-safety: transfer() may be called from any thread; balance() and total() are exact once
// the threads that transfer have been joined (in between they may see a debit without its credit).
// Progress: transfer() is lock-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace idem::tool {

class ledger {
public:
    ledger(std::size_t accounts, std::int64_t opening_balance)
        : accounts_(std::make_unique<account[]>(accounts)), size_(accounts), opening_(opening_balance) {
        for (std::size_t i = 0; i < size_; ++i)
            accounts_[i].balance.store(opening_balance, std::memory_order_relaxed);  // relaxed: before the threads start
    }

    /// Moves `amount` cents from `from` to `to`; false (and no change) when `from` has too little.
    bool transfer(std::size_t from, std::size_t to, std::int64_t amount) noexcept {
        // relaxed throughout: each balance is an independent counter whose own modification order is
        // all a transfer needs; the totals are read after the workers are joined (join synchronizes).
        std::atomic<std::int64_t>& payer = accounts_[from].balance;
        std::int64_t b = payer.load(std::memory_order_relaxed);
        do {
            if (b < amount) return false;
        } while (!payer.compare_exchange_weak(b, b - amount, std::memory_order_relaxed));
        accounts_[to].balance.fetch_add(amount, std::memory_order_relaxed);
        return true;
    }

    [[nodiscard]] std::int64_t balance(std::size_t a) const noexcept {
        return accounts_[a].balance.load(std::memory_order_relaxed);  // relaxed: read after join
    }
    [[nodiscard]] std::int64_t total() const noexcept {
        std::int64_t sum = 0;
        for (std::size_t i = 0; i < size_; ++i) sum += balance(i);
        return sum;
    }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] std::int64_t opening_balance() const noexcept { return opening_; }
    [[nodiscard]] std::int64_t opening_total() const noexcept { return opening_ * static_cast<std::int64_t>(size_); }

private:
    struct alignas(64) account {
        std::atomic<std::int64_t> balance{0};
    };
    static_assert(sizeof(account) == 64,
                  "one account per cache line: transfers on different accounts must not "
                  "contend on a shared line");
    static_assert(std::atomic<std::int64_t>::is_always_lock_free, "a balance must be a lock-free atomic");

    std::unique_ptr<account[]> accounts_;
    std::size_t size_;
    std::int64_t opening_;
};

}  // namespace idem::tool
