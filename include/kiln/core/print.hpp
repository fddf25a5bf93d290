// Printing tensors the way torch does: nested brackets, aligned columns, summaries of large tensors.
#pragma once

#include <iosfwd>
#include <string>

#include "kiln/core/config.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

/// torch-style text: `tensor([[1.0000, 2.5000], ...])`, with the dtype when it is not the default
/// and the device when it is not the CPU (a CUDA tensor is copied to the host to be printed).
KILN_DECL std::string to_string(const Tensor& tensor);
/// Writes to_string(t).
KILN_DECL std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace kiln

#if KILN_HEADER_ONLY
#include "kiln/core/print_impl.hpp"
#endif
