// A fixture for the layering test: closes an include cycle with core/low.hpp.
#pragma once
#include "kiln/core/low.hpp"
