"""Contract tests: every method of Protocol/blazedb.openrpc.json against a real blazed, results checked with jsonschema."""
import base64
import copy
import json
import os

import jsonschema
import openrpc
import pydantic
import pytest

import blazedb

from conftest import ROOT

DOC = json.load(open(os.path.join(ROOT, "Protocol", "blazedb.openrpc.json"), encoding="utf-8"))
METHODS = {m["name"]: m for m in DOC["methods"]}
ERROR_CODES = {e["code"] for e in DOC["components"]["errors"].values()}


def schema_with_components(schema):
    """A schema whose '#/components/...' references resolve against the document's components."""
    return dict(schema, components=DOC["components"])


def check_result(method, result):
    jsonschema.validate(result, schema_with_components(METHODS[method]["result"]["schema"]), cls=jsonschema.Draft7Validator)


def test_document_is_a_valid_openrpc_document():
    openrpc.OpenRPC.model_validate(DOC)
    for broken in ({k: v for k, v in DOC.items() if k != "info"}, dict(DOC, methods=[{"summary": "no name"}])):
        with pytest.raises(pydantic.ValidationError):
            openrpc.OpenRPC.model_validate(broken)


def test_every_embedded_schema_is_valid_and_every_example_matches_it():
    for name, schema in DOC["components"]["schemas"].items():
        jsonschema.Draft7Validator.check_schema(schema)
    for m in DOC["methods"]:
        jsonschema.Draft7Validator.check_schema(m["result"]["schema"])
        assert m["paramStructure"] == "by-name"
        assert m["examples"], f"{m['name']} has no example"
        for example in m["examples"]:
            check_result(m["name"], example["result"]["value"])
            params = {p["name"]: p for p in m["params"]}
            given = {p["name"] for p in example["params"]}
            assert given <= set(params), f"{m['name']} example uses unknown params"
            assert {n for n, p in params.items() if p["required"]} <= given, f"{m['name']} example lacks required params"
            for p in example["params"]:
                jsonschema.validate(p["value"], schema_with_components(params[p["name"]]["schema"]))
        for e in m["errors"]:
            assert e["code"] in ERROR_CODES, f"{m['name']} lists an error code the catalogue lacks"


COVERED_OK = set()
COVERED_ERR = set()


@pytest.fixture
def client(daemon):
    with blazedb.Client(daemon.socket) as c:
        yield c


def ok(c, method, **params):
    result = c.call(method, params)
    check_result(method, result)
    COVERED_OK.add(method)
    return result


def err(c, method, code, kind=None, **params):
    with pytest.raises(blazedb.BlazeError) as info:
        c.call(method, params)
    e = info.value
    assert e.code == code, f"{method}: {e}"
    assert e.code in ERROR_CODES and isinstance(e.kind, str) and e.kind
    if kind:
        assert e.kind == kind, f"{method}: {e}"
    listed = {e["code"] for e in METHODS[method]["errors"]}
    assert e.code in listed, f"{method} returned {e.code}, which its errors list does not document"
    COVERED_ERR.add(method)
    return e


