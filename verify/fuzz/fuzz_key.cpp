// verify/fuzz/fuzz_key.cpp: the key parser and composer (include/idem/key.hpp), and the helpers that read
// keys back (key::printable, biz_type_of).
//
// Input: one mode byte, then the rest.
//   mode even: the rest is a candidate key text. key::parse must accept it exactly when it is 1..128
//     bytes without NUL or control bytes (checked against an independent predicate), the throwing
//     constructor must agree with parse, and an accepted key must round-trip byte for byte.
//   mode odd: the rest is split into (txid, operation, 4-byte version) at the first two 0xff bytes.
//     key::compose must succeed exactly when both components are valid keys without '_' and the
//     result fits in 128 bytes, and its result must split back into the same triple (injectivity).
// Every failure must be an idem::error with errc::invalid_key and a message; nothing else may escape.
#include <idem/key.hpp>
#include <idem/store.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace {

[[noreturn]] void fail(const char* what, std::string_view input) {
    std::fprintf(stderr, "fuzz_key: %s (input '%s')\n", what, idem::key::printable(input).c_str());
    std::abort();
}

bool valid_key(std::string_view s) {
    if (s.empty() || s.size() > 128) return false;
    for (unsigned char c : s)
        if (c < 0x20 || c == 0x7f) return false;
    return true;
}

void check_printable(std::string_view s) {
    const std::string p = idem::key::printable(s);
    for (unsigned char c : p)
        if (c < 0x20 || c == 0x7f) fail("printable() left a control byte", s);
    if (p.size() > 160 * 4 + 3) fail("printable() is unbounded", s);
}

void parse_mode(std::string_view text) {
    std::string why;
    const auto k = idem::key::parse(text, &why);
    const bool expect = valid_key(text);
    if (k.has_value() != expect) fail(expect ? "parse rejected a valid key" : "parse accepted an invalid key", text);
    if (!k && why.empty()) fail("parse gave no reason", text);
    bool threw = false;
    try {
        idem::key direct(text);
        if (direct.view() != text) fail("constructor changed the text", text);
    } catch (const idem::error& e) {
        threw = true;
        if (e.kind() != idem::errc::invalid_key) fail("constructor threw a code other than invalid_key", text);
    }
    if (threw == expect) fail("constructor and parse disagree", text);
    if (k) {
        if (k->view() != text || k->size() != text.size()) fail("key does not round-trip", text);
        // biz_type_of fits the VARCHAR(32) column and is never empty ("default" when the key has
        // no operation part, e.g. "A__v1").
        const std::string biz = idem::biz_type_of(k->view());
        if (biz.size() > 32) fail("biz_type_of longer than 32 bytes", text);
        if (biz.empty()) fail("biz_type_of is empty", text);
    }
    check_printable(text);
}

void compose_mode(std::string_view rest) {
    const auto a = rest.find('\xff');
    const auto b = a == std::string_view::npos ? a : rest.find('\xff', a + 1);
    if (b == std::string_view::npos) return;
    const std::string_view txid = rest.substr(0, a), op = rest.substr(a + 1, b - a - 1);
    std::uint32_t version = 0;
    const std::string_view tail = rest.substr(b + 1);
    std::memcpy(&version, tail.data(), std::min<std::size_t>(tail.size(), 4));
    const std::string v = std::to_string(version);
    const bool comps_ok = valid_key(txid) && valid_key(op) && txid.find('_') == std::string_view::npos &&
                          op.find('_') == std::string_view::npos;
    const bool expect = comps_ok && txid.size() + op.size() + 3 + v.size() <= 128;
    try {
        const idem::key k = idem::key::compose(txid, op, version);
        if (!expect) fail("compose accepted invalid components", rest);
        // Injectivity: split at the first '_' and the last "_v" and recover the triple exactly.
        const std::string_view s = k.view();
        const auto first = s.find('_');
        const auto last = s.rfind("_v");
        if (first == std::string_view::npos || last == std::string_view::npos || last <= first)
            fail("composed key does not split", s);
        if (s.substr(0, first) != txid || s.substr(first + 1, last - first - 1) != op || s.substr(last + 2) != v)
            fail("composed key does not split back into its triple", s);
        if (idem::biz_type_of(s) != op.substr(0, 32)) fail("biz_type_of does not name the operation", s);
    } catch (const idem::error& e) {
        if (expect) fail("compose rejected valid components", rest);
        if (e.kind() != idem::errc::invalid_key || std::strlen(e.what()) == 0) fail("compose threw a bad error", rest);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    if (data[0] % 2 == 0) parse_mode(rest);
    else compose_mode(rest);
    return 0;
}
