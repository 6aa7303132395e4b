// key_test: the idempotency key's rules (1..128 bytes, no NUL/control bytes, UTF-8 byte for byte),
// key::compose's injectivity, and the error category.
#include <idem/idem.hpp>
#include <idem/store.hpp>

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "support/threads.hpp"

namespace {

using idem::errc;

// Runs `make` and returns the idem::error it threw; fails the test when it does not throw one.
template <class Fn>
idem::error thrown_by(Fn make) {
    try {
        make();
    } catch (const idem::error& e) {
        return e;
    }
    ADD_FAILURE() << "expected idem::error";
    return idem::error(errc::invalid_argument, "<nothing thrown>");
}

TEST(Key, AcceptsValidKeys) {
    for (std::string_view text :
         {"a", "TX20230615123456_TRANSFER_v2", "order-42", "with space", "~!@#$%^&*()", "\x80\xff"}) {
        const idem::key k(text);
        EXPECT_EQ(k.view(), text);
        EXPECT_EQ(k.size(), text.size());
        EXPECT_EQ(k.str(), std::string(text));
        EXPECT_TRUE(idem::key::parse(text).has_value()) << text;
    }
}

TEST(Key, RejectsEmptyKey) {
    const auto e = thrown_by([] { idem::key k(""); });
    EXPECT_EQ(e.kind(), errc::invalid_key);
    EXPECT_EQ(e.code(), errc::invalid_key);
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();

    std::string why;
    EXPECT_FALSE(idem::key::parse("", &why).has_value());
    EXPECT_NE(why.find("empty"), std::string::npos) << why;
}

TEST(Key, LengthLimitIs128Bytes) {
    const std::string ok(128, 'k');
    EXPECT_EQ(idem::key(ok).size(), 128u);

    const std::string too_long(129, 'k');
    const auto e = thrown_by([&] { idem::key k(too_long); });
    EXPECT_EQ(e.kind(), errc::invalid_key);
    EXPECT_NE(std::string(e.what()).find("129 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("128"), std::string::npos) << e.what();
    EXPECT_FALSE(idem::key::parse(too_long).has_value());
    EXPECT_FALSE(idem::key::parse(std::string(100000, 'k')).has_value());
}

TEST(Key, RejectsNulByte) {
    const std::string_view text("ab\0cd", 5);
    const auto e = thrown_by([&] { idem::key k(text); });
    EXPECT_EQ(e.kind(), errc::invalid_key);
    const std::string what = e.what();
    EXPECT_NE(what.find("NUL"), std::string::npos) << what;
    EXPECT_NE(what.find("offset 2"), std::string::npos) << what;
    EXPECT_NE(what.find("ab\\x00cd"), std::string::npos) << "the message names the input, escaped: " << what;
}

TEST(Key, RejectsControlBytes) {
    for (const char c : {'\x01', '\x1f', '\x7f', '\n', '\t'}) {
        const std::string text = std::string("key") + c;
        const auto e = thrown_by([&] { idem::key k(text); });
        EXPECT_EQ(e.kind(), errc::invalid_key);
        const std::string what = e.what();
        static constexpr char hex[] = "0123456789abcdef";
        const std::string code = std::string("0x") + hex[(c >> 4) & 15] + hex[c & 15];
        EXPECT_NE(what.find("control byte " + code), std::string::npos) << what;
        EXPECT_NE(what.find("offset 3"), std::string::npos) << what;
        EXPECT_FALSE(idem::key::parse(text).has_value());
    }
    // 0x20 (space) and 0x7e (~) are the printable edges.
    EXPECT_TRUE(idem::key::parse(" ~").has_value());
}

TEST(Key, Utf8PassesByteForByte) {
    const std::string text = "\xe6\x94\xaf\xe4\xbb\x98_\xf0\x9f\x92\xb3_v1";  // "支付_💳_v1"
    const idem::key k(text);
    EXPECT_EQ(k.str(), text);
    EXPECT_EQ(k.size(), text.size());
    // 42 three-byte characters are 126 bytes (fits); 43 are 129 bytes (does not).
    std::string han;
    for (int i = 0; i < 42; ++i) han += "\xe6\x94\xaf";
    EXPECT_TRUE(idem::key::parse(han).has_value());
    EXPECT_FALSE(idem::key::parse(han + "\xe6\x94\xaf").has_value());
}

TEST(Key, EqualityIsByteEquality) {
    EXPECT_EQ(idem::key("abc"), idem::key("abc"));
    EXPECT_FALSE(idem::key("abc") == idem::key("abC"));
    EXPECT_FALSE(idem::key("abc") == idem::key("abc "));
}

TEST(KeyCompose, BuildsTxidOperationVersion) {
    EXPECT_EQ(idem::key::compose("TX1", "PAY", 2).str(), "TX1_PAY_v2");
    EXPECT_EQ(idem::key::compose("TX20230615123456", "TRANSFER", 2).str(), "TX20230615123456_TRANSFER_v2");
    EXPECT_EQ(idem::key::compose("a", "b", 0).str(), "a_b_v0");
    EXPECT_EQ(idem::key::compose("a", "b", 4294967295u).str(), "a_b_v4294967295");
}

TEST(KeyCompose, SeparatorInsideAComponentThrowsNamingIt) {
    const auto in_txid = thrown_by([] { (void)idem::key::compose("TX_1", "PAY", 1); });
    EXPECT_EQ(in_txid.kind(), errc::invalid_key);
    EXPECT_NE(std::string(in_txid.what()).find("transaction id"), std::string::npos) << in_txid.what();
    EXPECT_NE(std::string(in_txid.what()).find("'TX_1'"), std::string::npos) << in_txid.what();

    const auto in_op = thrown_by([] { (void)idem::key::compose("TX1", "PAY_OUT", 1); });
    EXPECT_EQ(in_op.kind(), errc::invalid_key);
    EXPECT_NE(std::string(in_op.what()).find("operation"), std::string::npos) << in_op.what();
    EXPECT_NE(std::string(in_op.what()).find("'PAY_OUT'"), std::string::npos) << in_op.what();
    EXPECT_EQ(std::string(in_op.what()).find("transaction id"), std::string::npos)
        << "blames the wrong component: " << in_op.what();
}

TEST(KeyCompose, InvalidComponentsThrowNamingThem) {
    const auto empty_txid = thrown_by([] { (void)idem::key::compose("", "PAY", 1); });
    EXPECT_EQ(empty_txid.kind(), errc::invalid_key);
    EXPECT_NE(std::string(empty_txid.what()).find("transaction id"), std::string::npos) << empty_txid.what();

    const auto ctrl_op = thrown_by([] { (void)idem::key::compose("TX1", "P\x01Y", 1); });
    EXPECT_EQ(ctrl_op.kind(), errc::invalid_key);
    EXPECT_NE(std::string(ctrl_op.what()).find("operation"), std::string::npos) << ctrl_op.what();

    // Each component fits but the composed key does not.
    const auto too_long = thrown_by([] { (void)idem::key::compose(std::string(64, 't'), std::string(64, 'o'), 1); });
    EXPECT_EQ(too_long.kind(), errc::invalid_key);
    EXPECT_NE(std::string(too_long.what()).find("128"), std::string::npos) << too_long.what();
}

// Property: different (txid, operation, version) triples never compose to the same key, and the
// key splits back into its triple. Components are drawn from a tiny alphabet holding the
// separator, 'v' and digits, which are exactly the bytes a non-injective scheme would confuse.
TEST(KeyCompose, IsInjectiveOverRandomTriples) {
    const std::uint64_t seed = idem_test::test_seed();
    SCOPED_TRACE("IDEM_SEED=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const std::string alphabet = "_v12-";
    auto component = [&] {
        std::string s(std::uniform_int_distribution<std::size_t>(0, 4)(rng), ' ');
        for (auto& c : s) c = alphabet[std::uniform_int_distribution<std::size_t>(0, alphabet.size() - 1)(rng)];
        return s;
    };
    using triple = std::tuple<std::string, std::string, std::uint32_t>;
    std::map<std::string, triple> seen;
    std::size_t composed = 0, rejected = 0;
    const std::size_t rounds = idem_test::env_size("IDEM_KEY_TRIPLES", 20000, 20000);
    for (std::size_t i = 0; i < rounds; ++i) {
        const triple t{component(), component(), std::uniform_int_distribution<std::uint32_t>(0, 130)(rng)};
        const auto& [txid, op, version] = t;
        const bool valid = !txid.empty() && !op.empty() && txid.find('_') == std::string::npos &&
                           op.find('_') == std::string::npos;
        std::string text;
        try {
            text = idem::key::compose(txid, op, version).str();
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), errc::invalid_key);
            EXPECT_FALSE(valid) << "rejected a valid triple (" << txid << ", " << op << ", " << version << "): " << e.what();
            ++rejected;
            continue;
        }
        ++composed;
        ASSERT_TRUE(valid) << "accepted (" << txid << ", " << op << ", " << version << ") as " << text;
        const auto [it, inserted] = seen.emplace(text, t);
        ASSERT_TRUE(inserted || it->second == t)
            << "two triples give key '" << text << "': (" << std::get<0>(it->second) << ", " << std::get<1>(it->second)
            << ", " << std::get<2>(it->second) << ") and (" << txid << ", " << op << ", " << version << ")";
        // Splitting at the first and last separators recovers the triple.
        const auto first = text.find('_'), last = text.rfind('_');
        ASSERT_NE(first, last);
        EXPECT_EQ(text.substr(0, first), txid);
        EXPECT_EQ(text.substr(first + 1, last - first - 1), op);
        EXPECT_EQ(text.substr(last + 1), "v" + std::to_string(version));
        // key::split() recovers it too.
        const idem::key k(text);
        const auto parts = k.split();
        ASSERT_TRUE(parts.has_value()) << text;
        EXPECT_EQ(parts->txid, txid);
        EXPECT_EQ(parts->operation, op);
        EXPECT_EQ(parts->version, version);
    }
    std::cout << "[ idem    ] composed " << composed << " keys (" << seen.size() << " distinct), rejected " << rejected
              << '\n';
    EXPECT_GT(composed, rounds / 10);
    EXPECT_GT(rejected, rounds / 10);
}

// split() answers only for keys compose() could have made: anything else has no parts, so ordered
// versions and per-operation leases leave it alone.
TEST(KeySplit, RefusesWhatComposeCannotMake) {
    for (const char* text : {"plain", "a_b", "a_b_c_v1", "_b_v1", "a__v1", "a_b_v", "a_b_1", "a_b_V1", "a_b_v01", "a_b_v-1",
                             "a_b_v+1", "a_b_v1x", "a_b_v4294967296", "a_b_v 1"})
        EXPECT_FALSE(idem::key(text).split().has_value()) << text;
    // The parts are views into the key: the key must outlive them (a temporary key would not).
    const idem::key zero_key("a_b_v0");
    const auto zero = zero_key.split();
    ASSERT_TRUE(zero.has_value());
    EXPECT_EQ(zero->version, 0u);
    const idem::key max_key("TX9_PAY_v4294967295");
    const auto max = max_key.split();
    ASSERT_TRUE(max.has_value());
    EXPECT_EQ(max->txid, "TX9");
    EXPECT_EQ(max->operation, "PAY");
    EXPECT_EQ(max->version, 4294967295u);
}

TEST(ErrorCategory, NameAndMessages) {
    EXPECT_STREQ(idem::error_category().name(), "idem");
    EXPECT_EQ(&idem::error_category(), &idem::make_error_code(errc::stale_ticket).category());

    std::set<std::string> messages;
    for (int v = static_cast<int>(errc::invalid_key); v <= static_cast<int>(errc::superseded); ++v) {
        const std::string m = idem::error_category().message(v);
        EXPECT_FALSE(m.empty()) << v;
        EXPECT_NE(m, "unknown idem error") << "errc " << v << " has no message";
        EXPECT_TRUE(messages.insert(m).second) << "two codes share the message '" << m << "'";
    }
    EXPECT_EQ(idem::error_category().message(0), "unknown idem error");
    EXPECT_EQ(idem::error_category().message(9999), "unknown idem error");
    EXPECT_EQ(idem::make_error_code(errc::duplicate_request).message(), "duplicate request: the key already completed");
}

TEST(ErrorCategory, ErrcConvertsToErrorCode) {
    const std::error_code ec = errc::stale_ticket;  // is_error_code_enum
    EXPECT_EQ(ec.category(), idem::error_category());
    EXPECT_EQ(ec.value(), static_cast<int>(errc::stale_ticket));
    EXPECT_TRUE(ec == errc::stale_ticket);
    EXPECT_FALSE(ec == errc::empty_ticket);
    EXPECT_FALSE(std::error_code{} == errc::stale_ticket);
    EXPECT_FALSE(ec == std::make_error_code(std::errc::invalid_argument)) << "must not alias a generic code";
}

TEST(ErrorCategory, ErrorIsASystemError) {
    const idem::error e(errc::payload_mismatch, "key 'K' reused");
    const std::system_error& base = e;
    EXPECT_EQ(base.code(), errc::payload_mismatch);
    EXPECT_EQ(e.kind(), errc::payload_mismatch);
    const std::string what = e.what();
    EXPECT_NE(what.find("key 'K' reused"), std::string::npos) << what;
    EXPECT_NE(what.find("different request payload"), std::string::npos) << what;
}

// The store's biz_type column: the operation of a composed key, "default" for anything else
// (never empty: the column is NOT NULL and a reader groups by it).
TEST(BizType, IsTheOperationOfAComposedKeyAndDefaultOtherwise) {
    EXPECT_EQ(idem::biz_type_of(idem::key::compose("TX1", "TRANSFER", 3).view()), "TRANSFER");
    EXPECT_EQ(idem::biz_type_of("plain-key"), "default");
    EXPECT_EQ(idem::biz_type_of("A__v1"), "default") << "an empty operation part";
    EXPECT_EQ(idem::biz_type_of("A_B_x"), "default") << "no version suffix";
    const std::string op(40, 'P');
    EXPECT_EQ(idem::biz_type_of(idem::key::compose("TX1", op, 1).view()), std::string(32, 'P')) << "cut to the column";
}

}  // namespace
