// payload_test: response payloads in process scope (ticket.succeed(outcome, payload), typed run()).
//
// Bytes round trip exactly (NUL, invalid UTF-8, every size around a word and a page), up to
// options.max_payload and no further; a full payload budget is a retryable refusal that changes
// nothing and recovers once a rotation recycled a generation; duplicates (begin, begin_wait, run,
// query) replay the bytes; racing duplicates read in_progress or the whole payload, never torn or
// another record's bytes (also across recycles, under TSan: label concurrency); sync mode hides
// the payload until durable; restore() puts it back; the transition offered carries it.
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <latch>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/manual_guard.hpp"

namespace {

using idem::begin_status;
using idem::errc;
using idem::record_state;
using idem_test::manual_guard;
using idem_test::test_options;

/// n bytes that depend on `seed`: every byte value appears, NUL and bytes invalid in UTF-8 included.
std::string pattern(std::size_t n, std::uint64_t seed) {
    std::string s(n, '\0');
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (std::size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s[i] = static_cast<char>(x >> 56);
    }
    return s;
}

/// Claims k, succeeds it with `payload`, and returns the completion's answer.
std::error_code complete(manual_guard& g, const idem::key& k, std::uint64_t outcome, std::string_view payload) {
    auto r = g.begin(k);
    EXPECT_EQ(r.status, begin_status::acquired) << k.view();
    return r.ticket.succeed(outcome, payload);
}

TEST(Payload, EmptyPayloadIsNoPayload) {
    manual_guard g(test_options());
    const idem::key k("EMPTY");
    ASSERT_FALSE(complete(g, k, 7, ""));
    const auto d = g.begin(k);
    EXPECT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.outcome, 7u);
    EXPECT_TRUE(d.payload.empty());
    EXPECT_TRUE(g.query(k).payload.empty());
}

TEST(Payload, BytesRoundTripExactlyAtEverySize) {
    manual_guard g(test_options(4096));
    std::vector<std::size_t> sizes;
    for (std::size_t n = 1; n <= 40; ++n) sizes.push_back(n);
    for (std::size_t n : {4095, 4096, 4097, 65535}) sizes.push_back(n);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        const idem::key k = idem_test::key_n("SIZE", sizes[i]);
        const std::string bytes = pattern(sizes[i], i);
        ASSERT_FALSE(complete(g, k, i, bytes));
        const auto d = g.begin(k);
        ASSERT_EQ(d.status, begin_status::succeeded);
        EXPECT_EQ(d.outcome, i);
        EXPECT_EQ(d.payload, bytes) << sizes[i] << " bytes";
        const auto v = g.query(k);
        EXPECT_EQ(v.state, record_state::succeeded);
        EXPECT_EQ(v.payload, bytes);
    }
}

TEST(Payload, NulAndInvalidUtf8RoundTrip) {
    manual_guard g(test_options());
    const std::string bytes("\0\xff\xfe\xc3\x28\xa0\xa1\xe2\x28\xa1\0\0{\"ok\":true}\xf0\x28\x8c\x28\0", 27);
    ASSERT_EQ(bytes.size(), 27u);
    const idem::key k("BINARY");
    ASSERT_FALSE(complete(g, k, 1, bytes));
    EXPECT_EQ(g.begin(k).payload, bytes);
    EXPECT_EQ(g.begin_wait(k, 0, std::chrono::milliseconds(1)).payload, bytes);
    EXPECT_EQ(g.run(k,
                    []() -> std::string {
                        ADD_FAILURE() << "ran a duplicate";
                        return {};
                    }),
              bytes);
    std::size_t seen = 0;
    g.for_each([&](const std::string& key, const idem::record_view& v) {
        if (key == "BINARY") {
            EXPECT_EQ(v.payload, bytes);
            ++seen;
        }
    });
    EXPECT_EQ(seen, 1u);
}

