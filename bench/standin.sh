#!/bin/sh
# A stand-in for lmc on the boards of bench/fleet.py: it sleeps a set time and prints a valid
# `lmc/1` document, so that what is measured is the harness and not the engine.
#
#   exec_prefix = ["sh", "/path/to/bench/standin.sh", "SECONDS"]
#
# The board runs `sh standin.sh SECONDS <lmc binary> <command> [options...]`: the binary and its
# options are ignored (the prompt on standard input too), the command is answered.
# SECONDS may be left out for $BENCHFARM_STANDIN_S (default 1). Only `generate` and `info` are
# answered; anything else exits 2 with one line on stderr, as lmc does for bad input.
# Plain sh and `sleep`: a run costs two processes, so 64 boards fit on a small machine.

seconds=${BENCHFARM_STANDIN_S:-1}
case ${1:-} in
    '' | *[!0-9.]*) ;;
    *) seconds=$1; shift ;;
esac
[ $# -gt 0 ] && shift  # the lmc binary the board was handed
command=${1:-}

case $command in
generate)
    sleep "$seconds" || exit 1
    printf '%s\n' '{"schema": "lmc/1", "command": "generate", "standin": true,' \
        ' "config": {"attn": "exact", "threads": 1},' \
        ' "prompt_tokens": 128, "prefill_ms": 1.0,' \
        ' "tokens": [11, 12], "steps": [{"token": 11, "ms": 0.5, "attn_ms": 0.1},' \
        ' {"token": 12, "ms": 0.5, "attn_ms": 0.1}],' \
        ' "decode_ms_per_token": 0.5, "attn_ms_per_token": 0.1}'
    ;;
info)
    printf '%s\n' "{\"schema\": \"lmc/1\", \"command\": \"info\", \"version\": \"standin\"," \
        " \"source_hash\": \"standin\", \"compiler\": \"sh\", \"flags\": \"\"," \
        " \"arch\": \"$(uname -m)\", \"simd\": []}"
    ;;
*)
    echo "standin.sh: command '$command' is not one the stand-in answers (generate, info)" >&2
    exit 2
    ;;
esac
