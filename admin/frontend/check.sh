#!/bin/sh
# Rebuild the flow builder bundle from its locked sources and fail when the committed bundle differs
# (CI runs this; tests/admin/test_builder_bundle.py checks the sources hash without Node).
set -eu
cd "$(dirname "$0")"
npm ci --no-audit --no-fund
npm run build
git diff --exit-code -- ../static/flows/builder.js ../static/flows/builder.css
# A bundle that was never committed has no diff: it must at least be tracked.
git ls-files --error-unmatch ../static/flows/builder.js ../static/flows/builder.css >/dev/null
