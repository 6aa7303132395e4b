// race_test: exactly-once claims under contention (the seed's 100-thread test, repeated over many
// rounds and keys), and a completing owner racing compensation of its expired lease.
//
// Environment: IDEM_SEED (replay), IDEM_THREADS, IDEM_ROUNDS, IDEM_KEYS.
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <array>
#include <atomic>
#include <latch>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "support/manual_guard.hpp"
#include "support/threads.hpp"
#include "support/yielding_atomic.hpp"

namespace {

using idem::begin_status;
using idem::errc;
using idem_test::mix;

std::uint64_t outcome_of(std::size_t round, std::size_t k) { return mix(round * 1'000'003u + k); }

// 100 threads released by one latch race begin() on the same keys. Per key: exactly one thread
// acquires; every other thread is told in_progress or succeeded, and a succeeded answer carries the
// owner's outcome. In odd rounds each thread walks the keys in its own seeded order.
TEST(Race, HundredThreadsExactlyOneAcquires) {
    const std::uint64_t seed = idem_test::test_seed();
    SCOPED_TRACE("IDEM_SEED=" + std::to_string(seed));
    const std::size_t threads = idem_test::env_size("IDEM_THREADS", 100, 100);
    const std::size_t rounds = idem_test::env_size("IDEM_ROUNDS", 40, 6);
    const std::size_t keys = idem_test::env_size("IDEM_KEYS", 64, 24);

    idem::guard g(idem_test::test_options(rounds * keys + 16));
    for (std::size_t round = 0; round < rounds; ++round) {
        std::vector<idem::key> ks;
        for (std::size_t k = 0; k < keys; ++k)
            ks.push_back(idem::key("R" + std::to_string(round) + "_K" + std::to_string(k)));
        struct tally {
            std::atomic<int> acquired{0}, in_progress{0}, succeeded{0}, wrong_outcome{0}, other{0};
        };
        std::vector<tally> t(keys);
        std::vector<std::vector<std::size_t>> order(threads);
        std::mt19937_64 rng(seed ^ mix(round));
        for (auto& o : order) {
            o.resize(keys);
            for (std::size_t k = 0; k < keys; ++k) o[k] = k;
            if (round % 2 == 1) std::shuffle(o.begin(), o.end(), rng);
        }
        idem_test::run_on_latch(threads, [&](std::size_t i) {
            for (std::size_t k : order[i]) {
                auto r = g.begin(ks[k]);
                switch (r.status) {
                    case begin_status::acquired:
                        t[k].acquired.fetch_add(1);
                        if (r.ticket.succeed(outcome_of(round, k))) t[k].other.fetch_add(1);
                        break;
                    case begin_status::in_progress: t[k].in_progress.fetch_add(1); break;
                    case begin_status::succeeded:
                        t[k].succeeded.fetch_add(1);
                        if (r.outcome != outcome_of(round, k)) t[k].wrong_outcome.fetch_add(1);
                        break;
                    default: t[k].other.fetch_add(1); break;
                }
            }
        });
        for (std::size_t k = 0; k < keys; ++k) {
            SCOPED_TRACE("round " + std::to_string(round) + " key " + ks[k].str());
            ASSERT_EQ(t[k].acquired.load(), 1);
            ASSERT_EQ(t[k].in_progress.load() + t[k].succeeded.load(), static_cast<int>(threads) - 1);
            ASSERT_EQ(t[k].wrong_outcome.load(), 0);
            ASSERT_EQ(t[k].other.load(), 0);
            const auto v = g.query(ks[k]);
            ASSERT_EQ(v.state, idem::record_state::succeeded);
            ASSERT_EQ(v.outcome, outcome_of(round, k));
        }
    }
    const auto s = g.snapshot();
    EXPECT_EQ(s.acquired, rounds * keys);
    EXPECT_EQ(s.succeeded, rounds * keys);
    EXPECT_EQ(s.duplicates + s.in_progress_hits, rounds * keys * (threads - 1));
    EXPECT_EQ(s.stale_tickets, 0u);
}

// The seed's exact test, on one key: 100 threads, one winner, and the winner holds the claim until
// every loser has answered, so every loser must see in_progress (never succeeded, never acquired).
TEST(Race, HundredThreadsOneKeyHeldClaim) {
    const std::uint64_t seed = idem_test::test_seed();
    SCOPED_TRACE("IDEM_SEED=" + std::to_string(seed));
    const std::size_t threads = idem_test::env_size("IDEM_THREADS", 100, 100);
    const std::size_t rounds = idem_test::env_size("IDEM_ROUNDS", 40, 6);
    idem::guard g(idem_test::test_options(rounds + 16));
    for (std::size_t round = 0; round < rounds; ++round) {
        const idem::key k("TX" + std::to_string(seed % 100000) + "_" + std::to_string(round) + "_PAY_v1");
        std::atomic<int> acquired{0}, in_progress{0}, other{0};
        std::latch answered(static_cast<std::ptrdiff_t>(threads));
        idem_test::run_on_latch(threads, [&](std::size_t) {
            auto r = g.begin(k);
            if (r.status == begin_status::acquired) acquired.fetch_add(1);
            else if (r.status == begin_status::in_progress) in_progress.fetch_add(1);
            else other.fetch_add(1);
            answered.arrive_and_wait();  // the winner completes only after every loser answered
            if (r.ticket && r.ticket.succeed(round)) other.fetch_add(1);
        });
        ASSERT_EQ(acquired.load(), 1) << "round " << round;
        ASSERT_EQ(in_progress.load(), static_cast<int>(threads) - 1) << "round " << round;
        ASSERT_EQ(other.load(), 0) << "round " << round;
        auto again = g.begin(k);
        ASSERT_EQ(again.status, begin_status::succeeded);
        ASSERT_EQ(again.outcome, round);
    }
}

// An owner whose lease expired completes while one or two compensation passes resolve the same
// claim. Exactly one side wins per key: the owner's succeed() returns ok and no pass resolves it,
// or a pass resolves it and the owner gets stale_ticket. The record shows the winner's result.
// With the resolver answering unknown the claim is marked in doubt and the owner always wins.
TEST(Race, OwnerCompletionVersusCompensationResolvesOnce) {
    const std::uint64_t seed = idem_test::test_seed();
    SCOPED_TRACE("IDEM_SEED=" + std::to_string(seed));
    const std::size_t rounds = idem_test::env_size("IDEM_ROUNDS", 200, 24);
    const std::size_t keys = idem_test::env_size("IDEM_KEYS", 32, 16);
    constexpr std::size_t owners = 2, compensators = 2;
    constexpr std::array verdicts{idem::resolution::succeeded, idem::resolution::failed, idem::resolution::not_executed,
                                  idem::resolution::unknown};
    std::size_t owner_wins = 0, compensation_wins = 0;
    std::mt19937_64 rng(seed);

    for (std::size_t round = 0; round < rounds; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        const idem::resolution verdict = verdicts[round % verdicts.size()];
        const std::uint64_t resolver_outcome = 1'000'000 + round;
        idem::manual_clock clock;
        auto opts = idem_test::test_options(keys);
        opts.lease = std::chrono::seconds(1);
        std::atomic<int> asked{0};
        opts.resolve = [&](const idem::expired_claim&) {
            asked.fetch_add(1);
            return idem::resolver_answer{verdict, resolver_outcome};
        };
        idem_test::manual_guard g(opts, clock);
        std::vector<idem::key> ks;
        std::vector<idem_test::manual_ticket> tickets;
        for (std::size_t k = 0; k < keys; ++k) {
            ks.push_back(idem_test::key_n("L", k));
            auto r = g.begin(ks.back());
            ASSERT_EQ(r.status, begin_status::acquired);
            tickets.push_back(std::move(r.ticket));
        }
        clock.advance(opts.lease + std::chrono::nanoseconds(1 + rng() % 1000));

        std::vector<std::error_code> owner_result(keys);
        std::atomic<std::size_t> resolved{0};
        idem_test::run_on_latch(owners + compensators, [&](std::size_t i) {
            if (i < owners) {
                for (std::size_t k = i; k < keys; k += owners) {
                    // errc::busy: compensation holds the record for a moment; the ticket stays valid.
                    do owner_result[k] = tickets[k].succeed(k);
                    while (owner_result[k] == errc::busy);
                }
            } else {
                resolved.fetch_add(g.compensate());
            }
        });

        std::size_t owners_won = 0;
        for (std::size_t k = 0; k < keys; ++k) {
            SCOPED_TRACE("key " + ks[k].str());
            const auto v = g.query(ks[k]);
            if (!owner_result[k]) {
                ++owners_won;
                EXPECT_EQ(v.state, idem::record_state::succeeded);
                EXPECT_EQ(v.outcome, k);
            } else {
                ASSERT_EQ(owner_result[k], errc::stale_ticket);
                ASSERT_NE(verdict, idem::resolution::unknown) << "an in-doubt claim is still its owner's";
                switch (verdict) {
                    case idem::resolution::succeeded:
                        EXPECT_EQ(v.state, idem::record_state::succeeded);
                        EXPECT_EQ(v.outcome, resolver_outcome);
                        break;
                    case idem::resolution::failed: EXPECT_EQ(v.state, idem::record_state::failed); break;
                    default: EXPECT_EQ(v.state, idem::record_state::absent); break;
                }
            }
            EXPECT_FALSE(v.in_doubt);
        }
        EXPECT_EQ(owners_won + resolved.load(), keys) << "every claim is resolved exactly once";
        const auto s = g.snapshot();
        EXPECT_EQ(s.compensated, resolved.load());
        // A compensation pass that loses to the owner is counted as a stale completion too, so
        // stale_tickets is at least the number of stale owners.
        EXPECT_GE(s.stale_tickets, keys - owners_won);
        EXPECT_EQ(s.succeeded + s.failed + s.released, keys) << "one completion transition per claim";
        owner_wins += owners_won;
        compensation_wins += resolved.load();
        if (HasFailure()) break;
    }
    std::cout << "[ idem    ] owner won " << owner_wins << ", compensation won " << compensation_wins << '\n';
}

// Racing compensation passes alone (no owner): each expired claim is resolved by exactly one pass.
TEST(Race, ConcurrentCompensationPassesResolveEachClaimOnce) {
    const std::size_t rounds = idem_test::env_size("IDEM_ROUNDS", 100, 12);
    const std::size_t keys = idem_test::env_size("IDEM_KEYS", 32, 16);
    for (std::size_t round = 0; round < rounds; ++round) {
        idem::manual_clock clock;
        auto opts = idem_test::test_options(keys);
        opts.lease = std::chrono::seconds(1);
        opts.resolve = [](const idem::expired_claim& c) {
            return idem::resolver_answer{idem::resolution::succeeded, c.fence};
        };
        idem_test::manual_guard g(opts, clock);
        std::vector<idem_test::manual_ticket> tickets;
        for (std::size_t k = 0; k < keys; ++k) {
            auto r = g.begin(idem_test::key_n("C", k));
            ASSERT_EQ(r.status, begin_status::acquired);
            tickets.push_back(std::move(r.ticket));
        }
        clock.advance(std::chrono::seconds(2));
        std::atomic<std::size_t> resolved{0};
        idem_test::run_on_latch(4, [&](std::size_t) { resolved.fetch_add(g.compensate()); });
        ASSERT_EQ(resolved.load(), keys) << "round " << round;
        ASSERT_EQ(g.snapshot().compensated, keys);
        for (std::size_t k = 0; k < keys; ++k) {
            const auto v = g.query(idem_test::key_n("C", k));
            ASSERT_EQ(v.state, idem::record_state::succeeded);
            ASSERT_EQ(v.outcome, tickets[k].fence()) << "the resolver was told the claim's fence";
            ASSERT_EQ(tickets[k].succeed(), errc::stale_ticket);
        }
    }
}

// The key text lives in a per-generation arena that threads append to in per-stripe chunks and that
// recycling resets. Threads started on a latch claim keys of every length from 1 to 128 bytes (the
// longest keys fill the arena's per-slot reserve), over several generations, each recycled while the
// next one takes claims. Every record's text, as for_each and the compensation resolver read it,
// must be its own key: an overlapping entry, a reset under a live claim or a torn read would give a
// record another key's text (its outcome is a function of its own text, so that is checked too).
TEST(Race, KeyTextOfEveryRecordSurvivesRacingAppendsAndRecycling) {
    const std::size_t threads = idem_test::env_size("IDEM_THREADS", 8, 4);
    const std::size_t per_thread = 48;
    const std::size_t capacity = threads * per_thread;
    auto text_of = [](std::size_t gen, std::size_t t, std::size_t i) {
        // Length 1..128 spread over the keys; the prefix makes every key distinct.
        std::string s = "G" + std::to_string(gen) + "T" + std::to_string(t) + "I" + std::to_string(i) + "-";
        const std::size_t len = 1 + (t * per_thread + i) * 37 % idem::key::max_size;
        if (s.size() < len) s.append(len - s.size(), static_cast<char>('a' + (t + i) % 26));
        return s;  // never shorter than its prefix, so distinct even when len is small
    };
    auto outcome_for = [](std::string_view text) { return idem::fingerprint_of(text); };
    idem::manual_clock clock;
    auto opts = idem_test::test_options(capacity);
    opts.retention = std::chrono::seconds(1);
    opts.lease = std::chrono::seconds(10);
    std::vector<std::string> asked;  // key texts the resolver was asked about (compensate() runs on this thread)
    opts.resolve = [&asked](const idem::expired_claim& c) {
        asked.emplace_back(c.key);
        return idem::resolver_answer{idem::resolution::not_executed, 0};
    };
    idem_test::manual_guard g(opts, clock);
    for (std::size_t gen = 0; gen < 6; ++gen) {
        std::vector<std::vector<idem_test::manual_ticket>> held(threads);
        std::atomic<std::size_t> refused{0};
        idem_test::run_on_latch(threads, [&](std::size_t t) {
            for (std::size_t i = 0; i < per_thread; ++i) {
                const std::string text = text_of(gen, t, i);
                auto r = g.begin(idem::key(text));
                if (r.status != begin_status::acquired) {
                    refused.fetch_add(1);
                    continue;
                }
                if (i % 8 == 7) {
                    held[t].push_back(std::move(r.ticket));  // left processing: compensation reads its text
                } else if (r.ticket.succeed(outcome_for(text))) {
                    refused.fetch_add(1);
                }
            }
        });
        ASSERT_EQ(refused.load(), 0u) << "generation " << gen;
        // Every record of this generation, read back: own text, own outcome.
        std::set<std::string> expected, seen;
        for (std::size_t t = 0; t < threads; ++t)
            for (std::size_t i = 0; i < per_thread; ++i) expected.insert(text_of(gen, t, i));
        std::size_t wrong = 0;
        g.for_each([&](std::string text, const idem::record_view& v) {
            if (!expected.count(text)) return;  // a record of the previous generation, still in memory
            seen.insert(text);
            if (v.state == idem::record_state::succeeded && v.outcome != outcome_for(text)) ++wrong;
        });
        EXPECT_EQ(wrong, 0u) << "records whose outcome belongs to another key's text, generation " << gen;
        EXPECT_EQ(seen, expected) << "generation " << gen;
        // The held claims expire; the resolver must be asked about exactly their texts.
        asked.clear();
        clock.advance(std::chrono::seconds(11));
        EXPECT_EQ(g.compensate(), threads * per_thread / 8);
        std::set<std::string> want_asked;
        for (std::size_t t = 0; t < threads; ++t)
            for (std::size_t i = 7; i < per_thread; i += 8) want_asked.insert(text_of(gen, t, i));
        EXPECT_EQ(std::set<std::string>(asked.begin(), asked.end()), want_asked) << "generation " << gen;
        for (auto& h : held)
            for (auto& tk : h) EXPECT_EQ(tk.succeed(), errc::stale_ticket);
        // Older than the retention: the previous generation is recycled (its arena reset) and
        // takes the next generation's claims.
        clock.advance(std::chrono::seconds(2));
        if (gen > 0) ASSERT_TRUE(g.collect()) << "generation " << gen;
        else (void)g.collect();
        if (HasFailure()) break;
    }
    EXPECT_GE(g.snapshot().rotations, 4u);
}

// Counters and arena cursors live in per-thread stripes: 64 a thread owns alone (plain adds) and 8
// shared by the threads beyond them (locked adds). Two waves of 80 threads (so 16 share, and the
// second wave takes over the stripes the first gave back when its threads ended) each claim fresh
// keys across many 64-slot chunks. Two threads writing one owned stripe would lose counts or hand
// one slot or key-arena range to two keys: every key must come back with its own outcome and text,
// and every counter must be exact.
template <template <class> class Atomic>
void more_threads_than_owned_stripes(std::uint32_t yield_period) {
    const std::size_t threads = idem_test::env_size("IDEM_THREADS", 80, 80);
    const std::size_t per_thread = idem_test::env_size("IDEM_KEYS", 200, 70);
    constexpr std::size_t waves = 2;
    const std::size_t total = waves * threads * per_thread;
    idem::basic_guard<Atomic, idem::steady_clock_source> g(idem_test::test_options(total + 16));
    idem_test::yield_injector::period.store(yield_period);
    auto name = [&](std::size_t wave, std::size_t t, std::size_t j) {
        return "W" + std::to_string(wave) + "_T" + std::to_string(t) + "_" + std::to_string(j);
    };
    std::atomic<std::size_t> refused{0};
    for (std::size_t wave = 0; wave < waves; ++wave) {
        idem_test::run_on_latch(threads, [&](std::size_t t) {
            for (std::size_t j = 0; j < per_thread; ++j) {
                const std::string text = name(wave, t, j);
                auto r = g.begin(idem::key(text), mix(j));
                if (r.status != begin_status::acquired || r.ticket.succeed(mix(text.size() * 1000003u + t * 131u + j)))
                    refused.fetch_add(1);
            }
        });
    }
    idem_test::yield_injector::period.store(0);
    EXPECT_EQ(refused.load(), 0u);
    std::size_t seen = 0, wrong = 0;
    g.for_each([&](const std::string& text, const idem::record_view& v) {
        ++seen;
        // Parse W<wave>_T<t>_<j> back and recompute what that key's owner recorded.
        std::size_t wave = 0, t = 0, j = 0;
        if (std::sscanf(text.c_str(), "W%zu_T%zu_%zu", &wave, &t, &j) != 3 || name(wave, t, j) != text ||
            v.state != idem::record_state::succeeded || v.outcome != mix(text.size() * 1000003u + t * 131u + j) ||
            v.fingerprint != mix(j))
            ++wrong;
    });
    EXPECT_EQ(seen, total);
    EXPECT_EQ(wrong, 0u);
    const auto s = g.snapshot();
    EXPECT_EQ(s.acquired, total);
    EXPECT_EQ(s.succeeded, total);
    EXPECT_EQ(s.duplicates + s.in_progress_hits + s.capacity_exhausted, 0u);
}

TEST(Race, MoreThreadsThanOwnedStripesKeepArenasAndCountersExact) { more_threads_than_owned_stripes<std::atomic>(0); }

// With a yield before about one atomic access in four, a thread is often descheduled between the
// load and the store of a plain add: a stripe with two writers would lose counts here.
TEST(Race, MoreThreadsThanOwnedStripesWithInjectedYields) { more_threads_than_owned_stripes<idem_test::yielding_atomic>(4); }

// Stripe ownership itself: of threads alive at the same time, at most 64 own a stripe, no two own
// the same one, the rest share the 8 shared stripes (and are not told they own them), and stripes
// come back when their threads end: a second wave owns as many as the first. (Lost counts from two
// writers on one owned stripe need a preemption between a load and its store to show, so the test
// above cannot be relied on to catch them; this one checks the rule that prevents them.)
TEST(Race, StripesAreOwnedByOneLiveThreadEach) {
    using engine = idem::detail::table::record_table<std::atomic, idem::steady_clock_source>;
    const idem::detail::table::stripe_ref mine = engine::stripe();  // this thread may own one already
    const std::size_t threads = idem::detail::table::stripe_count + 8;
    std::size_t owned_first_wave = 0;
    for (int wave = 0; wave < 2; ++wave) {
        std::vector<idem::detail::table::stripe_ref> got(threads);
        std::latch all_alive(static_cast<std::ptrdiff_t>(threads));
        idem_test::run_on_latch(threads, [&](std::size_t i) {
            got[i] = engine::stripe();
            all_alive.arrive_and_wait();  // nobody ends (and gives its stripe back) before all took one
        });
        std::set<unsigned> owned;
        std::size_t shared = 0;
        for (const auto& st : got) {
            if (st.owned) {
                EXPECT_LT(st.index, idem::detail::table::owned_stripes);
                EXPECT_TRUE(owned.insert(st.index).second) << "stripe " << st.index << " owned twice";
                EXPECT_FALSE(mine.owned && st.index == mine.index) << "stripe " << st.index << " is the main thread's";
            } else {
                ++shared;
                EXPECT_GE(st.index, idem::detail::table::owned_stripes);
                EXPECT_LT(st.index, idem::detail::table::stripe_count);
            }
        }
        EXPECT_EQ(owned.size() + shared, threads);
        EXPECT_GE(owned.size(), idem::detail::table::owned_stripes - 2) << "wave " << wave;  // the main thread's, a spare
        if (wave == 0) owned_first_wave = owned.size();
        else EXPECT_EQ(owned.size(), owned_first_wave) << "stripes of ended threads were not given back";
    }
    // Atomics built on std::atomic run on real threads and own stripes like it.
    EXPECT_EQ((idem::detail::table::record_table<idem_test::yielding_atomic, idem::steady_clock_source>::stripe().owned),
              mine.owned);
}

// A ticket held in a thread_local that was built before the thread's first guard call is dropped
// at thread exit after the thread gave its stripe back (thread_locals die in reverse order of
// construction). The release it records must count on a shared stripe: by then another thread may
// own the stripe this one had. 64 such threads end while 64 others start claiming.
std::atomic<int> g_owned_at_drop{0};

struct ticket_held_at_exit {
    std::optional<idem::ticket> t;
    ~ticket_held_at_exit() {
        if (idem::detail::table::record_table<std::atomic, idem::steady_clock_source>::stripe().owned)
            g_owned_at_drop.fetch_add(1);
        t.reset();  // drops the claim: a release, counted
    }
};

TEST(Race, ATicketDroppedAtThreadExitCountsOnASharedStripe) {
    const std::size_t threads = idem::detail::table::owned_stripes;
    idem::guard g(idem_test::test_options(4 * threads + 16));
    g_owned_at_drop.store(0);
    idem_test::run_on_latch(2 * threads, [&](std::size_t i) {
        if (i < threads) {
            thread_local ticket_held_at_exit held;  // built before this thread's first guard call
            auto r = g.begin(idem_test::key_n("EXIT", i));
            if (r.status == begin_status::acquired) held.t.emplace(std::move(r.ticket));
        } else {
            for (std::size_t j = 0; j < 2; ++j) {
                auto r = g.begin(idem_test::key_n("LIVE", i * 2 + j));
                if (r.status == begin_status::acquired) (void)r.ticket.succeed(1);
            }
        }
    });
    EXPECT_EQ(g_owned_at_drop.load(), 0) << "a ticket dropped at thread exit counted on an owned stripe";
    const auto s = g.snapshot();
    EXPECT_EQ(s.acquired, threads + 2 * threads);
    EXPECT_EQ(s.released, threads) << "every ticket dropped at thread exit is recorded";
    EXPECT_EQ(s.succeeded, 2 * threads);
    for (std::size_t i = 0; i < threads; ++i)  // released: claimable again (query reports it absent)
        EXPECT_EQ(g.begin(idem_test::key_n("EXIT", i)).status, begin_status::acquired);
}

}  // namespace
