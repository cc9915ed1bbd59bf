#!/usr/bin/env bash
# fetch-compare.sh: fetch one file over loopback with the tools a user would
# use instead of repronet, and with repronet, in interleaved rounds (a fresh
# receiver each time), and print the times, the receivers' CPU and the
# ratios. Issue 29, item 1.
#
#   scripts/fetch-compare.sh [-s MIB] [-r ROUNDS] [-w WORKDIR] [-k] [--no-kubo] [-b OLD_REPRONET]
#
# Paths, each round in this order:
#   http        busybox httpd -> curl -o FILE; openssl dgst -sha256 FILE; sync FILE
#   kubo-pin    Kubo (fresh repo and daemon) `ipfs pin add CID` from a Kubo seed
#   kubo-get    Kubo (fresh repo and daemon) `ipfs get CID -o FILE`
#   rn-store    repronet capsule get -o /dev/null (into the store only)
#   rn-file     repronet capsule get -o FILE (what the issue is about)
#   old-file    with -b: the same with another repronet binary (e.g. built
#               from an earlier commit), for before/after in one run
# Wall time of the receiving command(s) only: daemons are started and
# connected before the clock starts; repronet's time includes its process
# start (it has no daemon). CPU is user+sys of the receiving processes
# (for Kubo: the daemon's, from /proc, since the client only asks).
#
# Preparation (not timed): builds repronet from this checkout and Kubo
# (github.com/ipfs/kubo at KUBO_VERSION, from the Go module proxy, with the
# Go toolchain it needs, also from the proxy); installs nothing else. Needs
# busybox (busybox-static), curl and openssl. Traffic stays on 127.0.0.1.
# Everything lives in WORKDIR (default /tmp/fetch-compare) and is removed at
# the end unless -k.
set -euo pipefail

MIB=1024
ROUNDS=4
WORK=/tmp/fetch-compare
KEEP=0
KUBO=1
OLD=
KUBO_VERSION=${KUBO_VERSION:-v0.39.0}
KUBO_GO=${KUBO_GO:-go1.25.4} # Kubo v0.39's dependencies do not build with Go 1.26
while [ $# -gt 0 ]; do
	case "$1" in
	-s) MIB=$2; shift 2 ;;
	-r) ROUNDS=$2; shift 2 ;;
	-w) WORK=$2; shift 2 ;;
	-k) KEEP=1; shift ;;
	--no-kubo) KUBO=0; shift ;;
	-b) OLD=$2; shift 2 ;;
	*) echo "usage: $0 [-s MIB] [-r ROUNDS] [-w WORKDIR] [-k] [--no-kubo] [-b OLD_REPRONET]" >&2; exit 2 ;;
	esac
done
REPO=$(cd "$(dirname "$0")/.." && pwd)
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
for t in busybox curl openssl; do
	command -v $t >/dev/null || { echo "$t is needed (apt-get install busybox-static curl openssl)" >&2; exit 1; }
done
mkdir -p "$WORK/bin" "$WORK/seed"
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ "$KEEP" = 0 ]; then rm -rf "$WORK/seed" "$WORK/recv" "$WORK/rn-seed" "$WORK/kubo-seed"; fi
}
trap cleanup EXIT

echo "== preparing in $WORK"
(cd "$REPO" && CGO_ENABLED=0 "$GO" build -o "$WORK/bin/repronet" ./cmd/repronet)
RN=$WORK/bin/repronet
IPFS=$WORK/bin/ipfs
if [ "$KUBO" = 1 ] && [ ! -x "$IPFS" ]; then
	echo "building Kubo $KUBO_VERSION with $KUBO_GO (Go module proxy)..."
	if ! (cd "$WORK" && GOTOOLCHAIN=$KUBO_GO GOBIN="$WORK/bin" CGO_ENABLED=0 GOFLAGS=-mod=mod \
		"$GO" install "github.com/ipfs/kubo/cmd/ipfs@$KUBO_VERSION") >"$WORK/kubo-build.log" 2>&1; then
		echo "Kubo could not be built here (see $WORK/kubo-build.log): comparing with HTTP only" >&2
		KUBO=0
	fi
fi
[ -x "$IPFS" ] || KUBO=0

