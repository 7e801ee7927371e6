#!/usr/bin/env bash
# The test suite's OpenMP wait policy (conftest.py sets OMP_WAIT_POLICY=PASSIVE): the same end-to-end test twice AT
# THE SAME TIME, once under libgomp's default policy and once under PASSIVE, so both meet the same load (each other,
# and whatever else runs). Prints each one's seconds and the ratio. An empty OMP_WAIT_POLICY is libgomp's default
# (it ignores a value it cannot read) and stops conftest.py from setting PASSIVE.
#   bash benchmarks/suite_omp_wait.sh [TEST_ID]
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=${1:-'integration_tests/test_resume.py::test_sigkill_then_resume_reproduces_the_uninterrupted_metrics[default]'}
run() {  # $1: the policy's name, $2: OMP_WAIT_POLICY's value
    local start end
    start=$(date +%s.%N)
    OMP_WAIT_POLICY=$2 python3 -m pytest -q -p no:cacheprovider "$TEST" > "/tmp/suite_omp_wait_$1.$$.log" 2>&1 \
        || { echo "$1: the test failed, see /tmp/suite_omp_wait_$1.$$.log" >&2; return 1; }
    end=$(date +%s.%N)
    rm -f "/tmp/suite_omp_wait_$1.$$.log"
    python3 -c "print(f'$1 {$end - $start:.1f} s')"
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
run default "" > "/tmp/suite_omp_wait_default.$$" & first=$!
run passive PASSIVE > "/tmp/suite_omp_wait_passive.$$" & second=$!
wait "$first" "$second"
cat "/tmp/suite_omp_wait_default.$$" "/tmp/suite_omp_wait_passive.$$"
python3 - "/tmp/suite_omp_wait_default.$$" "/tmp/suite_omp_wait_passive.$$" <<'PY'
import sys
default, passive = (float(open(p).read().split()[1]) for p in sys.argv[1:])
print(f"default / passive: {default / passive:.2f}x")
PY
rm -f "/tmp/suite_omp_wait_default.$$" "/tmp/suite_omp_wait_passive.$$"