TEST(Payload, MaximumSizeIsTakenAndOneMoreIsRefusedWithoutChange) {
    manual_guard g(test_options());
    const std::size_t max = g.opts().max_payload;
    EXPECT_EQ(max, std::size_t{64} << 10) << "the documented default";
    const idem::key k("MAX");
    auto r = g.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    const std::string over = pattern(max + 1, 1);
    EXPECT_EQ(r.ticket.succeed(5, over), errc::invalid_argument);
    EXPECT_TRUE(r.ticket.valid()) << "a refused payload leaves the claim held";
    EXPECT_EQ(g.query(k).state, record_state::processing);
    EXPECT_EQ(g.begin(k).status, begin_status::in_progress);
    const std::string exact = pattern(max, 2);
    ASSERT_FALSE(r.ticket.succeed(5, exact));
    EXPECT_FALSE(r.ticket.valid());
    const auto d = g.begin(k);
    EXPECT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.payload, exact);
}

// A terminal failure keeps its error response (a declined payment's body), replayed with the
// failure code; a retryable one cannot keep one, since its retry runs again: refused, nothing changed.
TEST(Payload, TerminalFailureKeepsItsResponseAndARetryableOneIsRefused) {
    manual_guard g(test_options());
    const idem::key k("DECLINED");
    auto r = g.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    const std::string body = pattern(300, 9);
    EXPECT_EQ(r.ticket.fail(402, idem::failure_policy::retryable, body), errc::invalid_argument);
    ASSERT_TRUE(r.ticket.valid()) << "a refused payload leaves the claim held";
    EXPECT_EQ(g.query(k).state, record_state::processing);
    EXPECT_EQ(r.ticket.fail(402, idem::failure_policy::terminal, pattern(g.opts().max_payload + 1, 3)),
              errc::invalid_argument);
    ASSERT_TRUE(r.ticket.valid());
    ASSERT_FALSE(r.ticket.fail(402, idem::failure_policy::terminal, body));
    EXPECT_FALSE(r.ticket.valid());
    const auto d = g.begin(k);
    EXPECT_EQ(d.status, begin_status::failed);
    EXPECT_EQ(d.outcome, 402u);
    EXPECT_EQ(d.payload, body);
    EXPECT_EQ(g.query(k).payload, body);
    // Without a payload, fail(code, policy, "") is fail(code, policy): a retryable failure releases.
    auto r2 = g.begin(idem::key("RETRY"));
    ASSERT_FALSE(r2.ticket.fail(7, idem::failure_policy::retryable, ""));
    EXPECT_EQ(g.begin(idem::key("RETRY")).status, begin_status::acquired);
}

TEST(Payload, HardMaximumIsOneMebibyte) {
    auto o = test_options();
    o.max_payload = idem::options::max_payload_limit;
    manual_guard g(o);
    const std::string mib = pattern(std::size_t{1} << 20, 3);
    ASSERT_FALSE(complete(g, idem::key("MIB"), 0, mib));
    EXPECT_EQ(g.begin(idem::key("MIB")).payload, mib);

    o.max_payload = idem::options::max_payload_limit + 1;
    try {
        manual_guard bad(o);
        ADD_FAILURE() << "max_payload over 1 MiB was taken";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("options.max_payload"), std::string::npos) << e.what();
    }
    o = test_options();
    o.payload_budget = o.max_payload - 1;
    try {
        manual_guard bad(o);
        ADD_FAILURE() << "a budget below max_payload was taken";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("options.payload_budget"), std::string::npos) << e.what();
    }
}

TEST(Payload, ZeroBudgetTurnsPayloadsOff) {
    auto o = test_options();
    o.payload_budget = 0;
    manual_guard g(o);
    auto r = g.begin(idem::key("OFF"));
    ASSERT_EQ(r.status, begin_status::acquired);
    EXPECT_EQ(r.ticket.succeed(1, "x"), errc::capacity_exhausted);
    EXPECT_TRUE(r.ticket.valid());
    EXPECT_FALSE(r.ticket.succeed(1));  // without one it completes
}