FILE=$WORK/seed/capsule.bin
openssl rand -out "$FILE" $((MIB << 20))
SHA=$(openssl dgst -sha256 -r "$FILE" | cut -d' ' -f1)

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# HTTP seed.
HPORT=$(port)
busybox httpd -f -p "127.0.0.1:$HPORT" -h "$WORK/seed" &
PIDS+=($!)

# repronet seed: imported, then served.
"$RN" capsule add --data "$WORK/rn-seed" "$FILE" >"$WORK/rn-add.txt"
CID=$(cut -d' ' -f1 "$WORK/rn-add.txt")
RPORT=$(port)
"$RN" capsule serve --data "$WORK/rn-seed" --listen "/ip4/127.0.0.1/tcp/$RPORT" >"$WORK/rn-serve.txt" 2>"$WORK/rn-serve.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$WORK/rn-serve.txt" ] && break; sleep 0.1; done
RADDR=$(grep 127.0.0.1 "$WORK/rn-serve.txt" | head -1)

# Kubo seed with the same layout (Kubo's unixfs-v1-2025 profile).
kubo_conf() { # IPFS_PATH set; $1 swarm port
	"$IPFS" init --empty-repo >/dev/null
	"$IPFS" config --json Addresses.Swarm "[\"/ip4/127.0.0.1/tcp/$1\"]"
	"$IPFS" config Addresses.API "/ip4/127.0.0.1/tcp/$(port)"
	"$IPFS" config Addresses.Gateway "/ip4/127.0.0.1/tcp/$(port)"
	"$IPFS" config Routing.Type none
	"$IPFS" config --json Bootstrap '[]'
	"$IPFS" config --json Discovery.MDNS.Enabled false
	"$IPFS" config --json Import.CidVersion 1
	"$IPFS" config --json Import.UnixFSRawLeaves true
	"$IPFS" config Import.UnixFSChunker size-1048576
	"$IPFS" config --json Import.UnixFSFileMaxLinks 1024
}
kubo_start() { # IPFS_PATH set; prints the daemon's pid
	"$IPFS" daemon --offline=false >"$IPFS_PATH/daemon.log" 2>&1 &
	local pid=$!
	for _ in $(seq 300); do grep -q "Daemon is ready" "$IPFS_PATH/daemon.log" 2>/dev/null && break; sleep 0.1; done
	echo $pid
}
if [ "$KUBO" = 1 ]; then
	export IPFS_PATH=$WORK/kubo-seed
	KPORT=$(port)
	kubo_conf "$KPORT"
	KCID=$("$IPFS" add -Q --pin "$FILE")
	if [ "$KCID" != "$CID" ]; then
		echo "Kubo's CID $KCID differs from repronet's $CID: the comparison would not be like for like" >&2
		exit 1
	fi
	KPID=$(kubo_start)
	PIDS+=($KPID)
	KADDR="/ip4/127.0.0.1/tcp/$KPORT/p2p/$("$IPFS" config Identity.PeerID)"
	unset IPFS_PATH
fi

clk() { awk '{print $1}' /proc/uptime; }
# cpu of a pid (user+sys seconds) from /proc
pcpu() { awk -v t="$(getconf CLK_TCK)" '{print ($14+$15)/t}' "/proc/$1/stat"; }

