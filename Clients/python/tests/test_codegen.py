"""The generator: one edit to the protocol document reaches the Swift, Python and JavaScript sides."""
import copy
import json
import os
import subprocess
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "Protocol", "codegen"))

from blazegen import javascript, model, python, swift  # noqa: E402

DOC_PATH = os.path.join(ROOT, "Protocol", "blazedb.openrpc.json")


def outputs_for(doc, tmp_path):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    m = model.load(str(path))
    files = {}
    for writer in (swift, python, javascript):
        files.update(writer.outputs(m))
    return files


def test_a_new_parameter_reaches_every_target(tmp_path):
    doc = json.load(open(DOC_PATH, encoding="utf-8"))
    before = outputs_for(doc, tmp_path)
    edited = copy.deepcopy(doc)
    get = next(m for m in edited["methods"] if m["name"] == "doc.get")
    get["params"].append({"name": "asOfSeq", "required": False, "description": "Read as of this feed sequence.",
                          "schema": {"type": "integer"}})
    after = outputs_for(edited, tmp_path)

    swift_file = after["Sources/BlazeProtocol/Generated/RPCMethods.swift"]
    assert "public var asOfSeq: Int?" in swift_file
    assert 'self.asOfSeq = try RPCParam.optional(params, "asOfSeq", of: Self.method, RPCDecode.int)' in swift_file
    assert '"db", "collection", "id", "fields", "at", "atTime", "vectors", "asOfSeq"' in swift_file
    assert "asOfSeq" not in before["Sources/BlazeProtocol/Generated/RPCMethods.swift"]

    py = after["Clients/python/blazedb/__init__.py"]
    assert "as_of_seq: int = MISSING" in py and 'params["asOfSeq"] = as_of_seq' in py

    dts = after["Clients/js/index.d.ts"]
    assert '"asOfSeq"?: number' in dts
    # Only the generated files of the method's targets change (the result types do not: the result is the same).
    changed = sorted(k for k in after if after[k] != before[k])
    assert changed == ["Clients/js/index.d.ts", "Clients/python/blazedb/__init__.py", "Clients/python/blazedb/aio.py",
                       "Sources/BlazeProtocol/Generated/RPCMethods.swift"]
    assert "as_of_seq: int = MISSING" in after["Clients/python/blazedb/aio.py"]


def test_committed_files_are_what_the_generator_writes():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "Protocol", "codegen", "generate.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_by_position_method_is_refused(tmp_path):
    doc = json.load(open(DOC_PATH, encoding="utf-8"))
    doc["methods"][0]["paramStructure"] = "by-position"
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    try:
        model.load(str(path))
    except ValueError as e:
        assert "by-name" in str(e)
    else:
        raise AssertionError("a by-position method was accepted")
