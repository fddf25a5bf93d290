// kiln's ONNX export and import compiled once (separate compilation): the CMake target
// kiln::onnx_compiled, which links kiln::kiln_compiled and ONNX.
#define KILN_BUILDING_ONNX_LIBRARY 1
#include "kiln/export/onnx.hpp"
#include "kiln/export/onnx_import.hpp"
