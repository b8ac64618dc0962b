#!/usr/bin/env bash
# Builds the provisioner of an earlier commit of this repository from git history, as its image
# carries it (that commit's own hack/build-static.sh, profile `image`), for the upgrade tests
# (Makefile, test-upgrade). Its sources come from `git archive` into target/upgrade-earlier/src;
# it compiles in the image build's target dir, target/image, so the dependencies the two commits
# share (Cargo.lock is the same) are not compiled again: only the top crate is, once per commit.
# (A copy of that target dir would not do: the build scripts' outputs name their absolute paths,
# and every dependency would be compiled anew.) The binary is kept under its commit's name, since
# the next image build of this checkout writes the same output path.
#
# Usage: hack/build-earlier-provisioner.sh COMMIT
# Prints the binary's path. A clone without that commit (a shallow one) fails, naming it.
set -euo pipefail

if [ "$#" -ne 1 ]; then
  echo "usage: $0 COMMIT" >&2
  exit 2
fi
commit="$1"
cd "$(dirname "$0")/.."
repo="$PWD"
out="$repo/target/upgrade-earlier"
binary="$out/hostpath-provisioner-$commit"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
git cat-file -e "$commit^{commit}" 2>/dev/null \
  || { echo "$0: commit $commit is not in this clone (a shallow clone? fetch the history)" >&2; exit 1; }
rm -rf "$out/src"
mkdir -p "$out/src"
git archive "$commit" | tar -x -C "$out/src"
built="$(cd "$out/src" && HPP_GIT_COMMIT="$commit" bash hack/build-static.sh x86_64-unknown-linux-gnu image "$repo/target/image")"
cp "$built" "$binary.tmp"
mv "$binary.tmp" "$binary"
rm -rf "$out/src"
echo "$binary"
