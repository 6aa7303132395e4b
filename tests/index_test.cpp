// tests/index_test.cpp: the index's 32-bit tags (docs/design.md, "Index positions and publication").
//
// An index position carries only 32 bits of the key's hash (the tag) besides the slot's number, so
// keys whose tags are equal are common enough to meet in a large guard. Two such keys must stay two
// records: a lookup that meets a position with its tag compares the slot's whole 128-bit identity and
// probes on when it is another key's. The keys below share the tag *and* the first position of their
// probe sequence, found by a birthday search under the engine's own secret (about 2^19 hashes for
// 32 + 6 bits), so each one's probe must pass the other's position. The last test covers the other
// kind of position a probe passes: a withdrawn one.
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <unordered_map>
#include <utility>

#include <unistd.h>

namespace {

using engine = idem::detail::table::record_table<std::atomic, idem::manual_clock>;
using idem::begin_status;
using idem::detail::table::slot_state;

constexpr std::size_t capacity = 32;  // each generation: next_pow2(2 * 32) = 64 positions
constexpr std::uint64_t mask = 63;

std::uint64_t signature(const engine& e, const idem::key& k) {
    const auto h = e.hash(k);
    return idem::detail::table::position::tag(h) << 32 | (h.lo & mask);
}

/// Two distinct keys with equal tags and equal first positions under e's secret.
std::pair<idem::key, idem::key> colliding_keys(const engine& e) {
    std::unordered_map<std::uint64_t, std::uint64_t> seen;
    for (std::uint64_t i = 0; i < (std::uint64_t{1} << 26); ++i) {
        const idem::key k("collide-" + std::to_string(i));
        const auto [it, fresh] = seen.emplace(signature(e, k), i);
        if (!fresh) return {idem::key("collide-" + std::to_string(it->second)), k};
    }
    ADD_FAILURE() << "no two keys with the same tag and position among 2^26";
    return {idem::key("a"), idem::key("b")};
}

idem::options small() {
    idem::options o;
    o.capacity = capacity;
    return o;
}

TEST(Index, KeysSharingATagAndAPositionStayTwoRecords) {
    engine e(small(), idem::manual_clock{}, nullptr);
    const auto [a, b] = colliding_keys(e);
    const auto ha = e.hash(a), hb = e.hash(b);
    ASSERT_EQ(idem::detail::table::position::tag(ha), idem::detail::table::position::tag(hb));
    ASSERT_TRUE(ha.lo != hb.lo || ha.hi != hb.hi) << "a real 128-bit collision; pick other keys";

    auto ra = e.begin(a, 1);
    ASSERT_EQ(ra.status, begin_status::acquired);
    // b's probe meets a's position (same tag, a's claim published) and must not take it for b's.
    auto rb = e.begin(b, 2);
    ASSERT_EQ(rb.status, begin_status::acquired) << "b was answered from a's record";

    EXPECT_FALSE(e.complete(a, ra.claim, slot_state::succeeded, 11, idem::transition_cause::succeed));
    EXPECT_FALSE(e.complete(b, rb.claim, slot_state::failed, 22, idem::transition_cause::fail));

    const auto da = e.begin(a, 1);
    EXPECT_EQ(da.status, begin_status::succeeded);
    EXPECT_EQ(da.outcome, 11u);
    const auto db = e.begin(b, 2);
    EXPECT_EQ(db.status, begin_status::failed);
    EXPECT_EQ(db.outcome, 22u);
    // Fingerprints are per record too: a's fingerprint is not b's.
    EXPECT_EQ(e.begin(a, 2).status, begin_status::payload_mismatch);
    EXPECT_EQ(e.begin(b, 1).status, begin_status::payload_mismatch);
}

TEST(Index, TheSecondKeyOfATagIsFoundWhenTheFirstIsInProgress) {
    engine e(small(), idem::manual_clock{}, nullptr);
    const auto [a, b] = colliding_keys(e);
    auto rb = e.begin(b, 7);  // b first this time: a's probe passes b's position
    ASSERT_EQ(rb.status, begin_status::acquired);
    auto ra = e.begin(a, 8);
    ASSERT_EQ(ra.status, begin_status::acquired);
    // Both claims are live: each key's duplicate sees its own claim in progress, not the other's state.
    EXPECT_FALSE(e.complete(a, ra.claim, slot_state::succeeded, 5, idem::transition_cause::succeed));
    EXPECT_EQ(e.begin(b, 7).status, begin_status::in_progress);
    const auto da = e.begin(a, 8);
    EXPECT_EQ(da.status, begin_status::succeeded);
    EXPECT_EQ(da.outcome, 5u);
}

// A withdrawn position (its claim gave up: here because the fence space was exhausted, which makes
// a fresh claim withdraw its position and answer capacity_exhausted) keeps the key's tag and has no
// slot. A claim of the same key must probe past it to a position of its own, and a lookup must probe
// past it to that claim.
TEST(Index, AWithdrawnPositionIsProbedPast) {
    engine e(small(), idem::manual_clock{}, nullptr);
    const idem::key k("withdrawn-then-claimed");
    e.set_fence_floor(((std::uint64_t{1} << 20) - 1) << 32);  // the next fence generation overflows 52 bits
    EXPECT_EQ(e.begin(k, 1).status, begin_status::capacity_exhausted);
    EXPECT_EQ(e.snapshot_stats().max_probe, 1u);
    e.set_fence_floor(0);
    auto r = e.begin(k, 1);
    ASSERT_EQ(r.status, begin_status::acquired);
    EXPECT_EQ(e.snapshot_stats().max_probe, 2u) << "the claim did not take the position after the withdrawn one";
    ASSERT_EQ(e.query(k).state, idem::record_state::processing) << "the lookup stopped at the withdrawn position";
    EXPECT_EQ(e.begin(k, 1).status, begin_status::in_progress);
    EXPECT_FALSE(e.complete(k, r.claim, slot_state::succeeded, 9, idem::transition_cause::succeed));
    const auto d = e.begin(k, 1);
    EXPECT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.outcome, 9u);
}

}  // namespace

