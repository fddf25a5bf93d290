# The layering test: every header under include/kiln/ belongs to one layer (by its folder), and
# includes only headers of its own layer or lower ones; and no set of headers includes itself
# through others (no include cycles). docs/ARCHITECTURE.md explains the layers.
#   cmake -DKILN_INCLUDE_DIR=<repo>/include -P tests/check_layers.cmake
# Prints every violation (file, line, the include, both layers) and fails if there is any.

if(NOT KILN_INCLUDE_DIR)
  message(FATAL_ERROR "check_layers: pass -DKILN_INCLUDE_DIR=<repo>/include")
endif()

# Bottom-up. An entry is a folder (ending in /) or a file, relative to include/kiln/.
set(KILN_LAYERS
  "core: core/ debug/ version.hpp"
  "tables: tables/"
  "ir: ir/"
  "passes: passes/"
  "fuse: fuse/"
  "lowering: expr/ trace/"
  "cache: cache/"
  "cpu backend: backends/cpu/"
  "cuda backend: backends/cuda/"
  "ops and front doors: ops/ interop/"
  "autograd: autograd/"
  "compile: compile/ compile.hpp"
  "nn: nn/"
  "export: export/"
  "dist: dist/"
  "umbrella: kiln.hpp nn.hpp dist.hpp export.hpp src.hpp"
)

# layer index of a path relative to include/kiln/ (the longest matching entry), or -1
function(kiln_layer_of rel out_index out_name)
  set(best -1)
  set(best_len 0)
  set(best_name "")
  set(i 0)
  foreach(layer IN LISTS KILN_LAYERS)
    string(REGEX REPLACE ":.*" "" name "${layer}")
    string(REGEX REPLACE "^[^:]*: *" "" entries "${layer}")
    string(REPLACE " " ";" entries "${entries}")
    foreach(e IN LISTS entries)
      string(LENGTH "${e}" n)
      set(hit FALSE)
      if(e MATCHES "/$")
        string(FIND "${rel}" "${e}" pos)
        if(pos EQUAL 0)
          set(hit TRUE)
        endif()
      elseif(rel STREQUAL e)
        set(hit TRUE)
      endif()
      if(hit AND n GREATER best_len)
        set(best ${i})
        set(best_len ${n})
        set(best_name "${name}")
      endif()
    endforeach()
    math(EXPR i "${i} + 1")
  endforeach()
  set(${out_index} ${best} PARENT_SCOPE)
  set(${out_name} "${best_name}" PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE headers RELATIVE "${KILN_INCLUDE_DIR}/kiln" "${KILN_INCLUDE_DIR}/kiln/*.hpp")
list(SORT headers)
set(errors 0)
set(edges "")  # "from>to" pairs between headers
foreach(h IN LISTS headers)
  kiln_layer_of("${h}" hl hname)
  if(hl LESS 0)
    message(NOTICE "check_layers: violation: ${h} is in no layer (add its folder to KILN_LAYERS and docs/ARCHITECTURE.md)")
    math(EXPR errors "${errors} + 1")
    continue()
  endif()
  file(STRINGS "${KILN_INCLUDE_DIR}/kiln/${h}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]kiln/")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "kiln/[^\">]+" inc "${line}")
    string(REGEX REPLACE "^kiln/" "" inc "${inc}")
    if(NOT EXISTS "${KILN_INCLUDE_DIR}/kiln/${inc}")
      message(NOTICE "check_layers: violation: ${h} includes kiln/${inc}, which does not exist")
      math(EXPR errors "${errors} + 1")
      continue()
    endif()
    list(APPEND edges "${h}>${inc}")
    kiln_layer_of("${inc}" il iname)
    if(il GREATER hl)
      message(NOTICE "check_layers: violation: ${h} (layer ${hname}) includes kiln/${inc} (layer ${iname}, higher)")
      math(EXPR errors "${errors} + 1")
    endif()
  endforeach()
endforeach()

# cycles: repeatedly drop headers that include no remaining header, then those no remaining
# header includes; what is left lies on a cycle (adjacency lists and membership flags in variables
# named after the headers: a scan of every edge per header took 12 s)
foreach(e IN LISTS edges)
  string(FIND "${e}" ">" p)
  string(SUBSTRING "${e}" 0 ${p} from)
  math(EXPR p "${p} + 1")
  string(SUBSTRING "${e}" ${p} -1 to)
  if(NOT from STREQUAL to)
    list(APPEND "kiln_adj_1_${from}" "${to}")
    list(APPEND "kiln_adj_2_${to}" "${from}")
  endif()
endforeach()
set(left ${headers})
foreach(h IN LISTS left)
  set("kiln_left_${h}" TRUE)
endforeach()
foreach(side 1 2)
  set(changed TRUE)
  while(changed)
    set(changed FALSE)
    set(next "")
    foreach(h IN LISTS left)
      set(linked FALSE)
      foreach(other IN LISTS "kiln_adj_${side}_${h}")
        if(kiln_left_${other})
          set(linked TRUE)
          break()
        endif()
      endforeach()
      if(linked)
        list(APPEND next "${h}")
      else()
        set("kiln_left_${h}" FALSE)
        set(changed TRUE)
      endif()
    endforeach()
    set(left ${next})
  endwhile()
endforeach()
if(left)
  string(REPLACE ";" ", " cyc "${left}")
  message(NOTICE "check_layers: violation: include cycle among: ${cyc}")
  math(EXPR errors "${errors} + 1")
endif()

list(LENGTH headers nh)
list(LENGTH edges ne)
if(errors GREATER 0)
  message(FATAL_ERROR "check_layers: ${errors} violation(s) in ${nh} headers")
endif()
message(STATUS "check_layers: ${nh} headers, ${ne} includes, every include goes to the same layer or a lower one, no cycles")
