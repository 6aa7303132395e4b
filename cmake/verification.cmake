# cmake/verification.cmake: the verification layer (docs/testing.md), as ctest tests. Its sources
# all live under verify/: the SPIN model, the Relacy test, the simulation and the fuzzers.
#
# Included from the root CMakeLists.txt when IDEM_BUILD_TESTS is on.
#
# Labels:
#   model  spin_model   verify/run_spin.sh: SPIN searches of verify/idem.pml (package `spin`)
#          relacy_test  verify/relacy_test.cpp: Relacy drives the real engine (package `relacy-dev`)
#   sim    sim_test     verify/sim_test.cpp: deterministic simulation, IDEM_VERIFY_SIM_SEEDS seeds
#   fuzz   fuzz         verify/fuzz/run_fuzz.sh: builds verify/fuzz/ with clang-14 (ASan + UBSan,
#                       libFuzzer) in <build>/fuzz and runs every target IDEM_VERIFY_FUZZ_SECONDS seconds
#
#   ctest -L 'model|sim|fuzz' --output-on-failure        (about 5 minutes on 2 cores)
set(IDEM_VERIFY_SIM_SEEDS 1000 CACHE STRING "Simulation seeds that ctest runs (sim_test --seeds)")
set(IDEM_VERIFY_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz target runs under ctest")
set(IDEM_VERIFY_RELACY_BUDGET 10 CACHE STRING "Seconds each Relacy context-bound search may take (0: no limit)")

set(_idem_verify_src ${CMAKE_CURRENT_LIST_DIR}/../verify)
find_package(GTest REQUIRED)

# ---- sim: deterministic simulation ------------------------------------------------------------------
add_executable(sim_test ${_idem_verify_src}/sim_test.cpp)
target_link_libraries(sim_test PRIVATE idem::idem idem::sqlite GTest::gtest)
if(TARGET idem::rocksdb)  # test seeds_on_file_stores runs the seeds over a RocksDB disk too
  target_link_libraries(sim_test PRIVATE idem::rocksdb)
  target_compile_definitions(sim_test PRIVATE IDEM_SIM_ROCKSDB)
endif()
target_compile_options(sim_test PRIVATE -Wall -Wextra -Werror=return-type)
add_test(NAME sim_test COMMAND sim_test --seeds=${IDEM_VERIFY_SIM_SEEDS})
set_tests_properties(sim_test PROPERTIES LABELS sim TIMEOUT 600)

# ---- model: SPIN ------------------------------------------------------------------------------------
add_test(NAME spin_model
  COMMAND ${_idem_verify_src}/run_spin.sh --work ${CMAKE_CURRENT_BINARY_DIR}/verify/spin)
set_tests_properties(spin_model PROPERTIES LABELS model TIMEOUT 900)

# ---- model: Relacy ----------------------------------------------------------------------------------
# Relacy runs its threads as fibers (ucontext) and replaces operator new/delete: it cannot run under
# a sanitizer, and sized deallocation must be off (Relacy does not replace the sized delete).
find_path(IDEM_RELACY_INCLUDE_DIR relacy/relacy.hpp)
if(IDEM_RELACY_INCLUDE_DIR AND NOT IDEM_SANITIZER)
  add_executable(relacy_test ${_idem_verify_src}/relacy_test.cpp)
  target_link_libraries(relacy_test PRIVATE idem::idem)
  target_include_directories(relacy_test SYSTEM PRIVATE ${IDEM_RELACY_INCLUDE_DIR})
  target_compile_options(relacy_test PRIVATE -fno-sized-deallocation -O2 -Wall -Wextra)
  add_test(NAME relacy_test COMMAND relacy_test)
  set_tests_properties(relacy_test PROPERTIES LABELS model TIMEOUT 900
    ENVIRONMENT "IDEM_RELACY_BUDGET=${IDEM_VERIFY_RELACY_BUDGET}")
elseif(NOT IDEM_RELACY_INCLUDE_DIR)
  message(STATUS "idem: relacy/relacy.hpp not found (Debian: relacy-dev); relacy_test is not built")
endif()

# ---- fuzz: libFuzzer targets in their own clang configuration -----------------------------------------
add_test(NAME fuzz
  COMMAND ${_idem_verify_src}/fuzz/run_fuzz.sh --build ${CMAKE_CURRENT_BINARY_DIR}/fuzz
          --seconds ${IDEM_VERIFY_FUZZ_SECONDS} --jobs 2)
set_tests_properties(fuzz PROPERTIES LABELS fuzz TIMEOUT 1200)
