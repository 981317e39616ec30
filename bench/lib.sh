# Shell helpers the GPU scripts in bench/ share; sourced, not run. They read PYTHON (python3),
# `out` (the results folder) and `deadline` (SECONDS at which the call's budget ends).

unpack_wheels() {  # every wheel pack brought along (.whl_*/site.tar.xz, Python 3.12) into /tmp/site
  local pack
  for pack in .whl_*/site.tar.xz; do
    [ -e "$pack" ] && { mkdir -p /tmp/site && tar xJf "$pack" -C /tmp/site || return 1; }
  done
  return 0
}

left_s() { echo $((deadline - SECONDS)); }

guarded() {  # guarded NAME LIMIT_S COMMAND...: within the budget left, output kept in $out/NAME.out
  local name=$1 limit=$(($2 < $(left_s) ? $2 : $(left_s)))
  shift 2
  [ "$limit" -gt 20 ] || { echo "$name: skipped (no time left)"; return 0; }
  timeout -k 10 "$limit" "$@" > "$out/$name.out" 2>&1
  local status=$?
  [ "$status" = 124 ] && echo "$name: stopped after ${limit}s (what ended before is in its JSON)"
  [ "$status" != 0 ] && tail -5 "$out/$name.out"
  echo "$name: exit $status at ${SECONDS}s"
}

ready() { "${PYTHON:-python3}" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$1" 2> /dev/null; }

server_pid=""
stop_server() {  # SIGTERM to the server's process group (it and its workers), then SIGKILL
  [ -n "$server_pid" ] || return 0
  kill -TERM -- "-$server_pid" 2> /dev/null
  for _ in $(seq 1 20); do kill -0 "$server_pid" 2> /dev/null || break; sleep 0.5; done
  kill -KILL -- "-$server_pid" 2> /dev/null
  wait "$server_pid" 2> /dev/null
  server_pid=""
}
trap stop_server EXIT
