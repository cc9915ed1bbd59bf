#!/bin/sh
# Rainfall at one station, with a Monte Carlo check: the number of rainy
# days and the total rainfall (deterministic, from ../data/rainfall.csv),
# a Monte Carlo estimate of pi seeded from /dev/urandom (different in
# every run), and the time the run finished. Writes into ../results.
set -e
export LC_ALL=C

DATA=../data
OUT=../results
mkdir -p "$OUT"

awk -F, 'NR > 1 { n++; total += $2; if ($2 > 0) rainy++ }
	END { printf "days,rainy_days,total_mm\n%d,%d,%.1f\n", n, rainy, total }' "$DATA/rainfall.csv" > "$OUT/rainfall.csv"

seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
pi=$(awk -v seed="$seed" 'BEGIN { srand(seed); for (i = 0; i < 20000; i++) { x = rand(); y = rand(); if (x*x + y*y <= 1) c++ }
	printf "%.4f", 4 * c / 20000 }')

{
	printf 'rainy_days %s\n' "$(awk -F, 'NR == 2 { print $2 }' "$OUT/rainfall.csv")"
	printf 'pi_estimate %s\n' "$pi"
	printf 'finished_at %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$OUT/summary.txt"
