// Include this in exactly one .cpp of a program built with KILN_SEPARATE_COMPILATION defined
// everywhere: it compiles kiln's runtime there (the CMake target kiln::kiln_compiled does this).
#pragma once

#if !defined(KILN_SEPARATE_COMPILATION)
#error "kiln/src.hpp is for separate compilation: define KILN_SEPARATE_COMPILATION for every translation unit"
#endif
#define KILN_BUILDING_LIBRARY 1
#include "kiln/kiln.hpp"
