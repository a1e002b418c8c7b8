#!/usr/bin/env bash
# Generates the Python protobuf and gRPC stubs of proto/fusedserve/v1/*.proto
# into the fusedserve_client package (fusedserve_client/_proto/), with .pyi
# type stubs. Needs grpcio-tools for the Python it runs (pip install
# grpcio-tools, or Debian's python3-grpc-tools).
#
# usage: generate_stubs.sh [PACKAGE_DIR]
#   PACKAGE_DIR  the fusedserve_client directory to generate into (default:
#                the one beside this script); tests use a copy in the build tree.
# env:   PYTHON (default python3), FUSEDSERVE_PROTO_DIR (default ../../proto)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
proto_root=$(cd "${FUSEDSERVE_PROTO_DIR:-$here/../../proto}" && pwd)
pkg_dir=${1:-$here/fusedserve_client}
[ -f "$pkg_dir/__init__.py" ] || { echo "generate_stubs: $pkg_dir is not the fusedserve_client package" >&2; exit 2; }

if ! "$python" -c "import grpc_tools.protoc" 2>/dev/null; then
  echo "generate_stubs: '$python' has no grpc_tools: pip install grpcio-tools (or apt-get install python3-grpc-tools)" >&2
  exit 1
fi

out=$pkg_dir/_proto
tmp=$(mktemp -d "$pkg_dir/._proto.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

mapfile -t protos < <(cd "$proto_root" && find fusedserve -name '*.proto' | sort)
"$python" -m grpc_tools.protoc -I"$proto_root" \
  --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" "${protos[@]}"

# protoc writes absolute imports named after the proto package
# ("from fusedserve.v1 import fusedserve_pb2"); inside our package they must
# be relative, or a top-level "fusedserve" module would be needed on sys.path.
"$python" - "$tmp" <<'PY'
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
    (d / "__init__.py").touch()
for f in root.rglob("*.py*"):
    rel_pkg = f.parent.relative_to(root).parts  # e.g. ("fusedserve", "v1")
    def fix(m):
        target = m.group(1).split(".")
        # relative import from the generated file's package to the target's
        up = len(rel_pkg)
        return "from " + "." * (up + 1) + ".".join(target) + " import"
    text = re.sub(r"^from ((?:fusedserve)(?:\.\w+)*) import", fix, f.read_text(), flags=re.M)
    f.write_text(text)
PY

rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "generate_stubs: ${protos[*]} -> $out"
