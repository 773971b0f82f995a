#!/usr/bin/env bash
# Print a PYTHONPATH entry under which `import nib.engine` etc. work from a plain checkout
# (no pip install): a link tree nib/{engine,service,sdk,v1,bridge} -> the repo's folders.
# The package maps folders onto the nib.* namespace, so PYTHONPATH=. alone does not work.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tree="${NIB_LINK_TREE:-${TMPDIR:-/tmp}/nib-link-tree}"
rm -rf "$tree" && mkdir -p "$tree/nib"
ln -s "$repo/engine" "$tree/nib/engine"
ln -s "$repo/service" "$tree/nib/service"
ln -s "$repo/sdk" "$tree/nib/sdk"
ln -s "$repo/proto/nib/v1" "$tree/nib/v1"
ln -s "$repo/ide-extension-bridge" "$tree/nib/bridge"
echo "$tree"
