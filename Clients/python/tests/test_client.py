"""Behaviour of the generated Python client itself."""
import inspect

import blazedb


def test_socket_is_found_like_blazectl_finds_it():
    assert blazedb.default_socket_path({"BLAZEDB_SOCKET": "/x.sock"}) == "/x.sock"
    assert blazedb.default_socket_path({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/blazedb/blazed.sock"
    assert blazedb.default_socket_path({}).startswith("/tmp/blazedb-")


def test_methods_are_typed_keyword_only_and_documented():
    sig = inspect.signature(blazedb.Client.__init__)
    assert "socket_path" in sig.parameters
    method = blazedb._Doc.patch
    params = inspect.signature(method).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for n, p in params.items() if n != "self")
    assert params["db"].annotation is str and params["incr"].default is not inspect.Parameter.empty
    assert "counter" in method.__doc__ and "incr:" in method.__doc__


def test_namespaced_methods_and_context_manager(daemon):
    with blazedb.Client(daemon.socket) as client:
        client.doc.insert(db="default", collection="todos", doc={"_id": "a", "title": "Milk", "prio": 2})
        client.doc.patch(db="default", collection="todos", id="a", incr={"views": 1})
        assert client.doc.get(db="default", collection="todos", id="a")["doc"]["views"] == 1
        assert client.query.count(db="default", collection="todos")["count"] == 1
        assert client.doc.get_many(db="default", collection="todos", ids=["a", "b"])["docs"][1] is None
        # An omitted optional parameter is not sent; None is sent as JSON null.
        resolved_default = client.conflict.list(db="default")
        assert resolved_default == {"conflicts": []}
    assert client._sock.fileno() == -1, "the context manager closes the connection"
