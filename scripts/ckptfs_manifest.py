"""Read a ckptfs manifest with every backend's files resolved (for the benchmark scripts).

Manifests of format 3 and later name one stored file list per backend: a JSON object in
STORE/objects/xx/<id> with `files`, and for a delta `base` (the list it applies to) and
`removed` (names). Formats 1 and 2 list `files` inline. A file entry with `chunks`
(format 4: RocksDB's MANIFEST) is stored as the objects `chunks.ids`, joined in order. Object ids are not verified here:
ckptfs fsck does that.
"""
import json
import os


def _read_list(store, list_id):
    with open(os.path.join(store, "objects", list_id[:2], list_id)) as f:
        return json.load(f)


def resolve_list(store, list_id):
    chain = []
    while list_id is not None:
        stored = _read_list(store, list_id)
        chain.append(stored)
        list_id = stored.get("base")
    files = {}
    for stored in reversed(chain):
        for name in stored.get("removed", []):
            del files[name]
        for f in stored["files"]:
            files[f["name"]] = f
    return [files[name] for name in sorted(files)]


def load(store, manifest_path):
    """The manifest as a dict whose backends all carry `files`."""
    with open(manifest_path) as f:
        m = json.load(f)
    for b in m["backends"]:
        if "files" not in b:
            b["files"] = resolve_list(store, b["list"])
    return m


def object_path(store, object_id):
    return os.path.join(store, "objects", object_id[:2], object_id)


def read_file(store, f):
    """The content of one file entry: its object, or its chunks (format 4) joined."""
    if "chunks" in f:
        parts = []
        for chunk in f["chunks"]["ids"]:
            with open(object_path(store, chunk), "rb") as c:
                parts.append(c.read())
        data = b"".join(parts)
        assert len(data) == f["size"], (f["name"], len(data), f["size"])
        return data
    with open(object_path(store, f["object"]), "rb") as o:
        return o.read()