TEST(Payload, BudgetExhaustionIsRetryableAndRecoversAfterRotation) {
    idem::manual_clock clock;
    auto o = test_options(8);  // rotation once the current generation holds 4 records
    o.retention = std::chrono::seconds(1);
    o.max_payload = 16 << 10;
    o.payload_budget = 64 << 10;  // one 64 KiB chunk: four 16 KiB payloads
    manual_guard g(o, clock);
    for (int i = 0; i < 4; ++i) ASSERT_FALSE(complete(g, idem_test::key_n("FULL", i), i, pattern(16 << 10, i)));
    auto r = g.begin(idem::key("FULL4"));
    ASSERT_EQ(r.status, begin_status::acquired);
    EXPECT_EQ(r.ticket.succeed(4, pattern(16 << 10, 4)), errc::capacity_exhausted);
    EXPECT_TRUE(r.ticket.valid()) << "nothing changed: the ticket stays valid";
    EXPECT_EQ(g.query(idem::key("FULL4")).state, record_state::processing);
    EXPECT_EQ(r.ticket.succeed(4, "x"), errc::capacity_exhausted) << "even one byte: the budget is spent";
    ASSERT_FALSE(r.ticket.succeed(4)) << "the outcome alone still records";
    for (int i = 0; i < 4; ++i) EXPECT_EQ(g.begin(idem_test::key_n("FULL", i)).payload, pattern(16 << 10, i));

    // run() never truncates, and never records an operation that ran as failed: the key is left
    // in doubt for the resolver, and run() says why.
    int ran = 0;
    try {
        (void)g.run(idem::key("RUNFULL"), [&] {
            ++ran;
            return pattern(100, 9);
        });
        ADD_FAILURE() << "a payload over the budget was recorded";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::capacity_exhausted);
        EXPECT_NE(std::string(e.what()).find("options.payload_budget"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("in doubt"), std::string::npos) << e.what();
    }
    EXPECT_EQ(ran, 1);
    EXPECT_EQ(g.begin(idem::key("RUNFULL")).status, begin_status::in_doubt) << "it ran: neither FAILED nor free";

    // A rotation makes the recycled (empty) generation current: new claims store payloads again.
    clock.advance(std::chrono::seconds(2));
    ASSERT_TRUE(g.collect());
    ASSERT_FALSE(complete(g, idem::key("AFTER"), 1, pattern(16 << 10, 10)));
    EXPECT_EQ(g.begin(idem::key("AFTER")).payload, pattern(16 << 10, 10));
    EXPECT_EQ(g.begin(idem_test::key_n("FULL", 2)).payload, pattern(16 << 10, 2)) << "the previous generation still replays";
}

TEST(Payload, RunRefusesAPayloadOverTheMaximumAndLeavesTheKeyInDoubt) {
    auto o = test_options();
    o.max_payload = 100;
    manual_guard g(o);
    try {
        (void)g.run(idem::key("BIG"), [] { return std::string(101, 'x'); });
        ADD_FAILURE() << "101 bytes over a maximum of 100 were taken";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::invalid_argument);
        const std::string what = e.what();
        EXPECT_NE(what.find("101"), std::string::npos) << what;
        EXPECT_NE(what.find("options.max_payload = 100"), std::string::npos) << what;
    }
    EXPECT_EQ(g.begin(idem::key("BIG")).status, begin_status::in_doubt) << "fn ran: it must not run again";
}

// The budget counts the bytes payloads take, not the chunks threads carve them from: with
// max_payload 1 MiB and a 2 MiB budget (two chunks), four threads storing 10 bytes each all
// succeed (the review saw the third and fourth refused, and their executed operations recorded
// as FAILED), and the budget is refused only once its bytes are really spent.
TEST(Payload, BudgetCountsBytesNotPerThreadChunks) {
    auto o = test_options(64);
    o.max_payload = 1 << 20;
    o.payload_budget = 2 << 20;
    manual_guard g(o);
    constexpr int threads = 4;
    std::latch start(threads);
    std::atomic<int> refused{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            start.arrive_and_wait();
            try {
                const std::string got = g.run(idem_test::key_n("SMALL", t), [&] { return pattern(10, t); });
                EXPECT_EQ(got, pattern(10, t));
            } catch (const idem::error& e) {
                ++refused;
                ADD_FAILURE() << e.what();
            }
        });
    for (auto& t : ts) t.join();
    EXPECT_EQ(refused.load(), 0);
    for (int t = 0; t < threads; ++t) {
        const auto r = g.begin(idem_test::key_n("SMALL", t));
        EXPECT_EQ(r.status, begin_status::succeeded);
        EXPECT_EQ(r.payload, pattern(10, t));
    }
    // 40 bytes (two words each: 64 in memory) are used; 2 MiB - 64 bytes remain. One payload of
    // 1 MiB fits, a second one does not (the budget's bytes are spent), and 1 KiB still does.
    ASSERT_FALSE(complete(g, idem::key("BIG1"), 1, pattern(1 << 20, 1)));
    auto r = g.begin(idem::key("BIG2"));
    ASSERT_EQ(r.status, begin_status::acquired);
    EXPECT_EQ(r.ticket.succeed(2, pattern(1 << 20, 2)), errc::capacity_exhausted);
    EXPECT_FALSE(r.ticket.succeed(2, pattern(1 << 10, 2))) << "the rest of the budget still takes a small one";
    EXPECT_EQ(g.begin(idem::key("BIG1")).payload, pattern(1 << 20, 1));
}

