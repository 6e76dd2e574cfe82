#!/usr/bin/env bash
# Build the documentation site and take headless-Chromium screenshots of some of its pages, to look at them as a
# reader would (tables, plots, API pages). Needs chromium (Debian: `apt-get install chromium`); not part of CI.
#   bash tools/docs_screenshots.sh [OUT_DIR] [PAGE ...]     (pages relative to the site root; "" is the home page)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/kglightning-docs-shots}"
shift || true
pages=("$@")
[ ${#pages[@]} -gt 0 ] || pages=("" "methods/kg-guard/" "data/" "benchmarks/" "api/data/")
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
[ -n "$browser" ] || { echo "no chromium found (Debian: apt-get install chromium)" >&2; exit 1; }
site="$(mktemp -d)"
server=""
trap '[ -z "$server" ] || kill "$server" 2>/dev/null; rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --site-dir "$site" >/dev/null
port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python -m http.server "$port" --bind 127.0.0.1 --directory "$site" >/dev/null 2>&1 &
server=$!
sleep 1
mkdir -p "$out"
for page in "${pages[@]}"; do
    name="$(echo "${page:-home}" | tr '/' '_' | sed 's/_$//')"
    if timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1600 \
        --screenshot="$out/$name.png" "http://127.0.0.1:$port/$page" >/dev/null 2>&1; then
        echo "$out/$name.png"
    else
        echo "screenshot failed: /$page" >&2
    fi
done
