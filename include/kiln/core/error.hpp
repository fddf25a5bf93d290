// Typed exceptions and the source-location formatting every error message uses.
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

/// Base of every exception kiln throws.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};
/// Shapes that do not broadcast, bad axes, incompatible views, rank over the limit.
class ShapeError : public Error { using Error::Error; };
/// Dtypes an op does not accept or cannot combine.
class DTypeError : public Error { using Error::Error; };
/// An operation on a device that is absent or does not match.
class DeviceError : public Error { using Error::Error; };
/// Allocation failed after the caches were released.
class OutOfMemory : public Error { using Error::Error; };
/// Generated code failed to compile.
class CompileError : public Error { using Error::Error; };
/// An index or value out of range (element access, arguments).
class ValueError : public Error { using Error::Error; };
/// A bug in kiln itself, never the user's fault.
class InternalError : public Error { using Error::Error; };

namespace detail {

/// "file.cpp:42" with the directory stripped, for messages.
inline std::string format_location(const std::source_location& loc) {
    std::string_view file = loc.file_name();
    if (auto slash = file.find_last_of("/\\"); slash != std::string_view::npos) file.remove_prefix(slash + 1);
    if (file.empty()) return "<unknown>";
    return std::string(file) + ":" + std::to_string(loc.line());
}

/// Throws E with "kiln::<op>: <what> at <file:line>".
template <class E>
[[noreturn]] void fail(std::string_view op, const std::string& what, const std::source_location& loc) {
    throw E("kiln::" + std::string(op) + ": " + what + " at " + format_location(loc));
}

}  // namespace detail
}  // namespace kiln
