# Every code example in the docs and the public headers is compiled, with -Wall -Wextra -Werror, by a
# ctest test of its own (label docs), so none can rot. Included from tests/CMakeLists.txt.
#
# Where examples are:
#   * each ```cpp block of README.md and docs/*.md;
#   * each public header's example: in include/idem/NAME.hpp, the lines indented `//   ` (three
#     spaces) that directly follow the header's title (`// idem/NAME.hpp: ...`, one or more lines)
#     and one empty `//` line. An indented block anywhere else (a table, a list) is not an example.
# How an example is compiled:
#   * a block that defines `int main(` is a program: it is compiled as it stands. README.md's first
#     block is also built into readme_test, which runs it.
#   * anything else is a fragment: its leading #include lines stay at file scope (after the
#     header's own include, for a header's example), the rest becomes the body of a function.
#     Before the body comes tests/doc_examples/prelude.hpp: idem/idem.hpp (the core) and the names
#     a fragment may use without declaring them, the application's side of an example (execute(),
#     reply(), opts, key, ...). Any other idem header a fragment needs it includes itself.
# Each example is an object library outside `all` (doc_example_<where>_<n>), built by its test, so
# an example that stops compiling fails its test and leaves the rest of the build alone.

set(_idem_doc_dir ${CMAKE_CURRENT_BINARY_DIR}/doc_examples)
file(MAKE_DIRECTORY ${_idem_doc_dir})

# Writes TEXT to FILE unless FILE already holds it (an unchanged example is not rebuilt).
function(idem_write_if_changed file text)
  if(EXISTS ${file})
    file(READ ${file} old)
    if(old STREQUAL text)
      return()
    endif()
  endif()
  file(WRITE ${file} "${text}")
endfunction()

# idem_doc_example(NAME SOURCE TEXT HEADER): one example, from SOURCE (for messages), as TEXT;
# HEADER is the header whose example it is, or "".
function(idem_doc_example name source text header)
  if(text MATCHES "rocksdb_store\\.hpp" AND NOT TARGET idem::rocksdb)
    message(STATUS "${source}: ${name} needs idem::rocksdb, which this build has not: not compiled")
    return()
  endif()
  if(text MATCHES "mysql_store\\.hpp" AND NOT TARGET idem::mysql)
    message(STATUS "${source}: ${name} needs idem::mysql, which this build has not: not compiled")
    return()
  endif()
  set(out "// Generated from ${source} by tests/doc_examples.cmake: do not edit.\n")
  if(text MATCHES "int main\\(")
    string(APPEND out "${text}")
  else()
    set(includes "")
    if(text MATCHES "^#include")
      string(REGEX MATCH "^(#include[^\n]*\n|[ \t]*\n)+" includes "${text}")
    endif()
    string(LENGTH "${includes}" n)
    string(SUBSTRING "${text}" ${n} -1 body)
    if(header)
      string(APPEND out "#include <idem/${header}>\n")
    endif()
    string(APPEND out "${includes}\n#include \"prelude.hpp\"\n\n"
      "namespace idem_doc_example {\nvoid example() {\n${body}}\n}  // namespace idem_doc_example\n")
  endif()
  idem_write_if_changed(${_idem_doc_dir}/${name}.cpp "${out}")
  add_library(${name} OBJECT EXCLUDE_FROM_ALL ${_idem_doc_dir}/${name}.cpp)
  target_compile_options(${name} PRIVATE -Werror)  # idem_warnings' flags, every warning an error
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/doc_examples)
  target_link_libraries(${name} PRIVATE idem::idem idem_warnings)
  foreach(component sqlite postgres rocksdb mysql)
    if(TARGET idem::${component})
      target_link_libraries(${name} PRIVATE idem::${component})
    endif()
  endforeach()
  # One build at a time in this tree (two ninja runs in one build directory would race). Most are a
  # compile of seconds (unit); one that includes the global guard or the RocksDB store takes 40-55 s
  # under ctest -j2 on the CI machine (slow). ctest -LE docs leaves them all out of a quick run.
  set(kind "")
  if(out MATCHES "idem/(global_guard|rocksdb_store|stores/rocksdb_store)\\.hpp")
    set(kind slow)
  endif()
  idem_test(${name} COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target ${name}
            LABELS docs ${kind} TIMEOUT 300 PROPERTIES RESOURCE_LOCK idem_build_tree)
endfunction()

# ```cpp blocks of the docs.
file(GLOB _idem_docs CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/docs/*.md)
foreach(_idem_doc README.md ${_idem_docs})
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${_idem_doc})
  file(READ ${PROJECT_SOURCE_DIR}/${_idem_doc} _idem_rest)
  get_filename_component(_idem_stem ${_idem_doc} NAME_WE)
  set(_idem_n 0)
  while(TRUE)
    string(FIND "${_idem_rest}" "```cpp\n" _idem_begin)
    if(_idem_begin EQUAL -1)
      break()
    endif()
    math(EXPR _idem_begin "${_idem_begin} + 7")
    string(SUBSTRING "${_idem_rest}" ${_idem_begin} -1 _idem_rest)
    string(FIND "${_idem_rest}" "\n```" _idem_end)
    if(_idem_end EQUAL -1)
      message(FATAL_ERROR "${_idem_doc}: a ```cpp block is not closed")
    endif()
    math(EXPR _idem_end "${_idem_end} + 1")
    string(SUBSTRING "${_idem_rest}" 0 ${_idem_end} _idem_snippet)
    string(SUBSTRING "${_idem_rest}" ${_idem_end} -1 _idem_rest)
    math(EXPR _idem_n "${_idem_n} + 1")
    idem_doc_example(doc_example_${_idem_stem}_${_idem_n} ${_idem_doc} "${_idem_snippet}" "")
    if(_idem_doc STREQUAL "README.md" AND _idem_n EQUAL 1)
      set(_idem_readme_program "${_idem_snippet}")
    endif()
  endwhile()
endforeach()

# The headers' examples.
file(GLOB _idem_headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include/idem ${PROJECT_SOURCE_DIR}/include/idem/*.hpp)
foreach(_idem_header ${_idem_headers})
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/idem/${_idem_header})
  file(READ ${PROJECT_SOURCE_DIR}/include/idem/${_idem_header} _idem_text)
  if(_idem_text MATCHES "^(// [^ \n][^\n]*\n)+//\n((//   [^\n]*\n)+)")
    string(REGEX REPLACE "(^|\n)//   " "\\1" _idem_snippet "${CMAKE_MATCH_2}")
    get_filename_component(_idem_stem ${_idem_header} NAME_WE)
    idem_doc_example(doc_example_header_${_idem_stem} include/idem/${_idem_header} "${_idem_snippet}" ${_idem_header})
  endif()
endforeach()

# readme_test: README.md's first block is a whole program; it is built with everything else and run.
if(NOT DEFINED _idem_readme_program)
  message(FATAL_ERROR "README.md has no ```cpp block for readme_test")
endif()
idem_write_if_changed(${CMAKE_CURRENT_BINARY_DIR}/readme_snippet.cpp "${_idem_readme_program}")
idem_test(readme_test SOURCES ${CMAKE_CURRENT_BINARY_DIR}/readme_snippet.cpp NO_GTEST LABELS docs)
target_compile_options(readme_test PRIVATE -Werror)
