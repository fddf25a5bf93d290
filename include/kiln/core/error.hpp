// Typed exceptions and the source-location formatting every error message uses.
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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
/// Autograd misuse: backward of a non-scalar without a gradient, an in-place write into a leaf that
/// requires grad, a tensor saved for backward and modified in place since.
class GradError : public Error { using Error::Error; };
/// Distributed work failed (kiln::dist): a rank that exited or lost its connection, a collective
/// that timed out, a rendezvous that did not complete, ranks started with different world sizes.
class DistError : public Error { using Error::Error; };
/// kiln::export_program could not capture a function as one self-contained program (a graph break,
/// a dim declared dynamic that the program must specialize, an op with no saved form), or a program
/// file could not be written.
class ExportError : public Error { using Error::Error; };
/// An input outside an exported program's shape constraints: a dynamic dim out of its declared
/// range, two dims declared equal that differ, a static dim that changed (a ShapeError).
class ConstraintError : public ShapeError { using ShapeError::ShapeError; };
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

/// The public op the user called, while a composite of it runs (softmax, var, cat...).
struct UserOp {
    std::string_view name;
    std::source_location loc;
};
/// This thread's outermost UserOpScope, or nullptr.
inline const UserOp*& current_user_op() {
    thread_local const UserOp* op = nullptr;
    return op;
}

/// Names the user's op for the errors raised while a composite runs: the ops it decomposes into
/// (max, sum, slice, copy_...) fail as `kiln::softmax: ... at <the user's file:line>`, not as
/// `kiln::max`. Scopes nest; the outermost (the op the user wrote) wins. Each public composite
/// opens one first thing, with the op's name and the caller's location.
class UserOpScope {
public:
    UserOpScope(std::string_view name, const std::source_location& loc) : op_{name, loc} {
        if (current_user_op() == nullptr) {
            current_user_op() = &op_;
            owner_ = true;
        }
    }
    ~UserOpScope() {
        if (owner_) current_user_op() = nullptr;
    }
    UserOpScope(const UserOpScope&) = delete;
    UserOpScope& operator=(const UserOpScope&) = delete;

private:
    UserOp op_;
    bool owner_ = false;
};

/// Throws E with "kiln::<op>: <what> at <file:line>". Inside a UserOpScope, errors about the
/// user's input (shapes, dtypes, values, devices) name the scope's op and location instead.
template <class E>
[[noreturn]] void fail(std::string_view op, const std::string& what, const std::source_location& loc) {
    constexpr bool user_input = std::is_same_v<E, ShapeError> || std::is_same_v<E, DTypeError> ||
                                std::is_same_v<E, ValueError> || std::is_same_v<E, DeviceError>;
    if constexpr (user_input)
        if (const UserOp* u = current_user_op())
            throw E("kiln::" + std::string(u->name) + ": " + what + " at " + format_location(u->loc));
    throw E("kiln::" + std::string(op) + ": " + what + " at " + format_location(loc));
}

}  // namespace detail
}  // namespace kiln
