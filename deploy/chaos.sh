#!/usr/bin/env bash
# deploy/chaos.sh: kill HareMQ nodes every few seconds while a confirm load runs against a
# mirrored queue, then print what was confirmed, consumed and lost.
#
#   deploy/chaos.sh                          # compose cluster (deploy/docker-compose.yml), 60 s
#   deploy/chaos.sh --node hare1 -i 15       # always kill hare1, every 15 s
#   deploy/chaos.sh --local                  # nodes started by `haremq cluster up` on this host
#   deploy/chaos.sh --tally r1.json [...]    # only print the tally of perf JSON summaries
#
# Run `deploy/chaos.sh --help` for every option. The run is bounded (--duration plus the
# drain), and on exit (also on Ctrl-C) every node it killed is started again and the load stopped.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")

usage() {
  cat <<EOF
usage: deploy/chaos.sh [options] [-- extra haremq perf flags]

Kills a random node (or the one named with --node) every INTERVAL seconds with SIGKILL,
starts it again DOWN seconds later, while 'haremq perf' publishes persistent messages with
confirms to QUEUE (mirrored by the ha-all policy for ha.* queues) and consumes them. At the
end it drains the queue and prints sent / confirmed / consumed / lost. Exit status: 0 when no
confirmed message was lost, 1 when some were, 2 for a usage error.

  -d, --duration S      how long to keep killing and loading (default $DURATION)
  -i, --interval S      seconds between kills (default $INTERVAL)
      --down S          seconds a killed node stays down (default $DOWN)
  -n, --node NAME       kill this node (repeatable: pick at random among them; default: any)
      --nodes "A B C"   the cluster's nodes (default "${NODES[*]}")
  -s, --signal SIG      signal to kill with (default $SIGNAL)
      --local           kill local 'haremq node' processes (pid files in --pid-dir, else
                        pgrep -f "haremq node --name NAME") and restart them with the same
                        command line, working directory and environment
      --pid-dir DIR     local nodes are the pids in DIR/NAME.pid (no pgrep; rewritten on restart)
  -f, --compose-file F  compose file (default deploy/docker-compose.yml)
      --compose CMD     compose command (default: 'docker compose', else docker-compose,
                        else podman-compose)
  -h, --uri URL         broker URL for the load (repeatable; default one per node:
                        amqp://USER:PASS@127.0.0.1:5672..5674/%2F)
      --user U --pass P credentials for the default URLs (default \$HAREMQ_DEFAULT_USER /
                        \$HAREMQ_DEFAULT_PASS or haremq/haremq; guest/guest with --local)
  -u, --queue Q         queue (default $QUEUE; --keep-queue to not re-create it first)
  -c, --confirm N       unconfirmed messages per producer (default $CONFIRM)
      --drain S         consume what is left for S seconds after the load (default $DRAIN)
      --dry-run         print the kill/start commands instead of running them; no load
      --tally FILE...   print the tally of perf --json summaries (the last one may be a
                        consumers-only drain) and exit
      --help            this help
Environment: HAREMQ (the haremq command, default haremq or .venv/bin/haremq), PYTHON.
EOF
}

DURATION=60 INTERVAL=10 DOWN=5 SIGNAL=KILL QUEUE=ha.chaos CONFIRM=100 DRAIN=10
NODES=(hare1 hare2 hare3) TARGETS=() URIS=() PERF_EXTRA=()
MODE=compose PID_DIR="" COMPOSE_FILE="$HERE/docker-compose.yml" COMPOSE_CMD=""
USER_NAME="" USER_PASS="" DRY_RUN=0 KEEP_QUEUE=0 TALLY_ONLY=0 TALLY_FILES=()
PYTHON=${PYTHON:-python3}

die() { echo "chaos: $*" >&2; exit 2; }
say() { printf '%s chaos: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
num() { [[ $2 =~ ^[0-9]+$ ]] || die "$1 wants a whole number of seconds, got '$2'"; }

while [ $# -gt 0 ]; do
  case $1 in
    -d|--duration) num "$1" "${2-}"; DURATION=$2; shift 2 ;;
    -i|--interval) num "$1" "${2-}"; INTERVAL=$2; shift 2 ;;
    --down) num "$1" "${2-}"; DOWN=$2; shift 2 ;;
    -n|--node) [ -n "${2-}" ] || die "$1 wants a node name"; TARGETS+=("$2"); shift 2 ;;
    --nodes) read -r -a NODES <<< "${2-}"; shift 2 ;;
    -s|--signal) SIGNAL=${2-}; shift 2 ;;
    --local) MODE=local; shift ;;
    --pid-dir) PID_DIR=${2-}; shift 2 ;;
    -f|--compose-file) COMPOSE_FILE=${2-}; shift 2 ;;
    --compose) COMPOSE_CMD=${2-}; shift 2 ;;
    -h|--uri) URIS+=("${2-}"); shift 2 ;;
    --user) USER_NAME=${2-}; shift 2 ;;
    --pass) USER_PASS=${2-}; shift 2 ;;
    -u|--queue) QUEUE=${2-}; shift 2 ;;
    -c|--confirm) num "$1" "${2-}"; CONFIRM=$2; shift 2 ;;
    --drain) num "$1" "${2-}"; DRAIN=$2; shift 2 ;;
    --keep-queue) KEEP_QUEUE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --tally) TALLY_ONLY=1; shift; TALLY_FILES=("$@"); break ;;
    --help) usage; exit 0 ;;
    --) shift; PERF_EXTRA=("$@"); break ;;
    *) usage >&2; die "unknown option '$1'" ;;
  esac
