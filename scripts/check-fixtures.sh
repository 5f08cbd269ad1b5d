#!/bin/sh
# Proves the committed fake sysfs trees in testdata/sysfs are exactly what
# scripts/mkfakesysfs.py makes from testdata/sysfs/machines.json.
# Exits 1 and prints the differences on drift (also for stale or missing machine dirs).
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 scripts/mkfakesysfs.py testdata/sysfs/machines.json "$tmp"
if diff -r -x machines.json -x README.md "$tmp" testdata/sysfs; then
    echo "check-fixtures: testdata/sysfs matches scripts/mkfakesysfs.py"
else
    echo "check-fixtures: testdata/sysfs has drifted; run:" >&2
    echo "  scripts/mkfakesysfs.py testdata/sysfs/machines.json testdata/sysfs" >&2
    exit 1
fi
