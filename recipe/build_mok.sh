#!/usr/bin/env bash
# The mok output of recipe.yaml: the Python package, linked against the libmok that libmok-dev put
# in $PREFIX instead of bundling its own copy as the wheel does.
set -euxo pipefail

# A build dir of our own: the source tree may carry another build's CMake cache under python/build.
"$PYTHON" -m pip install "$SRC_DIR/python" -vv --no-deps --no-build-isolation --prefix "$PREFIX" \
  -Ccmake.define.MOK_USE_INSTALLED=ON \
  -Cbuild-dir="$SRC_DIR/build-mok-python"

# pip records the temporary build dir it installed from; that path means nothing to a user and
# would make the package depend on where it was built.
dist_info=$(echo "$PREFIX"/lib/python*/site-packages/mok-*.dist-info)
rm "$dist_info/direct_url.json"
sed -i '/\/direct_url\.json,/d' "$dist_info/RECORD"