done

[ "${#NODES[@]}" -gt 0 ] || die "--nodes is empty"
[ "$INTERVAL" -gt 0 ] || die "--interval must be > 0"
[ "$DURATION" -gt 0 ] || die "--duration must be > 0"
[ -n "$SIGNAL" ] || die "--signal is empty"
[ -n "$QUEUE" ] || die "--queue is empty"
for t in "${TARGETS[@]}"; do
  [[ " ${NODES[*]} " == *" $t "* ]] || die "--node $t is not one of: ${NODES[*]}"
done
[ "${#TARGETS[@]}" -gt 0 ] || TARGETS=("${NODES[@]}")

# --------------------------------------------------------------------------- tally

# Sums the load rounds' summaries and the drains' (consumers-only runs, -x 0).
# consumed counts this run's messages (perf tells them apart by a stamp), other_consumed those of
# earlier rounds; so "lost" = confirmed - consumed is exact when nothing was delivered twice, and
# a redelivery or a consumed unconfirmed message could hide a loss: the upper bound says how many.
tally() {
  "$PYTHON" - "$@" <<'PY'
import json, sys

rounds, drains = [], []
for path in sys.argv[1:]:
    with open(path) as f:
        s = json.load(f)
    (drains if s.get("config", {}).get("producers", 1) == 0 else rounds).append(s)
def total(key, rows):
    return sum(int(r.get(key) or 0) for r in rows)
sent, confirmed = total("sent", rounds), total("confirmed", rounds)
nacked, unconfirmed = total("nacked", rounds), total("outstanding", rounds)
consumed = total("consumed", rounds) + total("other_consumed", rounds)
drained = total("consumed", drains) + total("other_consumed", drains)
redelivered = total("redelivered", rounds + drains)
got = consumed + drained
lost = max(0, confirmed - got)
worst = max(0, confirmed - max(0, got - redelivered - unconfirmed))
errors = [e for r in rounds + drains for e in r.get("errors") or []]
print(f"load rounds  {len(rounds)}" + (" (a round ends when perf loses its connection)" if len(rounds) > 1 else ""))
print(f"sent         {sent:,}")
print(f"confirmed    {confirmed:,}   nacked {nacked:,}   unconfirmed {unconfirmed:,}")
print(f"consumed     {got:,}   (during the load {consumed:,}, drained after {drained:,}; redelivered {redelivered:,})")
bound = f"; up to {worst:,} if every redelivered or unconfirmed message consumed was a duplicate" if worst != lost else ""
print(f"lost         {lost:,}   (confirmed but never consumed{bound})")
for e in errors[:5]:
    print(f"perf error   {e}")
if len(errors) > 5:
    print(f"perf error   ... and {len(errors) - 5} more")
print("RESULT: no confirmed message lost" if lost == 0 else f"RESULT: {lost:,} confirmed messages lost")
sys.exit(1 if lost else 0)
PY
}

if [ "$TALLY_ONLY" = 1 ]; then
  [ "${#TALLY_FILES[@]}" -gt 0 ] || die "--tally wants perf JSON files"
  tally "${TALLY_FILES[@]}"
  exit $?
fi

# --------------------------------------------------------------------------- commands

