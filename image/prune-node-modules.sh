#!/bin/sh
# Removes from a production node_modules what Node never loads: type declarations and source
# maps (about half of @kubernetes/client-node). Shared by scripts/image.sh and the Dockerfile.
set -eu
find "$1" -type f \( -name '*.d.ts' -o -name '*.d.mts' -o -name '*.d.cts' -o -name '*.map' \) -delete
