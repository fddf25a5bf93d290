// ONNX's own headers, for kiln/export/onnx.hpp and onnx_import.hpp: both include them first, all of
// them, so that ONNX's inline code is parsed before namespace kiln::onnx exists (with a user's
// `using namespace kiln;` in force, a later ONNX header's `onnx::` would be ambiguous).
#pragma once

#if !__has_include(<onnx/onnx_pb.h>)
#error "kiln's ONNX export and import need ONNX's headers (Debian: libonnx-dev libprotobuf-dev); link the CMake target kiln::onnx (-DKILN_WITH_ONNX=ON)"
#endif

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

// KILN_ONNX_HEADER_ONLY: whether this translation unit compiles the definitions of ONNX export and
// import: in header-only mode, and in separate compilation only in the one translation unit that
// builds kiln::onnx_compiled (src/kiln_onnx_compiled.cpp defines KILN_BUILDING_ONNX_LIBRARY).
#if !defined(KILN_SEPARATE_COMPILATION) || defined(KILN_BUILDING_ONNX_LIBRARY)
#define KILN_ONNX_HEADER_ONLY 1
#else
#define KILN_ONNX_HEADER_ONLY 0
#endif
