// The registry of library ops (ir::CallOp) by name: how a saved program (kiln/export) makes a call
// node's op again from its name and attributes. Each op registers where it is defined (nn/conv.hpp,
// nn/layers.hpp), so a program that loads a file with conv2d in it includes <kiln/nn.hpp>.
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln::ir {

using CallAttrs = std::vector<std::pair<std::string, double>>;
/// Makes a library op from its attributes; throws ValueError for attributes it cannot take.
using LibraryOpFactory = std::function<std::shared_ptr<const CallOp>(const CallAttrs&)>;

namespace detail {
struct LibraryOps {
    std::mutex mu;
    std::map<std::string, LibraryOpFactory> by_name;
};
inline LibraryOps& library_ops() {
    static LibraryOps* r = new LibraryOps;  // never destroyed: registrations may run during static init, lookups at exit
    return *r;
}
}  // namespace detail

/// Registers the factory of the library op `name` (the CallOp::name its ops carry), for loading
/// program files that call it. Returns true, so that a user's source file can register at static
/// initialization (`static const bool r = register_library_op(...)`); kiln's own ops are registered
/// by the loader (export/program_file.hpp), not by their headers, whose registrations would compile
/// the ops' kernels into every translation unit.
inline bool register_library_op(const std::string& name, LibraryOpFactory make) {
    auto& r = detail::library_ops();
    std::lock_guard lock(r.mu);
    r.by_name[name] = std::move(make);
    return true;
}

/// The factory registered for `name`, or an empty function.
inline LibraryOpFactory find_library_op(const std::string& name) {
    auto& r = detail::library_ops();
    std::lock_guard lock(r.mu);
    auto it = r.by_name.find(name);
    return it == r.by_name.end() ? LibraryOpFactory{} : it->second;
}

/// Attribute `key` of an op being made again: ValueError when it is missing or not an integer in
/// [lo, hi] (a saved file may say anything).
inline std::int64_t int_attr(const CallAttrs& a, const std::string& op, const std::string& key, std::int64_t lo, std::int64_t hi) {
    for (const auto& [k, v] : a)
        if (k == key) {
            if (!(v >= static_cast<double>(lo) && v <= static_cast<double>(hi)) || v != std::floor(v))
                throw ValueError(op + ": attribute '" + key + "' is " + std::to_string(v) + ", not an integer in [" + std::to_string(lo) +
                                 ", " + std::to_string(hi) + "]");
            return static_cast<std::int64_t>(v);
        }
    throw ValueError(op + ": attribute '" + key + "' is missing");
}

}  // namespace kiln::ir
