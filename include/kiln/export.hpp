// Export and deploy: kiln::export_program (a strict capture into one program with parameters lifted
// to named inputs and named dynamic dims), ExportedProgram::save and kiln::load_program (one file
// that runs without the source). Not included by kiln.hpp: include it where programs are exported
// or loaded. It includes nn.hpp, whose library ops (conv2d, pooling, embedding) a saved program may call.
#pragma once

#include "kiln/nn.hpp"
#include "kiln/export/program.hpp"
#include "kiln/export/program_file.hpp"
