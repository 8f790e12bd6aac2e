"""Writes the Python client's generated part: error classes, method namespaces and `Client` (Clients/python).

The connection, errors' base class and subscriptions are ordinary source in Clients/python/blazedb/_runtime.py.
"""
import json
from typing import List

from .model import HEADER, Model, Method, Type, camel_type, snake

_FREEFORM = {"Document": "Dict[str, Any]", "DocumentInput": "Dict[str, Any]", "Filter": "Dict[str, Any]"}


def annotation(t: Type) -> str:
    """The Python type hint of a parameter."""
    if t.ref in _FREEFORM:
        return _FREEFORM[t.ref]
    return {
        "string": "str", "integer": "int", "number": "float", "boolean": "bool", "object": "Dict[str, Any]",
        "map": "Dict[str, Any]", "struct": "Dict[str, Any]",
        "array": f"List[{annotation(t.item)}]" if t.item and t.item.kind in ("string", "integer") else "List[Any]",
    }.get(t.kind, "Union[str, List[str]]" if t.accepts == ["string", "array"] else "Any")


def result_name(m: Method) -> str:
    """`DocInsertResult` for `doc.insert`."""
    return m.type_name + "Result"


def hint(t: Type, name: str, out: List[str]) -> str:
    """The type hint of a result value; closed objects become TypedDicts named `name`, appended to `out`."""
    if t.ref in _FREEFORM:
        return "Dict[str, Any]"
    if t.kind == "struct":
        typed_dict(t, name, out)
        return name
    if t.kind == "nullable":
        return f"Optional[{hint(t.item, name, out)}]"
    if t.kind == "array":
        return f"List[{hint(t.item, name + 'Item', out)}]"
    if t.kind == "map":
        return f"Dict[str, {hint(t.item, name + 'Value', out)}]"
    if t.kind == "enum":
        return "Literal[" + ", ".join(repr(v) for v in t.values) + "]"
    if t.kind == "const":
        return f"Literal[{t.value!r}]"
    return {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "object": "Dict[str, Any]"}.get(
        t.kind, "Any")


def typed_dict(t: Type, name: str, out: List[str]) -> None:
    """Appends the TypedDict of a closed object (its optional members in a `total=False` subclass)."""
    fields = [(mb, hint(mb.type, name + camel_type(mb.name), out)) for mb in t.members]
    required = [(mb, h) for mb, h in fields if mb.required]
    optional = [(mb, h) for mb, h in fields if not mb.required]

    def body(members):
        lines = []
        for mb, h in members:
            if mb.description:
                lines.append(f"    # {mb.description}")
            lines.append(f"    {mb.name}: {h}")
        return lines or ["    pass"]

    if optional:
        out += [f"class _{name}Required(TypedDict):", *body(required), "", "",
                f"class {name}(_{name}Required, total=False):", *body(optional), "", ""]
    else:
        out += [f"class {name}(TypedDict):", *body(required), "", ""]


def types_module(model: Model) -> str:
    """`blazedb/_types.py`: the TypedDict of every method's result."""
    out = [f'"""Result types of the BlazeDB clients ({HEADER})."""', "",
           "from typing import Any, Dict, List, Literal, Optional, TypedDict", "", ""]
    names = []
    for m in model.methods:
        if m.name == "subscribe":
            continue
        if m.result.kind == "struct":
            typed_dict(m.result, result_name(m), out)
        else:
            out += [f"{result_name(m)} = {hint(m.result, result_name(m), out)}", "", ""]
        names.append(result_name(m))
    out += ["__all__ = [" + ", ".join(f'"{n}"' for n in names) + "]", ""]
    return "\n".join(out)


def _signature(name: str, m: Method, asynchronous: bool, subscription: str) -> List[str]:
    sig = ["self"] + (["*"] if m.params else [])
    for p in sorted(m.params, key=lambda p: not p.required):
        sig.append(f"{snake(p.name)}: {annotation(p.type)}" + ("" if p.required else " = MISSING"))
    returns = subscription if m.name == "subscribe" else result_name(m)
    return [f"    {'async ' if asynchronous else ''}def {snake(name)}({', '.join(sig)}) -> {returns}:"]


def _method(name: str, m: Method, client_expr: str, asynchronous: bool = False):
    subscribes = m.name == "subscribe"
    lines = _signature(name, m, asynchronous, "AsyncSubscription" if asynchronous else "Subscription")
    doc = [m.summary, ""] + [f"{p.name}: {p.description}" for p in m.params]
    if subscribes and asynchronous:
        doc += ["", "Returns an AsyncSubscription: `async for` its events (dicts); it raises the subscription's",
                "final error as a BlazeError; use it as an async context manager (or await unsubscribe()) to end it."]
    elif subscribes:
        doc += ["", "Returns a Subscription: iterate it for events (dicts); it raises the subscription's final",
                "error as a BlazeError; use it as a context manager (or call unsubscribe()) to end it."]
    body = "\n".join(("        " + line) if line else "" for line in doc[1:])
    lines.append('        """' + doc[0] + "\n" + body + '\n        """')
    lines.append("        params: Dict[str, Any] = {}")
    for p in m.params:
        if p.required:
            lines.append(f'        params["{p.name}"] = {snake(p.name)}')
        else:
            lines += [f"        if {snake(p.name)} is not MISSING:", f'            params["{p.name}"] = {snake(p.name)}']
    call = f'{"await " if asynchronous else ""}{client_expr}.call("{m.name}", params)'
    if subscribes:
        lines.append(f"        return {'AsyncSubscription' if asynchronous else 'Subscription'}({client_expr}, {call})")
    else:
        lines.append(f"        return cast({result_name(m)}, {call})")
    return lines + [""]


