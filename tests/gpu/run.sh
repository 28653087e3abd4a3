#!/usr/bin/env bash
# The CUDA backend's checks that need a GPU, in one command:
#
#   tests/gpu/run.sh
#
# On a machine with one or more NVIDIA GPUs (driver, CUDA >= 12 with nvcc,
# NCCL, and the build dependencies of scripts/setup.sh already installed),
# it builds gradsyncd, libgradsync and the programs of tests/gpu with
# -Dcuda=enabled in a build directory of its own (GS_GPU_BUILD, default
# /tmp/gradsync-gpu-build), then runs:
#
#   kernels  gpu-kernels: the pack and unpack kernels against the host
#            backend's conversion kernels on the same inputs, bitwise
#   sync     gradsyncd --backend cuda on one GPU and gpu-trainer in another
#            process syncing the ResNet-50 layout through CUDA IPC, fp16 and
#            then bf16 on the wire, every element against the host kernels
#   recovery the same trainer with one step's gradients 5 s late, past
#            --peer-timeout: that step aborted for it with every tensor the
#            trainer's own, the communicators made again, the next step right
#   busbw    fused fp16 all-reduce through gradsyncd (every local GPU, one
#            trainer process each) beside NCCL called directly on the same
#            sizes, as bus bandwidth (busbw = algbw * 2(n-1)/n)
#
# It prints one line per check (PASS, FAIL or SKIP) and a summary, and exits
# 0 only when every check passed. Logs stay in the directory the summary
# names when something failed. It takes well under 5 minutes.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# A fresh CUDA install puts neither nvcc on PATH nor its libraries where the
# loader looks.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$PATH:$CUDA_HOME/bin"
export LD_LIBRARY_PATH="$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BUILD=${GS_GPU_BUILD:-${TMPDIR:-/tmp}/gradsync-gpu-build}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gradsync-gpu.XXXXXX")
SIZES="1048576 8388608 33554432" # elements: 2, 16 and 64 MiB of fp16
PASSED=0 FAILED=0 SKIPPED=0
DAEMON_PID=

report() { # STATUS NAME TEXT
	printf '%s %s: %s\n' "$1" "$2" "$3"
	case $1 in
	PASS) PASSED=$((PASSED + 1)) ;;
	FAIL) FAILED=$((FAILED + 1)) ;;
	*) SKIPPED=$((SKIPPED + 1)) ;;
	esac
}

# The program's own PASS/FAIL line, or a FAIL with its log's tail.
relay() { # NAME STATUS LOG
	local line
	line=$(grep -E '^(PASS|FAIL) ' "$3" | tail -n 1)
	if [ "$2" -eq 0 ] && [ "${line%% *}" = PASS ]; then
		report PASS "$1" "${line#*: }"
	elif [ -n "$line" ] && [ "${line%% *}" = FAIL ]; then
		report FAIL "$1" "${line#*: }"
	else
		report FAIL "$1" "exit status $2; $(tail -n 3 "$3" | tr '\n' ' ')"
	fi
}

stop_daemon() {
	[ -n "$DAEMON_PID" ] || return 0
	kill -TERM "$DAEMON_PID" 2>/dev/null
	for _ in $(seq 100); do
		kill -0 "$DAEMON_PID" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$DAEMON_PID" 2>/dev/null
	wait "$DAEMON_PID" 2>/dev/null
	local rc=$?
	DAEMON_PID=
	return $rc
}

finish() {
	stop_daemon
	printf 'SUMMARY: %d passed, %d failed, %d skipped' "$PASSED" "$FAILED" "$SKIPPED"
	if [ "$FAILED" -gt 0 ]; then
		printf ' (logs in %s)\n' "$WORK"
	else
		printf '\n'
		rm -rf "$WORK"
	fi
}
trap finish EXIT

# The job of a check, as its trainers carry it: GRADSYNC_* variables
# (NAME=value) that libgradsync reads from their environment, set by
# set_job and given to every trainer with `env "${JOB[@]}"`.
JOB=()
set_job() { # NAME=value...
	JOB=("$@")
}