// ---- memory: committed lazily, arenas in huge pages (docs/design.md, "Memory") -------------------

namespace {

std::size_t resident_bytes() {
    long pages = 0, resident = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        std::fclose(f);
    }
    return static_cast<std::size_t>(resident) * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

/// AnonHugePages (bytes) of the mapping that contains [p, p + bytes), from /proc/self/smaps.
std::size_t anon_huge_bytes(const void* p, std::size_t bytes) {
    const auto lo = reinterpret_cast<std::uintptr_t>(p), hi = lo + bytes;
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool inside = false;
    std::size_t total = 0;
    while (std::getline(smaps, line)) {
        unsigned long a = 0, b = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &a, &b) == 2 && line.find(':') > line.find(' ')) {
            inside = a < hi && lo < b;
            continue;
        }
        unsigned long kb = 0;
        if (inside && std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kb) == 1) total += kb * 1024;
    }
    return total;
}

idem::options sized(std::size_t capacity) {
    idem::options o;
    o.capacity = capacity;
    return o;
}

}  // namespace

// A guard sized for 4M live records maps about 3.4 GB (two generations of a 64 MiB index, 512 MiB of
// slots, 1.1 GiB of key arena). Holding 1,000 records it must stay resident in tens of MiB: the
// arenas are committed as claims reach them plus the toucher's margin (16 MiB per arena in use), and
// an index this large is in 4 KiB pages (in huge pages, 1,000 claims at random positions would
// commit nearly all 64 MiB of it).
TEST(Memory, AHugeCapacityHoldingFewKeysStaysSmall) {
    const std::size_t before = resident_bytes();
    engine e(sized(std::size_t{1} << 22), idem::manual_clock{}, nullptr);
    for (int i = 0; i < 1000; ++i)
        ASSERT_EQ(e.begin(idem::key("few-keys-" + std::to_string(i)), 1).status, begin_status::acquired);
    const std::size_t grown = resident_bytes() - before;
    EXPECT_LT(grown, std::size_t{48} << 20)
        << "resident memory grew by " << (grown >> 20) << " MiB for 1,000 records: memory is no longer committed lazily";
}

// The arenas are advised MADV_HUGEPAGE and aligned to 2 MiB: a fault (or the toucher) commits 2 MiB
// at once, and lookups take one TLB entry per 2 MiB. If the advice is lost, on a kernel whose THP
// mode is "madvise" the arena gets no huge page at all.
TEST(Memory, TheSlotArenaIsInHugePages) {
    std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string m;
    std::getline(mode, m);
    if (m.empty() || m.find("[never]") != std::string::npos)
        GTEST_SKIP() << "transparent huge pages are disabled in this kernel (" << (m.empty() ? "no sysfs entry" : m)
                     << "): the arenas' MADV_HUGEPAGE advice has no effect to check";
    engine e(sized(std::size_t{1} << 20), idem::manual_clock{}, nullptr);
    for (int i = 0; i < 50'000; ++i)
        ASSERT_EQ(e.begin(idem::key("huge-" + std::to_string(i)), 1).status, begin_status::acquired);
    const auto [p, bytes] = e.slot_memory(0);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % (std::size_t{2} << 20), 0u) << "the arena is not 2 MiB aligned";
    // The constructor populated the first 4 MiB (two huge pages) and 50,000 slots are 3.2 MB; the
    // toucher's margin beyond them is asynchronous, so it is not counted on here.
    EXPECT_GE(anon_huge_bytes(p, bytes), std::size_t{4} << 20)
        << "the slot arena has (almost) no huge pages; THP mode: " << m;
}
