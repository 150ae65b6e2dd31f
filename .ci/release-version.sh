#!/usr/bin/env bash
# The release workflow's first check (.github/workflows/release.yml), before anything is
# built: a tag vX.Y.Z releases version X.Y.Z only when the crate (Cargo.toml and its entry
# in Cargo.lock), the chart (version and appVersion: they move with the crate) and
# CHANGELOG.md (a section "## [X.Y.Z]") all say X.Y.Z. Prints X.Y.Z; otherwise says what
# differs and fails. tests/chart/release.rs runs it on this tree.
#
#   .ci/release-version.sh vX.Y.Z
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:?usage: release-version.sh vX.Y.Z}

if ! [[ $tag =~ ^v([0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?)$ ]]; then
  echo "the tag $tag is not vX.Y.Z (or vX.Y.Z-PRERELEASE)" >&2
  exit 1
fi
version=${BASH_REMATCH[1]}

chart=charts/mailer-operator/Chart.yaml
# A top-level key of Chart.yaml, its value unquoted.
chart_field() { sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *\$/\1/p" "$chart" | sed -n 1p; }

crate=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | sed -n 1p)
# The version line that follows the mailer package's name in Cargo.lock.
locked=$(sed -n '/^name = "mailer"$/{n;s/^version = "\(.*\)"$/\1/p;}' Cargo.lock | sed -n 1p)
failed=0
for found in "Cargo.toml version:$crate" "Cargo.lock mailer:$locked" \
  "$chart version:$(chart_field version)" "$chart appVersion:$(chart_field appVersion)"; do
  if [[ ${found##*:} != "$version" ]]; then
    echo "the tag $tag is version $version, but ${found%:*} is '${found##*:}'" >&2
    failed=1
  fi
done
if ! grep -q "^## \[${version//./\\.}\]" CHANGELOG.md; then
  echo "CHANGELOG.md has no section '## [$version]' for the tag $tag" >&2
  failed=1
fi
((failed == 0)) || exit 1
echo "$version"
