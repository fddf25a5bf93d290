// The object that builds a precompiled header of kiln's headers (KILN_PCH: tests/ and examples/CMakeLists.txt).