// A completion the guard refused, then a dropped ticket: the caller said the effect happened, so
// the key is left in doubt for the resolver, never released for a second run.
TEST(Payload, DropAfterARefusedSuccessLeavesTheKeyInDoubt) {
    auto o = test_options(64);
    o.max_payload = 100;
    manual_guard g(o);
    {
        auto r = g.begin(idem::key("CHARGED"));
        ASSERT_EQ(r.status, begin_status::acquired);
        EXPECT_EQ(r.ticket.succeed(1, std::string(101, 'x')), errc::invalid_argument);
        EXPECT_TRUE(r.ticket.valid());
    }  // dropped
    EXPECT_EQ(g.begin(idem::key("CHARGED")).status, begin_status::in_doubt);
    {
        auto r = g.begin(idem::key("EXPLICIT"));
        ASSERT_EQ(r.status, begin_status::acquired);
        r.ticket.leave_in_doubt();
        EXPECT_FALSE(r.ticket.valid());
    }
    EXPECT_EQ(g.begin(idem::key("EXPLICIT")).status, begin_status::in_doubt);
    {
        auto r = g.begin(idem::key("NEVER_RAN"));
        ASSERT_EQ(r.status, begin_status::acquired);
    }  // dropped without a completion attempt: released per options.on_failure (retryable)
    EXPECT_EQ(g.begin(idem::key("NEVER_RAN")).status, begin_status::acquired);
}

// ---- typed run() -----------------------------------------------------------------------------

struct receipt {
    std::uint32_t status;
    std::uint16_t currency;
    char id[10];
    double amount;
    bool operator==(const receipt&) const = default;
};

struct money {
    long long cents;
    std::string currency;
    bool operator==(const money&) const = default;
};

enum class verdict : std::uint8_t { approved = 3, declined = 4 };

struct no_codec {
    std::string s;
};

}  // namespace

template <>
struct idem::codec<money> {
    static std::string encode(const money& m) { return std::to_string(m.cents) + ' ' + m.currency; }
    static money decode(std::string_view b) {
        const auto sp = b.find(' ');
        return {std::stoll(std::string(b.substr(0, sp))), std::string(b.substr(sp + 1))};
    }
};

// What compiles (the compile-fail cases of run() are these concepts' negatives: run() static_asserts
// on idem::storable).
static_assert(idem::storable<void>);
static_assert(idem::storable<int> && idem::storable<std::uint64_t> && idem::storable<bool>);
static_assert(idem::storable<verdict>);
static_assert(idem::storable<std::string> && idem::storable<std::vector<std::byte>>);
static_assert(idem::storable<std::span<const std::byte>>);
static_assert(idem::storable<receipt> && idem::payload_result<receipt>);
static_assert(idem::storable<money> && idem::has_codec<money>);
static_assert(!idem::storable<double>, "a double used to be narrowed to the outcome: now a compile error");
static_assert(!idem::storable<float>);
static_assert(!idem::storable<int*>);
static_assert(!idem::storable<no_codec>);
static_assert(!idem::storable<std::vector<int>>);
static_assert(!idem::payload_result<int> && !idem::payload_result<bool>, "integers keep the outcome path");

