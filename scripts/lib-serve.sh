# Sourced by serve-vllm.sh and serve-llamacpp.sh: the tail both share.
#
# serve NAME PROBE_URL BANNER COMMAND...: start COMMAND in the background (stopped with this script:
# Ctrl-C, or the tests ending it), print BANNER once PROBE_URL answers, or fail with one line if the
# server exits before it does, then wait for the server.
serve() {
    local name=$1 probe=$2 banner=$3
    shift 3
    "$@" &
    server=$!
    trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' INT TERM EXIT
    until curl -sf "$probe" >/dev/null 2>&1; do
        if ! kill -0 "$server" 2>/dev/null; then echo "$name: the server exited before answering" >&2; exit 1; fi
        sleep 1
    done
    echo "$banner"
    wait "$server"
}
