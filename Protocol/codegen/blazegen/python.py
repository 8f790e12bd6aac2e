"""Writes the Python client's generated part: error classes, method namespaces and `Client` (Clients/python).

The connection, errors' base class and subscriptions are ordinary source in Clients/python/blazedb/_runtime.py.
"""
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


def _method(name: str, m: Method, client_expr: str):
    sig = ["self"] + (["*"] if m.params else [])
    for p in sorted(m.params, key=lambda p: not p.required):
        sig.append(f"{snake(p.name)}: {annotation(p.type)}" + ("" if p.required else " = MISSING"))
    subscribes = m.name == "subscribe"
    lines = [f"    def {snake(name)}({', '.join(sig)}) -> {'Subscription' if subscribes else 'Dict[str, Any]'}:"]
    doc = [m.summary, ""] + [f"{p.name}: {p.description}" for p in m.params]
    if subscribes:
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
    call = f'{client_expr}.call("{m.name}", params)'
    lines.append(f"        return Subscription({client_expr}, {call})" if subscribes else f"        return {call}")
    return lines + [""]


def client(model: Model) -> str:
    errors = list(model.errors.items())
    out = [f'"""BlazeDB client for Python ({HEADER})."""', "",
           "from typing import Any, Dict, List, Union", "",
           "from ._runtime import MISSING, BlazeError, Connection, Subscription, default_socket_path", "",
           '__all__ = ["Client", "Subscription", "BlazeError", "default_socket_path"' +
           "".join(f', "{n}Error"' for n, _ in errors) + "]", "", ""]
    for name, e in errors:
        out += [f"class {name}Error(BlazeError):", f'    """{e["message"]}"""', "", f"    code = {e['code']}", "", ""]
    areas = model.areas()
    for area, methods in areas.items():
        out += [f"class _{camel_type(area)}:", f'    """Methods `{area}.*`."""', "",
                '    def __init__(self, client: "Client"):', "        self._client = client", ""]
        for m in methods:
            out += _method(m.verb, m, "self._client")
        out.append("")
    out += ["class Client(Connection):",
            '    """A connection to blazed. Use as a context manager; one request at a time per client."""', "",
            "    def __init__(self, socket_path: Union[str, None] = None, timeout: Union[float, None] = 30.0):",
            "        super().__init__(socket_path, timeout)"]
    out += [f"        self.{snake(area)} = _{camel_type(area)}(self)" for area in areas]
    out.append("")
    for m in model.toplevel():
        out += _method(m.name, m, "self")
    out += ['    def __enter__(self) -> "Client":', "        return self", ""]
    return "\n".join(out)


def pyproject(model: Model) -> str:
    return "\n".join([
        f"# {HEADER}", "[build-system]", 'requires = ["setuptools>=61"]', 'build-backend = "setuptools.build_meta"', "",
        "[project]", 'name = "blazedb"', f'version = "{model.version}"', 'description = "Client for blazed, the BlazeDB daemon"',
        'requires-python = ">=3.9"', "dependencies = []", "", "[tool.setuptools]", 'packages = ["blazedb"]', ""])


def outputs(model: Model):
    return {
        "Clients/python/pyproject.toml": pyproject(model),
        "Clients/python/blazedb/__init__.py": client(model),
    }
