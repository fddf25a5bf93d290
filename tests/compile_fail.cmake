# One compile-fail check: runs the C++ compiler on one tests/compile_fail/<name>.cpp with
# -fsyntax-only (the diagnostics under test are static_asserts of the expression templates, which
# template instantiation raises without code generation) and prints its output; fails when the
# compiler does. Run by ctest (tests/CMakeLists.txt) straight, not through the build tool, so the
# checks run in parallel and no build tree is locked.
#   cmake -DCXX=... -DSRC=... -DINCLUDES=<dir;dir> [-DCONTROL=ON] [-DPCH=<dir>] -P compile_fail.cmake
#   cmake -DCXX=... -DINCLUDES=<dir;dir> -DMAKE_PCH=<dir> -P compile_fail.cmake
# (INCLUDES: kiln's include/ first, then its dependencies' folders)
# MAKE_PCH writes <dir>/kiln/kiln.hpp.gch, kiln.hpp precompiled with the same flags (GCC); with
# PCH=<dir> a check finds it through -I<dir> when its first line includes <kiln/kiln.hpp> (1.8 s
# against 5.8 s a check on the dev VM). GCC uses a precompiled header only where it would give the
# same result, and parses kiln.hpp itself where it cannot use it.
# With CONTROL=ON, SRC may list several files: they are compiled as one translation unit (kiln.hpp
# parsed once), each in a namespace of its own with its main renamed, and WORK names the directory
# for that file.
set(required CXX SRC INCLUDES)
if(DEFINED MAKE_PCH)
  set(required CXX INCLUDES)
endif()
foreach(v IN LISTS required)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "compile_fail.cmake: pass -D${v}=...")
  endif()
endforeach()
set(args -std=c++20 -fsyntax-only -DKILN_SEPARATE_COMPILATION)  # declarations of the runtime only
foreach(dir IN LISTS INCLUDES)
  list(APPEND args "-I${dir}")
endforeach()
if(DEFINED MAKE_PCH)
  list(REMOVE_ITEM args -fsyntax-only)
  file(MAKE_DIRECTORY ${MAKE_PCH}/kiln)
  file(WRITE ${MAKE_PCH}/kiln_pch.hpp "#include <kiln/kiln.hpp>\n")
  execute_process(COMMAND ${CXX} ${args} -x c++-header ${MAKE_PCH}/kiln_pch.hpp -o ${MAKE_PCH}/kiln/kiln.hpp.gch.tmp
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "compile_fail.cmake: ${CXX} could not precompile kiln.hpp (exit ${rc})")
  endif()
  file(RENAME ${MAKE_PCH}/kiln/kiln.hpp.gch.tmp ${MAKE_PCH}/kiln/kiln.hpp.gch)
  # GCC takes the header as found where its .gch is: a second #include of it (the controls' files)
  # opens that path, so kiln.hpp itself must be there too (a link, the same file for #pragma once)
  list(GET INCLUDES 0 kiln_include)
  file(CREATE_LINK ${kiln_include}/kiln/kiln.hpp ${MAKE_PCH}/kiln/kiln.hpp SYMBOLIC)
  return()
endif()
if(DEFINED PCH)
  list(INSERT args 0 "-I${PCH}")
endif()
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
