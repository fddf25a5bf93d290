// ONNX import: kiln::onnx::load("model.onnx") reads an ONNX model through ONNX's protobuf classes and
// returns an ExportedProgram that kiln compiles and fuses like a traced one, on the CPU and CUDA.
//
// How: the ONNX graph is run by an interpreter written with kiln ops, and that interpreter is
// captured by export_program, so an imported model goes through the same strict capture, dynamic
// dims (ONNX dim_params become kiln::Dims), passes, fuser and caches as C++ code. Values known when
// the model loads (initializers, Constant nodes, Shape and Size of inputs, and whatever is computed
// from them only: the shape arithmetic exporters write) are evaluated on the host there; everything
// else is traced. An op, attribute or dtype kiln cannot run is an onnx::ImportError naming the node.
// docs/EXPORT.md lists the ops. Needs ONNX (Debian: libonnx-dev libprotobuf-dev): link kiln::onnx.
#pragma once

#include "kiln/export/onnx_proto.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/export/program.hpp"

namespace kiln::onnx {

/// An ONNX model kiln cannot run: an op, attribute or dtype it does not implement, or a value it
/// needs when the model loads (a Reshape's shape) that depends on the inputs' values.
class ImportError : public Error { using Error::Error; };

struct LoadOptions {
    /// Ranges of the model's named dims (an input dim with a dim_param); a named dim not listed is
    /// Dim(name) (1 to any size). A dim with neither a size nor a name is named "<input>_<k>".
    std::map<std::string, Dim> dims{};
    /// The size each named dim is traced at (default: 8, clamped to its range).
    std::map<std::string, std::int64_t> example_sizes{};
    /// Inputs given a fixed shape (their named dims are specialized to it).
    std::map<std::string, Shape> shapes{};
    /// Inputs bound to a value when the model loads: they stop being inputs, and the program is
    /// specialized to them (like torch.export's constants). For models that take a shape, axes or
    /// a count as an input tensor, which kiln needs when it builds the program.
    std::map<std::string, Tensor> constants{};
};

/// A TensorProto as a CPU tensor (raw_data, the typed fields, or external data next to `dir`).
KILN_DECL Tensor tensor_from_proto(const ::onnx::TensorProto& p, const std::string& dir = "", std::source_location loc = std::source_location::current());

/// A file holding one serialized TensorProto (the ONNX node tests' input_0.pb, output_0.pb).
KILN_DECL Tensor read_tensor_file(const std::string& path, std::source_location loc = std::source_location::current());

/// An ONNX model as an exported program (see the top of this file). `dir` is where its external
/// data lies.
KILN_DECL ExportedProgram from_model(const ::onnx::ModelProto& model_in, const LoadOptions& opt = {}, const std::string& dir = "", std::source_location loc = std::source_location::current());

/// Reads an ONNX model file and returns it as an exported program: run it with ep.run({inputs})
/// or ep(inputs...) on the CPU or CUDA, save it as a kiln program, or export it to ONNX again.
KILN_DECL ExportedProgram load(const std::string& path, const LoadOptions& opt = {}, std::source_location loc = std::source_location::current());

}  // namespace kiln::onnx

#if KILN_ONNX_HEADER_ONLY
#include "kiln/export/onnx_import_impl.hpp"
#endif
