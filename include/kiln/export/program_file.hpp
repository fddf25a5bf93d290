// An exported program as one file: a safetensors file (the lifted tensors, by name) whose metadata
// holds the program as JSON, its format version and a checksum. docs/EXPORT.md describes it.
#pragma once

#include <cstdint>
#include <map>
#include <source_location>
#include <string>

#include "kiln/export/program.hpp"

namespace kiln {
namespace detail::program_file {

inline constexpr int format_version = 1;
inline constexpr const char* format_name = "kiln.program";

/// FNV-1a over the program text and every tensor's bytes, in name order.
KILN_DECL std::uint64_t checksum(const std::string& program, const std::map<std::string, Tensor>& tensors);

}  // namespace detail::program_file

/// Reads a program saved by ExportedProgram::save. Malformed, truncated, corrupted or newer-format
/// files are ValueErrors naming the file and what is wrong; nothing is run before every check passed.
KILN_DECL ExportedProgram load_program(const std::string& path, std::source_location loc = std::source_location::current());

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/export/program_file_impl.hpp"
#endif
