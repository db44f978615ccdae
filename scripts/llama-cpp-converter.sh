#!/usr/bin/env bash
# Prints the path of llama.cpp's convert_hf_to_gguf.py, fetching it on first use; its LoRA
# adapter converter, convert_lora_to_gguf.py, is beside it.
#
# The converters (with the conversion/ package and the gguf-py/ library they import) come from the
# source distribution of llama-cpp-python on PyPI, which vendors llama.cpp: a pinned version whose
# sha256 is checked. Only those files are unpacked, into a cache outside the clone:
# $RSGL_LLAMA_CPP_DIR (default /var/tmp/rsgl-llama-cpp)/llama.cpp-<version>/; a cache from before
# a file was wanted gets the missing files from a new download. If the Python that
# runs it ($PYTHON, default python3) lacks sentencepiece (which the converter imports for
# Llama-derived models), it is installed into deps-py<X.Y>/ beside the converter, not into the
# environment: run the converter with that folder on PYTHONPATH (tests/gguf_convert.py does).
#
#   python "$(scripts/llama-cpp-converter.sh)" MODEL_FOLDER --outfile out.gguf --outtype f32
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e  # llama_cpp_python-0.3.36.tar.gz
SENTENCEPIECE=0.2.3
INDEX=${PIP_INDEX_URL:-https://pypi.org/simple}
PYTHON=${PYTHON:-python3}
CACHE=${RSGL_LLAMA_CPP_DIR:-/var/tmp/rsgl-llama-cpp}
DEST=$CACHE/llama.cpp-$VERSION

if [[ ! -f $DEST/convert_hf_to_gguf.py || ! -f $DEST/convert_lora_to_gguf.py ]]; then
    mkdir -p "$CACHE"
    echo "llama-cpp-converter: fetching llama-cpp-python $VERSION's llama.cpp converter into $DEST" >&2
    # Download to a temporary folder, then rename: concurrent runs never see half a copy.
    "$PYTHON" - "$INDEX" "$VERSION" "$SHA256" "$CACHE" "$DEST" <<'EOF'
import hashlib, json, os, shutil, sys, tarfile, tempfile, urllib.parse, urllib.request

index, version, sha256, cache, dest = sys.argv[1:]
filename = f"llama_cpp_python-{version}.tar.gz"
# The simple index as JSON (PEP 691): the sdist's URL, relative to the index page on some mirrors.
page = index.rstrip("/") + "/llama-cpp-python/"
request = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(request, timeout=60) as response:
    files = json.load(response)["files"]
url = next((urllib.parse.urljoin(page, f["url"]) for f in files if f["filename"] == filename), None)
if url is None:
    sys.exit(f"llama-cpp-converter: {page} lists no {filename}")

work = tempfile.mkdtemp(prefix="download-", dir=cache)
try:
    archive = os.path.join(work, filename)
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as response, open(archive, "wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        sys.exit(f"llama-cpp-converter: sha256 mismatch for {url}: got {digest.hexdigest()}, expected {sha256}")

    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    wanted = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "LICENSE", "conversion/", "gguf-py/", "models/templates/")
    unpacked = os.path.join(work, "llama.cpp")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.name[len(prefix) :].startswith(wanted)]
        for member in members:
            member.name = member.name[len(prefix) :]
        tar.extractall(unpacked, members=members, filter="data")
    try:
        os.rename(unpacked, dest)
    except OSError:  # a cache from before some file was wanted, or another run got there first
        for entry in os.listdir(unpacked):
            try:
                os.rename(os.path.join(unpacked, entry), os.path.join(dest, entry))
            except OSError:  # the cache has it
                pass
        if not all(os.path.isfile(os.path.join(dest, script)) for script in ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py")):
            raise
finally:
    shutil.rmtree(work, ignore_errors=True)
EOF
fi

if ! "$PYTHON" -c "import sentencepiece" 2>/dev/null; then
    DEPS=$DEST/deps-py$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if ! PYTHONPATH=$DEPS "$PYTHON" -c "import sentencepiece" 2>/dev/null; then
        echo "llama-cpp-converter: installing sentencepiece $SENTENCEPIECE into $DEPS" >&2
        "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --no-warn-conflicts --root-user-action=ignore --target "$DEPS.tmp$$" "sentencepiece==$SENTENCEPIECE" >&2
        mv -T "$DEPS.tmp$$" "$DEPS" 2>/dev/null || rm -rf "$DEPS.tmp$$"  # or another run got there first
    fi
fi

echo "$DEST/convert_hf_to_gguf.py"
