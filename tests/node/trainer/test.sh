#!/usr/bin/env bash
# Unit test of the test trainer (trainer.c), without a cluster: three instances on
# 127.0.0.2, .3 and .4 (all of 127.0.0.0/8 is local on Linux) for each source, and the
# failures that must fail: a peer that never comes, a wrong address, an own address that
# is not this machine's.
#
# Usage: tests/node/trainer/test.sh [TRAINER]   (default: compiles trainer.c)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trainer=${1:-}
if [ -z "$trainer" ]; then
	trainer=$work/trainer
	gcc -static -O2 -Wall -Wextra -Werror -o "$trainer" "$here/trainer.c"
fi

step() { printf 'trainer-test: %s\n' "$*" >&2; }
fail() {
	printf 'trainer-test: step "%s" failed: %s\n' "$1" "$2" >&2
	exit 1
}

# A port free on 127.0.0.2-4 (the kernel picks it on 127.0.0.1; good enough here).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run NAME ENV... -- ARGS...: starts one instance in the background, output in $work/NAME.
pids=()
run() {
	local name=$1
	shift
	local envs=()
	while [ "$1" != -- ]; do
		envs+=("$1")
		shift
	done
	shift
	env -i "${envs[@]}" "$trainer" --timeout 10 "$@" >"$work/$name" 2>&1 &
	pids+=($!)
}
# wait_all EXPECTED_STATUS...: waits for the instances in order, checks each status.
wait_all() {
	local i=0 rc
	for want in "$@"; do
		rc=0
		wait "${pids[$i]}" || rc=$?
		[ "$rc" = "$want" ] || {
			cat "$work"/* >&2
			fail "$case" "instance $i exited $rc, expected $want"
		}
		i=$((i + 1))
	done
	pids=()
}
expect_line() {
	grep -qF -- "$2" "$work/$1" || {
		cat "$work/$1" >&2
		fail "$case" "$1 has no line with: $2"
	}
}

case=tf
step "$case: three workers in a full mesh from TF_CONFIG"
p=$(free_port)
cluster="{\"worker\":[\"127.0.0.2:$p\",\"127.0.0.3:$p\",\"127.0.0.4:$p\"]}"
rm -f "$work"/w*
for i in 0 1 2; do
	run "w$i" "TF_CONFIG={\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":$i}}" --
done
wait_all 0 0 0
expect_line w0 "trainer: worker:0: connected to worker:2 at 127.0.0.4:$p"
expect_line w2 "trainer: worker:2: accepted worker:1 from "
expect_line w1 "trainer: ok: worker:1 reached 2 peers and was reached by 2"

case=tf-ps
step "$case: a chief, a ps and a worker; the chief starts last"
p=$(free_port)
cluster="{\"chief\":[\"127.0.0.2:$p\"],\"ps\":[\"127.0.0.3:$p\"],\"worker\":[\"127.0.0.4:$p\"]}"
rm -f "$work"/w*
run w0 "TF_CONFIG={\"cluster\":$cluster,\"task\":{\"type\":\"ps\",\"index\":0}}" --
run w1 "TF_CONFIG={\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":0}}" --
sleep 1
run w2 "TF_CONFIG={\"cluster\":$cluster,\"task\":{\"type\":\"chief\",\"index\":0}}" --
wait_all 0 0 0
expect_line w2 "trainer: ok: chief:0 reached 2 peers and was reached by 2"

case=torch
step "$case: rank 0 and two others from MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE"
p=$(free_port)
rm -f "$work"/w*
for r in 1 2 0; do
	run "w$r" MASTER_ADDR=127.0.0.2 MASTER_PORT="$p" RANK=$r WORLD_SIZE=3 -- --source torch
done
wait_all 0 0 0
expect_line w0 "trainer: ok: rank 0 reached 0 peers and was reached by 2"
expect_line w1 "trainer: rank 1: connected to rank 0 at 127.0.0.2:$p"

case=jax
step "$case: from Kubeflow's COORDINATOR_ADDRESS (host), COORDINATOR_PORT, PROCESS_ID, NUM_PROCESSES"
p=$(free_port)
rm -f "$work"/w*
for r in 0 1 2; do
	run "w$r" COORDINATOR_ADDRESS=127.0.0.2 COORDINATOR_PORT="$p" PROCESS_ID=$r NUM_PROCESSES=3 -- --source jax
done
wait_all 0 0 0
expect_line w0 "trainer: ok: process 0 reached 0 peers and was reached by 2"
expect_line w1 "trainer: process 1: connected to process 0 at 127.0.0.2:$p"

case=jax-both
step "$case: JAX's own JAX_COORDINATOR_ADDRESS (host:port) and the rest, with Kubeflow's that agree"
p=$(free_port)
rm -f "$work"/w*
for r in 0 1; do
	run "w$r" JAX_COORDINATOR_ADDRESS="127.0.0.2:$p" JAX_PROCESS_ID=$r JAX_NUM_PROCESSES=2 \
		COORDINATOR_ADDRESS=127.0.0.2 COORDINATOR_PORT="$p" PROCESS_ID=$r NUM_PROCESSES=2 -- --source jax
done
wait_all 0 0
expect_line w0 "trainer: ok: process 0 reached 0 peers and was reached by 1"

case=jax-disagree
step "$case: Kubeflow's variables that name another process than JAX's fail"
p=$(free_port)
rm -f "$work"/w*
run w0 JAX_COORDINATOR_ADDRESS="127.0.0.2:$p" JAX_PROCESS_ID=1 JAX_NUM_PROCESSES=2 \
	COORDINATOR_ADDRESS=127.0.0.2 COORDINATOR_PORT="$p" PROCESS_ID=0 NUM_PROCESSES=2 -- --source jax
wait_all 1
expect_line w0 "disagree with COORDINATOR_ADDRESS:COORDINATOR_PORT=127.0.0.2:$p PROCESS_ID=0 NUM_PROCESSES=2"

case=hostfile
step "$case: an MPI hostfile, a full mesh on --port"
p=$(free_port)
printf '127.0.0.2 slots=1\n127.0.0.3 slots=1\n127.0.0.4 slots=2\n' >"$work/hostfile"
rm -f "$work"/w*
for r in 0 1 2; do
	run "w$r" -- --hostfile "$work/hostfile" --port "$p" --rank $r
done
wait_all 0 0 0
expect_line w2 "trainer: ok: rank 2 reached 2 peers and was reached by 2"

case=missing-peer
step "$case: a peer that never starts fails both the one that waits for it and the one that connects"
p=$(free_port)
cluster="{\"worker\":[\"127.0.0.2:$p\",\"127.0.0.3:$p\",\"127.0.0.4:$p\"]}"
rm -f "$work"/w*
for i in 0 1; do
	run "w$i" "TF_CONFIG={\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":$i}}" -- --timeout 2
done
wait_all 1 1
expect_line w0 "trainer: error: worker:0: could not reach worker:2 at 127.0.0.4:$p within 2s: connect: Connection refused"

case=wrong-address
step "$case: TF_CONFIG that gives worker:1 the address of worker:2"
p=$(free_port)
q=$(free_port)
rm -f "$work"/w*
good="{\"worker\":[\"127.0.0.2:$p\",\"127.0.0.3:$p\",\"127.0.0.4:$q\"]}"
bad="{\"worker\":[\"127.0.0.2:$p\",\"127.0.0.4:$q\",\"127.0.0.4:$q\"]}"
run w2 "TF_CONFIG={\"cluster\":$good,\"task\":{\"type\":\"worker\",\"index\":2}}" -- --timeout 3
run w0 "TF_CONFIG={\"cluster\":$bad,\"task\":{\"type\":\"worker\",\"index\":0}}" -- --timeout 3
wait_all 1 1
expect_line w0 "answered \"hello from worker:2\": that address is not worker:1's"

case=not-mine
step "$case: an own address that is not this machine's"
rm -f "$work"/w*
run w0 MASTER_ADDR=192.0.2.99 MASTER_PORT=1234 RANK=0 WORLD_SIZE=2 -- --source torch
wait_all 1
expect_line w0 "cannot listen on its own address 192.0.2.99:1234: Cannot assign requested address (not an address of this pod)"

step "ok: 10 cases"