if [ -n "${HAREMQ:-}" ]; then
  read -r -a HAREMQ_CMD <<< "$HAREMQ"
elif command -v haremq > /dev/null 2>&1; then
  HAREMQ_CMD=(haremq)
elif [ -x "$ROOT/.venv/bin/haremq" ]; then
  HAREMQ_CMD=("$ROOT/.venv/bin/haremq")
elif [ "$DRY_RUN" = 1 ]; then
  HAREMQ_CMD=(haremq)
else
  die "no haremq command (install it, make a .venv with 'make run', or set HAREMQ)"
fi

if [ "$MODE" = compose ]; then
  if [ -n "$COMPOSE_CMD" ]; then
    read -r -a COMPOSE <<< "$COMPOSE_CMD"
  elif docker compose version > /dev/null 2>&1; then
    COMPOSE=(docker compose)
  elif command -v docker-compose > /dev/null 2>&1; then
    COMPOSE=(docker-compose)
  elif command -v podman-compose > /dev/null 2>&1; then
    COMPOSE=(podman-compose)
  elif [ "$DRY_RUN" = 1 ]; then
    COMPOSE=(docker compose)
  else
    die "no compose command found (use --compose CMD, or --local)"
  fi
  [ "$DRY_RUN" = 1 ] || [ -f "$COMPOSE_FILE" ] || die "no compose file $COMPOSE_FILE"
  COMPOSE+=(-f "$COMPOSE_FILE")
fi

