// kiln's runtime compiled once (separate compilation): the CMake target kiln::kiln_compiled.
#include "kiln/src.hpp"