declare -A T C
run_http() {
	local out=$WORK/recv/http.bin
	local t0 t1 s
	t0=$(clk)
	s=$( { TIMEFORMAT='%U %S'; time { curl -s -o "$out" "http://127.0.0.1:$HPORT/capsule.bin" && openssl dgst -sha256 -r "$out" >"$WORK/recv/http.sha" && sync "$out"; }; } 2>&1 )
	t1=$(clk)
	[ "$(cut -d' ' -f1 "$WORK/recv/http.sha")" = "$SHA" ] || { echo "http: wrong sha256" >&2; exit 1; }
	echo "$(echo "$t1 - $t0" | bc) $(echo "$s" | awk '{print $1+$2}')"
}
run_rn() { # $1: output (/dev/null or a file); $2: binary (default $RN)
	local t0 t1 s
	t0=$(clk)
	s=$( { TIMEFORMAT='%U %S'; time "${2:-$RN}" capsule get --data "$WORK/recv/rn" --peer "$RADDR" "$CID" -o "$1" 2>"$WORK/recv/rn.log"; } 2>&1 )
	t1=$(clk)
	echo "$(echo "$t1 - $t0" | bc) $(echo "$s" | awk '{print $1+$2}')"
}
run_kubo() { # $1: pin or get
	export IPFS_PATH=$WORK/recv/kubo
	kubo_conf "$(port)" >/dev/null
	local pid t0 t1 c0 c1
	pid=$(kubo_start)
	"$IPFS" swarm connect "$KADDR" >/dev/null
	c0=$(pcpu "$pid")
	t0=$(clk)
	if [ "$1" = pin ]; then
		"$IPFS" pin add "$CID" >/dev/null || { echo "kubo pin add failed" >&2; exit 1; }
	else
		"$IPFS" get -o "$WORK/recv/kubo.bin" "$CID" >/dev/null 2>&1 || { echo "kubo get failed" >&2; exit 1; }
	fi
	t1=$(clk)
	c1=$(pcpu "$pid")
	kill "$pid"; wait "$pid" 2>/dev/null || true
	unset IPFS_PATH
	echo "$(echo "$t1 - $t0" | bc) $(echo "$c1 - $c0" | bc)"
}

PATHS=(http rn-file rn-store)
[ "$KUBO" = 1 ] && PATHS=(http kubo-pin rn-file kubo-get rn-store)
[ -n "$OLD" ] && PATHS+=(old-file)
echo "== $MIB MiB, $ROUNDS rounds, CID $CID; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-6s %-9s %8s %8s\n" round path wall_s cpu_s
for r in $(seq "$ROUNDS"); do
	for p in "${PATHS[@]}"; do
		rm -rf "$WORK/recv"; mkdir -p "$WORK/recv"
		sync -f "$WORK" 2>/dev/null || true
		case $p in
		http) res=$(run_http) ;;
		rn-file) res=$(run_rn "$WORK/recv/rn.bin")
			[ "$(openssl dgst -sha256 -r "$WORK/recv/rn.bin" | cut -d' ' -f1)" = "$SHA" ] || { echo "rn-file: wrong sha256" >&2; exit 1; } ;;
		rn-store) res=$(run_rn /dev/null) ;;
		old-file) res=$(run_rn "$WORK/recv/rn.bin" "$OLD") ;;
		kubo-pin) res=$(run_kubo pin) ;;
		kubo-get) res=$(run_kubo get) ;;
		esac
		T[$p]="${T[$p]:-} $(echo "$res" | cut -d' ' -f1)"
		C[$p]="${C[$p]:-} $(echo "$res" | cut -d' ' -f2)"
		printf "%-6s %-9s %8.2f %8.2f   load %s\n" "$r" "$p" $res "$(cut -d' ' -f1 /proc/loadavg)"
	done
done
rm -rf "$WORK/recv"

med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
echo "== medians over $ROUNDS rounds (wall s, receiver CPU s; per $MIB MiB)"
for p in "${PATHS[@]}"; do
	printf "%-9s wall %6.2f  cpu %6.2f  (walls:%s)\n" "$p" "$(echo "${T[$p]}" | med)" "$(echo "${C[$p]}" | med)" "${T[$p]}"
done
ratio() { echo "scale=3; $(echo "${T[$1]}" | med) / $(echo "${T[$2]}" | med)" | bc; }
echo "== speed ratios (>1: repronet faster); per round, then of the medians"
for base in http kubo-pin old-file; do
	[ -n "${T[$base]:-}" ] || continue
	per=""
	b=(${T[$base]}); f=(${T[rn-file]})
	for i in "${!b[@]}"; do per="$per $(echo "scale=2; ${b[$i]} / ${f[$i]}" | bc)"; done
	printf "rn-file vs %-8s %sx  (rounds:%s)\n" "$base" "$(ratio "$base" rn-file)" "$per"
done
printf "rn-file CPU vs http: %sx\n" "$(echo "scale=2; $(echo "${C[rn-file]}" | med) / $(echo "${C[http]}" | med)" | bc)"