namespace {

template <class Fn>
auto never(Fn) {
    return [] {
        ADD_FAILURE() << "a duplicate ran fn";
        return std::invoke_result_t<Fn>{};
    };
}

TEST(TypedRun, IntegralsKeepTheOutcomePath) {
    manual_guard g(test_options());
    auto fn = [] { return 42; };
    const auto first = g.run(idem::key("INT"), fn);
    static_assert(std::is_same_v<decltype(first), const std::uint64_t>, "run() of an integral returns the outcome");
    EXPECT_EQ(first, 42u);
    EXPECT_EQ(g.run(idem::key("INT"), never(fn)), 42u);
    EXPECT_TRUE(g.begin(idem::key("INT")).payload.empty()) << "no payload on the integral path";
    EXPECT_EQ(g.run(idem::key("BOOL"), [] { return true; }), 1u);
    EXPECT_EQ(g.run(idem::key("ENUM"), [] { return verdict::declined; }), 4u);
    EXPECT_EQ(g.run(idem::key("VOID"), [] {}), 0u);
}

TEST(TypedRun, StringsAndBytesAreStoredAndReplayed) {
    manual_guard g(test_options());
    const std::string body("{\"id\":\"ch_1\",\"amount\":100}\0tail", 32);
    auto fn = [&] { return body; };
    EXPECT_EQ(g.run(idem::key("STR"), fn), body);
    EXPECT_EQ(g.run(idem::key("STR"), never(fn)), body);
    EXPECT_EQ(g.begin(idem::key("STR")).payload, body);

    const std::vector<std::byte> bytes{std::byte{0}, std::byte{0xff}, std::byte{0x80}};
    auto vfn = [&] { return bytes; };
    EXPECT_EQ(g.run(idem::key("VEC"), vfn), bytes);
    EXPECT_EQ(g.run(idem::key("VEC"), never(vfn)), bytes);

    static const std::array<std::byte, 4> backing{std::byte{1}, std::byte{0}, std::byte{2}, std::byte{0xfe}};
    auto sfn = [] { return std::span<const std::byte>(backing); };
    const std::vector<std::byte> as_vector(backing.begin(), backing.end());
    const auto first = g.run(idem::key("SPAN"), sfn);
    static_assert(std::is_same_v<decltype(first), const std::vector<std::byte>>, "a span replays as a vector");
    EXPECT_EQ(first, as_vector);
    EXPECT_EQ(g.run(idem::key("SPAN"),
                    [] {
                        ADD_FAILURE() << "a duplicate ran fn";
                        return std::span<const std::byte>();
                    }),
              as_vector);
}

TEST(TypedRun, TriviallyCopyableStructsAreStoredAsBytes) {
    manual_guard g(test_options());
    const receipt rc{201, 978, {'c', 'h', '_', '1', '\0', 'x', 'y', 'z', '\xff', '\0'}, 12.5};
    auto fn = [&] { return rc; };
    EXPECT_EQ(g.run(idem::key("STRUCT"), fn), rc);
    EXPECT_EQ(g.run(idem::key("STRUCT"), never(fn)), rc);
    EXPECT_EQ(g.begin(idem::key("STRUCT")).payload.size(), sizeof(receipt));
    // A record written by other code (another size) is not silently reinterpreted.
    ASSERT_FALSE(complete(g, idem::key("OTHER"), 0, "short"));
    try {
        (void)g.run(idem::key("OTHER"), never(fn));
        ADD_FAILURE() << "5 bytes were replayed as a receipt";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::corrupt_record);
    }
}

TEST(TypedRun, ACodecCoversAnythingElse) {
    manual_guard g(test_options());
    const money m{12345, "EUR"};
    auto fn = [&] { return m; };
    EXPECT_EQ(g.run(idem::key("CODEC"), fn), m);
    EXPECT_EQ(g.run(idem::key("CODEC"), never(fn)), m);
    EXPECT_EQ(g.begin(idem::key("CODEC")).payload, "12345 EUR");
}

TEST(TypedRun, WaitingDuplicateGetsThePayload) {
    manual_guard g(test_options());
    const idem::key k("WAITED");
    auto owner = g.begin(k);
    ASSERT_EQ(owner.status, begin_status::acquired);
    std::latch asked(1);
    std::thread t([&] {
        asked.wait();
        EXPECT_FALSE(owner.ticket.succeed(0, "done"));
    });
    idem::run_options ro;
    ro.wait = std::chrono::seconds(30);
    asked.count_down();
    EXPECT_EQ(g.run(
                  k,
                  [] {
                      ADD_FAILURE() << "ran while another held the claim";
                      return std::string();
                  },
                  ro),
              "done");
    t.join();
}

