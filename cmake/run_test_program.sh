#!/bin/sh
# run_test_program.sh PROGRAM [ARGS...]: runs a test program as it is, or, when QKV_TEST_WRAPPER is
# set, as `$QKV_TEST_WRAPPER PROGRAM ARGS...` (cmake/qkv_test_launcher.cmake says why).
if [ -n "${QKV_TEST_WRAPPER:-}" ]; then
    exec "$QKV_TEST_WRAPPER" "$@"
fi
exec "$@"
