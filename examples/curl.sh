#!/usr/bin/env bash
# A first conversation with a remote-autograd server using nothing but curl:
# create a session, upload two tensors (JSON), multiply them, run backward,
# and read the gradient back as JSON. proto/SPEC.md explains every field.
#
#   URL=http://127.0.0.1:8000 bash examples/curl.sh            # a server without tokens
#   URL=https://gpu-host:8000 TOKEN=... bash examples/curl.sh  # a server with tokens
#
# Needs curl and python3 (only to pick the session id out of a JSON answer).
set -euo pipefail

URL="${URL:-http://127.0.0.1:8000}"
TOKEN="${TOKEN:-}"

# Every /v1 request says which protocol it speaks; a token if the server has them.
headers=(-H 'Remote-Autograd-Protocol: 1' -H 'Content-Type: application/json')
if [[ -n "$TOKEN" ]]; then
  headers+=(-H "Authorization: Bearer $TOKEN")
fi

# api METHOD PATH [curl options]: one request; prints the answer. On an error status it
# prints the server's error body (which says what went wrong) and stops the script.
api() {
  local method=$1 path=$2 answer status
  shift 2
  # -s without -S: when nothing answers, the one line below says so instead of curl's own.
  if ! answer=$(curl -s -X "$method" "${headers[@]}" -w '\n%{http_code}' "$URL$path" "$@"); then
    echo "error: no remote-autograd server answers at $URL: start one with \`make serve\` (or set URL=...)" >&2
    exit 1
  fi
  status=${answer##*$'\n'}  # the last line: the status written by -w
  answer=${answer%$'\n'*}
  if (( status >= 400 )); then
    echo "error: $method $path answered $status: $answer" >&2
    exit 1
  fi
  printf '%s' "$answer"
}

# 1. A session: the server's room for our tensors. The answer is JSON; keep its id.
created=$(api POST /v1/sessions)
SID=$(printf '%s' "$created" | python3 -c 'import json, sys; print(json.load(sys.stdin)["session_id"])')
echo "session: $SID"

# 2. One program does the rest. Ids are ours: x and w are uploaded, y and loss are made
#    by ops, then backward fills x.grad and w.grad on the server.
#    x = [1, 2, 3], w = [4, 5, 6] (both require grad); loss = sum(x * w).
api POST "/v1/sessions/$SID/programs" -d '{
  "id": "first-steps-1",
  "steps": [
    {"kind": "put", "id": "x", "requires_grad": true,
     "value": {"dtype": "float32", "shape": [3], "data": [1, 2, 3]}},
    {"kind": "put", "id": "w", "requires_grad": true,
     "value": {"dtype": "float32", "shape": [3], "data": [4, 5, 6]}},
    {"kind": "call", "op": "mul", "args": [{"ref": "x"}, {"ref": "w"}], "out": ["y"]},
    {"kind": "call", "op": "sum", "args": [{"ref": "y"}], "out": ["loss"]},
    {"kind": "backward", "tensors": ["loss"]}
  ]}' > /dev/null
echo "forward and backward done"

# 3. The gradient of x (it is w: d/dx sum(x * w) = w), as JSON.
echo "x.grad:"
api GET "/v1/sessions/$SID/tensors/x?value=false"
echo

# 4. Close the session: the server frees everything it held.
api DELETE "/v1/sessions/$SID"
echo "session closed"
