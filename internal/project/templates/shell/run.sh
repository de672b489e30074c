#!/bin/sh
# __NAME__: a small POSIX shell script.
# Run it with `sh __NAME__/run.sh [NAME]` from the workspace, or `./run.sh`
# inside the directory.
set -eu

name="${1:-__NAME__}"
echo "Hello, $name!"