// ---- concurrency -----------------------------------------------------------------------------

TEST(PayloadRace, DuplicatesSeeInProgressOrTheWholePayload) {
    manual_guard g(test_options());
    constexpr int readers = 4;
    constexpr int keys = 200;
    std::latch start(readers + 1);
    std::atomic<int> done{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < readers; ++t)
        ts.emplace_back([&, t] {
            start.arrive_and_wait();
            for (int i = 0; done.load(std::memory_order_acquire) == 0 || i < keys; ++i) {
                const int n = (i * 7 + t) % keys;
                const idem::key k = idem_test::key_n("RACE", n);
                const auto v = g.query(k);  // never claims
                if (v.state == record_state::succeeded) {
                    ASSERT_EQ(v.payload, pattern(100 + n, n)) << "torn or foreign bytes for key " << n;
                } else {
                    ASSERT_TRUE(v.payload.empty());
                }
                auto r = g.begin(idem_test::key_n("RACE", n));
                if (r.status == begin_status::succeeded) {
                    ASSERT_EQ(r.payload, pattern(100 + n, n));
                }
                if (r.status == begin_status::acquired) (void)r.ticket.succeed(n, pattern(100 + n, n));
            }
        });
    start.arrive_and_wait();
    for (int n = 0; n < keys; ++n) {
        auto r = g.begin(idem_test::key_n("RACE", n));
        if (r.status == begin_status::acquired) {
            ASSERT_FALSE(r.ticket.succeed(n, pattern(100 + n, n)));
        }
    }
    done.store(1, std::memory_order_release);
    for (auto& t : ts) t.join();
    for (int n = 0; n < keys; ++n) EXPECT_EQ(g.begin(idem_test::key_n("RACE", n)).payload, pattern(100 + n, n));
}

TEST(PayloadRace, RecyclesNeverShowAnotherRecordsBytes) {
    // Generations recycle while duplicates copy payloads: the arena is reused by other keys, and a
    // reader must never return those bytes as its key's (its validation sees the recycle).
    auto o = test_options(16);
    o.retention = {};
    manual_guard g(o);
    constexpr int readers = 3;
    constexpr int keys = 3000;
    std::latch start(readers + 1);
    std::atomic<int> written{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < readers; ++t)
        ts.emplace_back([&, t] {
            start.arrive_and_wait();
            std::uint64_t x = 12345 + t;
            while (!stop.load(std::memory_order_acquire)) {
                const int hi = written.load(std::memory_order_acquire);
                if (hi == 0) continue;
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                const int n = hi - 1 - static_cast<int>((x >> 33) % 8);
                if (n < 0) continue;
                const auto v = g.query(idem_test::key_n("CYCLE", n));
                if (v.state == record_state::succeeded) {
                    ASSERT_EQ(v.payload, pattern(64 + n % 200, n)) << n;
                }
            }
        });
    start.arrive_and_wait();
    for (int n = 0; n < keys; ++n) {
        auto r = g.begin(idem_test::key_n("CYCLE", n));
        if (r.status == begin_status::capacity_exhausted) {
            g.collect();
            r = g.begin(idem_test::key_n("CYCLE", n));
        }
        ASSERT_EQ(r.status, begin_status::acquired) << n;
        ASSERT_FALSE(r.ticket.succeed(n, pattern(64 + n % 200, n)));
        written.store(n + 1, std::memory_order_release);
        if (n % 8 == 7) g.collect();
    }
    stop.store(true, std::memory_order_release);
    for (auto& t : ts) t.join();
    EXPECT_GT(g.snapshot().rotations, 10u);
}

// ---- sync mode, sink, recovery ---------------------------------------------------------------

/// A sink that records what it is offered (with a copy of the payload view at offer time), commits
/// claims at once and terminal rows only when the test says so.
class recording_sink : public idem::transition_sink {
public:
    bool sync = false;
    std::atomic<std::uint64_t> committed_upto{0};
    std::vector<std::string> payloads;
    std::vector<std::string_view> views;