def test_every_method_succeeds_and_fails_as_documented(client, daemon):
    c = client
    ok(c, "rpc.discover")
    ok(c, "daemon.info")
    settings = {s["key"]: s for s in ok(c, "daemon.config")["settings"]}
    assert settings["socket"]["value"] == daemon.socket and settings["socket"]["source"] == "flag --socket"
    assert settings["max-batch"] == {"key": "max-batch", "value": 256, "source": "default", "env": "BLAZEDB_MAX_BATCH"}
    err(c, "daemon.config", -32602, bogus=1)
    assert "blazed_requests_total" in ok(c, "daemon.metrics")["text"]
    err(c, "daemon.metrics", -32602, bogus=1)
    ok(c, "db.create", db="app")
    err(c, "db.create", -32011, "database_exists", db="app")
    ok(c, "db.list")
    ok(c, "collection.list", db="app")
    err(c, "collection.list", -32010, "database_not_found", db="missing")
    ok(c, "doc.insert", db="app", collection="todos", doc={"_id": "t1", "title": "Buy milk", "n": 1.0, "big": 2**62})
    err(c, "doc.insert", -32011, "document_exists", db="app", collection="todos", doc={"_id": "t1"})
    got = ok(c, "doc.get", db="app", collection="todos", id="t1")["doc"]
    assert got == {"_id": "t1", "title": "Buy milk", "n": 1.0, "big": 2**62}
    assert isinstance(got["n"], float) and isinstance(got["big"], int), "numbers keep their kind"
    err(c, "doc.get", -32010, "document_not_found", db="app", collection="todos", id="zz")
    ok(c, "doc.getMany", db="app", collection="todos", ids=["t1", "zz"], fields=["title"])
    err(c, "doc.getMany", -32602, db="app", collection="todos", ids=[1])
    hist = ok(c, "doc.history", db="app", collection="todos", id="t1")
    assert [e["type"] for e in hist["entries"]] == ["insert"] and hist["cursor"] is None
    assert ok(c, "doc.get", db="app", collection="todos", id="t1", at=hist["entries"][0]["seq"])["doc"]["title"] == "Buy milk"
    err(c, "doc.history", -32012, "limit_out_of_range", db="app", collection="todos", id="t1", limit=0)
    ok(c, "doc.put", db="app", collection="todos", id="t2", doc={"title": "Write docs", "n": 2})
    err(c, "doc.put", -32602, "id_mismatch", db="app", collection="todos", id="t2", doc={"_id": "other"})
    ok(c, "doc.patch", db="app", collection="todos", id="t2", set={"done": False}, incr={"views": 1}, add={"tags": ["x"]})
    err(c, "doc.patch", -32602, "invalid_patch", db="app", collection="todos", id="t2", incr={"views": "one"})
    ok(c, "tx.commit", db="app", ops=[{"op": "insert", "collection": "todos", "doc": {"_id": "t3"}},
                                        {"op": "patch", "collection": "todos", "id": "t3", "set": {"n": 3}}])
    err(c, "tx.commit", -32010, "document_not_found", db="app", ops=[{"op": "delete", "collection": "todos", "id": "nope"}])
    ok(c, "index.create", db="app", collection="todos", fields=["n"])
    err(c, "index.create", -32011, "index_exists", db="app", collection="todos", fields=["n"])
    ok(c, "index.list", db="app", collection="todos")
    assert ok(c, "index.list", db="app", collection="nope")["indexes"] == []
    err(c, "index.list", -32602, "invalid_name", db="app", collection="no pe")
    page = ok(c, "query.find", db="app", collection="todos", where={"n": {"$gte": 1}}, sort="-n", limit=2)
    assert [d["_id"] for d in page["docs"]] == ["t3", "t2"] and page["cursor"]
    rest = ok(c, "query.find", db="app", collection="todos", where={"n": {"$gte": 1}}, sort="-n", limit=2, cursor=page["cursor"])
    assert [d["_id"] for d in rest["docs"]] == ["t1"] and rest["cursor"] is None
    err(c, "query.find", -32602, "invalid_filter", db="app", collection="todos", where={"n": {"$regex": "x"}})
    assert ok(c, "query.count", db="app", collection="todos", where={"done": False})["count"] == 1
    assert ok(c, "query.count", db="app", collection="nope")["count"] == 0
    assert ok(c, "query.find", db="app", collection="nope", where={"n": 1}) == {"docs": [], "cursor": None}
    ok(c, "index.create", db="app", collection="todos", fields=["emb"], vector={"dimensions": 2, "metric": "l2"})
    ok(c, "doc.patch", db="app", collection="todos", id="t1", set={"emb": {"$vector": [1, 0]}})
    ok(c, "doc.patch", db="app", collection="todos", id="t2", set={"emb": {"$vector": [0, 1]}})
    near = ok(c, "query.nearest", db="app", collection="todos", field="emb", vector=[0.9, 0.1], k=1, vectors="array")
    assert near["index"] == "todos.emb" and near["results"][0]["doc"]["_id"] == "t1"
    assert near["results"][0]["doc"]["emb"] == {"$vector": [1, 0]}
    err(c, "query.nearest", -32602, "invalid_vector", db="app", collection="todos", field="emb", vector=[1, 2, 3], k=1)
    err(c, "query.nearest", -32012, "limit_out_of_range", db="app", collection="todos", field="emb", vector=[1, 2], k=0)
    err(c, "query.nearest", -32010, "database_not_found", db="nope", collection="todos", field="emb", vector=[1, 2], k=1)
    err(c, "query.nearest", -32602, "invalid_params", db="app", collection="todos", field="emb", k=1)
    ok(c, "index.drop", db="app", name="todos.emb")
    assert ok(c, "doc.getMany", db="app", collection="nope", ids=["a", "b"])["docs"] == [None, None]
    err(c, "query.count", -32602, "invalid_name", db="app", collection="no pe")
    assert ok(c, "query.update", db="app", collection="todos", where={"n": {"$gte": 2}}, set={"meta.seen": True},
              returnIds=True) == {"count": 2, "ids": ["t2", "t3"]}
    err(c, "query.update", -32602, "invalid_path", db="app", collection="todos", where={}, set={"n.x": 1})
    assert ok(c, "query.delete", db="app", collection="nope", where={}) == {"count": 0}
    agg = ok(c, "query.aggregate", db="app", collection="todos", group=["done"], aggregates={"n": {"$count": {}}})
    assert [(g["key"]["done"], g["values"]["n"]) for g in agg["groups"]] == [(None, 2), (False, 1)] and not agg["truncated"]
    err(c, "query.aggregate", -32602, "invalid_aggregate", db="app", collection="todos", aggregates={"n": {"$median": "x"}})
    err(c, "query.delete", -32602, "invalid_params", db="app", collection="todos")
    ok(c, "doc.insert", db="app", collection="scratch", doc={"_id": "s"})
    assert ok(c, "collection.drop", db="app", collection="scratch") == {"collection": "scratch", "deleted": 1, "indexes": 0, "changes": 1}
    err(c, "collection.drop", -32010, "collection_not_found", db="app", collection="scratch")
    assert ok(c, "query.explain", db="app", collection="todos", where={"n": 3})["indexes"] == ["todos.n"]
    err(c, "query.explain", -32012, db="app", collection="todos", limit=0)
    ok(c, "conflict.list", db="app")
    err(c, "conflict.list", -32012, db="app", limit=0)
    err(c, "conflict.resolve", -32010, "conflict_not_found", db="app", collection="todos", id="t1", field="title")
    sub = ok(c, "subscribe", db="app", collection="todos", where={"done": False}, since=0)
    err(c, "subscribe", -32010, "database_not_found", db="missing")
    err(c, "subscribe", -32602, "since_in_future", db="app", since=10**6)
    ok(c, "unsubscribe", subscription=sub["subscription"])
    err(c, "unsubscribe", -32010, "subscription_not_found", subscription=sub["subscription"])
    ok(c, "index.drop", db="app", name="todos.n")
    err(c, "index.drop", -32010, "index_not_found", db="app", name="todos.n")
    ok(c, "doc.delete", db="app", collection="todos", id="t3")
    err(c, "doc.delete", -32010, "document_not_found", db="app", collection="todos", id="t3")
    share = ok(c, "db.share", db="app")
    assert share["token"] is None and len(share["space"]) == 32
    err(c, "db.share", -32010, "database_not_found", db="missing")
    invite = ok(c, "db.invite", db="app", role="writer", address="127.0.0.1:9", expiresIn=60)
    assert invite["token"].startswith("blazedb-invite-2.") and invite["role"] == "writer"
    err(c, "db.invite", -32020, "not_listening", db="app", role="reader")
    err(c, "db.invite", -32602, "invalid_role", db="app", role="owner")
    err(c, "db.invite", -32010, "database_not_found", db="missing", role="reader")
    err(c, "db.join", -32011, "already_joined", token=invite["token"])
    err(c, "db.join", -32602, "invalid_token", token="nope")
    members = ok(c, "db.members", db="app")
    assert members["epoch"] == 1 and [(m["role"], m["thisDevice"]) for m in members["members"]] == [("admin", True)]
    err(c, "db.members", -32010, "database_not_found", db="missing")
    err(c, "db.revoke", -32010, "unknown_member", db="app", device="0" * 32)
    err(c, "db.revoke", -32020, "last_admin", db="app", device=members["members"][0]["device"])
    relay = ok(c, "db.relayCapability", db="app")
    assert relay["space"] == share["space"] and relay["capability"].startswith("blazedb-relay-1.")
    err(c, "db.relayCapability", -32010, "database_not_found", db="missing")
    # A legacy secret token (from before membership) still joins: its holders are the members.
    legacy = "blazedb-secret-1." + base64.urlsafe_b64encode(os.urandom(16) + b"\0\0\0\1" + os.urandom(32)).decode().rstrip("=")
    joined = ok(c, "db.join", token=legacy, db="joined")
    assert joined["db"] == "joined" and joined["space"] == ok(c, "sync.status", db="joined")["databases"][0]["space"]
    err(c, "db.relayCapability", -32020, "legacy_space", db="joined")
    ok(c, "peer.add", db="app", address="127.0.0.1:9")
    err(c, "peer.add", -32602, "invalid_address", db="app", address="nohost")
    assert [p["address"] for p in ok(c, "peer.list", db="app")["peers"]] == ["127.0.0.1:9"]
    err(c, "peer.list", -32010, "database_not_found", db="missing")
    folder = os.path.join(daemon.dir, "folder")
    os.mkdir(folder)
    assert ok(c, "folder.add", db="app", path=folder + "/") == {"db": "app", "path": folder, "added": True}
    err(c, "folder.add", -32602, "invalid_folder", db="app", path="relative")
    err(c, "folder.add", -32602, "invalid_folder", db="app", path=folder + "/missing")
    assert [f["path"] for f in ok(c, "folder.list", db="app")["folders"]] == [folder]
    err(c, "folder.list", -32010, "database_not_found", db="missing")
    assert ok(c, "folder.remove", db="app", path=folder)["removed"] is True
    err(c, "folder.remove", -32010, "database_not_found", db="missing", path=folder)
    status = ok(c, "sync.status", db="app")
    assert status["databases"][0]["space"] == share["space"] and status["databases"][0]["peers"][0]["peer"] == "127.0.0.1:9"
    err(c, "sync.status", -32010, "database_not_found", db="missing")
    ok(c, "db.create", db="plain")
    assert ok(c, "sync.pause", db="app") == {"db": "app", "paused": True}
    err(c, "sync.pause", -32020, "not_shared", db="plain")
    err(c, "db.relayCapability", -32020, "not_shared", db="plain")
    assert ok(c, "sync.resume", db="app") == {"db": "app", "paused": False}
    err(c, "sync.resume", -32010, "database_not_found", db="missing")
    ok(c, "sync.now", db="app")
    err(c, "sync.now", -32020, "not_shared", db="plain")
    assert ok(c, "peer.remove", db="app", address="127.0.0.1:9")["removed"] is True
    err(c, "peer.remove", -32602, "invalid_address", db="app", address="host:0")
    info = ok(c, "db.info", db="app")
    assert info["documents"] == 2 and len(info["stateHash"]) == 64
    backup_path = os.path.join(daemon.dir, "app.backup")
    backup = ok(c, "db.backup", db="app", path=backup_path)
    assert backup["stateHash"] == info["stateHash"] and backup["documents"] == 2 and backup["bytes"] == os.path.getsize(backup_path)
    err(c, "db.backup", -32011, "file_exists", db="app", path=backup_path)
    err(c, "db.backup", -32602, "invalid_path", db="app", path="relative.backup")
    err(c, "db.backup", -32010, "database_not_found", db="missing", path=backup_path + "2")
    restored = ok(c, "db.restore", path=backup_path, db="app_copy")
    assert restored == {"db": "app_copy", "documents": 2, "stateHash": info["stateHash"], "chunks": 0, "chunkBytes": 0}
    err(c, "db.restore", -32011, "database_exists", path=backup_path, db="app_copy")
    err(c, "db.restore", -32010, "file_not_found", path=backup_path + ".none", db="other")
    err(c, "db.restore", -32602, path=backup_path)
    compacted = ok(c, "db.compact", db="app_copy")
    assert compacted["db"] == "app_copy" and compacted["silentMembers"] == [] and compacted["sizeBytes"] > 0
    assert ok(c, "db.info", db="app_copy")["stateHash"] == info["stateHash"]
    err(c, "db.compact", -32010, "database_not_found", db="missing")
    err(c, "db.compact", -32602, db=5)
    err(c, "db.info", -32602, "invalid_name", db="../x")
    checked = ok(c, "db.check", db="app")
    assert checked["ok"] is True and checked["problems"] == [] and checked["db"] == "app" and checked["format"] >= 16
    err(c, "db.check", -32010, "database_not_found", db="missing")
    err(c, "db.check", -32602, "invalid_name", db="../x")
    blob_path = os.path.join(daemon.dir, "blob.bin")
    with open(blob_path, "wb") as f:
        f.write(os.urandom(300_000))
    put = ok(c, "blob.put", db="app", path=blob_path, type="application/octet-stream")
    blob = put["blob"]["id"]
    err(c, "blob.put", -32602, "invalid_path", db="app", path="relative")
    err(c, "blob.put", -32010, "file_not_found", db="app", path=blob_path + ".none")
    upload = ok(c, "blob.upload", db="app")["upload"]
    err(c, "blob.upload", -32010, "database_not_found", db="missing")
    assert ok(c, "blob.append", db="app", upload=upload, data=base64.b64encode(b"hello").decode())["size"] == 5
    err(c, "blob.append", -32602, "invalid_data", db="app", upload=upload, data="not base64!")
    assert ok(c, "blob.finish", db="app", upload=upload)["blob"]["size"] == 5
    err(c, "blob.finish", -32010, "upload_not_found", db="app", upload=upload)
    aborted = ok(c, "blob.upload", db="app")["upload"]
    assert ok(c, "blob.abort", db="app", upload=aborted) == {"aborted": True}
    err(c, "blob.abort", -32010, "upload_not_found", db="app", upload=aborted)
    assert base64.b64decode(ok(c, "blob.read", db="app", blob=blob, offset=10, length=4)["data"]) == open(blob_path, "rb").read()[10:14]
    err(c, "blob.read", -32012, "too_large", db="app", blob=blob, length=5 << 20)
    assert ok(c, "blob.stat", db="app", blob=blob)["heldBytes"] == 300_000
    err(c, "blob.stat", -32010, "blob_not_found", db="app", blob="ab" * 32)
    copy_path = os.path.join(daemon.dir, "blob.copy")
    assert ok(c, "blob.get", db="app", blob=blob, path=copy_path)["bytes"] == 300_000
    err(c, "blob.get", -32011, "file_exists", db="app", blob=blob, path=copy_path)
    assert ok(c, "db.info", db="app")["blobs"]["bytes"] >= 300_000
    assert ok(c, "blob.pin", db="app", blob=blob) == {"blob": blob, "pinned": True, "already": False}
    err(c, "blob.pin", -32602, "invalid_blob", db="app", blob="xyz")
    listed = ok(c, "blob.list", db="app")
    assert listed["next"] is None and [b["id"] for b in listed["blobs"]] == [blob] and listed["blobs"][0]["pinned"]
    err(c, "blob.list", -32602, "invalid_argument", db="app", limit=0)
    assert ok(c, "blob.unpin", db="app", blob=blob) == {"blob": blob, "pinned": False, "was": True}
    err(c, "blob.unpin", -32010, "database_not_found", db="missing", blob=blob)
    assert ok(c, "blob.policy", db="app", eager=["photos"], maxBytes=1 << 20) == {"eager": ["photos"], "maxBytes": 1 << 20}
    assert ok(c, "blob.policy", db="app") == {"eager": ["photos"], "maxBytes": 1 << 20}
    assert ok(c, "blob.policy", db="app", eager=[]) == {"eager": [], "maxBytes": None}
    err(c, "blob.policy", -32602, "invalid_name", db="app", eager=["no way"])
    # Nothing refers to either blob: without a grace period their chunks go.
    assert ok(c, "blob.gc", db="app", graceSeconds=0)["removedChunks"] >= 2
    assert ok(c, "db.info", db="app")["blobs"] == {"chunks": 0, "bytes": 0}
    err(c, "blob.gc", -32602, db="app", graceSeconds=-1)
    ok(c, "db.drop", db="app")
    err(c, "db.drop", -32010, "database_not_found", db="app")
    err(c, "daemon.info", -32602, bogus=1)
    err(c, "db.list", -32602, bogus=1)
    err(c, "rpc.discover", -32602, bogus=1)


