# One compile-fail check: runs the C++ compiler on one tests/compile_fail/<name>.cpp with
# -fsyntax-only (the diagnostics under test are static_asserts of the expression templates, which
# template instantiation raises without code generation) and prints its output; fails when the
# compiler does. Run by ctest (tests/CMakeLists.txt) straight, not through the build tool, so the
# checks run in parallel and no build tree is locked.
#   cmake -DCXX=... -DSRC=... -DINCLUDES=<dir;dir> [-DCONTROL=ON] -P compile_fail.cmake
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
execute_process(COMMAND ${CXX} ${args} ${SRC} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compile_fail.cmake: ${CXX} exited with ${rc} on ${SRC}")
endif()