def _result_imports(model: Model) -> List[str]:
    names = [result_name(m) for m in model.methods if m.name != "subscribe"]
    return ["from ._types import (", *[f"    {n}," for n in names], ")"]


def client(model: Model) -> str:
    errors = list(model.errors.items())
    out = [f'"""BlazeDB client for Python ({HEADER})."""', "",
           "from typing import Any, Dict, List, Union, cast", "",
           "from ._runtime import MISSING, BlazeError, Connection, Subscription, default_socket_path",
           *_result_imports(model), "from ._types import *  # noqa: F401,F403 (the result types, for users)", "",
           '__all__ = ["Client", "Subscription", "BlazeError", "default_socket_path"' +
           "".join(f', "{n}Error"' for n, _ in errors) +
           "".join(f', "{result_name(m)}"' for m in model.methods if m.name != "subscribe") + "]", "",
           "# BlazeDB's version, as the protocol document gives it (as the daemon's and the package's).",
           f"__version__ = {json.dumps(model.version)}", "", ""]
    for name, e in errors:
        out += [f"class {name}Error(BlazeError):", f'    """{e["message"]}"""', "", f"    code = {e['code']}", "", ""]
    out += _classes(model, "Connection", "A connection to blazed. Use as a context manager; one request at a time per client.",
                    asynchronous=False)
    out += ['    def __enter__(self) -> "Client":', "        return self", ""]
    return "\n".join(out)


def _classes(model: Model, base: str, doc: str, asynchronous: bool) -> List[str]:
    """The method namespaces (`_Doc`...) and `Client`, up to its context-manager entry."""
    out: List[str] = []
    areas = model.areas()
    for area, methods in areas.items():
        out += [f"class _{camel_type(area)}:", f'    """Methods `{area}.*`."""', "",
                '    def __init__(self, client: "Client"):', "        self._client = client", ""]
        for m in methods:
            out += _method(m.verb, m, "self._client", asynchronous)
        out.append("")
    out += [f"class Client({base}):", f'    """{doc}"""', "",
            "    def __init__(self, socket_path: Union[str, None] = None, timeout: Union[float, None] = 30.0):",
            "        super().__init__(socket_path, timeout)"]
    out += [f"        self.{snake(area)} = _{camel_type(area)}(self)" for area in areas]
    out.append("")
    for m in model.toplevel():
        out += _method(m.name, m, "self", asynchronous)
    return out


def aio_client(model: Model) -> str:
    """`blazedb/aio.py`: the asyncio client, the same methods as coroutines."""
    out = [f'"""BlazeDB asyncio client for Python ({HEADER}).',
           "",
           "    async with blazedb.aio.Client() as db:",
           '        await db.doc.insert(db="default", collection="todos", doc={"title": "Buy milk"})',
           '        async with await db.subscribe(db="default", collection="todos") as live:',
           "            async for event in live: ...",
           "",
           "Requests may run concurrently on one client (responses are matched by id).",
           '"""', "",
           "from typing import Any, Dict, List, Union, cast", "",
           "from ._aio_runtime import AsyncConnection, AsyncSubscription",
           "from ._runtime import MISSING", *_result_imports(model), "",
           '__all__ = ["Client", "AsyncSubscription"]', "", ""]
    out += _classes(model, "AsyncConnection",
                    "A connection to blazed for asyncio. Use as an async context manager (it connects on entry).",
                    asynchronous=True)
    out += ['    async def __aenter__(self) -> "Client":', "        await self.connect()", "        return self", ""]
    return "\n".join(out)


def pyproject(model: Model) -> str:
    return "\n".join([
        f"# {HEADER}", "[build-system]", 'requires = ["setuptools>=61"]', 'build-backend = "setuptools.build_meta"', "",
        "[project]", 'name = "blazedb"', f'version = "{model.version}"', 'description = "Client for blazed, the BlazeDB daemon"',
        'requires-python = ">=3.9"', "dependencies = []", "", "[tool.setuptools]", 'packages = ["blazedb"]', "",
        "[tool.setuptools.package-data]", 'blazedb = ["py.typed"]', ""])


def outputs(model: Model):
    return {
        "Clients/python/pyproject.toml": pyproject(model),
        "Clients/python/blazedb/__init__.py": client(model),
        "Clients/python/blazedb/_types.py": types_module(model),
        "Clients/python/blazedb/aio.py": aio_client(model),
    }
