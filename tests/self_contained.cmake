# Each public header compiles on its own (a user may include <kiln/nn/layers.hpp> or
# <kiln/dist.hpp> without kiln.hpp first): runs the C++ compiler with -fsyntax-only on a one-line
# file per header, in separate compilation (the mode where a missing include is not covered by an
# _impl.hpp that happens to include it) and with the CUDA backend when the build has it.
#   cmake -DCXX=... -DINCLUDE_DIR=<include/> -DINCLUDES=<dir;dir> [-DCUDA_INCLUDE=<dir>] -DWORK=<dir> -P self_contained.cmake
foreach(v CXX INCLUDE_DIR INCLUDES WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "self_contained.cmake: pass -D${v}=...")
  endif()
endforeach()
set(args -std=c++20 -fsyntax-only -DKILN_SEPARATE_COMPILATION "-I${INCLUDE_DIR}")
foreach(dir IN LISTS INCLUDES)
  list(APPEND args "-I${dir}")
endforeach()
if(CUDA_INCLUDE)
  list(APPEND args -DKILN_WITH_CUDA=1 -isystem "${CUDA_INCLUDE}")
endif()
# the headers a user includes directly (kiln.hpp's parts are covered by kiln.hpp); the ONNX ones
# need ONNX's own include setup and are compiled by the kiln::onnx target
file(GLOB headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/kiln/*.hpp ${INCLUDE_DIR}/kiln/nn/*.hpp ${INCLUDE_DIR}/kiln/dist/*.hpp
     ${INCLUDE_DIR}/kiln/export/*.hpp ${INCLUDE_DIR}/kiln/ops/*.hpp)
list(FILTER headers EXCLUDE REGEX "_impl\\.hpp$|/src\\.hpp$|/export/onnx")
list(SORT headers)
file(MAKE_DIRECTORY ${WORK})
set(failed "")
foreach(h IN LISTS headers)
  string(MAKE_C_IDENTIFIER ${h} id)
  file(WRITE ${WORK}/${id}.cpp "#include <${h}>\n")
  execute_process(COMMAND ${CXX} ${args} ${WORK}/${id}.cpp RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(REGEX MATCH "[^\n]*error[^\n]*" first "${out}")
    message("${h}: does not compile on its own: ${first}")
    list(APPEND failed ${h})
  endif()
endforeach()
list(LENGTH headers n)
list(LENGTH failed nf)
message("${n} headers, ${nf} not self-contained")
if(nf GREATER 0)
  message(FATAL_ERROR "self_contained.cmake: ${failed}")
endif()