def test_every_documented_method_was_exercised():
    # Runs after the test above (pytest keeps file order); conflict.resolve's and db.revoke's success paths need two
    # devices and are covered by the Swift suite (ReplicationRPCTests, MembershipDaemonTests), so they are exempt here.
    assert set(METHODS) - COVERED_OK == {"conflict.resolve", "db.revoke"}, f"no success call for {set(METHODS) - COVERED_OK}"
    assert set(METHODS) - {"rpc.discover", "db.list", "daemon.info"} <= COVERED_ERR | {"db.list", "daemon.info"}


def test_errors_carry_codes_and_kinds_as_exception_classes(client):
    with pytest.raises(blazedb.NotFoundError) as info:
        client.doc.get(db="default", collection="none", id="x")
    assert info.value.code == -32010 and info.value.kind == "document_not_found"
    with pytest.raises(blazedb.MethodNotFoundError):
        client.call("no.such")
    with pytest.raises(blazedb.InvalidParamsError):
        client.doc.insert(db="default", collection="c", doc={"_reserved": 1})
    with pytest.raises(ValueError):
        client.doc.insert(db="default", collection="c", doc={"x": float("nan")})


NOTIFICATION = next(n for n in DOC["x-notifications"] if n["name"] == "subscription")


def test_subscription_notifications_match_the_document(client, daemon):
    jsonschema.Draft7Validator.check_schema(NOTIFICATION["params"]["schema"])
    for example in NOTIFICATION["examples"]:
        jsonschema.validate(example["params"], schema_with_components(NOTIFICATION["params"]["schema"]))
    client.db.create(db="n")
    sub = client.call("subscribe", {"db": "n", "where": {"v": {"$gt": 1}}})
    # Writes from another connection, so that this one reads nothing but the raw notifications.
    with blazedb.Client(daemon.socket) as writer:
        writer.doc.put(db="n", collection="c", id="a", doc={"v": 2})
        writer.doc.patch(db="n", collection="c", id="a", set={"v": 0})
        writer.db.drop(db="n")
    seen = []
    while not seen or "error" not in seen[-1]:
        message = client._read_message()
        assert "id" not in message and message["method"] == "subscription"
        jsonschema.validate(message["params"], schema_with_components(NOTIFICATION["params"]["schema"]))
        assert message["params"]["subscription"] == sub["subscription"]
        seen.append(message["params"])
    types = [e["type"] for p in seen[:-1] for e in p["events"]]
    assert types == ["insert", "leave"]
    assert seen[-1]["error"]["data"]["kind"] == "database_dropped"


def test_every_call_of_every_test_is_checked_against_its_result_schema(daemon):
    from conftest import _RESULTS
    assert blazedb.Client.call.__name__ == "checked"
    with blazedb.Client(daemon.socket) as c:
        assert c.call("db.list")["databases"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"databases": [{"name": "a", "extra": 1}]}, _RESULTS["db.list"], cls=jsonschema.Draft7Validator)