# Starts gradsyncd for $JOB on $WORK/NAME.sock; waits until it listens
# (NCCL's set-up takes seconds). Returns non-zero, with the log's tail, if
# it does not.
start_daemon() { # NAME ARGS...
	local name=$1
	shift
	SOCK=$WORK/$name.sock
	DLOG=$WORK/$name.daemon.log
	"$BUILD/daemon/gradsyncd" --socket="$SOCK" --backend=cuda --log-level=info \
		--node-port=0 "$@" >"$DLOG" 2>&1 &
	DAEMON_PID=$!
	for _ in $(seq 900); do
		[ -S "$SOCK" ] && return 0
		kill -0 "$DAEMON_PID" 2>/dev/null || break
		sleep 0.1
	done
	stop_daemon
	return 1
}

# ---- build --------------------------------------------------------------------

build() {
	local missing="" tool
	for tool in meson ninja nvcc pkg-config protoc-c; do
		command -v "$tool" >/dev/null || missing="$missing $tool"
	done
	if [ -n "$missing" ]; then
		report FAIL build "missing:$missing (CUDA's bin on PATH? scripts/setup.sh installs the rest)"
		exit 1
	fi
	local args=(-Dcuda=enabled -Dtests=false)
	# The host compiler CI builds the CUDA code with (Debian 12's GCC 12;
	# CUDA 13 accepts up to GCC 15).
	if command -v g++-12 >/dev/null; then
		args+=("-Dcuda_ccbindir=$(command -v g++-12)")
	fi
	local setup=(meson setup "$BUILD" "$ROOT")
	[ -f "$BUILD/build.ninja" ] && setup=(meson setup --reconfigure "$BUILD" "$ROOT")
	if ! "${setup[@]}" "${args[@]}" >"$WORK/setup.log" 2>&1; then
		report FAIL build "meson setup failed: $(grep -m1 -E 'ERROR' "$WORK/setup.log") (see $WORK/setup.log)"
		exit 1
	fi
	if ! ninja -C "$BUILD" daemon/gradsyncd tests/gpu/gpu-kernels tests/gpu/gpu-trainer \
		tests/gpu/gpu-nccl-busbw >"$WORK/build.log" 2>&1; then
		report FAIL build "ninja failed: $(grep -m1 -E 'error:|FAILED' "$WORK/build.log")"
		exit 1
	fi
}

# ---- the checks -----------------------------------------------------------------

check_kernels() {
	timeout 180 "$BUILD/tests/gpu/gpu-kernels" >"$WORK/kernels.log" 2>&1
	relay kernels $? "$WORK/kernels.log"
}

check_sync() { # WIRE
	local log=$WORK/sync-$1.log
	set_job GRADSYNC_LOCAL_SIZE=1 GRADSYNC_WIRE="$1"
	if ! start_daemon "sync-$1"; then
		report FAIL "sync $1" "gradsyncd --backend cuda did not start: $(tail -n 2 "$DLOG" | tr '\n' ' ')"
		return
	fi
	timeout 240 env "${JOB[@]}" "$BUILD/tests/gpu/gpu-trainer" --socket="$SOCK" \
		--layout="$ROOT/layouts/resnet50.txt" --steps=5 --clip-step=3 --rank=0 >"$log" 2>&1
	local rc=$?
	if ! stop_daemon; then
		echo "FAIL sync: gradsyncd did not exit cleanly (see $DLOG)" >>"$log"
		rc=1
	fi
	relay "sync $1" "$rc" "$log"
}

