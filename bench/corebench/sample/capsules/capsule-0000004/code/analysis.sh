#!/bin/sh
# Robust summary of the daily discharge at two river gauges: the median
# and the median absolute deviation of each, with robust-stats (installed
# by environment/Dockerfile). Reads ../data/discharge.csv, writes into
# ../results.
set -e
export LC_ALL=C

DATA=../data
OUT=../results
mkdir -p "$OUT"

if ! command -v robust-stats >/dev/null 2>&1; then
	echo "analysis.sh: robust-stats is not installed: run in the capsule's environment (environment/Dockerfile)" >&2
	exit 1
fi

for gauge in upstream downstream; do
	robust-stats "$DATA/discharge.csv" "$gauge" | awk -v g="$gauge" '{ printf "%s_%s %s\n", $1, g, $2 }'
done > "$OUT/robust_stats.txt"

{
	cat "$OUT/robust_stats.txt"
	awk '$1 ~ /^median_/ { sub(/^median_/, "", $1); print $2, $1 }' "$OUT/robust_stats.txt" | sort -k1,1nr |
		awk 'NR == 1 { printf "larger_median_gauge \"%s\"\n", $2 }'
	printf 'tool "%s"\n' "$(robust-stats --version)"
} > "$OUT/summary.txt"
