// idem/payload.hpp: what run() can store of a function's result, and how.
//
//   #include <idem/idem.hpp>
//   #include <string>
//   #include <string_view>
//   struct receipt { std::uint32_t status; char id[12]; };          // trivially copyable: stored as bytes
//   struct money { long long cents; std::string currency; };        // not: it gets a codec
//   template <> struct idem::codec<money> {
//       static std::string encode(const money& m) { return std::to_string(m.cents) + ' ' + m.currency; }
//       static money decode(std::string_view b) {
//           const auto sp = b.find(' ');
//           return {std::stoll(std::string(b.substr(0, sp))), std::string(b.substr(sp + 1))};
//       }
//   };
//   static_assert(idem::storable<receipt> && idem::storable<money> && !idem::storable<double>);
//   int main() {
//       idem::guard g;
//       const money m = g.run(idem::key("CHARGE_1"), [] { return money{1250, "EUR"}; });
//       const money again = g.run(idem::key("CHARGE_1"), [] { return money{}; });  // not run: 1250 EUR
//       const std::string body = g.run(idem::key("HTTP_1"), [] { return std::string("{\"id\":1}"); });
//       return m.cents == again.cents && body.size() == 8 ? 0 : 1;
//   }
//
// run(k, fn) stores fn's result R so that a duplicate gets it back (guard_contract.hpp):
//
//   * idem::codec<R> specialized (encode(const R&) -> std::string, decode(std::string_view) -> R):
//     the codec's bytes, as a payload. It wins over every rule below (a codec<double> makes double
//     storable).
//   * void: outcome 0. Integral R (bool included: true is 1) and enumerations with an integral
//     underlying type: the 64-bit outcome, no payload (the fast path of before); run() returns
//     std::uint64_t as it always did.
//   * std::string, std::vector<std::byte>: the bytes, as a payload; run() returns R.
//   * std::span<const std::byte> / std::span<std::byte>: the bytes, as a payload; run() returns
//     std::vector<std::byte> (a span cannot own the replayed bytes).
//   * a trivially copyable class (a struct of numbers and arrays): its object representation,
//     sizeof(R) bytes, as a payload; run() returns R. A replay whose bytes are not sizeof(R) long
//     (the record was written by other code) throws errc::corrupt_record. Pointers inside such a
//     struct are stored as numbers: meaningless in another process; give such a type a codec.
//   * anything else (double, float, pointers, a class with a std::string member...) does not
//     compile: run() static_asserts with the rules above. Floating point is refused on purpose:
//     it used to be cast to the integer outcome, silently narrowed.
//
// A payload is at most options.max_payload bytes (guard.hpp, options.hpp).
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "idem/error.hpp"

namespace idem {

/// A user codec for T: specialize with static std::string encode(const T&) and static T
/// decode(std::string_view). decode gets exactly the bytes encode returned; it may throw (run()
/// lets the exception through to the duplicate's caller).
template <class T>
struct codec;

/// T has a usable idem::codec<T> specialization.
template <class T>
concept has_codec = requires(const T& v, std::string_view b) {
    { codec<T>::encode(v) } -> std::convertible_to<std::string>;
    { codec<T>::decode(b) } -> std::same_as<T>;
};

namespace detail {

template <class T>
inline constexpr bool is_byte_span_v = false;
template <std::size_t N>
inline constexpr bool is_byte_span_v<std::span<const std::byte, N>> = true;
template <std::size_t N>
inline constexpr bool is_byte_span_v<std::span<std::byte, N>> = true;

template <class T>
concept outcome_result = std::is_void_v<T> || std::integral<T> ||
    (std::is_enum_v<T>&& std::integral<std::underlying_type_t<T>>);

template <class T>
concept bytes_result = std::same_as<T, std::string> || std::same_as<T, std::vector<std::byte>> || is_byte_span_v<T>;

template <class T>
concept trivial_result = std::is_class_v<T> && std::is_trivially_copyable_v<T> && !bytes_result<T>;

}  // namespace detail

/// A result run() stores as a response payload (not as the 64-bit outcome).
template <class T>
concept payload_result = has_codec<T> || detail::bytes_result<T> || detail::trivial_result<T>;

/// A result run() can store at all: an outcome (void, integral, enum) or a payload. See above.
template <class T>
concept storable = payload_result<T> || detail::outcome_result<T>;

namespace detail {

/// Whether a ticket type can record a payload (its class says so: basic_ticket and
/// global_ticket do).
template <class Ticket>
inline constexpr bool carries_payloads_v = requires {
    requires Ticket::carries_payloads;
};

/// What run() returns for a result of type R.
template <class R>
using run_result_t = std::conditional_t<outcome_result<R> && !has_codec<R>, std::uint64_t,
                                        std::conditional_t<is_byte_span_v<R>, std::vector<std::byte>, R>>;

/// The outcome of an outcome_result value (void: not called).
template <class R>
[[nodiscard]] constexpr std::uint64_t outcome_of(const R& v) noexcept {
    if constexpr (std::is_enum_v<R>) return static_cast<std::uint64_t>(static_cast<std::underlying_type_t<R>>(v));
    else return static_cast<std::uint64_t>(v);
}

/// The bytes of a payload_result value. A std::string is viewed where it is, not copied.
template <class R>
struct encoded {
    std::string owned;
    std::string_view bytes;
};

template <class R>
[[nodiscard]] encoded<R> encode_result(const R& v) {
    encoded<R> e;
    if constexpr (has_codec<R>) {
        e.owned = codec<R>::encode(v);
        e.bytes = e.owned;
    } else if constexpr (std::same_as<R, std::string>) {
        e.bytes = v;
    } else if constexpr (bytes_result<R>) {
        e.bytes = std::string_view(reinterpret_cast<const char*>(v.data()), v.size());
    } else {
        e.bytes = std::string_view(reinterpret_cast<const char*>(&v), sizeof(R));
    }
    return e;
}

/// What run() returns for the value fn returned (a span becomes the vector it would replay as).
template <class R>
[[nodiscard]] run_result_t<R> returned(R&& v) {
    if constexpr (is_byte_span_v<std::remove_cvref_t<R>>) return std::vector<std::byte>(v.begin(), v.end());
    else return std::forward<R>(v);
}

/// A replayed payload as R. `who` names the key for the error of a payload that cannot be R.
template <class R>
[[nodiscard]] run_result_t<R> decode_result(const std::string& bytes, const std::string& who) {
    if constexpr (has_codec<R>) {
        return codec<R>::decode(bytes);
    } else if constexpr (std::same_as<R, std::string>) {
        return bytes;
    } else if constexpr (bytes_result<R>) {
        const auto* p = reinterpret_cast<const std::byte*>(bytes.data());
        return std::vector<std::byte>(p, p + bytes.size());
    } else {
        if (bytes.size() != sizeof(R))
            throw error(errc::corrupt_record,
                        who + ": the recorded payload has " + std::to_string(bytes.size()) +
                            " bytes; a replay as this result type needs sizeof = " + std::to_string(sizeof(R)));
        struct raw {
            unsigned char b[sizeof(R)];
        } r;  // not R itself: R need not be default-constructible
        std::memcpy(r.b, bytes.data(), sizeof(R));
        return std::bit_cast<R>(r);
    }
}

}  // namespace detail
}  // namespace idem
