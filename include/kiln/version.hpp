// kiln's version: part of every on-disk cache key, so a new kiln never loads an old kiln's kernels.
#pragma once

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_STRING "0.1.0"

namespace kiln {
inline constexpr const char* version = KILN_VERSION_STRING;
}  // namespace kiln
