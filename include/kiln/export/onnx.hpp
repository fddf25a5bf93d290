// ONNX export of an exported program: kiln::onnx::export_model(ep, "model.onnx") writes an ONNX
// model (opset 17, IR version 8) through ONNX's own protobuf classes, checked by ONNX's checker:
// dynamic dims as dim_param, the lifted tensors as initializers, named inputs and outputs. An op with
// no mapping is an ExportError naming it. Needs ONNX (Debian: libonnx-dev libprotobuf-dev): link the
// CMake target kiln::onnx (KILN_WITH_ONNX). docs/EXPORT.md lists the mapping.
#pragma once

#include "kiln/export/onnx_proto.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/export/program.hpp"

namespace kiln::onnx {

struct Options {
    int opset = 17;
    bool check = true;  ///< run ONNX's checker on the model (an ExportError when it refuses it)
};

/// The ONNX model of an exported program (checked by ONNX's checker unless opt.check is false).
KILN_DECL ::onnx::ModelProto to_model_proto(const ExportedProgram& ep, const Options& opt = {},
                                            std::source_location loc = std::source_location::current());

/// Writes the ONNX model of an exported program to `path` (under a temporary name, renamed into
/// place: a failure leaves no file).
KILN_DECL void export_model(const ExportedProgram& ep, const std::string& path, const Options& opt = {},
                            std::source_location loc = std::source_location::current());

}  // namespace kiln::onnx

#if KILN_ONNX_HEADER_ONLY
#include "kiln/export/onnx_impl.hpp"
#endif
