# One compile-fail check: runs the C++ compiler on one tests/compile_fail/<name>.cpp with
# -fsyntax-only (the diagnostics under test are static_asserts of the expression templates, which
# template instantiation raises without code generation) and prints its output; fails when the
# compiler does. Run by ctest (tests/CMakeLists.txt) straight, not through the build tool, so the
# checks run in parallel and no build tree is locked.
#   cmake -DCXX=... -DSRC=... -DINCLUDES=<dir;dir> [-DCONTROL=ON] -P compile_fail.cmake
# With CONTROL=ON, SRC may list several files: they are compiled as one translation unit (kiln.hpp
# parsed once), each in a namespace of its own with its main renamed, and WORK names the directory
# for that file.
foreach(v CXX SRC INCLUDES)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "compile_fail.cmake: pass -D${v}=...")
  endif()
endforeach()
set(args -std=c++20 -fsyntax-only -DKILN_SEPARATE_COMPILATION)  # declarations of the runtime only
foreach(dir IN LISTS INCLUDES)
  list(APPEND args "-I${dir}")
endforeach()
if(CONTROL)
  list(APPEND args -DKILN_COMPILE_FAIL_CONTROL)
endif()
list(LENGTH SRC nsrc)
if(nsrc GREATER 1)
  if(NOT CONTROL OR NOT DEFINED WORK)
    message(FATAL_ERROR "compile_fail.cmake: several sources need -DCONTROL=ON and -DWORK=<dir>")
  endif()
  # every file's own #include <kiln/kiln.hpp> is then a no-op (#pragma once)
  set(tu "#include <kiln/kiln.hpp>\n#include <string>\n")
  set(i 0)
  foreach(f IN LISTS SRC)
    string(APPEND tu "#define main control_main_${i}\nnamespace control_${i} {\n#include \"${f}\"\n}\n#undef main\n")
    math(EXPR i "${i} + 1")
  endforeach()
  string(APPEND tu "int main() {}\n")
  file(MAKE_DIRECTORY ${WORK})
  file(WRITE ${WORK}/compile_fail_controls.cpp "${tu}")
  set(SRC ${WORK}/compile_fail_controls.cpp)
endif()
execute_process(COMMAND ${CXX} ${args} ${SRC} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compile_fail.cmake: ${CXX} exited with ${rc} on ${SRC}")
endif()
