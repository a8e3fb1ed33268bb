# Runs "${SDPA} ${ARGS}" and fails unless it exits with EXPECTED_EXIT and, when
# EXPECTED_OUTPUT is set, its stdout + stderr match that regular expression (and, when
# UNEXPECTED_OUTPUT is set, do not match that one).
# (CTest's PASS_REGULAR_EXPRESSION alone ignores the exit code; this checks both.)
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${SDPA}" ${args}
                RESULT_VARIABLE exit_code
                OUTPUT_VARIABLE stdout
                ERROR_VARIABLE stderr)
message("${stdout}${stderr}")
if(NOT "${exit_code}" STREQUAL "${EXPECTED_EXIT}")
  message(FATAL_ERROR "sdpa ${ARGS}: expected exit code ${EXPECTED_EXIT}, got ${exit_code}")
endif()
if(DEFINED EXPECTED_OUTPUT AND NOT "${stdout}${stderr}" MATCHES "${EXPECTED_OUTPUT}")
  message(FATAL_ERROR "sdpa ${ARGS}: output does not match '${EXPECTED_OUTPUT}'")
endif()
if(DEFINED UNEXPECTED_OUTPUT AND "${stdout}${stderr}" MATCHES "${UNEXPECTED_OUTPUT}")
  message(FATAL_ERROR "sdpa ${ARGS}: output matches '${UNEXPECTED_OUTPUT}'")
endif()
