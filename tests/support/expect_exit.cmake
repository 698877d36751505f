# A CTest command that must fail in a given way: runs the command given after the script name
# and passes only if it exits with CODE and its output (stdout + stderr) matches REGEX.
# (PASS_REGULAR_EXPRESSION ignores the exit code and WILL_FAIL accepts any non-zero one.)
#   add_test(NAME t COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=bad flag"
#                           -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
#                           $<TARGET_FILE:tool> --flag)
if(NOT DEFINED CODE OR NOT DEFINED REGEX)
  message(FATAL_ERROR "expect_exit.cmake: pass -DCODE=<exit code> and -DREGEX=<output regex>")
endif()
# CMAKE_ARGV: cmake [-D...] -P <this script> <command> [args...]
set(script expect_exit.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/script_command.cmake)
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "${CODE}")
  message(FATAL_ERROR "expected exit code ${CODE}, got '${rc}' from: ${cmd}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}' (exit code ${rc} as expected)")
endif()
