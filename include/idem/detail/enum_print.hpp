// idem/detail/enum_print.hpp: how the public enums print (their operator<< forwards here).
//
// An enumerator prints as its name; a value outside the enum as `type(n)`, so a corrupt or newer
// value is seen for what it is instead of as an unprintable byte. The operators are templates on
// the stream so that a header declaring one needs only <iosfwd>: <ostream> is the caller's, who
// has it wherever there is a stream to print to.
#pragma once

#include <iosfwd>

namespace idem::detail {

/// Prints `name`, or `type(value)` when name is null (a value the enum does not name).
template <class Ostream, class Enum>
Ostream& print_enum(Ostream& os, const char* name, const char* type, Enum e) {
    if (name != nullptr) return os << name;
    return os << type << '(' << static_cast<unsigned long long>(e) << ')';
}

}  // namespace idem::detail