# Step 2's gradients come 5 s late, past --peer-timeout: the step is aborted
# for that, the NCCL communicators are aborted and made again, and step 3
# is right.
check_recovery() {
	local log=$WORK/recovery.log
	set_job GRADSYNC_LOCAL_SIZE=1
	if ! start_daemon recovery --peer-timeout=2; then
		report FAIL recovery "gradsyncd --backend cuda did not start: $(tail -n 2 "$DLOG" | tr '\n' ' ')"
		return
	fi
	timeout 120 env "${JOB[@]}" "$BUILD/tests/gpu/gpu-trainer" --socket="$SOCK" \
		--layout="$ROOT/layouts/resnet50.txt" --steps=3 --late-step=2 --rank=0 >"$log" 2>&1
	local rc=$?
	if ! grep -q "rebuilding the NCCL communicators" "$DLOG"; then
		echo "FAIL recovery: gradsyncd did not make its communicators again (see $DLOG)" >>"$log"
		rc=1
	fi
	if ! stop_daemon; then
		echo "FAIL recovery: gradsyncd did not exit cleanly (see $DLOG)" >>"$log"
		rc=1
	fi
	relay recovery "$rc" "$log"
}

check_busbw() { # GPUS
	local n=$1 log=$WORK/busbw.log
	# shellcheck disable=SC2086 # the sizes are words
	if ! timeout 120 "$BUILD/tests/gpu/gpu-nccl-busbw" $SIZES >"$WORK/nccl.log" 2>&1; then
		report FAIL busbw "NCCL alone failed: $(tail -n 2 "$WORK/nccl.log" | tr '\n' ' ')"
		return
	fi
	set_job GRADSYNC_LOCAL_SIZE="$n" GRADSYNC_WIRE=fp16 GRADSYNC_THRESHOLD=4294967296 \
		GRADSYNC_FUSION_BUFFER=33554432
	if ! start_daemon busbw; then
		report FAIL busbw "gradsyncd --backend cuda did not start: $(tail -n 2 "$DLOG" | tr '\n' ' ')"
		return
	fi
	: >"$log"
	local size r pids
	for size in $SIZES; do
		pids=""
		for r in $(seq 0 $((n - 1))); do
			timeout 120 env "${JOB[@]}" "$BUILD/tests/gpu/gpu-trainer" --socket="$SOCK" \
				--rank="$r" --bench-elements="$size" >>"$log" 2>&1 &
			pids="$pids $!"
		done
		for r in $pids; do
			if ! wait "$r"; then
				stop_daemon
				report FAIL busbw "a trainer of $size elements failed: $(tail -n 2 "$log" | tr '\n' ' ')"
				return
			fi
		done
	done
	stop_daemon
	# elements=N ranks=R step_us=T from both; GB/s = bytes / (us * 1000).
	local text
	text=$(awk -v n="$n" '
		/^(NCCL|BENCH) / {
			for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
			alg = v["elements"] * 2 / (v["step_us"] * 1000)
			bw[$1, v["elements"]] = n > 1 ? alg * 2 * (n - 1) / n : alg
			if ($1 == "NCCL") order[++k] = v["elements"]
		}
		END {
			what = n > 1 ? "busbw" : "algbw (busbw is 0 with one GPU)"
			out = sprintf("fused fp16 all-reduce on %d GPU%s, %s in GB/s, gradsyncd vs NCCL alone:", n, n > 1 ? "s" : "", what)
			for (i = 1; i <= k; i++) {
				e = order[i]; d = bw["BENCH", e]; c = bw["NCCL", e]
				if (d == "" || c == "") { print "MISSING " e; exit }
				out = out sprintf(" %d MiB %.1f vs %.1f (%.2f);", e * 2 / 1048576, d, c, c > 0 ? d / c : 0)
			}
			print out
		}' "$WORK/nccl.log" "$log")
	case $text in
	MISSING* | "") report FAIL busbw "no figure for ${text#MISSING } elements (see $log)" ;;
	*) report PASS busbw "${text%;}" ;;
	esac
}

build
NGPU=$("$BUILD/tests/gpu/gpu-nccl-busbw" --count 2>"$WORK/gpus.log")
if [ -z "$NGPU" ] || [ "$NGPU" -lt 1 ]; then
	report FAIL gpu "no usable GPU: $(tail -n 1 "$WORK/gpus.log")"
	exit 1
fi
[ "$NGPU" -gt 16 ] && NGPU=16 # as many as gpu-nccl-busbw drives
check_kernels
check_sync fp16
check_sync bf16
check_recovery
check_busbw "$NGPU"
[ "$FAILED" -eq 0 ]
