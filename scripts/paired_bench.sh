#!/usr/bin/env bash
# Paired A/B on a noisy host: two `reprise bench` runs take turns, one timed
# step each (`--lockstep`), so step i of A and step i of B see the same
# moment of the machine; B's speed over A's is the median of the per-step
# ratios. Compares two builds, or two settings of one build (-a / -b set
# environment variables for one side, e.g. REPRISE_PREFETCH or REPRISE_ISA).
#
#   scripts/paired_bench.sh [-a 'VAR=value ...'] [-b 'VAR=value ...'] BIN_A BIN_B [bench options]
#   scripts/paired_bench.sh /tmp/reprise-old build/reprise -m model.gguf -t 2 -p 0 -n 256 -d 1024
#
# Prints one line per test: the pairs compared, each side's median step
# time, and B/A speed as the median of per-pair ratios with the quartiles.
# An A/A run (the same binary twice) gives medians within ~0.5 % of 1.
set -euo pipefail
env_a="" env_b=""
while getopts "a:b:" opt; do
  case $opt in
    a) env_a=$OPTARG ;;
    b) env_b=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 2 ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
bin_a=$1 bin_b=$2
shift 2

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkfifo "$dir/a" "$dir/b"
# A has the first turn. The script keeps A's FIFO open until both exit: a
# FIFO drops its bytes when no process holds it open.
exec 3<>"$dir/a"
printf 't' >&3
# shellcheck disable=SC2086
env $env_a "$bin_a" bench "$@" --lockstep "$dir/a,$dir/b" --step-times "$dir/a.tsv" >"$dir/a.out" 2>&1 &
pid_a=$!
# shellcheck disable=SC2086
env $env_b "$bin_b" bench "$@" --lockstep "$dir/b,$dir/a" --step-times "$dir/b.tsv" >"$dir/b.out" 2>&1 &
pid_b=$!
# A side that fails would leave the other waiting for its turn (up to the
# bench's lockstep timeout): stop the survivor at once.
status=0
for _ in 1 2; do  # the two benches are this shell's only jobs
  if ! wait -n; then
    status=1
    kill $pid_a $pid_b 2>/dev/null || true
  fi
done
exec 3>&-
if [ $status -ne 0 ]; then
  echo "a bench failed; its output (A, then B):" >&2
  cat "$dir/a.out" "$dir/b.out" >&2
fi
[ $status -eq 0 ] || exit $status
grep -h "lockstep:" "$dir/a.out" "$dir/b.out" >&2 || true

# Join the two step logs on (test, index): one line per pair.
awk -F'\t' 'NR == FNR { a[$1 "\t" $2] = $3; next }
            ($1 "\t" $2) in a { print $1 "\t" a[$1 "\t" $2] "\t" $3 }' "$dir/a.tsv" "$dir/b.tsv" >"$dir/pairs.tsv"
if [ ! -s "$dir/pairs.tsv" ]; then
  echo "no paired steps (do both sides run the same tests?)" >&2
  exit 1
fi
# Quantile p of a column of numbers (median: 0.5), by nearest rank.
q() { sort -g | awk -v p="$1" '{ v[NR] = $1 } END { i = int(p * (NR - 1) + 0.5) + 1; print v[i] }'; }
for test in $(cut -f1 "$dir/pairs.tsv" | sort -u); do
  n=$(awk -F'\t' -v t="$test" '$1 == t' "$dir/pairs.tsv" | wc -l)
  ta=$(awk -F'\t' -v t="$test" '$1 == t { print $2 }' "$dir/pairs.tsv" | q 0.5)
  tb=$(awk -F'\t' -v t="$test" '$1 == t { print $3 }' "$dir/pairs.tsv" | q 0.5)
  ratios=$(awk -F'\t' -v t="$test" '$1 == t { print $2 / $3 }' "$dir/pairs.tsv")
  printf '%s\tpairs %d\tA %.3f ms\tB %.3f ms\tB/A speed: median %.4f (quartiles %.4f-%.4f)\n' \
    "$test" "$n" "$(awk -v x="$ta" 'BEGIN { print x * 1000 }')" "$(awk -v x="$tb" 'BEGIN { print x * 1000 }')" \
    "$(echo "$ratios" | q 0.5)" "$(echo "$ratios" | q 0.25)" "$(echo "$ratios" | q 0.75)"
done