if [ "${#URIS[@]}" -eq 0 ]; then
  if [ "$MODE" = local ]; then
    u=${USER_NAME:-guest} p=${USER_PASS:-guest}
  else
    u=${USER_NAME:-${HAREMQ_DEFAULT_USER:-haremq}} p=${USER_PASS:-${HAREMQ_DEFAULT_PASS:-haremq}}
  fi
  for ((i = 0; i < ${#NODES[@]}; i++)); do
    URIS+=("amqp://$u:$p@127.0.0.1:$((5672 + i))/%2F")
  done
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/haremq-chaos.XXXXXX")
DOWN_NODES=()      # killed and not started again yet
LOAD_PID=""
declare -A KILLS=() RESTARTED=()

run() {  # a command, or its echo with --dry-run
  if [ "$DRY_RUN" = 1 ]; then echo "+ $*"; else "$@"; fi
}

# A process that exists and is not a zombie (a killed node stays one until its parent reaps it).
alive() {
  local state
  state=$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2> /dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# The URLs whose host:port accepts a TCP connection now (perf gives up on a URL it cannot reach).
live_uris() {
  local u hp host port
  for u in "${URIS[@]}"; do
    hp=${u#*://}; hp=${hp#*@}; hp=${hp%%/*}; hp=${hp%%\?*}
    host=${hp%:*} port=${hp##*:}
    if [ "$host" = "$hp" ]; then
      port=5672; [[ $u != amqps://* ]] || port=5671
    fi
    # shellcheck disable=SC2016  # $0 and $1 are the inner shell's
    if timeout 2 bash -c 'exec 3<> "/dev/tcp/$0/$1"' "$host" "$port" 2> /dev/null; then echo "$u"; fi
  done
}

uri_args() {  # -h URL for each argument
  local u
  for u in "$@"; do printf '%s\n' -h "$u"; done
}

# Local processes: a node is `... haremq node ... --name NAME ...` (or python -m haremq.cluster.cli).
local_pids() {
  local node=$1 pid
  if [ -n "$PID_DIR" ]; then   # pid files only: nothing else is touched
    [ -f "$PID_DIR/$node.pid" ] || return 0
    pid=$(tr -dc 0-9 < "$PID_DIR/$node.pid")
    if [ -n "$pid" ] && alive "$pid"; then echo "$pid"; fi
    return 0
  fi
  # only processes of this host's pid namespace, not the same command inside a container
  local ns
  ns=$(readlink /proc/self/ns/pid)
  for pid in $(pgrep -f -- "(haremq|node\\.cli) node .*--name[ =]$node( |\$)"); do
    [ "$(readlink "/proc/$pid/ns/pid" 2> /dev/null)" != "$ns" ] || ! alive "$pid" || echo "$pid"
  done
}

kill_node() {
  local node=$1 pid
  if [ "$MODE" = compose ]; then
    run "${COMPOSE[@]}" kill -s "$SIGNAL" "$node"
  else
    pid=$(local_pids "$node" | head -1) || true
    if [ -z "$pid" ]; then say "$node: no local process found, not killed"; return 1; fi
    if [ ! -e "$WORK/$node.argv" ]; then   # remember how to start it again
      cat "/proc/$pid/cmdline" > "$WORK/$node.argv"
      cat "/proc/$pid/environ" > "$WORK/$node.env"
      readlink "/proc/$pid/cwd" > "$WORK/$node.cwd"
      local log
      log=$(readlink "/proc/$pid/fd/2" 2> /dev/null || true)
      [ -f "$log" ] || log="${TMPDIR:-/tmp}/haremq-chaos-$node.log"
      echo "$log" > "$WORK/$node.log"
    fi
    run kill -s "$SIGNAL" "$pid"
  fi
  DOWN_NODES+=("$node")
  KILLS[$node]=$(( ${KILLS[$node]:-0} + 1 ))
}

start_node() {
  local node=$1 n rest=()
  if [ "$MODE" = compose ]; then
    run "${COMPOSE[@]}" start "$node" || say "$node: start failed"
  elif [ -n "$(local_pids "$node")" ]; then
    say "$node: already running again (restarted by its supervisor)"
  elif [ -e "$WORK/$node.argv" ]; then
    local argv=() envv=() cwd log
    mapfile -d '' argv < "$WORK/$node.argv"
    mapfile -d '' envv < "$WORK/$node.env"
    cwd=$(cat "$WORK/$node.cwd") log=$(cat "$WORK/$node.log")
    if [ "$DRY_RUN" = 1 ]; then
      echo "+ (cd $cwd && ${argv[*]}) >> $log"
    else
      (cd "$cwd" && exec env -i "${envv[@]}" setsid "${argv[@]}" >> "$log" 2>&1 < /dev/null) &
      RESTARTED[$node]=$!
      [ -z "$PID_DIR" ] || echo "$!" > "$PID_DIR/$node.pid"
    fi
  fi
  for n in "${DOWN_NODES[@]}"; do [ "$n" = "$node" ] || rest+=("$n"); done
  DOWN_NODES=("${rest[@]+"${rest[@]}"}")
}

cleanup() {
  local rc=$? n
  trap - EXIT INT TERM
  for n in "${DOWN_NODES[@]+"${DOWN_NODES[@]}"}"; do
    say "starting $n again"
    start_node "$n" || true
  done
  if [ -n "$LOAD_PID" ] && kill -0 "$LOAD_PID" 2> /dev/null; then
    touch "$WORK/stop"
    if [ -f "$WORK/perf.pid" ]; then kill -INT "$(cat "$WORK/perf.pid")" 2> /dev/null || true; fi
    for _ in $(seq 1 50); do kill -0 "$LOAD_PID" 2> /dev/null || break; sleep 0.2; done
    if [ -f "$WORK/perf.pid" ]; then kill -KILL "$(cat "$WORK/perf.pid")" 2> /dev/null || true; fi
    kill "$LOAD_PID" 2> /dev/null || true
    wait "$LOAD_PID" 2> /dev/null || true
  fi
  if [ "${#RESTARTED[@]}" -gt 0 ]; then
    for n in "${!RESTARTED[@]}"; do
      say "$n runs again as pid ${RESTARTED[$n]} (log $(cat "$WORK/$n.log" 2> /dev/null || echo -));" \
          "'haremq cluster up' does not own it: stop it with kill ${RESTARTED[$n]}"
    done
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

# --------------------------------------------------------------------------- load

now() { date +%s; }
START=$(now)
DEADLINE=$((START + DURATION))


# Runs perf until the deadline. perf spreads producers and consumers over the URLs; when a
# worker's node dies perf ends the round (unless it fails over by itself), and a new round
# starts on the same queue: the tally adds the rounds up.
load_loop() {
  local round=0 left rc
  while [ ! -e "$WORK/stop" ]; do
    left=$((DEADLINE - $(now)))
    [ "$left" -gt 0 ] || break
    local live=() args=()
    mapfile -t live < <(live_uris)
    if [ "${#live[@]}" -eq 0 ]; then sleep 1; continue; fi
    mapfile -t args < <(uri_args "${live[@]}")
    round=$((round + 1))
    local extra=()
    [ "$round" -gt 1 ] || [ "$KEEP_QUEUE" = 1 ] || extra+=(--recreate)
    "${HAREMQ_CMD[@]}" perf "${args[@]}" -x 1 -y 1 -s 64 -f persistent -c "$CONFIRM" -q 500 \
      -u "$QUEUE" -z "$left" --drain-timeout 20 --quiet --json "$WORK/round$round.json" \
      "${extra[@]+"${extra[@]}"}" "${PERF_EXTRA[@]+"${PERF_EXTRA[@]}"}" \
      2> "$WORK/round$round.err" &
    echo $! > "$WORK/perf.pid"
    rc=0; wait $! || rc=$?
    rm -f "$WORK/perf.pid"
    if [ "$rc" -ne 0 ]; then
      say "load round $round ended (perf status $rc: $(tail -n 1 "$WORK/round$round.err" 2> /dev/null | cut -c1-120))"
      [ -s "$WORK/round$round.json" ] || rm -f "$WORK/round$round.json"
      sleep 1
    fi
  done
}

say "mode $MODE, nodes ${NODES[*]}, killing ${TARGETS[*]} with SIG$SIGNAL every ${INTERVAL}s" \
    "(down ${DOWN}s) for ${DURATION}s; load on $QUEUE via ${#URIS[@]} URL(s)"
if [ "$DRY_RUN" = 0 ]; then
  load_loop &
  LOAD_PID=$!
fi

# --------------------------------------------------------------------------- kills

sleep_until() {  # sleep until an epoch second, or less if the load is gone
  while [ "$(now)" -lt "$1" ]; do
    if [ -n "$LOAD_PID" ] && ! kill -0 "$LOAD_PID" 2> /dev/null; then return 1; fi
    sleep 1
  done
}

while true; do
  next=$(( $(now) + INTERVAL ))
  [ $((next + DOWN)) -lt "$DEADLINE" ] || break
  sleep_until "$next" || break
  node=${TARGETS[RANDOM % ${#TARGETS[@]}]}
  say "kill -s $SIGNAL $node"
  kill_node "$node" || continue
  sleep_until $(( $(now) + DOWN )) || true
  say "start $node"
  start_node "$node"
done

summary=""
for n in "${NODES[@]}"; do
  [ -z "${KILLS[$n]:-}" ] || summary+=" $n x${KILLS[$n]}"
done
say "kills:${summary:- none}"

if [ "$DRY_RUN" = 1 ]; then exit 0; fi

say "waiting for the load to finish"
sleep_until "$DEADLINE" || true
for _ in $(seq 1 $((30 * 5))); do kill -0 "$LOAD_PID" 2> /dev/null || break; sleep 0.2; done
touch "$WORK/stop"
wait "$LOAD_PID" 2> /dev/null || true
LOAD_PID=""

# Consume what is left, one consumer per URL (whichever node serves the queue), in rounds of
# DRAIN seconds until a round finds nothing (at most 10).
if [ "$DRAIN" -gt 0 ]; then
  live=() args=()
  for d in $(seq 1 10); do
    mapfile -t live < <(live_uris)
    if [ "${#live[@]}" -eq 0 ]; then say "no node answers yet"; sleep 2; continue; fi
    mapfile -t args < <(uri_args "${live[@]}")
    say "draining $QUEUE (${DRAIN}s, round $d, through ${#live[@]} node(s))"
    "${HAREMQ_CMD[@]}" perf "${args[@]}" -x 0 -y "${#live[@]}" -f persistent -u "$QUEUE" -q 500 \
      -z "$DRAIN" --quiet --json "$WORK/drain$d.json" 2> "$WORK/drain$d.err" ||
      say "drain: $(tail -n 1 "$WORK/drain$d.err" | cut -c1-150)"
    [ -s "$WORK/drain$d.json" ] || { sleep 2; continue; }   # a node not serving yet
    "$PYTHON" -c 'import json, sys; s = json.load(open(sys.argv[1])); sys.exit(0 if s["consumed"] + s["other_consumed"] else 1)' \
      "$WORK/drain$d.json" || break
  done
fi

files=()
for f in "$WORK"/round*.json "$WORK"/drain*.json; do
  [ -s "$f" ] && files+=("$f")
done
[ "${#files[@]}" -gt 0 ] || { say "no perf summary was written (is the cluster up?)"; exit 1; }
echo "--- chaos: ${DURATION}s, kills:${summary:- none}"
tally "${files[@]}"
