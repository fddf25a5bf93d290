// Include this in exactly one .cpp of a program built with KILN_SEPARATE_COMPILATION defined
// everywhere: it compiles kiln's runtime there (the CMake target kiln::kiln_compiled does this).
#pragma once

#if !defined(KILN_SEPARATE_COMPILATION)
#error "kiln/src.hpp is for separate compilation: define KILN_SEPARATE_COMPILATION for every translation unit"
#endif
#if defined(KILN_HEADER_ONLY) && !KILN_HEADER_ONLY
#error "kiln/src.hpp must come before every other kiln header in its .cpp (they were read as declarations only)"
#endif
#define KILN_BUILDING_LIBRARY 1
#include "kiln/kiln.hpp"
#include "kiln/nn.hpp"
// the optional modules users include themselves
#include "kiln/nn/bert.hpp"
#include "kiln/nn/tokenizer.hpp"
#include "kiln/dist.hpp"
#include "kiln/export.hpp"
