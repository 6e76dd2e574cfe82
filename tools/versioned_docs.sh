#!/usr/bin/env bash
# The versioned documentation site (mike): builds this tree's docs (strict, as mkdocs.yml says) into the branch
# given as $1 (default docs-site) of this clone, as the package's version X.Y with the alias `latest`, then checks
# what it wrote. Nothing is pushed: `mike serve --branch docs-site` shows the site with its version switcher, and a
# release publishes with `mike deploy --push --update-aliases X.Y latest` (CONTRIBUTING.md, "Documentation").
# A commit needs an identity: the GIT_* variables below are used only where none is set.
set -euo pipefail
cd "$(dirname "$0")/.."
branch="${1:-docs-site}"
if [ ! -e .git ]; then  # (a clone git refuses, e.g. one another user owns, fails below with git's own message)
  echo "versioned site: skipped ($PWD is not a git clone, and mike commits the site to a branch)"
  exit 0
fi
version=$(python -c "import kglightning; print('.'.join(kglightning.__version__.split('.')[:2]))")
export GIT_AUTHOR_NAME="${GIT_AUTHOR_NAME:-kglightning docs}"
export GIT_AUTHOR_EMAIL="${GIT_AUTHOR_EMAIL:-docs@kglightning.invalid}"
export GIT_COMMITTER_NAME="${GIT_COMMITTER_NAME:-$GIT_AUTHOR_NAME}"
export GIT_COMMITTER_EMAIL="${GIT_COMMITTER_EMAIL:-$GIT_AUTHOR_EMAIL}"
NO_MKDOCS_2_WARNING=1 mike deploy --ignore-remote-status --branch "$branch" --update-aliases \
    "$version" latest
git show "$branch:versions.json" | python -c "
import json, sys
versions = {v['version']: v['aliases'] for v in json.load(sys.stdin)}
assert versions.get('$version') == ['latest'], f'versions.json: {versions}'
print('versioned site: $branch holds', ', '.join(f'{v} ({\", \".join(a) or \"no alias\"})' for v, a in versions.items()))
"
git cat-file -e "$branch:$version/index.html"
git cat-file -e "$branch:$version/api/index.html"
