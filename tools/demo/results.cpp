// tools/demo/results.cpp: the durable store read back after a demo run.
#include "demo/results.hpp"

#include <charconv>
#include <chrono>
#include <memory>
#include <string_view>

namespace idem::tool::demo {

void check_store(const store_spec& spec, idem::durability mode, const std::string& prefix,
                 const std::function<std::uint64_t(std::size_t)>& outcome_of, std::size_t unique, durable_report& dr) {
    std::unique_ptr<idem::store> st = open_store(spec, mode, open_mode::existing);
    std::vector<std::uint8_t> seen(unique, 0);
    static constexpr std::string_view suffix = "_TRANSFER_v1";
    st->load([&](const idem::stored_record& r) {
        const std::string_view k = r.key;
        if (!k.starts_with(prefix) || !k.ends_with(suffix)) return;
        const std::string_view digits = k.substr(prefix.size(), k.size() - prefix.size() - suffix.size());
        std::uint64_t n = 0;
        const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
        if (ec != std::errc{} || p != digits.data() + digits.size() || n == 0 || n > unique) return;
        seen[n - 1] = 1;
        const std::uint64_t want = outcome_of(n - 1);
        if (r.state == idem::record_state::succeeded && r.outcome == want) {
            ++dr.records_ok;
            return;
        }
        ++dr.records_wrong;
        if (dr.record_problems.size() < 5)
            dr.record_problems.push_back("key '" + r.key + "' is " + idem::to_string(r.state) + " with outcome " +
                                         std::to_string(r.outcome) + "; the application recorded outcome " +
                                         std::to_string(want));
    });
    for (std::uint8_t s : seen) dr.records_missing += s == 0;
    const auto t0 = std::chrono::steady_clock::now();
    dr.verify = idem::verify(*st);
    dr.verify_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace idem::tool::demo