    bool reserve() noexcept override { return true; }
    void unreserve() noexcept override {}
    std::uint64_t offer(const idem::transition& t) noexcept override {
        std::lock_guard lock(m_);
        payloads.emplace_back(t.payload);
        views.push_back(t.payload);
        const std::uint64_t seq = ++seq_;
        if (t.to == record_state::processing) committed_upto.store(seq);  // claims commit at once
        return seq;
    }
    idem::durability_wait await(std::uint64_t seq) noexcept override {
        return durable(seq) ? idem::durability_wait::committed : idem::durability_wait::timed_out;
    }
    bool durable(std::uint64_t seq) const noexcept override { return seq <= committed_upto.load(); }
    bool synchronous() const noexcept override { return sync; }
    void commit_all() { committed_upto.store(seq_); }

private:
    std::mutex m_;
    std::uint64_t seq_ = 0;
};

TEST(PayloadSink, TheTransitionCarriesTheBytesInTheArena) {
    recording_sink sink;
    manual_guard g(test_options(), {}, &sink);
    const std::string bytes = pattern(300, 5);
    ASSERT_FALSE(complete(g, idem::key("SINK"), 3, bytes));
    ASSERT_EQ(sink.payloads.size(), 2u);  // the claim, the success
    EXPECT_TRUE(sink.payloads[0].empty()) << "claims carry no payload";
    EXPECT_EQ(sink.payloads[1], bytes);
    EXPECT_EQ(sink.views[1], bytes) << "the view stays valid after succeed() returned (until flushed)";
    EXPECT_NE(sink.views[1].data(), bytes.data()) << "the bytes were copied into the arena";
}

TEST(PayloadSink, SyncModeHidesThePayloadUntilDurable) {
    recording_sink sink;
    sink.sync = true;
    manual_guard g(test_options(), {}, &sink);
    const idem::key k("SYNC");
    auto r = g.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    EXPECT_EQ(r.ticket.succeed(9, "secret response"), errc::store_unavailable);
    const auto hidden = g.begin(k);
    EXPECT_EQ(hidden.status, begin_status::in_doubt);
    EXPECT_TRUE(hidden.payload.empty()) << "not durable: not visible";
    EXPECT_EQ(hidden.outcome, 0u);
    EXPECT_TRUE(g.query(k).payload.empty());
    sink.commit_all();
    const auto shown = g.begin(k);
    EXPECT_EQ(shown.status, begin_status::succeeded);
    EXPECT_EQ(shown.outcome, 9u);
    EXPECT_EQ(shown.payload, "secret response");
    EXPECT_EQ(g.query(k).payload, "secret response");
}

TEST(PayloadRecovery, RestorePutsThePayloadBack) {
    manual_guard g(test_options(), {}, nullptr, /*defer_maintenance=*/true);
    const std::string bytes("restored\0\xff", 10);
    using acc = idem::detail::guard_access;
    ASSERT_EQ(acc::restore(g, idem::key("R1"), {record_state::succeeded, 5, 77, 0, {}, g.now(), bytes}),
              begin_status::acquired);
    ASSERT_EQ(acc::restore(g, idem::key("R2"), {record_state::failed, 6, 3, 0, {}, g.now(), "why"}), begin_status::acquired);
    ASSERT_EQ(acc::restore(g, idem::key("R3"), {record_state::succeeded, 7, 1, 0, {}, g.now()}), begin_status::acquired);
    EXPECT_EQ(acc::restore(g, idem::key("R4"),
                           {record_state::succeeded, 8, 1, 0, {}, g.now(), std::string(g.opts().max_payload + 1, 'x')}),
              begin_status::capacity_exhausted);
    const auto d1 = g.begin(idem::key("R1"));
    EXPECT_EQ(d1.status, begin_status::succeeded);
    EXPECT_EQ(d1.outcome, 77u);
    EXPECT_EQ(d1.payload, bytes);
    const auto d2 = g.begin(idem::key("R2"));
    EXPECT_EQ(d2.status, begin_status::failed);
    EXPECT_EQ(d2.payload, "why");
    EXPECT_TRUE(g.begin(idem::key("R3")).payload.empty());
    // Restored twice (a later row of the same key) without a payload: the first one's is gone.
    ASSERT_EQ(acc::restore(g, idem::key("R1"), {record_state::succeeded, 9, 78, 0, {}, g.now()}), begin_status::acquired);
    EXPECT_TRUE(g.begin(idem::key("R1")).payload.empty());
}

}  // namespace
