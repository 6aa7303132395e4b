# cmake/IdemWarnings.cmake: idem_warnings, the one place idem's own targets take their warning
# flags from. Every test, tool, benchmark and example target links it (PRIVATE), instead of typing
# the flags; a target that wants more adds them itself (the doc examples add -Werror, the
# QuickFIX translation units -Wno-deprecated).
#
# Included from the root CMakeLists.txt and from verify/fuzz/CMakeLists.txt (a project of its own).
# Not part of the installed package: users of idem choose their own warnings (the cmake_import
# consumers under tests/ type theirs, as a user would).
if(NOT TARGET idem_warnings)
  add_library(idem_warnings INTERFACE)
  # -Werror=return-type: falling off the end of a non-void function is undefined behaviour that
  # gcc only warns about; it is an error everywhere in idem's own code.
  target_compile_options(idem_warnings INTERFACE -Wall -Wextra -Werror=return-type)
endif()
