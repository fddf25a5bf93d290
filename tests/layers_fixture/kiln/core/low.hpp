// A fixture for the layering test: a core header that includes an nn header (must be reported).
#pragma once
#include "kiln/nn/high.hpp"
